/*
 * The default pool (ants' package-level Submit/Running/...): an unlimited
 * pool with default options, created on first use rather than at load time
 * (so a program that never submits starts nothing). co_shutdown's hook
 * releases it and waits up to 100 ms (co_shutdown's own grace for
 * stragglers) for its busy workers; then the pool is destroyed, and the
 * next use creates a fresh one. If a worker is still busy, the hook reopens
 * the pool, leaves it usable, and co_shutdown fails with CO_EBUSY at once:
 * had it gone on, that worker could have ended within co_shutdown's grace
 * and the runtime stopped under a live pool. Unlike the pools users make,
 * it does not hold the runtime up (co__rt_hold): the hook destroys it.
 */
#include "internal.h"
#include "pool_impl.h"

/* dflt: written under dflt_lock with release; read lock-free with acquire
 * (pairs with that store: a reader sees a fully built pool). */
static co_pool_t *dflt;
static co__lock_t dflt_lock;

static int default_pool_shutdown(void) {
    int rc = 0;
    co__lock(&dflt_lock);
    co_pool_t *p = dflt;
    if (p) {
        (void)co__pool_release_begin(p);
        if (co__pool_drain_until(p, co_deadline_after(100 * 1000 * 1000)) == 0) {
            __atomic_store_n(&dflt, NULL, __ATOMIC_RELEASE);
            co_pool_destroy(p);
        } else {
            co_pool_reboot(p);
            rc = CO_EBUSY;
        }
    }
    co__unlock(&dflt_lock);
    return rc;
}

co_pool_t *co_default_pool(void) {
    co_pool_t *p = __atomic_load_n(&dflt, __ATOMIC_ACQUIRE);
    if (CO_LIKELY(p != NULL)) return p;
    if (co__ensure_init() < 0) return NULL;
    co__lock(&dflt_lock);
    p = dflt;
    if (!p && co_pool_new(&p, -1, NULL) == 0) {
        /* No hold on the runtime: co_shutdown's hook destroys it */
        p->holds_rt = false;
        co__rt_unhold();
        co__at_shutdown(default_pool_shutdown); /* registers once */
        __atomic_store_n(&dflt, p, __ATOMIC_RELEASE);
    }
    co__unlock(&dflt_lock);
    return p;
}

int co_submit(void (*fn)(void *arg), void *arg) {
    co_pool_t *p = co_default_pool();
    if (!p) return CO_ENOMEM;
    return co_pool_submit(p, fn, arg);
}
