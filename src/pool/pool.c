/*
 * The pool: ants v2.11 (Pool and PoolWithFunc) on colony's coroutines.
 * This file: creation, the getters and statistics, release, reboot and the
 * waits for the workers (wait_idle, release_timeout, destroy). Submitting
 * is submit.c, the workers and the chute worker.c, the purge and tune
 * purge.c; pool_locked.h holds what they share under the lock.
 *
 * Workers. A worker is a record (co__pw_t). Idle, it is only that record in
 * the idle queue (pool_impl.h): no coroutine, no stack. Busy, a coroutine
 * runs it. Whoever activates the record queues it on the run queue as a
 * token; a coroutine is made for it only if it has to run on its own.
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
 * (finish_locked; worker_panic_done after a panic's report). busy_old
 * counts busy workers activated before the last release (their record's
 * gen is older than p->gen); release_timeout and destroy wait for it to
 * drain.
 */
#include "pool/pool_locked.h"

#include <string.h>

#define DEFAULT_EXPIRY ((int64_t)1000000000)

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
    int rc = co__rt_hold(CO__HOLD_POOL);
    if (rc < 0) return rc;
    /* A worker runs task after task: a task cannot promise for the next
     * ones that nothing touches the stack while parked (compact.c). */
    co__compact_refuse_entry(co__pool_worker_main);
    co_pool_t *p = NULL; /* cache-line aligned (see the struct) */
    if (posix_memalign((void **)&p, CO__CACHELINE, sizeof *p) != 0) {
        co__rt_unhold(CO__HOLD_POOL);
        return CO_ENOMEM;
    }
    memset(p, 0, sizeof *p);
    rc = co__wq_init(&p->idle, o.prealloc, o.prealloc ? capacity : 0);
    if (rc < 0) {
        free(p);
        co__rt_unhold(CO__HOLD_POOL);
        return rc;
    }
    p->cap = capacity;
    p->state = CO__POOL_OPEN;
    p->fn = fn;
    p->opts = o;
    p->expiry = o.expiry_ns;
    p->no_purge = o.disable_purge;
    p->purge.fn = co__pool_purge_fire;
    p->purge.arg = p;
    p->purge.slot = -1;
    p->tag = CO__TAG_POOL;
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

int co_pool_running(const co_pool_t *p) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, "co_pool_running");
    return ld32(&p->running);
}
int co_pool_waiting(const co_pool_t *p) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, "co_pool_waiting");
    return ld32(&p->waiting);
}
int co_pool_cap(const co_pool_t *p) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, "co_pool_cap");
    return ld32(&p->cap);
}
int co_pool_available(const co_pool_t *p) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, "co_pool_available");
    int cap = ld32(&p->cap);
    return cap < 0 ? -1 : cap - ld32(&p->running);
}
bool co_pool_is_closed(const co_pool_t *p) {
    if (!p) return true;
    POOL_CHECK(p, "co_pool_is_closed");
    return __atomic_load_n(&p->state, __ATOMIC_RELAXED) != CO__POOL_OPEN;
}

void co_pool_stats(const co_pool_t *p, co_pool_stats_t *out) {
    if (!p || !out) co__fatal("co_pool_stats(%s): no %s", p ? "p, NULL" : "NULL, out", p ? "out" : "pool");
    POOL_CHECK(p, "co_pool_stats");
    memset(out, 0, sizeof *out);
    co_pool_t *mp = (co_pool_t *)p; /* the lock and the chute are not part of the value */
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    plock(mp);
    co__pool_drain_chute_locked(mp, &wl, &tofree);
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
    co__pool_drain_chute_locked(p, &wl, &tofree);
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
    co__pool_drain_chute_locked(p, &wl, &tofree);
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
    co__pkw_t pw;
    co__wait_prepare(&pw, CO__WR_POOL);
    pw.w.n = self;
    co__waitq_push(&p->drainq, &pw.w);
    rc = pwait(p, &pw.w, deadline, 0);
    rec_free_list(tofree);
    return rc;
}

void co_pool_release(co_pool_t *p) {
    if (!p) co__fatal("co_pool_release(NULL): no pool");
    POOL_CHECK(p, "co_pool_release");
    (void)co__pool_release_begin(p);
}

int co_pool_release_timeout(co_pool_t *p, int64_t ns) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, "co_pool_release_timeout");
    int rc = co__pool_release_begin(p);
    if (rc < 0) return rc;
    return co__pool_drain_until(p, co_deadline_after(ns));
}

void co_pool_reboot(co_pool_t *p) {
    if (!p) co__fatal("co_pool_reboot(NULL): no pool");
    POOL_CHECK(p, "co_pool_reboot");
    plock(p);
    if (p->state != CO__POOL_OPEN) __atomic_store_n(&p->state, CO__POOL_OPEN, __ATOMIC_RELAXED);
    punlock(p); /* opens the gate */
}

int co_pool_wait_idle(co_pool_t *p, int64_t deadline) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, "co_pool_wait_idle");
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    int rc = 0;
    plock(p);
    waiters_raise_locked(p); /* then drain: see "The chute" */
    co__pool_drain_chute_locked(p, &wl, &tofree);
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
    co__pkw_t pw;
    co__wait_prepare(&pw, CO__WR_POOL);
    co__waitq_push(&p->idleq, &pw.w);
    return pwait(p, &pw.w, deadline, 0);
}

void co_pool_destroy(co_pool_t *p) {
    if (!p) return;
    POOL_CHECK(p, "co_pool_destroy");
    if (co__recover_has_tag(p))
        co__fatal("co_pool_destroy(%p) called from one of its own tasks", (void *)p);
    co__default_pool_detach(p); /* the default pool: the next use makes a new one */
    (void)co__pool_release_begin(p);
    (void)co__pool_drain_until(p, CO_FOREVER);
    /* Submitters that timed out while being released still re-lock the
     * pool to unlink themselves, and one sent round again (RETRY) may be
     * allocating without the lock: wait for them (rare and brief). */
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
    CO__HANDLE_KILL(p, CO__TAG_POOL);
    free(p);
    co__rt_unhold(CO__HOLD_POOL); /* every pool holds the runtime; last: co_shutdown may free it now */
}
