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
 * Also here: the wait queues, a coroutine's own waiter (co__self_pkw), and
 * co_sleep.
 */
#include "runtime/proc.h"

#include <string.h>
#include <time.h>

/* co__unpark of a plain thread's parker. */
static inline void plain_uncount(co__parker_t *pk) {
    if (__atomic_load_n(&pk->counted, __ATOMIC_RELAXED) &&
        __atomic_exchange_n(&pk->counted, 0, __ATOMIC_RELAXED) ==
            __atomic_load_n(&co__plain_gen, __ATOMIC_RELAXED))
        __atomic_sub_fetch(&co__plain_parked_forever, 1, __ATOMIC_RELAXED);
}

void co__unpark_thread(co__parker_t *pk) {
    plain_uncount(pk); /* before the release: pk may be gone after it */
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
static int park_plain(co__parker_t *pk, int64_t deadline, bool timed);

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
#ifdef CO_TSAN
            __tsan_acquire(pk); /* its waker's hand-over (co__race_unpark) */
#endif
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
    const bool timed = deadline != CO_FOREVER;
    if (!timed) { /* counted before it can be woken: deadlock.c */
        __atomic_add_fetch(&co__plain_parked_forever, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&pk->counted, __atomic_load_n(&co__plain_gen, __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
    } else {
        __atomic_add_fetch(&co__plain_parked_timed, 1, __ATOMIC_RELAXED);
    }
    if (unlockf) unlockf(arg);
    return park_plain(pk, deadline, timed);
}

/* A plain thread's wait, counted as above; uncounts itself on the way out. */
static int park_plain(co__parker_t *pk, int64_t deadline, bool timed) {
    for (;;) {
        /* acquire: pairs with co__unpark's store-release */
        if (__atomic_load_n(&pk->futex, __ATOMIC_ACQUIRE) != 0) {
#ifdef CO_TSAN
            __tsan_acquire(pk); /* its waker's hand-over (co__race_unpark) */
#endif
            if (!timed) plain_uncount(pk);
            else __atomic_sub_fetch(&co__plain_parked_timed, 1, __ATOMIC_RELAXED);
            return 0;
        }
        int r = co__futex_wait(&pk->futex, 0, deadline);
        if (r == CO_ETIMEDOUT) {
            uint32_t w = CO__PK_WAITING;
            if (__atomic_compare_exchange_n(&pk->state, &w, CO__PK_TIMEDOUT, false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                __atomic_sub_fetch(&co__plain_parked_timed, 1, __ATOMIC_RELAXED);
                return CO_ETIMEDOUT;
            }
            /* a waker claimed us: wait for its wake, still counted as
             * timed (its release is coming) */
            deadline = CO_FOREVER;
        }
    }
}

static void unlock_lock(void *l) {
#ifdef CO_TSAN
    __tsan_release(l); /* an upper layer's lock, released here unseen (race.c) */
#endif
    co__unlock(l);
}

int co__park_lock(co__parker_t *pk, int64_t deadline, co__lock_t *l) {
    return co__park(pk, deadline, unlock_lock, l);
}

/* co__wait once the deadline claimed the parker. */
int co__wait_timedout(co__waiter_t *w, co__lock_t *l, int flags) {
    co__lock(l);
#ifdef CO_TSAN
    __tsan_acquire(l); /* the caller's lock, taken here unseen (race.c) */
#endif
    if (!(flags & CO__WAIT_KEEP_LOCK)) {
        co__waitq_remove(w); /* no-op if a waker already unlinked it */
#ifdef CO_TSAN
        __tsan_release(l);
#endif
        co__unlock(l);
    }
    return CO_ETIMEDOUT;
}

/* ---- wait queues ---------------------------------------------------------
 * Under the lock of the object that embeds the queue; push and pop are
 * inline (runtime.h). head is stored with relaxed atomic stores: a channel
 * reads it without the lock (co__waitq_head_acquire). */

static inline void waitq_set_head(co__waitq_t *q, co__waiter_t *w) {
    __atomic_store_n(&q->head, w, __ATOMIC_RELAXED);
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
        waitq_set_head(q, w);
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
        waitq_set_head(q, w->next);
    if (w->next)
        w->next->prev = w->prev;
    else
        q->tail = w->prev;
    w->next = w->prev = NULL;
    w->q = NULL;
}

/* ---- a coroutine's own waiter ---------------------------------------------- */

co__pkw_t *co__self_pkw(int wait_reason) {
    co_g_t *g = co__cur_g();
    /* (Not under TSan: a G record's waiter would carry the accesses of the
     * record's earlier lifetimes; a coroutine's stack is its own, race.c) */
    if (!g || CO_TSAN_ON) return NULL;
    co__pkw_t *pw = &g->wgwait;
    co__parker_init_g(&pw->pk, g, wait_reason);
    memset(&pw->w, 0, sizeof pw->w);
    pw->w.pk = &pw->pk;
    return pw;
}

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
