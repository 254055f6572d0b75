/*
 * The wait layer: the one way anything in colony blocks.
 *
 * A parker stands for one blocked caller. For a coroutine, parking switches
 * away (co__park_current) and the lock guarding the waiter's queue is
 * released only after the switch, in the post-switch action; so a waker,
 * which finds waiters only under that lock, can never ready a coroutine
 * that is still running. For a plain thread, parking releases the lock and
 * sleeps on a futex in the parker.
 *
 * Exactly one party claims a parker: a waker (co__claim, CAS WAITING->WOKEN)
 * or the deadline's timer (CAS WAITING->TIMEDOUT). Only the claimer may
 * unpark it, so a timed-out waiter is never woken twice, and a waker that
 * loses the CAS leaves that waiter alone.
 *
 * Also here: the waitgroup, the wait layer's first user, and co_sleep.
 */
#include "runtime/proc.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

bool co__claim(co__parker_t *pk, void *winner) {
    uint32_t w = CO__PK_WAITING;
    /* acq_rel: the claimer's hand-over happens before the unpark; pairs
     * with the parked side's acquire load of state after it resumes. */
    if (!__atomic_compare_exchange_n(&pk->state, &w, CO__PK_WOKEN, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return false;
    pk->winner = winner;
    return true;
}

/* co__unpark of a plain thread's parker. */
void co__unpark_thread(co__parker_t *pk) {
    /* store-release: pairs with the sleeping thread's acquire load */
    __atomic_store_n(&pk->futex, 1, __ATOMIC_RELEASE);
    co__futex_wake(&pk->futex, 1);
}

static bool park_timeout_claim(co__parker_t *pk) {
    uint32_t w = CO__PK_WAITING;
    return __atomic_compare_exchange_n(&pk->state, &w, CO__PK_TIMEDOUT, false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

static void park_timeout(void *arg) {
    co__parker_t *pk = arg;
    if (park_timeout_claim(pk)) co__unpark_cold(pk);
}

struct park_args {
    co__parker_t *pk;
    int64_t deadline;
    void (*unlockf)(void *);
    void *arg;
    co__timer_t timer;
};

/* Runs on the next context, once the parking G is off its stack. */
static void post_park(co_g_t *g, void *arg) {
    struct park_args *a = arg;
    /* Copy out first: once the timer is armed it may fire and the parked G
     * may run and return, ending the lifetime of *a. */
    void (*unlockf)(void *) = a->unlockf;
    void *uarg = a->arg;
    __atomic_store_n(&g->status, CO_G_WAITING, __ATOMIC_RELAXED);
    if (a->deadline != CO_FOREVER) co__timer_add(&a->timer, a->deadline);
    if (unlockf) unlockf(uarg);
}

/* A coroutine parking with no deadline: only the unlock to run after the
 * switch (no timer to arm). */
struct park_forever {
    void (*unlockf)(void *);
    void *arg;
};

static void post_park_forever(co_g_t *g, void *arg) {
    struct park_forever *a = arg;
    void (*unlockf)(void *) = a->unlockf; /* copy out: see post_park */
    void *uarg = a->arg;
    __atomic_store_n(&g->status, CO_G_WAITING, __ATOMIC_RELAXED);
    if (unlockf) unlockf(uarg);
}

static int park_until(co__parker_t *pk, int64_t deadline, void (*unlockf)(void *), void *arg);

int co__park(co__parker_t *pk, int64_t deadline, void (*unlockf)(void *), void *arg) {
    if (CO_LIKELY(deadline == CO_FOREVER && pk->g)) {
        /* Only a waker can claim pk (no deadline): it is WOKEN when we run. */
        struct park_forever a = {unlockf, arg};
        co__park_current(post_park_forever, &a, pk->wait_reason);
        return 0;
    }
    if (deadline != CO_FOREVER && deadline <= co_now()) {
        /* Already past: claim it ourselves (whoever holds the queue's lock
         * cannot have claimed it yet, unless it was claimed before). */
        int rc = park_timeout_claim(pk) ? CO_ETIMEDOUT : 0;
        if (unlockf) unlockf(arg);
        if (rc == 0 && !pk->g) {
            while (__atomic_load_n(&pk->futex, __ATOMIC_ACQUIRE) == 0)
                co__futex_wait(&pk->futex, 0, CO_FOREVER);
        } else if (rc == 0) {
            /* claimed by a waker before we parked: it will ready us. */
            co__park_current(NULL, NULL, pk->wait_reason);
        }
        return rc;
    }
    return park_until(pk, deadline, unlockf, arg);
}

/* co__park once the deadline is known not to have passed yet (or is
 * CO_FOREVER). */
static int park_until(co__parker_t *pk, int64_t deadline, void (*unlockf)(void *), void *arg) {
    if (pk->g) {
        struct park_args a;
        a.pk = pk;
        a.deadline = deadline;
        a.unlockf = unlockf;
        a.arg = arg;
        if (deadline != CO_FOREVER) { /* the timer is touched only then */
            memset(&a.timer, 0, sizeof a.timer);
            a.timer.fn = park_timeout;
            a.timer.arg = pk;
            a.timer.slot = -1;
        }
        co__park_current(post_park, &a, pk->wait_reason);
        /* acquire: pairs with the claimer's CAS (park_timeout or co__claim) */
        bool timedout = __atomic_load_n(&pk->state, __ATOMIC_ACQUIRE) == CO__PK_TIMEDOUT;
        if (timedout) {
            /* Only park_timeout, the timer's own callback, claims pk
             * TIMEDOUT here: its runner already took the timer off its
             * heap, and only its last touch of it remains. */
            co__timer_wait_fired(&a.timer);
        } else if (deadline != CO_FOREVER) {
            co__timer_del(&a.timer);
        }
        return timedout ? CO_ETIMEDOUT : 0;
    }
    co__forked_check(); /* in a forked child, the waker may be a thread not there */
    if (unlockf) unlockf(arg);
    for (;;) {
        /* acquire: pairs with co__unpark's store-release */
        if (__atomic_load_n(&pk->futex, __ATOMIC_ACQUIRE) != 0) return 0;
        int r = co__futex_wait(&pk->futex, 0, deadline);
        if (r == CO_ETIMEDOUT) {
            uint32_t w = CO__PK_WAITING;
            if (__atomic_compare_exchange_n(&pk->state, &w, CO__PK_TIMEDOUT, false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return CO_ETIMEDOUT;
            deadline = CO_FOREVER; /* a waker claimed us: wait for its wake */
        }
    }
}

static void unlock_lock(void *l) { co__unlock(l); }

int co__park_lock(co__parker_t *pk, int64_t deadline, co__lock_t *l) {
    return co__park(pk, deadline, unlock_lock, l);
}

int co__wait(co__waiter_t *w, co__lock_t *l, int64_t deadline, int flags) {
    if (co__park_lock(w->pk, deadline, l) == 0) return 0;
    co__lock(l);
    if (!(flags & CO__WAIT_KEEP_LOCK)) {
        co__waitq_remove(w); /* no-op if a waker already unlinked it */
        co__unlock(l);
    }
    return CO_ETIMEDOUT;
}

/* ---- wait queues --------------------------------------------------------- */

void co__waitq_push(co__waitq_t *q, co__waiter_t *w) {
    w->q = q;
    w->next = NULL;
    w->prev = q->tail;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
}

/* w into q just before at, a waiter of q (NULL: at the tail). */
static void waitq_insert_before(co__waitq_t *q, co__waiter_t *at, co__waiter_t *w) {
    if (!at) {
        co__waitq_push(q, w);
        return;
    }
    w->q = q;
    w->next = at;
    w->prev = at->prev;
    if (at->prev)
        at->prev->next = w;
    else
        q->head = w;
    at->prev = w;
}

void co__waitq_push_front(co__waitq_t *q, co__waiter_t *w) { waitq_insert_before(q, q->head, w); }

void co__waitq_insert_by_n(co__waitq_t *q, co__waiter_t *w) {
    co__waiter_t *at = q->head;
    while (at && at->n <= w->n) at = at->next;
    waitq_insert_before(q, at, w);
}

void co__waitq_remove(co__waiter_t *w) {
    co__waitq_t *q = w->q;
    if (!q) return;
    if (w->prev)
        w->prev->next = w->next;
    else
        q->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        q->tail = w->prev;
    w->next = w->prev = NULL;
    w->q = NULL;
}

co__waiter_t *co__waitq_pop(co__waitq_t *q) {
    co__waiter_t *w = q->head;
    if (w) co__waitq_remove(w);
    return w;
}

/* ---- waitgroup -----------------------------------------------------------
 *
 * state (atomic u64) = counter << 32 | waiters, as Go's WaitGroup. The rule
 * that makes `co_waitgroup_done(); ...the waiter frees the wg` safe: after
 * the counter reaches zero the adder touches the waitgroup only if waiters
 * were counted, and no counted waiter returns before the adder's last touch
 * (its store of 0 into state):
 *  - a woken waiter is unparked after that store;
 *  - a waiter whose deadline fired leaves by CAS-decrementing the waiter
 *    count only while the counter is non-zero; if the counter already hit
 *    zero, an adder is releasing it, and it waits for the store of 0. */
typedef struct wg_impl {
    co__lock_t lock;      /* protects q */
    uint32_t pad;
    uint64_t state;       /* atomic: counter << 32 | waiters (see above) */
    co__waitq_t q;        /* waiters, FIFO */
} wg_impl_t;
CO_STATIC_ASSERT(sizeof(wg_impl_t) <= sizeof(co_waitgroup_t), "co_waitgroup_t too small");

#define WG_COUNT(s) ((int32_t)((s) >> 32))
#define WG_WAITERS(s) ((uint32_t)(s))

/* The waiters a release claimed, to be unparked once it no longer touches
 * the waitgroup. Their coroutines (G records) are kept in an array, so that
 * the list of waiters, a chain of dependent cache misses, is walked once,
 * and the unparking can prefetch ahead (co__ready_many). A coroutine's
 * waiter is in its G record (co_g_t.wgwait), so the one walk touches
 * records allocated close together, not a stack page per waiter.
 * Plain threads' waiters, and every waiter when there is no memory for the
 * array, are linked through their `next` instead. */
typedef struct wg_release {
    co_g_t **gs;           /* [0, ng): coroutines */
    size_t ng, cap;
    co__waiter_t *list;    /* the rest, newest first */
    co_g_t *small[16];
} wg_release_t;

static void wg_release_init(wg_release_t *r, uint32_t nwaiters) {
    r->ng = 0;
    r->list = NULL;
    r->cap = sizeof r->small / sizeof r->small[0];
    r->gs = r->small;
    if (nwaiters > r->cap && !co__test_failing(CO__FAIL_WG_ARRAY)) {
        co_g_t **v = malloc(nwaiters * sizeof *v);
        if (v) {
            r->gs = v;
            r->cap = nwaiters;
        }
    }
}

/* w's parker is claimed: remember whom to unpark. */
static void wg_release_add(wg_release_t *r, co__waiter_t *w) {
    if (w->pk->g && r->ng < r->cap) {
        r->gs[r->ng++] = w->pk->g;
    } else {
        w->next = r->list;
        r->list = w;
    }
}

static void wg_release_run(wg_release_t *r) {
    if (r->ng > 8) {
        co__ready_many(r->gs, r->ng);
    } else {
        for (size_t i = 0; i < r->ng; i++) co__ready(r->gs[i]);
    }
    while (r->list) {
        co__waiter_t *n = r->list->next;
        co__unpark(r->list->pk);
        r->list = n;
    }
    if (r->gs != r->small) free(r->gs);
}

/* The counter reached zero with waiters counted (state s): release them.
 * Out of line, so that the common add and done set up no frame for it
 * (wg_release_t is 160 bytes of stack). */
static __attribute__((noinline)) void wg_release(wg_impl_t *wg, uint64_t s) {
    /* The counter is zero: no waiter joins or leaves the count any more, so
     * at most WG_WAITERS(s) are queued. */
    wg_release_t r;
    wg_release_init(&r, WG_WAITERS(s));
    co__lock(&wg->lock);
    co__waiter_t *w;
    while ((w = co__waitq_pop(&wg->q)))
        if (co__claim(w->pk, w)) wg_release_add(&r, w);
    co__unlock(&wg->lock);
    /* release: the last touch of *wg by this adder (see above). With the
     * counter at zero nothing else changes the state (a waiter that times
     * out now waits for this store; a new one returns at once), but an
     * add that races the release (a reuse before the waits returned, which
     * Go reports as misuse) would be wiped out by a plain store: the next
     * done would then find a negative counter, or a wait return early. */
    uint64_t exp = s;
    if (CO_UNLIKELY(!__atomic_compare_exchange_n(&wg->state, &exp, 0, false, __ATOMIC_RELEASE,
                                                 __ATOMIC_RELAXED)))
        co__fatal("co_waitgroup %p: co_waitgroup_add while its waiters were being released "
                  "(reused before co_waitgroup_wait returned)",
                  (void *)wg);
    wg_release_run(&r);
}

void co_waitgroup_add(co_waitgroup_t *wg_, int delta) {
    wg_impl_t *wg = (wg_impl_t *)wg_;
    /* acq_rel: Done's writes happen before a waiter's return */
    uint64_t s = __atomic_add_fetch(&wg->state, (uint64_t)(int64_t)delta << 32, __ATOMIC_ACQ_REL);
    int32_t v = WG_COUNT(s);
    if (CO_UNLIKELY(v < 0)) co__fatal("co_waitgroup %p: negative counter (%d)", (void *)wg_, v);
    if (v != 0 || WG_WAITERS(s) == 0 || delta == 0) return;
    wg_release(wg, s);
}

void co_waitgroup_done(co_waitgroup_t *wg) { co_waitgroup_add(wg, -1); }

int co_waitgroup_wait_until(co_waitgroup_t *wg_, int64_t deadline) {
    wg_impl_t *wg = (wg_impl_t *)wg_;
    uint64_t s = __atomic_load_n(&wg->state, __ATOMIC_ACQUIRE);
    if (WG_COUNT(s) == 0) return 0;
    if (deadline != CO_FOREVER && deadline <= co_now()) return CO_ETIMEDOUT;
    /* A coroutine waits with the waiter in its G record (runtime.h), a
     * plain thread with one on its stack, in one line. */
    co__pkw_t stackw __attribute__((aligned(64)));
    co_g_t *cg = co__cur_g();
    co__pkw_t *pw = cg ? &cg->wgwait : &stackw;
    co__parker_t *const pkp = &pw->pk;
    co__waiter_t *const wp = &pw->w;
    co__parker_init_g(pkp, cg, CO__WR_WAITGROUP);
    memset(wp, 0, sizeof *wp);
    wp->pk = pkp;
    co__lock(&wg->lock);
    do {
        s = __atomic_load_n(&wg->state, __ATOMIC_ACQUIRE);
        if (WG_COUNT(s) == 0) {
            co__unlock(&wg->lock);
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&wg->state, &s, s + 1, false, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    co__waitq_push(&wg->q, wp);
    if (co__wait(wp, &wg->lock, deadline, CO__WAIT_KEEP_LOCK) == 0) return 0;
    s = __atomic_load_n(&wg->state, __ATOMIC_ACQUIRE);
    while (WG_COUNT(s) != 0) {
        if (__atomic_compare_exchange_n(&wg->state, &s, s - 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            co__waitq_remove(wp);
            co__unlock(&wg->lock);
            return CO_ETIMEDOUT;
        }
    }
    co__unlock(&wg->lock);
    /* The counter reached zero and an adder is releasing the waiters: wait
     * for its last touch, then report success. */
    while (WG_WAITERS(__atomic_load_n(&wg->state, __ATOMIC_ACQUIRE)) != 0)
        co_yield(); /* sched_yield() on a plain thread */
    return 0;
}

void co_waitgroup_wait(co_waitgroup_t *wg) { (void)co_waitgroup_wait_until(wg, CO_FOREVER); }

/* ---- sleeping ------------------------------------------------------------- */

int co_sleep_until(int64_t deadline) {
    if (deadline < 0) return CO_EINVAL;
    if (co__cur_g()) {
        co__parker_t pk;
        co__parker_init(&pk, CO__WR_SLEEP);
        (void)co__park(&pk, deadline, NULL, NULL);
        return 0;
    }
    for (;;) {
        int64_t now = co_now();
        if (now >= deadline) return 0;
        int64_t d = deadline - now;
        struct timespec ts = {d / 1000000000, d % 1000000000};
        nanosleep(&ts, NULL);
    }
}

int co_sleep(int64_t ns) {
    if (ns <= 0) return 0;
    int64_t deadline = co__time_add(co_now(), ns); /* co_sleep(INT64_MAX): for ever */
    co_g_t *g = co__cur_g();
    if (g) {
        /* The deadline is ns ahead: skip co__park's second clock read. */
        co__parker_t pk;
        co__parker_init_g(&pk, g, CO__WR_SLEEP);
        (void)park_until(&pk, deadline, NULL, NULL);
        return 0;
    }
    return co_sleep_until(deadline);
}
