/*
 * Go's sync primitives: Mutex, RWMutex, Cond and Once.
 *
 * All of them block through the wait layer (runtime/runtime.h), so they work from
 * coroutines and from plain OS threads in any mix. The design follows Go's
 * sync package (mutex.go, rwmutex.go, cond.go, once.go) on top of a small
 * handoff semaphore (`sema_t` below, the analogue of runtime/sema.go).
 *
 * Misuse that Go turns into a fatal error (unlocking an unlocked mutex,
 * runlock without rlock, ...) calls co__fatal() with the object's address
 * and the operation, which prints one line and aborts.
 *
 * NULL (colony.h's rule): a call that returns int answers CO_EINVAL; a
 * void one cannot answer, so it aborts with "<call>(NULL): ...", as Go's
 * nil-pointer dereference panics. The check comes before the first
 * dereference: on the fast paths it is one test-and-branch, predicted
 * not taken, whose target is out of line (null_fatal).
 */
#include "runtime/runtime.h"

#include <sched.h>
#include <string.h>
#include <unistd.h>

/* A NULL object's fatal line. Out of line, and reached by a jump: GCC
 * would see that it never returns and call it, and a call gives the fast
 * path that tests for NULL a stack frame to set up (it does not
 * shrink-wrap the frame into the cold paths once there are two of
 * them); noipa hides that. Not noreturn for the same reason: callers
 * write `null_fatal(...); return;`. */
#if defined(__clang__)
#define NULL_FATAL_ATTR __attribute__((noinline, cold))
#else
#define NULL_FATAL_ATTR __attribute__((noinline, noipa, cold))
#endif
static NULL_FATAL_ATTR void null_fatal(const char *call, const char *what) {
    co__fatal("%s(NULL): NULL %s", call, what);
}

/* ---- sema_t: a counting semaphore with direct handoff ------------------ */
/*
 * Like runtime/sema.go's semaphore, but always in "handoff" mode: a release
 * that finds a waiter gives its unit to that waiter (the waiter returns
 * owning it) instead of bumping the count. Only when nobody waits does the
 * count grow; a later acquire takes it without locking. The mutex and
 * rwmutex below decide fairness in their own state words; the semaphore
 * only has to never lose a wake-up:
 *   acquire: count>0 ? take it : lock, re-check count, enqueue, park.
 *   release: lock, pop a waiter and hand it the unit, else count++.
 * count grows only under `lock`, so the re-check under the lock in acquire
 * and the waiter check under the lock in release cannot both miss.
 * The waiters never have a deadline, so a claim cannot fail; the loop in
 * sema_release is there only for robustness.
 */
typedef struct sema {
    uint32_t count;  /* atomic; increments only under lock (release order),
                        decrements by CAS anywhere (acquire order) */
    co__lock_t lock; /* protects q and increments of count */
    co__waitq_t q;   /* parked acquirers, FIFO (LIFO re-queues at the head) */
} sema_t;

static bool sema_trytake(sema_t *s) {
    uint32_t c = __atomic_load_n(&s->count, __ATOMIC_RELAXED);
    while (c > 0) {
        /* acquire: pairs with the release add in sema_release */
        if (__atomic_compare_exchange_n(&s->count, &c, c - 1, true, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            return true;
    }
    return false;
}

/* Take one unit, parking until one is released. lifo: queue at the head
 * (a waiter that already waited once, as Go's queueLifo). Always under the
 * lock, even a unit that is there already: a releaser that found nobody
 * queued adds the unit and then unlocks, and a taker that did not wait for
 * that unlock could return, and (the mutex's last user) free the sema
 * under the releaser's unlock. */
static void sema_acquire(sema_t *s, bool lifo, int reason) {
    co__pkw_t pw;
    co__wait_prepare(&pw, reason);
    co__lock(&s->lock);
    if (sema_trytake(s)) {
        co__unlock(&s->lock);
        return;
    }
    if (lifo)
        co__waitq_push_front(&s->q, &pw.w);
    else
        co__waitq_push(&s->q, &pw.w);
    co__wait(&pw.w, &s->lock, CO_FOREVER, 0); /* no deadline: only a claim ends it */
}

static void sema_release(sema_t *s) {
    co__lock(&s->lock);
    co__waiter_t *w;
    while ((w = co__waitq_pop(&s->q)) != NULL) {
        if (co__claim(w->pk, w)) {
            co__parker_t *pk = w->pk; /* w lives on the waiter's stack: read it first */
            co__unlock(&s->lock);
            co__unpark(pk);
            return;
        }
    }
    /* release: pairs with the acquire CAS in sema_trytake */
    __atomic_add_fetch(&s->count, 1, __ATOMIC_RELEASE);
    co__unlock(&s->lock);
}

/* ---- spinning policy --------------------------------------------------- */
/* Go spins (at most 4 rounds of 30 pauses) only on a multicore machine with
 * another P running. The runtime's idle-P count is not part of the internal
 * API, so we check the CPU count and, in a coroutine, that there is more
 * than one P. */
#define ACTIVE_SPIN 4
#define ACTIVE_SPIN_CNT 30

static int ncpu_cached; /* atomic relaxed: 0 unknown; benign recomputation */

static int ncpu(void) {
    int n = __atomic_load_n(&ncpu_cached, __ATOMIC_RELAXED);
    if (n == 0) {
        long r = sysconf(_SC_NPROCESSORS_ONLN);
        n = r > 0 ? (int)r : 1;
        __atomic_store_n(&ncpu_cached, n, __ATOMIC_RELAXED);
    }
    return n;
}

static bool can_spin(int iter) {
    if (iter >= ACTIVE_SPIN || ncpu() <= 1) return false;
    if (co__cur_g() != NULL && co_procs() <= 1) return false;
    return true;
}


static void do_spin(void) {
    for (int i = 0; i < ACTIVE_SPIN_CNT; i++) co__cpu_relax();
}

/* ---- Mutex -------------------------------------------------------------- */
/*
 * state (atomic) packs, as Go's Mutex.state:
 *   bit 0  LOCKED    held
 *   bit 1  WOKEN     a waiter is awake (spinning or just released): unlock
 *                    need not wake another
 *   bit 2  STARVING  starvation mode: unlock hands ownership straight to
 *                    the head waiter, newcomers queue at the tail
 *   bits 3.. number of waiters parked or about to park on sema
 * Normal mode: a woken waiter competes with arriving lockers (which usually
 * win, having the CPU), and re-queues at the head if it loses. A waiter that
 * waited over 1 ms switches the mutex to starvation mode. It goes back to
 * normal when the waiter that got the lock is the last one, or waited less
 * than 1 ms.
 * Memory order: every CAS that can take the lock is acq_rel (acquire for the
 * critical section, release keeps the waiter count chain ordered); unlock's
 * subtraction is release and pairs with those acquires.
 */
enum { M_LOCKED = 1, M_WOKEN = 2, M_STARVING = 4, M_WAITER_SHIFT = 3 };
#define M_WAITER ((uint32_t)1 << M_WAITER_SHIFT)
#define STARVATION_NS 1000000

typedef struct mutex {
    uint32_t state;
    sema_t sema;
} mutex_t;
CO_STATIC_ASSERT(sizeof(mutex_t) <= sizeof(co_mutex_t), "co_mutex_t too small");
CO_STATIC_ASSERT(_Alignof(mutex_t) <= _Alignof(co_mutex_t), "co_mutex_t misaligned");

/* Times any mutex entered starvation mode (read by tests/test_mutex_stress.c). */
CO_HIDDEN uint64_t co__mutex_starvation_count; /* atomic relaxed counter */

/* Out of line: co_mutex_lock's fast path then needs no frame (GCC does not
 * shrink-wrap it when the NULL test adds a second way in). */
static __attribute__((noinline)) void mutex_lock_slow(mutex_t *m, co_mutex_t *pub) {
    if (pub == NULL) co__fatal("co_mutex_lock(NULL): NULL mutex");
    int64_t wait_start = 0;
    bool starving = false, awoke = false;
    int iter = 0;
    uint32_t old = __atomic_load_n(&m->state, __ATOMIC_RELAXED);
    for (;;) {
        /* Spin while held in normal mode, hoping the holder releases soon.
         * Setting WOKEN tells unlock not to wake a parked waiter meanwhile. */
        if ((old & (M_LOCKED | M_STARVING)) == M_LOCKED && can_spin(iter)) {
            if (!awoke && !(old & M_WOKEN) && (old >> M_WAITER_SHIFT) != 0 &&
                __atomic_compare_exchange_n(&m->state, &old, old | M_WOKEN, false,
                                            __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                awoke = true;
            do_spin();
            iter++;
            old = __atomic_load_n(&m->state, __ATOMIC_RELAXED);
            continue;
        }
        uint32_t new = old;
        if (!(old & M_STARVING)) new |= M_LOCKED;               /* try to take it */
        if (old & (M_LOCKED | M_STARVING)) new += M_WAITER;     /* or queue */
        if (starving && (old & M_LOCKED)) new |= M_STARVING;    /* switch mode */
        if (awoke) {
            if (!(new & M_WOKEN))
                co__fatal("co_mutex_lock(%p): inconsistent mutex state (memory corrupted?)",
                          (void *)pub);
            new &= ~(uint32_t)M_WOKEN;
        }
        if (!__atomic_compare_exchange_n(&m->state, &old, new, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue; /* old was reloaded */
        if (!(old & (M_LOCKED | M_STARVING))) return; /* took it with the CAS */
        if (starving && !(old & M_STARVING) && (new & M_STARVING))
            __atomic_add_fetch(&co__mutex_starvation_count, 1, __ATOMIC_RELAXED);
        bool lifo = wait_start != 0;
        if (wait_start == 0) wait_start = co_now();
        sema_acquire(&m->sema, lifo, CO__WR_MUTEX);
        starving = starving || co_now() - wait_start > STARVATION_NS;
        old = __atomic_load_n(&m->state, __ATOMIC_RELAXED);
        if (old & M_STARVING) {
            /* Ownership was handed to us; the state still counts us as a
             * waiter and has LOCKED clear. */
            if ((old & (M_LOCKED | M_WOKEN)) || (old >> M_WAITER_SHIFT) == 0)
                co__fatal("co_mutex_lock(%p): inconsistent mutex state (memory corrupted?)",
                          (void *)pub);
            uint32_t delta = M_LOCKED - M_WAITER;
            /* Leave starvation mode if we did not starve or are the last
             * waiter; staying would make the next unlock hand off to nobody. */
            if (!starving || (old >> M_WAITER_SHIFT) == 1) delta -= M_STARVING;
            /* acquire: pairs with the release subtraction of the unlocker */
            __atomic_add_fetch(&m->state, delta, __ATOMIC_ACQ_REL);
            return;
        }
        awoke = true;
        iter = 0;
    }
}

void co_mutex_lock(co_mutex_t *pub) {
    mutex_t *m = (mutex_t *)pub;
    uint32_t z = 0;
    /* acquire: pairs with the release subtraction in unlock. A NULL mutex
     * goes to the slow path, which reports it (a fatal call here would
     * give this path a frame). */
    if (CO_LIKELY(pub != NULL &&
                  __atomic_compare_exchange_n(&m->state, &z, M_LOCKED, false, __ATOMIC_ACQUIRE,
                                              __ATOMIC_RELAXED)))
        return;
    mutex_lock_slow(m, pub);
}

int co_mutex_trylock(co_mutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) return CO_EINVAL;
    mutex_t *m = (mutex_t *)pub;
    uint32_t old = __atomic_load_n(&m->state, __ATOMIC_RELAXED);
    if (old & (M_LOCKED | M_STARVING)) return CO_EBUSY;
    /* acquire: pairs with the release subtraction in unlock */
    if (!__atomic_compare_exchange_n(&m->state, &old, old | M_LOCKED, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return CO_EBUSY;
    return 0;
}

/* may_yield: in starvation mode yield to the waiter we handed the lock to
 * (as Go does). False when the caller holds a co__lock_t.
 *
 * Every change is one CAS from a state with LOCKED set, and that CAS is the
 * unlocker's last touch of the state: it may be the last touch of the
 * mutex at all. Go releases LOCKED first and then, with waiters about,
 * loads and CASes the state again to wake one; in C a locker that got the
 * mutex meanwhile may have woken that waiter itself, and the waiter,
 * finding itself the last user (the last reference of an object counted
 * under the mutex), may have freed it under the unlocker's CAS. Here the
 * only touch after the CAS is sema_release's, when the CAS committed this
 * unlocker to wake a waiter: until that waiter is woken (by this very
 * call; sema_release's own last touches come before the wake-up) it is
 * inside co_mutex_lock, so the mutex cannot have been freed. */
static inline __attribute__((always_inline)) void mutex_unlock_inl(mutex_t *m, const void *pub,
                                                                   const char *op,
                                                                   bool may_yield) {
    /* A look first: under contention the state seldom reads LOCKED alone,
     * and a CAS that fails costs as much as one that succeeds. */
    uint32_t old = __atomic_load_n(&m->state, __ATOMIC_RELAXED);
    for (;;) {
        if (!(old & M_LOCKED)) co__fatal("%s(%p): unlock of unlocked mutex", op, pub);
        uint32_t nw = old - M_LOCKED;
        bool wake = false;
        if (old & M_STARVING) {
            /* Starvation mode: LOCKED goes clear but STARVING keeps
             * newcomers out; the head waiter owns the mutex once woken. */
            wake = true;
        } else if ((old >> M_WAITER_SHIFT) != 0 && !(old & M_WOKEN)) {
            /* A waiter to wake (none is awake already, spinning). */
            nw = (nw - M_WAITER) | M_WOKEN;
            wake = true;
        }
        /* release: publishes the critical section to the next locker */
        if (__atomic_compare_exchange_n(&m->state, &old, nw, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
            if (!wake) return;
            sema_release(&m->sema);
            if ((old & M_STARVING) && may_yield && co__cur_g() != NULL) co_yield();
            return;
        }
    }
}

/* The other unlockers' copy (rwmutex, cond, once); co_mutex_unlock has
 * its own, which saves the call it would otherwise jump through: that
 * pays for its NULL test. */
static __attribute__((noinline)) void mutex_unlock(mutex_t *m, const void *pub, const char *op,
                                                   bool may_yield) {
    mutex_unlock_inl(m, pub, op, may_yield);
}

void co_mutex_unlock(co_mutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) {
        null_fatal("co_mutex_unlock", "mutex");
        return;
    }
    mutex_unlock_inl((mutex_t *)pub, pub, "co_mutex_unlock", true);
}

/* ---- RWMutex ------------------------------------------------------------ */
/*
 * As Go's RWMutex: writers serialise on `w`; a writer announces itself by
 * subtracting MAX_READERS from reader_count, so readers arriving after it
 * see a negative count and park on reader_sem (a waiting writer blocks new
 * readers); it then waits on writer_sem for the readers that were active
 * (reader_wait) to leave. Unlock adds MAX_READERS back and releases every
 * reader that queued meanwhile.
 * reader_count and reader_wait are atomic, acq_rel: they pair the readers'
 * critical sections with the writer's.
 */
#define MAX_READERS (1 << 30)

typedef struct rwmutex {
    mutex_t w;            /* held by the writer (pending or active) */
    sema_t writer_sem;    /* writer waits here for departing readers */
    sema_t reader_sem;    /* readers wait here for the writer to finish */
    int32_t reader_count; /* atomic: active+pending readers, -MAX_READERS if a writer is pending */
    int32_t reader_wait;  /* atomic: readers the pending writer still waits for */
    /* atomic relaxed: 1 while a writer holds the lock (from when its lock
     * returns until its unlock starts); only the writer writes it. Lets
     * unlock tell a stray call (misuse) from the writer's own: with a
     * writer pending, reader_count alone does not (it reads as the count of
     * active readers there). */
    uint32_t wlocked;
} rwmutex_t;
CO_STATIC_ASSERT(sizeof(rwmutex_t) <= sizeof(co_rwmutex_t), "co_rwmutex_t too small");
CO_STATIC_ASSERT(_Alignof(rwmutex_t) <= _Alignof(co_rwmutex_t), "co_rwmutex_t misaligned");

void co_rwmutex_rlock(co_rwmutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) {
        null_fatal("co_rwmutex_rlock", "rwmutex");
        return;
    }
    rwmutex_t *rw = (rwmutex_t *)pub;
    if (__atomic_add_fetch(&rw->reader_count, 1, __ATOMIC_ACQ_REL) < 0)
        sema_acquire(&rw->reader_sem, false, CO__WR_RWMUTEX); /* a writer is pending */
}

void co_rwmutex_runlock(co_rwmutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) {
        null_fatal("co_rwmutex_runlock", "rwmutex");
        return;
    }
    rwmutex_t *rw = (rwmutex_t *)pub;
    int32_t r = __atomic_sub_fetch(&rw->reader_count, 1, __ATOMIC_ACQ_REL);
    if (CO_LIKELY(r >= 0)) return;
    /* wlocked: write-locked with readers queued behind the writer, whose
     * adds hide the writer's -MAX_READERS. A reader that holds its read
     * lock never sees 1 here: the pending writer sets it only after this
     * reader's reader_wait decrement below. */
    if (r + 1 == 0 || r + 1 == -MAX_READERS || __atomic_load_n(&rw->wlocked, __ATOMIC_RELAXED))
        co__fatal("co_rwmutex_runlock(%p): runlock of unlocked rwmutex", (void *)pub);
    /* A writer is pending: the last departing reader lets it in. */
    if (__atomic_sub_fetch(&rw->reader_wait, 1, __ATOMIC_ACQ_REL) == 0)
        sema_release(&rw->writer_sem);
}

void co_rwmutex_lock(co_rwmutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) {
        null_fatal("co_rwmutex_lock", "rwmutex");
        return;
    }
    rwmutex_t *rw = (rwmutex_t *)pub;
    co_mutex_lock((co_mutex_t *)&rw->w);
    int32_t r = __atomic_sub_fetch(&rw->reader_count, MAX_READERS, __ATOMIC_ACQ_REL) + MAX_READERS;
    if (r != 0 && __atomic_add_fetch(&rw->reader_wait, r, __ATOMIC_ACQ_REL) != 0)
        sema_acquire(&rw->writer_sem, false, CO__WR_RWMUTEX);
    __atomic_store_n(&rw->wlocked, 1, __ATOMIC_RELAXED);
}

/* Go's TryRLock: a reader gets in only while no writer holds or waits
 * (reader_count >= 0), as rlock would without parking. */
int co_rwmutex_tryrlock(co_rwmutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) return CO_EINVAL;
    rwmutex_t *rw = (rwmutex_t *)pub;
    int32_t c = __atomic_load_n(&rw->reader_count, __ATOMIC_RELAXED);
    for (;;) {
        if (c < 0) return CO_EBUSY; /* a writer holds it or waits */
        /* acq_rel, as rlock's add: pairs with the writer's lock and unlock */
        if (__atomic_compare_exchange_n(&rw->reader_count, &c, c + 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return 0;
    }
}

/* Go's TryLock: the writers' mutex without waiting, then no reader at all
 * (reader_count 0 -> -MAX_READERS in one CAS, so no reader waits to be
 * waited for); else the writers' mutex goes back. */
int co_rwmutex_trylock(co_rwmutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) return CO_EINVAL;
    rwmutex_t *rw = (rwmutex_t *)pub;
    if (co_mutex_trylock((co_mutex_t *)&rw->w) != 0) return CO_EBUSY;
    int32_t zero = 0;
    /* acq_rel, as lock's subtraction: pairs with the readers' runlock */
    if (!__atomic_compare_exchange_n(&rw->reader_count, &zero, -MAX_READERS, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        mutex_unlock(&rw->w, pub, "co_rwmutex_trylock", false);
        return CO_EBUSY;
    }
    __atomic_store_n(&rw->wlocked, 1, __ATOMIC_RELAXED);
    return 0;
}

void co_rwmutex_unlock(co_rwmutex_t *pub) {
    if (CO_UNLIKELY(pub == NULL)) {
        null_fatal("co_rwmutex_unlock", "rwmutex");
        return;
    }
    rwmutex_t *rw = (rwmutex_t *)pub;
    if (!__atomic_load_n(&rw->wlocked, __ATOMIC_RELAXED))
        co__fatal("co_rwmutex_unlock(%p): unlock of unlocked rwmutex", (void *)pub);
    __atomic_store_n(&rw->wlocked, 0, __ATOMIC_RELAXED);
    int32_t r = __atomic_add_fetch(&rw->reader_count, MAX_READERS, __ATOMIC_ACQ_REL);
    if (r >= MAX_READERS)
        co__fatal("co_rwmutex_unlock(%p): unlock of unlocked rwmutex", (void *)pub);
    for (int32_t i = 0; i < r; i++) sema_release(&rw->reader_sem);
    mutex_unlock(&rw->w, pub, "co_rwmutex_unlock", true);
}

/* ---- Cond --------------------------------------------------------------- */
/*
 * A FIFO of parked waiters under `lock`. A waiter enqueues itself and
 * unlocks the user's mutex while holding `lock`, and releases `lock` only
 * once parked (co__park_lock), so a signal sent after the mutex was released
 * always finds it. A waiter whose deadline claimed it is skipped by signal
 * (its claim fails), so no signal is lost to a timing-out waiter.
 */
typedef struct cond {
    co__lock_t lock; /* protects q and writes of nwait */
    uint32_t nwait;  /* atomic: length of q; stored under lock, loaded relaxed
                        by signal's fast path (see co_cond_signal) */
    co__waitq_t q;   /* parked waiters, FIFO */
} cond_t;
CO_STATIC_ASSERT(sizeof(cond_t) <= sizeof(co_cond_t), "co_cond_t too small");
CO_STATIC_ASSERT(_Alignof(cond_t) <= _Alignof(co_cond_t), "co_cond_t misaligned");

static int cond_wait(co_cond_t *pub, co_mutex_t *m, int64_t deadline) {
    cond_t *c = (cond_t *)pub;
    co__pkw_t pw;
    co__wait_prepare(&pw, CO__WR_COND);
    co__waiter_t *const w = &pw.w;
    if (!(__atomic_load_n(&((mutex_t *)m)->state, __ATOMIC_RELAXED) & M_LOCKED))
        co__fatal("co_cond_wait(%p): mutex %p is not locked", (void *)pub, (void *)m);
    co__lock(&c->lock);
    co__waitq_push(&c->q, w);
    __atomic_store_n(&c->nwait, c->nwait + 1, __ATOMIC_RELAXED);
    /* Lock order: cond lock, then the mutex's sema lock. No yield here. */
    mutex_unlock((mutex_t *)m, m, "co_cond_wait", false);
    int rc = co__wait(w, &c->lock, deadline, CO__WAIT_KEEP_LOCK);
    if (rc == CO_ETIMEDOUT) {
        if (w->q != NULL) { /* else a signal popped us and lost the claim */
            co__waitq_remove(w);
            __atomic_store_n(&c->nwait, c->nwait - 1, __ATOMIC_RELAXED);
        }
        co__unlock(&c->lock);
    }
    co_mutex_lock(m);
    return rc == CO_ETIMEDOUT ? CO_ETIMEDOUT : 0;
}

int co_cond_wait_until(co_cond_t *c, co_mutex_t *m, int64_t deadline) {
    if (c == NULL || m == NULL) return CO_EINVAL;
    return cond_wait(c, m, deadline);
}

void co_cond_wait(co_cond_t *c, co_mutex_t *m) {
    if (c == NULL) co__fatal("co_cond_wait(NULL, %p): NULL cond", (void *)m);
    if (m == NULL) co__fatal("co_cond_wait(%p, NULL): NULL mutex", (void *)c);
    (void)cond_wait(c, m, CO_FOREVER);
}

/* Wake up to `n` waiters (n < 0: all). The claimed waiters are ours: link
 * them through their `next` and unpark them after unlocking, so that a woken
 * waiter that frees the cond never races with our unlock. */
static void cond_wake(cond_t *c, int n) {
    co__waiter_t *wake = NULL, **tail = &wake, *w;
    co__lock(&c->lock);
    while (n != 0 && (w = co__waitq_pop(&c->q)) != NULL) {
        __atomic_store_n(&c->nwait, c->nwait - 1, __ATOMIC_RELAXED);
        if (co__claim(w->pk, w)) { /* else its deadline claimed it: skip it */
            *tail = w;
            tail = &w->next;
            n--;
        }
    }
    *tail = NULL;
    co__unlock(&c->lock);
    while (wake != NULL) {
        w = wake;
        wake = w->next; /* read before the wake: w dies once its owner runs */
        co__unpark(w->pk);
    }
}

void co_cond_signal(co_cond_t *c) {
    if (CO_UNLIKELY(c == NULL)) {
        null_fatal("co_cond_signal", "cond");
        return;
    }
    cond_t *cc = (cond_t *)c;
    /* Cheap exit when nobody waits. A waiter counts itself before it
     * releases the user's mutex, so a signaller that took that mutex after it
     * sees the count (the mutex orders them); a signal racing with a wait
     * without the mutex may miss it, as in Go. */
    if (__atomic_load_n(&cc->nwait, __ATOMIC_RELAXED) == 0) return;
    cond_wake(cc, 1);
}

void co_cond_broadcast(co_cond_t *c) {
    if (CO_UNLIKELY(c == NULL)) {
        null_fatal("co_cond_broadcast", "cond");
        return;
    }
    cond_t *cc = (cond_t *)c;
    if (__atomic_load_n(&cc->nwait, __ATOMIC_RELAXED) == 0) return;
    cond_wake(cc, -1);
}

/* ---- Once --------------------------------------------------------------- */
/*
 * done (atomic: store-release after fn returned, load-acquire on the fast
 * path) and a mutex that serialises the first callers, as Go's Once. owner
 * (atomic relaxed) names the caller running fn, so a recursive call from
 * inside fn is reported instead of deadlocking silently.
 */
typedef struct once {
    uint32_t done;
    uint32_t pad_;
    uintptr_t owner; /* 0, or the token of the caller running fn */
    mutex_t m;
} once_t;
CO_STATIC_ASSERT(sizeof(once_t) <= sizeof(co_once_t), "co_once_t too small");
CO_STATIC_ASSERT(_Alignof(once_t) <= _Alignof(co_once_t), "co_once_t misaligned");

static __thread char thread_token; /* its address names a plain thread */

static uintptr_t self_token(void) {
    struct co_g *g = co__cur_g();
    return g ? (uintptr_t)g : (uintptr_t)&thread_token;
}

/* The first calls: run fn once, or wait for the caller running it. Out of
 * line, so that co_once's fast path needs no frame. */
static __attribute__((noinline)) void once_slow(co_once_t *pub, void (*fn)(void *arg),
                                                void *arg) {
    if (pub == NULL) co__fatal("co_once(NULL): NULL once");
    once_t *o = (once_t *)pub;
    if (fn == NULL) co__fatal("co_once(%p): fn is NULL", (void *)pub);
    uintptr_t me = self_token();
    if (__atomic_load_n(&o->owner, __ATOMIC_RELAXED) == me)
        co__fatal("co_once(%p): called again from inside its own fn (would deadlock)", (void *)pub);
    co_mutex_lock((co_mutex_t *)&o->m);
    if (!__atomic_load_n(&o->done, __ATOMIC_RELAXED)) {
        __atomic_store_n(&o->owner, me, __ATOMIC_RELAXED);
        /* If fn panics, Go's Once still counts it as done and unlocks; do
         * the same, then let the panic go on. */
        void *pv = NULL;
        bool panicked = co_recover(fn, arg, &pv) == 1;
        __atomic_store_n(&o->owner, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&o->done, 1, __ATOMIC_RELEASE);
        mutex_unlock(&o->m, pub, "co_once", true);
        if (panicked) co_panic(pv);
        return;
    }
    mutex_unlock(&o->m, pub, "co_once", true);
}

void co_once(co_once_t *pub, void (*fn)(void *arg), void *arg) {
    once_t *o = (once_t *)pub;
    /* acquire: pairs with the release store in once_slow; fn's effects
     * are visible. A NULL once goes to once_slow, which reports it. */
    if (CO_LIKELY(pub != NULL && __atomic_load_n(&o->done, __ATOMIC_ACQUIRE))) return;
    once_slow(pub, fn, arg);
}

/* ---- test hooks (hidden; declared by the tests) ------------------------- */
/* Readers holding or waiting for rw, minus MAX_READERS while a writer is
 * pending or active: lets a test wait until a writer is queued. */
CO_HIDDEN int32_t co__rwmutex_reader_count(co_rwmutex_t *pub) {
    return __atomic_load_n(&((rwmutex_t *)pub)->reader_count, __ATOMIC_ACQUIRE);
}
