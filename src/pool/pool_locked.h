/*
 * What the pool's own files (pool.c, submit.c, worker.c, purge.c) share:
 * the lock with the gate it keeps, wake lists, spare records and the
 * counters with the waits that depend on them. A name ending in _locked
 * is called with the pool lock held. Private to those files.
 */
#ifndef COLONY_POOL_LOCKED_H
#define COLONY_POOL_LOCKED_H

#include "pool/pool_impl.h"

#define SPARE_MAX 256      /* retired records kept per pool for reuse */
#define RETRY 1            /* waiter result: go round the submit loop again */

typedef struct task {
    void (*fn)(void *);
    void *arg;
} task_t;

/* Lock held. Recompute the chute's gate from the fields it sums up (see
 * "The chute", worker.c): gen << 1 while a finishing worker of generation
 * gen may use the chute, odd while none may. seq_cst: pairs with the
 * seq_cst load of a worker after its chute push; every change that closes
 * the gate is followed by a drain. */
static inline void gate_update_locked(co_pool_t *p) {
    bool shut = p->waiters || p->state != CO__POOL_OPEN || (p->cap > 0 && p->running > p->cap) ||
                (!p->no_purge && !p->purge_armed);
    uint64_t g = p->gen << 1 | (uint64_t)shut;
    if (g != p->gate) __atomic_store_n(&p->gate, g, __ATOMIC_SEQ_CST);
}

/* Lock held. Recompute the waiters flag from the queues, and the gate. */
static inline void waiters_update_locked(co_pool_t *p) {
    uint32_t f = !co__waitq_empty(&p->submitq) || !co__waitq_empty(&p->idleq) ||
                 !co__waitq_empty(&p->drainq);
    if (f != p->waiters) __atomic_store_n(&p->waiters, f, __ATOMIC_RELAXED);
    gate_update_locked(p);
}

/* Lock held. Someone is about to wait on the pool: close the gate. The
 * caller drains next (see "The chute"). */
static inline void waiters_raise_locked(co_pool_t *p) {
    __atomic_store_n(&p->waiters, 1, __ATOMIC_RELAXED);
    gate_update_locked(p);
}

static inline void plock(co_pool_t *p) { co__plock(&p->lock); }
static inline void punlock(co_pool_t *p) {
    waiters_update_locked(p);
    co__punlock(&p->lock);
}
static inline bool ptrylock(co_pool_t *p) { return co__ptrylock(&p->lock); }
static inline void punlock_cb(void *l) { punlock(CO_CONTAINER_OF(l, co_pool_t, lock)); }
/* Park the caller; the lock is released once it can no longer run. */
static inline int ppark(co_pool_t *p, co__parker_t *pk, int64_t deadline) {
    return co__park(pk, deadline, punlock_cb, &p->lock);
}
/* co__wait (runtime.h) on the pool's lock, with the same contract: w, set
 * up by co__wait_prepare and linked on one of the pool's queues, the lock
 * held. Not co__wait itself: the pool's lock is a type of its own, whose
 * contended path yields a coroutine's P, and releasing it recomputes the
 * waiters flag and the gate (punlock), which co__unlock would skip. */
static inline int pwait(co_pool_t *p, co__waiter_t *w, int64_t deadline, int flags) {
    if (ppark(p, w->pk, deadline) == 0) return 0;
    plock(p);
    if (!(flags & CO__WAIT_KEEP_LOCK)) {
        co__waitq_remove(w); /* no-op if a waker already unlinked it */
        punlock(p);
    }
    return CO_ETIMEDOUT;
}

/* Relaxed atomic store/load of the [L, atomic] fields. */
static inline void st32(int32_t *x, int32_t v) { __atomic_store_n(x, v, __ATOMIC_RELAXED); }
static inline int32_t ld32(const int32_t *x) { return __atomic_load_n(x, __ATOMIC_RELAXED); }
static inline void rejected_inc(co_pool_t *p) {
    __atomic_add_fetch(&p->rejected, 1, __ATOMIC_RELAXED);
}

/* ---- wake lists: waiters claimed under the lock, unparked after it ------ */
typedef struct wakelist {
    co__waiter_t *head;
} wakelist_t;

/* Claim w (already unlinked) for this wake list; false if its deadline won. */
static inline bool wl_claim(wakelist_t *l, co__waiter_t *w, int result) {
    if (!co__claim(w->pk, w)) return false;
    w->result = result;
    w->next = l->head; /* w is unlinked: next is ours to use */
    l->head = w;
    return true;
}
static inline void wl_wake(wakelist_t *l) {
    co__waiter_t *w = l->head;
    while (w) {
        co__waiter_t *n = w->next; /* w's memory goes away once unparked */
        co__unpark(w->pk);
        w = n;
    }
    l->head = NULL;
}

/* ---- records ------------------------------------------------------------ */

/* Lock held. A spare record, or NULL. */
static inline co__pw_t *rec_get_locked(co_pool_t *p) {
    co__pw_t *w = p->spare;
    if (w) {
        p->spare = w->tok.pw_next;
        p->nspare--;
    }
    return w;
}
/* Lock held. Keep w for reuse, or chain it on *tofree. */
static inline void rec_put_locked(co_pool_t *p, co__pw_t *w, co__pw_t **tofree) {
    if (p->nspare < SPARE_MAX) {
        w->tok.pw_next = p->spare;
        p->spare = w;
        p->nspare++;
    } else {
        w->tok.pw_next = *tofree;
        *tofree = w;
    }
}
static inline void rec_free_list(co__pw_t *w) {
    while (w) {
        co__pw_t *n = w->tok.pw_next;
        free(w);
        w = n;
    }
}
/* Lock held. Recycle a list of records (purged or released idle ones). */
static inline void rec_put_list_locked(co_pool_t *p, co__pw_t *list, co__pw_t **tofree) {
    while (list) {
        co__pw_t *n = list->tok.pw_next;
        rec_put_locked(p, list, tofree);
        list = n;
    }
}

/* ---- counters and the waits that depend on them ------------------------ */

/* Lock held. A record starts a task: it is busy in the current generation. */
static inline void activate_locked(co_pool_t *p, co__pw_t *w, void (*fn)(void *), void *arg) {
    w->fn = fn;
    w->arg = arg;
    w->gen = p->gen;
    st32(&p->busy, p->busy + 1);
    p->submitted++;
}

/* Lock held. Wake wait_idle callers when nothing is busy, and drainers
 * whose threshold busy_old has reached. */
static inline void wake_waits_locked(co_pool_t *p, wakelist_t *wl) {
    co__waiter_t *w, *n;
    if (CO_LIKELY(co__waitq_empty(&p->idleq) && co__waitq_empty(&p->drainq))) return;
    if (p->busy == 0) {
        while ((w = co__waitq_pop(&p->idleq))) wl_claim(wl, w, 0);
    }
    for (w = p->drainq.head; w; w = n) {
        n = w->next;
        if (p->busy_old <= w->n) {
            co__waitq_remove(w);
            wl_claim(wl, w, 0);
        }
    }
}

/* Lock held. A busy task of release generation gen stops being busy. */
static inline void busy_dec_locked(co_pool_t *p, uint64_t gen, wakelist_t *wl) {
    st32(&p->busy, p->busy - 1);
    if (gen != p->gen) p->busy_old--;
    wake_waits_locked(p, wl);
}

/* Lock held. Pop blocked submitters until one is claimed; NULL if none.
 * With result 0 or CO_ECLOSED the submitter returns without touching the
 * pool again, so we account for it (sub_parked); a RETRY submitter stays
 * counted until its submit ends, and uncounts itself (submit.c). */
static inline co__waiter_t *claim_submitter_locked(co_pool_t *p, wakelist_t *wl, int result) {
    co__waiter_t *w;
    while ((w = co__waitq_pop(&p->submitq))) {
        st32(&p->waiting, p->waiting - 1);
        if (wl_claim(wl, w, result)) {
            if (result != RETRY) p->sub_parked--;
            return w;
        }
        /* lost to its deadline: it re-locks, sees itself unlinked, and
         * accounts for itself */
    }
    return NULL;
}

/* (an unlimited pool stops at INT32_MAX workers, where `running` would
 * overflow: full, as a bounded pool is) */
static inline bool has_room_locked(const co_pool_t *p) {
    return p->running < (p->cap < 0 ? INT32_MAX : p->cap);
}

/* Lock held. Let up to `room` blocked submitters go round again. */
static inline void retry_submitters_locked(co_pool_t *p, int room, wakelist_t *wl) {
    while (room-- > 0 && claim_submitter_locked(p, wl, RETRY)) {
    }
}

/* ---- across the files ---------------------------------------------------- */

/* worker.c. Lock held. Finish every record the workers left on the chute,
 * and let blocked submitters at the idle workers or room this made. */
CO_HIDDEN void co__pool_drain_chute_locked(co_pool_t *p, wakelist_t *wl, co__pw_t **tofree);
/* worker.c. A worker coroutine: its record's token function. */
CO_HIDDEN void co__pool_worker_main(void *arg);
/* purge.c. The purge timer's callback. */
CO_HIDDEN void co__pool_purge_fire(void *arg);

#endif
