/*
 * Retiring idle workers: by age (the purge timer) and by capacity
 * (co_pool_tune). An idle worker is only its record, so retiring one is
 * moving that record to the spares; no coroutine is involved.
 *
 * The purge timer is armed by the first worker to go idle (worker.c,
 * purge_arm_locked) for the oldest idle record's expiry, and re-adds itself
 * while idle records remain. While it is not armed the chute is shut (the
 * gate, worker.c): a record on the chute goes idle only when someone
 * drains it, and a pending timer is sure to.
 */
#include "pool/pool_locked.h"

/* Timer callback: retire every idle record unused for expiry_ns. Runs on
 * some M without timer locks. It re-adds itself while idle records remain;
 * otherwise it clears purge_armed, and the next worker to go idle arms it
 * again.
 * It only ever *tries* the pool lock: a timer may run on an M whose
 * coroutine is in the middle of parking with this very lock held (ppark
 * releases it only after the switch), so waiting for the lock here could
 * wait for ourselves. When the lock is busy, try again in a millisecond. */
#define PURGE_RETRY_NS ((int64_t)1000000)
void co__pool_purge_fire(void *arg) {
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
        co__pool_drain_chute_locked(p, &wl, &tofree);
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
        if (open) co__pool_drain_chute_locked(p, &wl, &tofree);
    }
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
}

void co_pool_tune(co_pool_t *p, int capacity) {
    if (!p) co__fatal("co_pool_tune(NULL): no pool");
    POOL_CHECK(p, "co_pool_tune");
    if (capacity <= 0 || p->opts.prealloc) return;
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
    co__pool_drain_chute_locked(p, &wl, &tofree);
    if (capacity > old) {
        /* Grow: the new room goes to blocked submitters first. */
        if (p->state == CO__POOL_OPEN) retry_submitters_locked(p, capacity - p->running, &wl);
    } else {
        /* Shrink: busy workers retire as they finish (worker.c); idle
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
