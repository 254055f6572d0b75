/*
 * The default pool (ants' package-level Submit/Running/...): an unlimited
 * pool with default options, created on first use rather than at load time
 * (so a program that never submits starts nothing).
 *
 * Its lifetime against co_shutdown. Like every pool it holds the runtime up
 * (co__rt_hold) while it exists, but co_shutdown's first look does not
 * count that hold (its shutdown hook's `holds`): the hook releases the
 * pool and waits up to 100 ms (co_shutdown's own grace for stragglers) for
 * its busy workers; then the pool is destroyed, giving its hold back, and
 * the next use creates a fresh one. If a worker is still busy, the hook
 * reopens the pool, leaves it usable, and co_shutdown fails with CO_EBUSY
 * at once: had it gone on, that worker could have ended within
 * co_shutdown's grace and the runtime stopped under a live pool. A default
 * pool made after the hook ran (another thread's first use meanwhile)
 * holds the runtime too, so co_shutdown's last look fails with CO_EBUSY
 * and that pool keeps working.
 *
 * co_submit against the hook (a Dekker pair, all seq_cst): co_submit counts
 * itself in `users`, then loads dflt; the hook stores dflt = NULL, then
 * loads `users`. Either the hook sees the submit and gives up (CO_EBUSY,
 * the pool put back untouched), or the submit sees NULL and makes a new
 * pool (under dflt_lock, after the hook). A submit never touches a pool
 * the hook destroys.
 *
 * co_pool_destroy of the default pool (co__default_pool_detach) uses the
 * same pair, but it cannot give up: it stores DETACHING, then waits for
 * `users` to drain. A co_submit that finds DETACHING takes its count back
 * and waits (uncounted, so the drain ends) until dflt is NULL, then makes
 * a new pool; one that loaded the pool before is waited for, and its task
 * runs on that pool, which the destroy then drains. So the next use after
 * a destroy makes a fresh pool, and nothing keeps the freed one.
 */
#include "runtime/runtime.h"
#include "pool/pool_impl.h"

#include <string.h>

/* dflt while co_pool_destroy detaches the pool (see above): never a pool. */
#define DETACHING ((co_pool_t *)(uintptr_t)1)
static inline bool is_pool(const co_pool_t *p) { return (uintptr_t)p > (uintptr_t)DETACHING; }

/* dflt: NULL, DETACHING or the pool. Written under dflt_lock (seq_cst);
 * read lock-free (seq_cst in co_submit, the Dekker pair above; acquire
 * elsewhere: a reader sees a fully built pool). */
static co_pool_t *dflt;
static co__lock_t dflt_lock;
/* atomic, seq_cst: co_submit calls between their count-in and their last
 * touch of the pool, or their look at a dflt that is not a pool (see
 * above) */
static int64_t users;

/* The hold the shutdown hook gives back: 1 while the pool exists (a pool
 * being detached by co_pool_destroy still holds until it is freed). */
static int default_pool_holds(void) { return __atomic_load_n(&dflt, __ATOMIC_ACQUIRE) != NULL; }

/* Tests that fork (co__test_reset_after_fork): the parent's pool is not
 * the child's (its workers do not exist there, nor its hold). Leaked. */
static void default_pool_forget(void) {
    dflt = NULL;
    memset(&dflt_lock, 0, sizeof dflt_lock);
    users = 0;
}

static int default_pool_shutdown(void) {
    int rc = 0;
    co__lock(&dflt_lock);
    co_pool_t *p = dflt;
    if (p == DETACHING) {
        rc = CO_EBUSY; /* a co_pool_destroy of it is under way */
    } else if (p) {
        __atomic_store_n(&dflt, NULL, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&users, __ATOMIC_SEQ_CST) != 0) {
            /* a co_submit is using it: leave it be */
            __atomic_store_n(&dflt, p, __ATOMIC_SEQ_CST);
            rc = CO_EBUSY;
        } else {
            (void)co__pool_release_begin(p);
            if (co__pool_drain_until(p, co_deadline_after(100 * 1000 * 1000)) == 0) {
                co_pool_destroy(p); /* gives its hold on the runtime back */
            } else {
                co_pool_reboot(p);
                __atomic_store_n(&dflt, p, __ATOMIC_SEQ_CST);
                rc = CO_EBUSY;
            }
        }
    }
    co__unlock(&dflt_lock);
    return rc;
}

static const co__rt_hook_t default_pool_hook = {
    .shutdown = default_pool_shutdown,
    .holds = default_pool_holds,
    .forget = default_pool_forget,
};

/* The default pool, made if there is none: NULL only if it cannot be
 * made. Waits out a co_pool_destroy detaching the last one. */
static co_pool_t *default_pool_make(void) {
    for (;;) {
        co__lock(&dflt_lock);
        co_pool_t *p = dflt;
        if (p != DETACHING) {
            /* co_pool_new takes the hold, starting the runtime if it is
             * down (waiting for a shutdown under way) */
            if (!p && co_pool_new(&p, -1, NULL) == 0) {
                co__at_shutdown(&default_pool_hook); /* registers once */
                __atomic_store_n(&dflt, p, __ATOMIC_SEQ_CST);
            }
            co__unlock(&dflt_lock);
            return p;
        }
        co__unlock(&dflt_lock);
        co_yield(); /* the destroy waits only for co_submit calls in flight */
    }
}

co_pool_t *co_default_pool(void) {
    co_pool_t *p = __atomic_load_n(&dflt, __ATOMIC_ACQUIRE);
    return CO_LIKELY(is_pool(p)) ? p : default_pool_make();
}

int co_submit(void (*fn)(void *arg), void *arg) {
    co_pool_t *p;
    for (;;) {
        __atomic_add_fetch(&users, 1, __ATOMIC_SEQ_CST);
        p = __atomic_load_n(&dflt, __ATOMIC_SEQ_CST);
        if (CO_LIKELY(is_pool(p))) break;
        /* None, or being destroyed: uncounted while it waits for (or makes)
         * the next one, which it then loads again, counted. */
        __atomic_sub_fetch(&users, 1, __ATOMIC_RELEASE);
        if (!default_pool_make()) return CO_ENOMEM;
    }
    int rc = co_pool_submit(p, fn, arg);
    /* release: this call's touches of the pool happen before a hook that
     * reads 0 destroys it */
    __atomic_sub_fetch(&users, 1, __ATOMIC_RELEASE);
    return rc;
}

/* co_pool_destroy(p), before anything else: if p is the default pool, it
 * stops being it (see the top of this file). Then the destroy goes on as
 * for any pool. */
void co__default_pool_detach(co_pool_t *p) {
    if (__atomic_load_n(&dflt, __ATOMIC_ACQUIRE) != p) return; /* the usual case */
    co__lock(&dflt_lock);
    bool mine = dflt == p;
    if (mine) __atomic_store_n(&dflt, DETACHING, __ATOMIC_SEQ_CST);
    co__unlock(&dflt_lock);
    if (!mine) return;
    /* seq_cst: after the store of DETACHING (the Dekker pair) */
    while (__atomic_load_n(&users, __ATOMIC_SEQ_CST) != 0) co_yield();
    co__lock(&dflt_lock);
    __atomic_store_n(&dflt, NULL, __ATOMIC_SEQ_CST);
    co__unlock(&dflt_lock);
}
