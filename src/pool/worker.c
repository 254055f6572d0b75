/*
 * The pool's workers: running tasks, and what a worker does when its task
 * ends.
 *
 * A worker coroutine runs records (worker_main, worker_run). When a task
 * returns, the worker (worker_done, finish_locked):
 *   - retires if the pool is closed, if it belongs to an older release
 *     generation, or if the pool shrank below its worker count; a retiring
 *     worker whose slot lets a blocked submitter in takes that submitter's
 *     task instead of exiting (a new worker, the same coroutine);
 *   - otherwise takes a blocked submitter's task if one waits (hand-off:
 *     the submit returns 0, the task runs on this coroutine right away);
 *   - otherwise puts its record back in the idle queue and its coroutine
 *     exits (the stack goes back to the runtime's per-P cache), unless the
 *     next coroutine of its P is an unstarted record of the same pool,
 *     which it then runs itself (worker_run).
 * A task that panicked: the worker retires (its slot to a blocked
 * submitter, which goes round again), then reports the panic on its
 * coroutine holding no slot, then exits; the task counts as busy until the
 * report is done (worker_panic_retire, worker_panic_done).
 *
 * The chute. Taking the lock at the end of every task makes the submitter
 * and the finishing workers, usually on different Ms, fight over it. So a
 * worker whose task ended while nobody waits on the pool pushes its record
 * on the chute (a lock-free stack: one CAS) and exits; the next holder of
 * the lock drains the chute (co__pool_drain_chute_locked: counters, idle
 * queue, purge timer), and every locked path that depends on those does so
 * first. The fast path is allowed only when its outcome is certain: the
 * pool is open, in the worker's generation, not above capacity, the purge
 * timer armed (it drains when it fires), and nobody waits (the `waiters`
 * flag). One word, the gate, says all of that (gate_update_locked), so the
 * worker's check is one load: a lock holder that changes any of them
 * stores the gate and then drains; the worker loads the gate, pushes, and
 * loads it again (all seq_cst), so either the drain sees the record or the
 * worker sees the change and drains itself (Dekker's pattern). Waiting
 * (submit, wait_idle, release_timeout) raises `waiters` before its last
 * drain, for the same reason.
 * Draining walks a linked list of records that their workers wrote last,
 * often on another CPU: one cache miss after another. So a worker thread
 * drains too, every DRAIN_EVERY pushes of its own, if the lock is free:
 * the records it pushed last are still in its cache. But not too often:
 * each drain takes the lock's line from the submitter, and the records a
 * submitter drains are the ones it is about to reuse anyway.
 */
#include "pool/pool_locked.h"

#include <stdio.h>
#include <time.h>

/* Lock held. Arm the purge timer for the oldest idle record if needed. */
static void purge_arm_locked(co_pool_t *p) {
    if (p->opts.disable_purge || p->purge_armed || co__wq_empty(&p->idle)) return;
    __atomic_store_n(&p->purge_armed, 1, __ATOMIC_RELAXED);
    gate_update_locked(p);
    co__timer_add(&p->purge, co__time_add(co__wq_oldest(&p->idle)->last_used, p->expiry));
}

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
 * worker_panic_retire instead): count it and decide what w does next.
 * With `handoff` non-NULL (w's coroutine is still running) w may take a
 * blocked submitter's task: that submitter is returned, claimed into
 * *handoff, and w is active again. Otherwise w is put in the idle queue or
 * retired, and NULL is returned. */
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
void co__pool_drain_chute_locked(co_pool_t *p, wakelist_t *wl, co__pw_t **tofree) {
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
         * per-record check but the sort. A tiny task holds the pool lock
         * twice (its submit and its drain): this keeps the second short. */
        if (CO_LIKELY(open && p->busy_old == 0 && (p->cap <= 0 || p->running <= p->cap))) {
            co__wq_t *q = &p->idle;
            int32_t done = 0;
            int64_t last = q->len ? co__wq_newest(q)->last_used : INT64_MIN;
            /* co__wq_insert's store, within the array's room: its ring,
             * room and growth checks per record cost more than the store */
            while (rev && q->len < q->cap) {
                co__pw_t *n = rev->tok.pw_next;
                if (rev->last_used < last)
                    rev->last_used = last; /* keep the queue sorted */
                last = rev->last_used;
                q->items[q->ring ? co__wq_slot(q, q->len) : q->len] = rev;
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
static inline CO_THREAD_STATE uint32_t chute_push_count(void) { return ++chute_pushes; }

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
    co__pool_drain_chute_locked(p, &wl, &tofree);
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
    co__pool_drain_chute_locked(p, &wl, &tofree);
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
     * (co__pin_wait), ordered before the push by its CAS. Two stores to
     * the M's own line, where a pool-wide count would take two RMWs on the
     * chute's contended line per task. */
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
    if (CO_UNLIKELY(chute_push_count() % DRAIN_EVERY == 0) && ptrylock(p)) {
        co__pool_drain_chute_locked(p, &wl, &tofree);
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
        w = co__take_unstarted(co__pool_worker_main, same_pool, p);
        if (!w) return;
        *cur = w;
    }
}

/* ---- panics ------------------------------------------------------------- */

/* Out of line: its 200-byte buffer would otherwise widen worker_main's frame,
 * which every parked task's stack carries and a wake reads back. */
__attribute__((noinline, cold)) static void report_panic(co_pool_t *p, void *value) {
    if (p->opts.panic_handler) {
        p->opts.panic_handler(value, p->opts.ctx);
        return;
    }
    char line[200];
    struct co_g *g = co__running_g();
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
    co__pool_drain_chute_locked(p, &wl, &tofree);
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
void co__pool_worker_main(void *arg) {
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
