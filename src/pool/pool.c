/*
 * The pool: ants v2.11 (Pool and PoolWithFunc) on colony's coroutines.
 *
 * Workers. A worker is a record (co__pw_t). Idle, it is only that record in
 * the idle queue (pool_impl.h): no coroutine, no stack. Busy, a coroutine
 * runs it (worker_main). Whoever activates the record queues it on the run
 * queue as a token (co__spawn_token; co__spawn for a non-default stack
 * size): a coroutine is made for it only if it has to run on its own, and
 * a worker that finishes first takes it over (worker_run). When a task
 * returns, the worker (worker_done, under the lock):
 *   - retires if the pool is closed, if it belongs to an older release
 *     generation, or if the pool shrank below its worker count; a retiring
 *     worker whose slot lets a blocked submitter in
 *     takes that submitter's task instead of exiting (a new worker, the
 *     same coroutine);
 *   - otherwise takes a blocked submitter's task if one waits (hand-off:
 *     the submit returns 0, the task runs on this coroutine right away);
 *   - otherwise puts its record back in the idle queue and its coroutine
 *     exits (the stack goes back to the runtime's per-P cache).
 * A task that panicked: the worker retires (its slot to a blocked
 * submitter, which goes round again), then reports the panic on its
 * coroutine holding no slot, then exits; the task counts as busy until the
 * report is done (worker_panic_retire, worker_panic_done).
 *
 * Submitting (submit_impl, under the lock): closed -> CO_ECLOSED; an idle
 * record -> activate it; room (cap < 0 or running < cap) -> a new record;
 * full -> CO_EOVERLOAD if nonblocking or max_blocking submitters already
 * wait; CO_EDEADLK if the caller is a task of this very pool (it would wait
 * for itself); CO_ETIMEDOUT if the deadline is past; else queue on submitq
 * and park. The waiter leaves the queue with result 0 (a worker took its
 * task), CO_ECLOSED (release), or RETRY (tune grew the pool, a spawn
 * failed or a panicked worker retired, freeing a slot: go round again).
 *
 * Invariant: submitq is non-empty only while the idle queue is empty (a
 * submitter queues only when no record is idle; a finishing worker serves
 * submitq before it goes idle), so the purge never has waiters to serve.
 *
 * No task is lost: a submit returns 0 only once a worker owns its task
 * (activated record handed to a successful co__spawn, or a hand-off under
 * the lock), and that worker runs it exactly once; every other outcome is
 * a negative return and the task never runs.
 *
 * Counts: busy++ at activation, busy-- when the worker is finished
 * (finish_locked; worker_panic_done after a panic's report). busy_old counts busy workers activated before the last
 * release (their record's gen is older than p->gen); release_timeout and
 * destroy wait for it to drain.
 *
 * The chute. Taking the lock at the end of every task makes the submitter
 * and the finishing workers, usually on different Ms, fight over it. So a
 * worker whose task ended while nobody waits on the pool pushes its record
 * on the chute (a lock-free stack: one CAS) and exits; the next holder of
 * the lock drains the chute (drain_chute_locked: counters, idle queue,
 * purge timer), and every locked path that depends on those does so first.
 * The fast path is allowed only when its outcome is certain: the pool is
 * open, in the worker's generation, not above capacity, the purge timer
 * armed (it drains when it fires), and nobody waits (the `waiters` flag).
 * One word, the gate, says all of that (gate_update_locked): a lock holder
 * that changes any of them stores the gate and then drains; the worker
 * loads the gate, pushes, and loads it again (all seq_cst), so either the
 * drain sees the record or the worker sees the change and drains itself
 * (Dekker's pattern). Waiting (submit, wait_idle, release_timeout) raises
 * `waiters` before its last drain, for the same reason. One load instead
 * of six took a tenth of the instructions of a tiny task (callgrind).
 * Draining walks a linked list of records that their workers wrote last,
 * often on another CPU: one cache miss after another. So a worker thread
 * drains too, every DRAIN_EVERY pushes of its own, if the lock is free:
 * the records it pushed last are still in its cache. 1M tasks of 10 ms
 * took 604 ms instead of 729, a plain thread's tiny tasks 107 ns each
 * instead of 144 (medians of 9 and 11 alternating runs). But not too
 * often: each drain takes the lock's line from the submitter, and the
 * records a submitter drains are the ones it is about to reuse anyway.
 * Every 64th push instead of every 16th: a plain thread's tiny tasks
 * 95.7 ns instead of 109.4 (medians of 21 alternating runs; a coroutine
 * submitter's and the 10 ms tasks' the same within the noise).
 */
#include "runtime/runtime.h"
#include "pool/pool_impl.h"
#include "arch/ctx.h" /* co__cycles */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPARE_MAX 256      /* retired records kept per pool for reuse */
#define RETRY 1            /* waiter result: go round the submit loop again */
#define DEFAULT_EXPIRY ((int64_t)1000000000)

typedef struct task {
    void (*fn)(void *);
    void *arg;
} task_t;

/* The pool lock (pool_impl.h picks its type). */
#if !defined(COLONY_POOL_SPINLOCK) && !defined(COLONY_POOL_FUTEXLOCK)
/* Contended path of co__plock (see pool_impl.h). */
__attribute__((noinline)) void co__plock_slow(co__plock_t *l) {
    bool coroutine = co__cur_g() != NULL;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            co__cpu_relax();
            if (co__lock_try_free(&l->l)) return;
        }
        if (coroutine) {
            co_yield(); /* let this P run someone else meanwhile */
            continue;
        }
        /* A plain thread sleeps, as on any co__lock_t (lock.c) */
        co__lock(&l->l);
        return;
    }
}
#endif

/* Lock held. Recompute the chute's gate from the fields it sums up (see
 * "The chute"): gen << 1 while a finishing worker of generation gen may use
 * the chute, odd while none may. seq_cst: pairs with the seq_cst load of a
 * worker after its chute push; every change that closes the gate is
 * followed by a drain. */
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
static void punlock_cb(void *l) { punlock(CO_CONTAINER_OF(l, co_pool_t, lock)); }
/* Park the caller; the lock is released once it can no longer run. */
static inline int ppark(co_pool_t *p, co__parker_t *pk, int64_t deadline) {
    return co__park(pk, deadline, punlock_cb, &p->lock);
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
static bool wl_claim(wakelist_t *l, co__waiter_t *w, int result) {
    if (!co__claim(w->pk, w)) return false;
    w->result = result;
    w->next = l->head; /* w is unlinked: next is ours to use */
    l->head = w;
    return true;
}
static void wl_wake(wakelist_t *l) {
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
static co__pw_t *rec_get_locked(co_pool_t *p) {
    co__pw_t *w = p->spare;
    if (w) {
        p->spare = w->tok.pw_next;
        p->nspare--;
    }
    return w;
}
/* Lock held. Keep w for reuse, or chain it on *tofree. */
static void rec_put_locked(co_pool_t *p, co__pw_t *w, co__pw_t **tofree) {
    if (p->nspare < SPARE_MAX) {
        w->tok.pw_next = p->spare;
        p->spare = w;
        p->nspare++;
    } else {
        w->tok.pw_next = *tofree;
        *tofree = w;
    }
}
static void rec_free_list(co__pw_t *w) {
    while (w) {
        co__pw_t *n = w->tok.pw_next;
        free(w);
        w = n;
    }
}
/* Lock held. Recycle a list of records (purged or released idle ones). */
static void rec_put_list_locked(co_pool_t *p, co__pw_t *list, co__pw_t **tofree) {
    while (list) {
        co__pw_t *n = list->tok.pw_next;
        rec_put_locked(p, list, tofree);
        list = n;
    }
}

/* ---- counters and the waits that depend on them ------------------------ */

/* Lock held. A record starts a task: it is busy in the current generation. */
static void activate_locked(co_pool_t *p, co__pw_t *w, void (*fn)(void *), void *arg) {
    w->fn = fn;
    w->arg = arg;
    w->gen = p->gen;
    st32(&p->busy, p->busy + 1);
    p->submitted++;
}

/* Lock held. Wake wait_idle callers when nothing is busy, and drainers
 * whose threshold busy_old has reached. */
static void wake_waits_locked(co_pool_t *p, wakelist_t *wl) {
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
static void busy_dec_locked(co_pool_t *p, uint64_t gen, wakelist_t *wl) {
    st32(&p->busy, p->busy - 1);
    if (gen != p->gen) p->busy_old--;
    wake_waits_locked(p, wl);
}

/* Lock held. Pop blocked submitters until one is claimed; NULL if none.
 * With result 0 or CO_ECLOSED the submitter returns without touching the
 * pool again, so we account for it (sub_parked); a RETRY submitter re-locks
 * and does that itself. */
static co__waiter_t *claim_submitter_locked(co_pool_t *p, wakelist_t *wl, int result) {
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

static inline bool has_room_locked(const co_pool_t *p) { return p->cap < 0 || p->running < p->cap; }

/* Lock held. Let up to `room` blocked submitters go round again. */
static void retry_submitters_locked(co_pool_t *p, int room, wakelist_t *wl) {
    while (room-- > 0 && claim_submitter_locked(p, wl, RETRY)) {
    }
}

/* ---- purge -------------------------------------------------------------- */

/* Lock held. Arm the purge timer for the oldest idle record if needed. */
static void purge_arm_locked(co_pool_t *p) {
    if (p->opts.disable_purge || p->purge_armed || co__wq_empty(&p->idle)) return;
    __atomic_store_n(&p->purge_armed, 1, __ATOMIC_RELAXED);
    gate_update_locked(p);
    co__timer_add(&p->purge, co__time_add(co__wq_oldest(&p->idle)->last_used, p->expiry));
}

static void drain_chute_locked(co_pool_t *p, wakelist_t *wl, co__pw_t **tofree);

/* Timer callback: retire every idle record unused for expiry_ns. Runs on
 * some M without timer locks. It re-adds itself while idle records remain;
 * otherwise it clears purge_armed, and the next worker to go idle arms it
 * again.
 * It only ever *tries* the pool lock: a timer may run on an M whose
 * coroutine is in the middle of parking with this very lock held (ppark
 * releases it only after the switch), so waiting for the lock here could
 * wait for ourselves. When the lock is busy, try again in a millisecond. */
#define PURGE_RETRY_NS ((int64_t)1000000)
static void purge_fire(void *arg) {
    co_pool_t *p = arg;
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    int n = 0;
    if (!ptrylock(p)) {
        co__timer_add(&p->purge, co_now() + PURGE_RETRY_NS); /* purge_armed stays set */
        return;
    }
    bool open = p->state == CO__POOL_OPEN;
    if (open) {
        drain_chute_locked(p, &wl, &tofree);
        co__pw_t *dead = co__wq_refresh(&p->idle, co_now() - p->expiry, &n);
        st32(&p->running, p->running - n);
        rec_put_list_locked(p, dead, &tofree);
    }
    co__pw_t *oldest = co__wq_oldest(&p->idle);
    if (open && oldest) {
        co__timer_add(&p->purge, co__time_add(oldest->last_used, p->expiry));
    } else {
        __atomic_store_n(&p->purge_armed, 0, __ATOMIC_RELAXED);
        gate_update_locked(p);
        /* A worker that still saw the timer armed may have pushed onto the
         * chute meanwhile: drain once more (going idle re-arms the timer). */
        if (open) drain_chute_locked(p, &wl, &tofree);
    }
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
}

/* ---- workers ------------------------------------------------------------ */

/* The time a worker went idle. Like ants (which stamps lastUsed from a
 * clock cached every 500 ms), a coarse reading is enough: the monotonic
 * clock at tick granularity (a few ms), read in a few ns. It is never
 * ahead of co_now(), so a worker is purged at most one tick early. */
static int64_t idle_stamp(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Lock held. Put a worker whose task just finished back in the idle
 * queue, stamped `now`. False if the queue refused it (out of memory). */
static bool idle_put_locked(co_pool_t *p, co__pw_t *w, int64_t now) {
    co__pw_t *newest = co__wq_newest(&p->idle);
    if (newest && newest->last_used > now) now = newest->last_used; /* keep it sorted */
    w->last_used = now;
    if (co__wq_insert(&p->idle, w) != 0) return false;
    purge_arm_locked(p);
    return true;
}

/* Lock held. A task of w ended (a panicked one goes through
 * worker_panic_retire instead): count it and decide what w does next. With `handoff` non-NULL (w's coroutine is still
 * running) w may take a blocked submitter's task: that submitter is
 * returned, claimed into *handoff, and w is active again. Otherwise w is put
 * in the idle queue or retired, and NULL is returned. */
static co__waiter_t *finish_locked(co_pool_t *p, co__pw_t *w, int64_t now, wakelist_t *handoff,
                                   co__pw_t **tofree) {
    p->completed++;
    bool old = w->gen != p->gen;
    st32(&p->busy, p->busy - 1);
    if (old) p->busy_old--;
    bool open = p->state == CO__POOL_OPEN;
    bool retire = !open || old || (p->cap > 0 && p->running > p->cap);
    if (retire) st32(&p->running, p->running - 1);
    co__waiter_t *sub = NULL;
    if (handoff && open && (!retire || has_room_locked(p)))
        sub = claim_submitter_locked(p, handoff, 0);
    if (sub) {
        /* Hand-off: w runs the blocked submitter's task (as a new worker if
         * it was retiring). Copy the task before the submitter runs again. */
        if (retire) st32(&p->running, p->running + 1);
        task_t *t = sub->data;
        activate_locked(p, w, t->fn, t->arg);
    } else if (retire || !idle_put_locked(p, w, now)) {
        if (!retire) st32(&p->running, p->running - 1);
        rec_put_locked(p, w, tofree);
    }
    return sub;
}

/* Lock held. Finish every record the workers left on the chute, oldest
 * first, and let blocked submitters at the idle workers or room this made. */
static void drain_chute_locked(co_pool_t *p, wakelist_t *wl, co__pw_t **tofree) {
    /* seq_cst: pairs with the pushes' CAS (see "The chute") */
    co__pw_t *list = __atomic_exchange_n(&p->chute, NULL, __ATOMIC_SEQ_CST);
    if (CO_LIKELY(!list)) return;
    co__pw_t *rev = NULL;
    while (list) {
        co__pw_t *n = list->tok.pw_next;
        list->tok.pw_next = rev;
        rev = list;
        list = n;
    }
    bool open = p->state == CO__POOL_OPEN;
    while (rev) {
        /* The common case in bulk: an open pool within its capacity, no
         * busy worker of an older generation (so none on the chute), and
         * room in the idle queue: each record just goes idle, with no
         * per-record check but the sort. The pool lock is the limit of
         * tiny tasks (each is two lock holds: its submit and its drain),
         * and this shortens the second: 37.9 -> 35.1 ns per tiny task
         * from a coroutine, 1M x 10 ms 493 -> 472 ms (medians of 15 and
         * 7 alternating runs). */
        if (CO_LIKELY(open && p->busy_old == 0 && (p->cap <= 0 || p->running <= p->cap))) {
            co__wq_t *q = &p->idle;
            int32_t done = 0;
            int64_t last = q->len ? co__wq_newest(q)->last_used : INT64_MIN;
            /* co__wq_insert's store, within the array's room: calling it
             * here (its ring, room and growth checks per record) made tiny
             * tasks ~6% slower (median of 21 alternating runs) */
            while (rev && q->len < q->cap) {
                co__pw_t *n = rev->tok.pw_next;
                if (rev->last_used < last)
                    rev->last_used = last; /* keep the queue sorted */
                last = rev->last_used;
                q->items[q->ring ? (q->head + q->len) % q->cap : q->len] = rev;
                q->len++;
                done++;
                rev = n;
            }
            p->completed += done;
            st32(&p->busy, p->busy - done);
            if (!rev) break;
        }
        /* The rest, one at a time: a retire, or a queue that must grow. */
        co__pw_t *n = rev->tok.pw_next;
        finish_locked(p, rev, rev->last_used, NULL, tofree);
        rev = n;
    }
    purge_arm_locked(p);
    if (p->state == CO__POOL_OPEN && !co__waitq_empty(&p->submitq)) {
        int room = co__wq_len(&p->idle) + (p->cap > p->running ? p->cap - p->running : 0);
        retry_submitters_locked(p, room, wl);
    }
    wake_waits_locked(p, wl);
}

/* Whether a worker of generation `gen` may finish through the chute (see
 * "The chute"): one seq_cst load of the gate, which pairs with its store by
 * a lock holder who drains after it. */
static inline bool chute_ok(const co_pool_t *p, uint64_t gen) {
    return __atomic_load_n(&p->gate, __ATOMIC_SEQ_CST) == gen << 1;
}

/* Chute pushes by this thread (any pool): every DRAIN_EVERY-th drains. */
#define DRAIN_EVERY 64
static __thread uint32_t chute_pushes;

/* worker_done after a chute push whose re-check failed: a lock holder
 * changed something after its last drain, so drain for it. Under
 * `inflight`, not the pin: taking the lock may yield, and the pin is this
 * M's. */
static __attribute__((noinline)) void chute_redrain(co_pool_t *p, void *pin) {
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    if (pin) {
        __atomic_add_fetch(&p->inflight, 1, __ATOMIC_RELAXED); /* ordered by the exit */
        co__pin_exit(pin);
    }
    plock(p);
    drain_chute_locked(p, &wl, &tofree);
    punlock(p);
    /* Our last access to *p. Release: destroy waits for inflight == 0. */
    __atomic_sub_fetch(&p->inflight, 1, __ATOMIC_RELEASE);
    wl_wake(&wl);
    rec_free_list(tofree);
}

/* worker_done under the lock: the chute was not allowed. */
static __attribute__((noinline)) bool worker_done_locked(co_pool_t *p, co__pw_t *w, int64_t now) {
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    plock(p);
    co__waiter_t *sub = finish_locked(p, w, now, &wl, &tofree);
    drain_chute_locked(p, &wl, &tofree);
    wake_waits_locked(p, &wl);
    punlock(p);
    /* Nothing below touches *p: a destroyer woken here may free it. */
    wl_wake(&wl);
    rec_free_list(tofree);
    return sub != NULL;
}

/* A task of w just ended (returned). Returns true with w
 * holding a new task, false if the coroutine must exit (w is then on the
 * chute, idle or retired, and no longer ours). */
static inline bool worker_done(co_pool_t *p, co__pw_t *w) {
    int64_t now = p->opts.disable_purge ? 0 : idle_stamp();
    uint64_t gen = w->gen;
    if (!chute_ok(p, gen)) return worker_done_locked(p, w, now);
    w->last_used = now;
    /* From the push on, *p may be destroyed (its last busy worker is
     * done) while we still read it: this M's pin holds destroy back
     * (co__pin_wait), ordered before the push by its CAS. A pool-wide
     * count did the same with two more RMWs on the chute's contended
     * line per task. With the scheduler's injection stack, a plain
     * thread submitting tiny tasks went from 11.1 to 13.4 M/s (median
     * of 15 alternating runs, bench_pool tiny thread=1); either change
     * alone moved nothing measurable. */
    void *pin = co__pin_enter();
    if (CO_UNLIKELY(!pin)) __atomic_add_fetch(&p->inflight, 1, __ATOMIC_RELAXED);
    co__pw_t *old = __atomic_load_n(&p->chute, __ATOMIC_RELAXED);
    do {
        w->tok.pw_next = old;
    } while (!__atomic_compare_exchange_n(&p->chute, &old, w, true, __ATOMIC_SEQ_CST,
                                          __ATOMIC_RELAXED));
    /* w is no longer ours. Did a lock holder change something after its
     * last drain? Then drain for it. */
    if (CO_UNLIKELY(!chute_ok(p, gen))) {
        chute_redrain(p, pin);
        return false;
    }
    /* Every DRAIN_EVERY pushes from this thread, drain the chute here if
     * the lock is free: the records this thread pushed last are still in
     * its cache, while the submitter would fetch each one from here in
     * turn, down a linked list. The try cannot yield, so the pin holds. */
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    bool drained = false;
    if (CO_UNLIKELY(++chute_pushes % DRAIN_EVERY == 0) && ptrylock(p)) {
        drain_chute_locked(p, &wl, &tofree);
        punlock(p);
        drained = true;
    }
    /* Our last access to *p. Release: destroy waits for the pin, then
     * for inflight == 0. */
    if (CO_LIKELY(pin != NULL))
        co__pin_exit(pin);
    else
        __atomic_sub_fetch(&p->inflight, 1, __ATOMIC_RELEASE);
    if (CO_UNLIKELY(drained)) {
        wl_wake(&wl);
        rec_free_list(tofree);
    }
    return false;
}

static void worker_main(void *arg);

/* co__take_unstarted's test: a worker coroutine of this very pool. */
static bool same_pool(void *arg, void *ctx) { return ((co__pw_t *)arg)->pool == ctx; }

/* Runs tasks until the worker must exit. *cur is the record being run: it
 * changes on a takeover. When a task ends and the record goes idle (or
 * retires), what the same P would run next is often another record of this
 * pool, queued as a token and not started yet (a submitter fills the queue
 * faster than tasks end): this coroutine then runs that record itself
 * (co__take_unstarted), and no coroutine is ever made for it. p stays
 * valid: the taken record is busy, and release/destroy wait for every busy
 * record. */
static void worker_run(void *arg) {
    co__pw_t **cur = arg;
    co__pw_t *w = *cur;
    co_pool_t *p = w->pool;
    void (*pfn)(void *) = p->fn;
    for (;;) {
        if (pfn)
            pfn(w->arg);
        else
            w->fn(w->arg);
        if (worker_done(p, w)) continue; /* handed a blocked submitter's task */
        w = co__take_unstarted(worker_main, same_pool, p);
        if (!w) return;
        *cur = w;
    }
}

/* Out of line: its 200-byte buffer would otherwise widen worker_main's frame,
 * which every parked task's stack carries and a wake reads back. */
__attribute__((noinline, cold)) static void report_panic(co_pool_t *p, void *value) {
    if (p->opts.panic_handler) {
        p->opts.panic_handler(value, p->opts.ctx);
        return;
    }
    char line[200];
    struct co_g *g = co__cur_g();
    snprintf(line, sizeof line,
             "colony: pool %p: worker exits from panic: %p in pool worker coroutine %llu",
             (void *)p, value, (unsigned long long)co__g_id(g));
    if (p->opts.logger) {
        p->opts.logger(line, p->opts.ctx);
    } else {
        fprintf(stderr, "%s\n", line);
        fflush(stderr);
    }
}

/* A task of w panicked, first half: the worker retires before the panic is
 * reported (ants: the goroutine's deferred exit gives its slot back, then
 * calls the handler). `running` drops by one, the record goes back, and a
 * blocked submitter goes round again for the slot; but the task stays
 * counted in `busy` until the report is done (worker_panic_done), so
 * wait_idle, release_timeout and destroy wait for the handler and *p
 * outlives it. Returns the record's generation, for the second half. */
static uint64_t worker_panic_retire(co_pool_t *p, co__pw_t *w) {
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    plock(p);
    uint64_t gen = w->gen;
    st32(&p->running, p->running - 1);
    rec_put_locked(p, w, &tofree);
    if (p->state == CO__POOL_OPEN && has_room_locked(p)) retry_submitters_locked(p, 1, &wl);
    drain_chute_locked(p, &wl, &tofree);
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
    return gen;
}

/* Second half: the report is done; the task counts as panicked, no longer
 * busy. Nothing after the unlock touches *p: a destroyer may free it. */
static void worker_panic_done(co_pool_t *p, uint64_t gen) {
    wakelist_t wl = {NULL};
    plock(p);
    p->panicked++;
    busy_dec_locked(p, gen, &wl);
    punlock(p);
    wl_wake(&wl);
}

typedef struct {
    co_pool_t *pool;
    void *value;
} panic_report_t;
static void report_panic_frame(void *arg) {
    panic_report_t *r = arg;
    report_panic(r->pool, r->value);
}

/* A worker coroutine. Its tasks run under a recover frame tagged with the
 * pool: a panic lands here. The worker retires, then the panic is reported
 * on this coroutine, which holds no slot by then (a handler may submit to
 * its own pool), under a frame tagged with the pool as a task is (a
 * handler that waits for the pool to go idle would wait for itself: it
 * gets CO_EDEADLK, as a task does); then the coroutine exits. */
static void worker_main(void *arg) {
    co__pw_t *cur = arg; /* the record running now (worker_run updates it) */
    co_pool_t *p = cur->pool;
    panic_report_t r = {p, NULL};
    if (!co__recover_tagged(worker_run, &cur, &r.value, p)) return;
    uint64_t gen = worker_panic_retire(p, cur);
    void *again;
    if (co__recover_tagged(report_panic_frame, &r, &again, p)) /* no lock held: user code */
        co__fatal("panic %p inside the panic handler of pool %p (the task's panic was %p)", again,
                  (void *)p, r.value);
    worker_panic_done(p, gen);
}

/* Start a coroutine for an activated record (lock not held). On failure the
 * activation is undone and the task will not run. */
static int launch(co_pool_t *p, co__pw_t *w) {
    /* At the default stack size the record goes on the run queue as a
     * token: a finishing worker takes it over with no G at all, and a G is
     * made only if it has to run on its own. */
    if (p->opts.stack_size == 0) {
        co__spawn_token(&w->token);
        return 0;
    }
    /* Unnamed (a name is a strncpy per spawn); the panic report says what
     * it is. */
    int rc = co__spawn(worker_main, w, p->opts.stack_size, NULL);
    if (CO_LIKELY(rc == 0)) {
        co__spawn_backpressure(); /* as co__spawn_token does */
        return 0;
    }
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    plock(p);
    p->submitted--;
    rejected_inc(p);
    st32(&p->running, p->running - 1);
    busy_dec_locked(p, w->gen, &wl);
    rec_put_locked(p, w, &tofree);
    /* The slot we held may be what a blocked submitter waits for. */
    if (p->state == CO__POOL_OPEN && has_room_locked(p)) retry_submitters_locked(p, 1, &wl);
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
    return rc;
}

/* ---- submit ------------------------------------------------------------- */

#ifndef THREAD_FULL_SPIN_TICKS
#define THREAD_FULL_SPIN_TICKS ((uint64_t)4 * CO__CYCLES_SHORT)
#endif
/* The rest of a submit that found no idle record at once, or a closed pool
 * (called with the lock held; releases it). */
static __attribute__((noinline)) int submit_slow(co_pool_t *p, void (*fn)(void *), void *arg,
                                                 int64_t deadline) {
    co__pw_t *fresh = NULL, *w, *tofree = NULL;
    wakelist_t wl = {NULL};
    bool raised = false;  /* waiters raised and the chute drained since the lock was taken */
    bool spun = false;    /* a plain thread watched the chute before parking */
    int64_t ticket = -1;  /* its place in submitq (sub_ticket), kept across RETRY */
    int rc;
    for (;;) {
        if (p->state != CO__POOL_OPEN) {
            rc = CO_ECLOSED;
            break;
        }
        if (co__wq_empty(&p->idle)) drain_chute_locked(p, &wl, &tofree);
        if ((w = co__wq_detach(&p->idle))) goto activate;
        if (has_room_locked(p)) {
            if (!(w = fresh ? fresh : rec_get_locked(p))) {
                punlock(p); /* no malloc under the lock */
                raised = false;
                /* One cache line each: a record crosses Ms twice per task
                 * (its submitter's and its worker's), and one line is one
                 * miss per crossing. */
                if (posix_memalign((void **)&fresh, CO__CACHELINE, sizeof *fresh) != 0)
                    fresh = NULL;
                else
                    memset(fresh, 0, sizeof *fresh);
                if (!fresh) {
                    rejected_inc(p);
                    wl_wake(&wl);
                    rec_free_list(tofree);
                    return CO_ENOMEM;
                }
                fresh->pool = p;
                fresh->token.fn = worker_main;
                plock(p);
                continue;
            }
            if (w == fresh) fresh = NULL;
            st32(&p->running, p->running + 1);
            goto activate;
        }
        /* Full. A submitter that already waited (ticket) and was sent round
         * again keeps its admission: newcomers that filled max_blocking
         * meanwhile do not turn it away. */
        if (p->opts.nonblocking ||
            (p->opts.max_blocking > 0 && ticket < 0 && p->waiting >= p->opts.max_blocking)) {
            rc = CO_EOVERLOAD;
            break;
        }
        if (co__recover_has_tag(p)) { /* a task of this pool waiting for itself */
            rc = CO_EDEADLK;
            break;
        }
        if (deadline != CO_FOREVER && deadline <= co_now()) {
            rc = CO_ETIMEDOUT;
            break;
        }
        /* Full: park at once. The first worker to finish hands its slot
         * straight to us (its coroutine runs our task: no spawn). Yielding
         * first to let queued workers run was tried: since workers take
         * over the unstarted ones queued behind them, it only delayed the
         * park (submit latency p99 25 us against 2 us when parking at
         * once; 1 P tiny tasks and 10 ms tasks slower too). */
        if (!raised && !spun && !co__cur_g()) {
            /* A plain thread would sleep on a futex, and its waker pay a
             * wake: with tasks that end within microseconds, watch the
             * chute for a moment (a few microseconds) first, without the
             * lock. Tiny tasks from a plain thread: context switches per
             * million 2912 -> 311, 75 -> 67 ns per task (median of 21
             * alternating runs). A coroutine parks without the kernel. */
            spun = true;
            punlock(p);
            wl_wake(&wl);
            uint64_t t0 = co__cycles();
            while (!__atomic_load_n(&p->chute, __ATOMIC_RELAXED) &&
                   co__cycles() - t0 < THREAD_FULL_SPIN_TICKS)
                for (int i = 0; i < 16; i++) co__cpu_relax();
            plock(p);
            continue;
        }
        if (!raised) {
            /* About to wait: from now on finishing workers take the lock
             * (see "The chute"); drain what they left before, and look
             * again. */
            waiters_raise_locked(p);
            raised = true;
            drain_chute_locked(p, &wl, &tofree);
            continue;
        }
        co__parker_t pk;
        co__parker_init(&pk, CO__WR_POOL);
        task_t t = {fn, arg};
        co__waiter_t wt;
        memset(&wt, 0, sizeof wt);
        wt.pk = &pk;
        wt.data = &t;
        /* First come, first served: a submitter that went round again
         * after RETRY and found the pool full again (a newcomer took the
         * slot meanwhile) goes back to its place by its first ticket, not
         * to the tail. */
        if (ticket < 0) {
            wt.n = ticket = p->sub_ticket++;
            co__waitq_push(&p->submitq, &wt);
        } else {
            wt.n = ticket;
            co__waitq_insert_by_n(&p->submitq, &wt);
        }
        st32(&p->waiting, p->waiting + 1);
        p->sub_parked++;
        wl_wake(&wl); /* before parking: nobody would wake them after */
        rc = ppark(p, &pk, deadline);
        raised = false;
        if (rc == CO_ETIMEDOUT) {
            plock(p);
            if (wt.q) { /* still queued: nobody popped us */
                co__waitq_remove(&wt);
                st32(&p->waiting, p->waiting - 1);
            }
            p->sub_parked--;
            break;
        }
        if (wt.result == RETRY) { /* the waker left sub_parked to us */
            plock(p);
            p->sub_parked--;
            continue;
        }
        /* 0: a worker took the task; CO_ECLOSED: release (counted as a
         * rejection by it). Our waker accounted for us, so *p may already
         * be gone (destroy): do not touch it again. */
        rec_free_list(fresh);
        rec_free_list(tofree);
        return wt.result;
    }
    rejected_inc(p);
    if (fresh) rec_put_locked(p, fresh, &tofree);
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
    return rc;
activate:
    activate_locked(p, w, fn, arg);
    if (fresh) rec_put_locked(p, fresh, &tofree);
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
    return launch(p, w);
}

/* A submit. The common case, an open pool with an idle record at hand, is
 * handled here: it changes no wait queue, so the unlock skips recomputing
 * `waiters`, and at the default stack size the launch cannot fail. Half the
 * instructions of a tiny task's submit were the general path's frame and
 * bookkeeping (callgrind, bench_pool tiny). */
static inline int submit_impl(co_pool_t *p, void (*fn)(void *), void *arg, int64_t deadline) {
    plock(p);
    co__pw_t *w;
    if (CO_UNLIKELY(p->state != CO__POOL_OPEN) || CO_UNLIKELY(p->opts.stack_size != 0) ||
        !(w = co__wq_detach(&p->idle)))
        return submit_slow(p, fn, arg, deadline);
    /* The next submit's record was likely last written by its worker on
     * another CPU: start fetching it now, for writing. */
    __builtin_prefetch(co__wq_peek(&p->idle), 1);
    activate_locked(p, w, fn, arg);
    co__punlock(&p->lock); /* no queue changed: `waiters` stands */
    co__spawn_token(&w->token);
    return 0;
}

int co_pool_submit_until(co_pool_t *p, void (*fn)(void *arg), void *arg, int64_t deadline) {
    if (!p) return CO_EINVAL;
    if (!fn || p->fn) {
        rejected_inc(p);
        return CO_EINVAL;
    }
    return submit_impl(p, fn, arg, deadline);
}

int co_pool_submit(co_pool_t *p, void (*fn)(void *arg), void *arg) {
    return co_pool_submit_until(p, fn, arg, CO_FOREVER);
}

int co__pool_invoke_until(co_pool_t *p, void *arg, int64_t deadline) {
    if (!p) return CO_EINVAL;
    if (!p->fn) {
        rejected_inc(p);
        return CO_EINVAL;
    }
    return submit_impl(p, NULL, arg, deadline);
}

int co_pool_invoke(co_pool_t *p, void *arg) { return co__pool_invoke_until(p, arg, CO_FOREVER); }

/* ---- creation ----------------------------------------------------------- */

static int pool_create(co_pool_t **out, int capacity, void (*fn)(void *),
                       const co_pool_opts_t *opts) {
    co_pool_opts_t o;
    if (opts)
        o = *opts;
    else
        memset(&o, 0, sizeof o);
    if (!o.disable_purge && o.expiry_ns < 0) return CO_EINVAL; /* ErrInvalidPoolExpiry */
    if (o.expiry_ns <= 0) o.expiry_ns = DEFAULT_EXPIRY;
    if (capacity <= 0) capacity = -1;
    if (o.prealloc && capacity < 0) return CO_EINVAL;          /* ErrInvalidPreAllocSize */
    if (o.max_blocking < 0) return CO_EINVAL;
    if (o.stack_size != 0 && (o.stack_size < CO_STACK_MIN || o.stack_size > CO_STACK_MAX))
        return CO_EINVAL;
    /* A pool needs the runtime as long as it exists (its purge timer, its
     * workers): co_shutdown fails with CO_EBUSY until it is destroyed. */
    int rc = co__rt_hold();
    if (rc < 0) return rc;
    co_pool_t *p = NULL; /* cache-line aligned (see the struct) */
    if (posix_memalign((void **)&p, CO__CACHELINE, sizeof *p) != 0) {
        co__rt_unhold();
        return CO_ENOMEM;
    }
    memset(p, 0, sizeof *p);
    rc = co__wq_init(&p->idle, o.prealloc, o.prealloc ? capacity : 0);
    if (rc < 0) {
        free(p);
        co__rt_unhold();
        return rc;
    }
    p->cap = capacity;
    p->state = CO__POOL_OPEN;
    p->fn = fn;
    p->opts = o;
    p->expiry = o.expiry_ns;
    p->no_purge = o.disable_purge;
    p->purge.fn = purge_fire;
    p->purge.arg = p;
    p->purge.slot = -1;
    gate_update_locked(p); /* closed until the purge timer is armed (unless disabled) */
    *out = p;
    return 0;
}

int co_pool_new(co_pool_t **out, int capacity, const co_pool_opts_t *opts) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    return pool_create(out, capacity, NULL, opts);
}

int co_pool_new_func(co_pool_t **out, int capacity, void (*fn)(void *arg),
                     const co_pool_opts_t *opts) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    if (!fn) return CO_EINVAL; /* ErrLackPoolFunc, checked before the options */
    return pool_create(out, capacity, fn, opts);
}

/* ---- getters: relaxed snapshots ----------------------------------------- */

int co_pool_running(const co_pool_t *p) { return p ? ld32(&p->running) : CO_EINVAL; }
int co_pool_waiting(const co_pool_t *p) { return p ? ld32(&p->waiting) : CO_EINVAL; }
int co_pool_cap(const co_pool_t *p) { return p ? ld32(&p->cap) : CO_EINVAL; }
int co_pool_available(const co_pool_t *p) {
    if (!p) return CO_EINVAL;
    int cap = ld32(&p->cap);
    return cap < 0 ? -1 : cap - ld32(&p->running);
}
bool co_pool_is_closed(const co_pool_t *p) {
    return !p || __atomic_load_n(&p->state, __ATOMIC_RELAXED) != CO__POOL_OPEN;
}

void co_pool_stats(const co_pool_t *p, co_pool_stats_t *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!p) return;
    co_pool_t *mp = (co_pool_t *)p; /* the lock and the chute are not part of the value */
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    plock(mp);
    drain_chute_locked(mp, &wl, &tofree);
    out->running = p->running;
    out->idle = co__wq_len(&p->idle);
    out->busy = p->busy;
    out->waiting = p->waiting;
    out->submitted = p->submitted;
    out->completed = p->completed;
    out->panicked = p->panicked;
    out->rejected = __atomic_load_n(&p->rejected, __ATOMIC_RELAXED);
    punlock(mp);
    wl_wake(&wl);
    rec_free_list(tofree);
}

/* ---- tune --------------------------------------------------------------- */

void co_pool_tune(co_pool_t *p, int capacity) {
    if (!p || capacity <= 0 || p->opts.prealloc) return;
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    plock(p);
    int old = p->cap;
    if (old < 0 || capacity == old) {
        punlock(p);
        return;
    }
    __atomic_store_n(&p->cap, capacity, __ATOMIC_RELAXED);
    gate_update_locked(p); /* then drain: see "The chute" */
    drain_chute_locked(p, &wl, &tofree);
    if (capacity > old) {
        /* Grow: the new room goes to blocked submitters first. */
        if (p->state == CO__POOL_OPEN) retry_submitters_locked(p, capacity - p->running, &wl);
    } else {
        /* Shrink: busy workers retire as they finish (worker_done); idle
         * ones cost nothing to retire now, oldest first. */
        int k = p->running - capacity;
        if (k > co__wq_len(&p->idle)) k = co__wq_len(&p->idle);
        if (k > 0) {
            rec_put_list_locked(p, co__wq_take_oldest(&p->idle, k), &tofree);
            st32(&p->running, p->running - k);
        }
    }
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
}

/* ---- release / reboot / wait -------------------------------------------- */

int co__pool_release_begin(co_pool_t *p) {
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    int n;
    plock(p);
    if (p->state != CO__POOL_OPEN) {
        punlock(p);
        return CO_ECLOSED;
    }
    /* Close, then drain (see "The chute"): workers on the chute are busy
     * workers of the old generation and retire. */
    __atomic_store_n(&p->state, CO__POOL_CLOSED, __ATOMIC_RELAXED);
    __atomic_store_n(&p->gen, p->gen + 1, __ATOMIC_RELAXED);
    gate_update_locked(p);
    p->busy_old = p->busy; /* every busy worker now belongs to an older generation */
    drain_chute_locked(p, &wl, &tofree);
    co__pw_t *dead = co__wq_reset(&p->idle, &n); /* idle workers exit */
    st32(&p->running, p->running - n);
    rec_put_list_locked(p, dead, &tofree);
    while (claim_submitter_locked(p, &wl, CO_ECLOSED)) rejected_inc(p);
    wake_waits_locked(p, &wl);
    punlock(p);
    /* The purge timer, if armed, finds the pool closed and stops itself. */
    wl_wake(&wl);
    rec_free_list(tofree);
    return 0;
}

int co__pool_drain_until(co_pool_t *p, int64_t deadline) {
    /* Called from one of the pool's own tasks, wait for every worker but
     * the caller's own (it exits when its task returns). */
    int self = co__recover_has_tag(p) ? 1 : 0;
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    int rc = 0;
    plock(p);
    waiters_raise_locked(p); /* then drain: see "The chute" */
    drain_chute_locked(p, &wl, &tofree);
    if (p->busy_old <= self)
        rc = 1;
    else if (deadline != CO_FOREVER && deadline <= co_now())
        rc = CO_ETIMEDOUT;
    if (rc) {
        punlock(p);
        wl_wake(&wl);
        rec_free_list(tofree);
        return rc == 1 ? 0 : rc;
    }
    wl_wake(&wl);
    co__parker_t pk;
    co__parker_init(&pk, CO__WR_POOL);
    co__waiter_t wt;
    memset(&wt, 0, sizeof wt);
    wt.pk = &pk;
    wt.n = self;
    co__waitq_push(&p->drainq, &wt);
    rc = ppark(p, &pk, deadline);
    if (rc == CO_ETIMEDOUT) {
        plock(p);
        co__waitq_remove(&wt);
        punlock(p);
    }
    rec_free_list(tofree);
    return rc;
}

void co_pool_release(co_pool_t *p) {
    if (p) (void)co__pool_release_begin(p);
}

int co_pool_release_timeout(co_pool_t *p, int64_t ns) {
    if (!p) return CO_EINVAL;
    int rc = co__pool_release_begin(p);
    if (rc < 0) return rc;
    return co__pool_drain_until(p, co_deadline_after(ns));
}

void co_pool_reboot(co_pool_t *p) {
    if (!p) return;
    plock(p);
    if (p->state != CO__POOL_OPEN) __atomic_store_n(&p->state, CO__POOL_OPEN, __ATOMIC_RELAXED);
    punlock(p); /* opens the gate */
}

int co_pool_wait_idle(co_pool_t *p, int64_t deadline) {
    if (!p) return CO_EINVAL;
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    int rc = 0;
    plock(p);
    waiters_raise_locked(p); /* then drain: see "The chute" */
    drain_chute_locked(p, &wl, &tofree);
    if (p->busy == 0)
        rc = 1;
    else if (co__recover_has_tag(p))
        rc = CO_EDEADLK; /* a task waiting for itself to finish */
    else if (deadline != CO_FOREVER && deadline <= co_now())
        rc = CO_ETIMEDOUT;
    if (rc) {
        punlock(p);
        wl_wake(&wl);
        rec_free_list(tofree);
        return rc == 1 ? 0 : rc;
    }
    wl_wake(&wl);
    rec_free_list(tofree);
    co__parker_t pk;
    co__parker_init(&pk, CO__WR_POOL);
    co__waiter_t wt;
    memset(&wt, 0, sizeof wt);
    wt.pk = &pk;
    co__waitq_push(&p->idleq, &wt);
    rc = ppark(p, &pk, deadline);
    if (rc == CO_ETIMEDOUT) {
        plock(p);
        co__waitq_remove(&wt);
        punlock(p);
    }
    return rc;
}

void co_pool_destroy(co_pool_t *p) {
    if (!p) return;
    if (co__recover_has_tag(p)) co__fatal("co_pool_destroy(%p) called from one of its own tasks", (void *)p);
    (void)co__pool_release_begin(p);
    (void)co__pool_drain_until(p, CO_FOREVER);
    /* Submitters that timed out while being released still re-lock the
     * pool to unlink themselves: wait for them (rare and brief). */
    for (;;) {
        plock(p);
        int n = p->sub_parked;
        punlock(p);
        if (n == 0) break;
        co_yield();
    }
    /* Workers that finished through the chute may still be reading *p:
     * pinned (first: a worker goes from its pin to inflight, never back)
     * or counted in inflight. */
    co__pin_wait();
    while (__atomic_load_n(&p->inflight, __ATOMIC_ACQUIRE) != 0) co_yield();
    co__timer_del(&p->purge); /* waits for a running callback */
    int n;
    rec_free_list(__atomic_exchange_n(&p->chute, NULL, __ATOMIC_ACQUIRE)); /* empty by now */
    rec_free_list(co__wq_reset(&p->idle, &n)); /* empty after the release */
    rec_free_list(p->spare);
    co__wq_destroy(&p->idle);
    free(p);
    co__rt_unhold(); /* every pool holds the runtime; last: co_shutdown may free it now */
}
