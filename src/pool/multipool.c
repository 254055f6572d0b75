/*
 * Multipool: ants' MultiPool / MultiPoolWithFunc. n sub-pools of cap_each
 * workers, all with the same options; each submit picks one sub-pool by
 * round-robin (an atomic counter) or least-tasks (the sub-pool with the
 * fewest running workers, a linear scan). A round-robin pick that answers
 * CO_EOVERLOAD is retried once on the least-tasks pick, as ants does.
 *
 * The multipool's own state (open/closed) is one atomic word; release and
 * reboot change it and the sub-pools' states together under `life`, so a
 * release racing a reboot leaves either everything open or everything
 * closed. The sub-pools carry their own locks.
 */
#include "runtime/runtime.h"
#include "pool/pool_impl.h"

#include <limits.h>

#include <stdlib.h>

struct co_multipool {
    co_pool_t **pools; /* immutable after creation */
    int n;
    int lb;            /* CO_LB_* */
    bool func;         /* sub-pools are function pools */
    uint32_t rr;       /* atomic relaxed: round-robin counter */
    co_mutex_t life;   /* protects state changes and the sub-pools' release/reboot; a
                        * co_mutex (it parks), since the pool lock taken under it may
                        * yield the coroutine */
    uint32_t state;    /* [life] writes; atomic acquire reads: CO__POOL_OPEN / CLOSED */
    uint32_t tag;      /* CO__TAG_MPOOL from creation until destroy frees it (chan/chan.h) */
};
_Static_assert(offsetof(struct co_multipool, tag) >= 32, "the tag must lie past what free() writes");

#define MP_CHECK(mp, call) CO__HANDLE_CHECK(mp, CO__TAG_MPOOL, call)

/* The most sub-pools a multipool may have. Sub-pools spread the lock of
 * one pool over several; past a few per CPU they only cost memory (a
 * sub-pool is a few hundred bytes, made at once), and an n such as
 * INT_MAX made sub-pools until the OOM killer came. */
#define MP_MAX_POOLS 65536

static int mp_create(co_multipool_t **out, int n, int cap_each, void (*fn)(void *), int lb,
                     const co_pool_opts_t *opts) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    if (n <= 0 || n > MP_MAX_POOLS) return CO_EINVAL;                  /* ErrInvalidMultiPoolSize */
    if (lb != CO_LB_ROUND_ROBIN && lb != CO_LB_LEAST_TASKS) return CO_EINVAL; /* ErrInvalidLoadBalancingStrategy */
    co_multipool_t *mp = calloc(1, sizeof *mp);
    if (!mp) return CO_ENOMEM;
    mp->pools = calloc((size_t)n, sizeof *mp->pools);
    if (!mp->pools) {
        free(mp);
        return CO_ENOMEM;
    }
    mp->n = n;
    mp->lb = lb;
    mp->func = fn != NULL;
    mp->rr = UINT32_MAX; /* the first pick is sub-pool 0 */
    for (int i = 0; i < n; i++) {
        int rc = fn ? co_pool_new_func(&mp->pools[i], cap_each, fn, opts)
                    : co_pool_new(&mp->pools[i], cap_each, opts);
        if (rc < 0) { /* a sub-pool's error is returned as is */
            for (int j = 0; j < i; j++) co_pool_destroy(mp->pools[j]);
            free(mp->pools);
            free(mp);
            return rc;
        }
    }
    mp->tag = CO__TAG_MPOOL;
    *out = mp;
    return 0;
}

int co_multipool_new(co_multipool_t **out, int n, int cap_each, int lb, const co_pool_opts_t *opts) {
    return mp_create(out, n, cap_each, NULL, lb, opts);
}

int co_multipool_new_func(co_multipool_t **out, int n, int cap_each, void (*fn)(void *arg), int lb,
                          const co_pool_opts_t *opts) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    if (!fn) return CO_EINVAL;
    return mp_create(out, n, cap_each, fn, lb, opts);
}

static int least_tasks(const co_multipool_t *mp) {
    int best = 0, min = co_pool_running(mp->pools[0]);
    for (int i = 1; i < mp->n; i++) {
        int r = co_pool_running(mp->pools[i]);
        if (r < min) {
            min = r;
            best = i;
        }
    }
    return best;
}

static int pick(co_multipool_t *mp, int lb) {
    if (lb == CO_LB_LEAST_TASKS) return least_tasks(mp);
    return (int)(__atomic_add_fetch(&mp->rr, 1, __ATOMIC_RELAXED) % (uint32_t)mp->n);
}

static int mp_dispatch(co_multipool_t *mp, void (*fn)(void *), void *arg) {
    if (__atomic_load_n(&mp->state, __ATOMIC_ACQUIRE) != CO__POOL_OPEN) return CO_ECLOSED;
    co_pool_t *p = mp->pools[pick(mp, mp->lb)];
    int rc = mp->func ? co_pool_invoke(p, arg) : co_pool_submit(p, fn, arg);
    if (rc == CO_EOVERLOAD && mp->lb == CO_LB_ROUND_ROBIN) {
        p = mp->pools[least_tasks(mp)];
        rc = mp->func ? co_pool_invoke(p, arg) : co_pool_submit(p, fn, arg);
    }
    return rc;
}

int co_multipool_submit(co_multipool_t *mp, void (*fn)(void *arg), void *arg) {
    if (!mp) return CO_EINVAL;
    MP_CHECK(mp, "co_multipool_submit");
    if (!fn || mp->func) return CO_EINVAL;
    return mp_dispatch(mp, fn, arg);
}

int co_multipool_invoke(co_multipool_t *mp, void *arg) {
    if (!mp) return CO_EINVAL;
    MP_CHECK(mp, "co_multipool_invoke");
    if (!mp->func) return CO_EINVAL;
    return mp_dispatch(mp, NULL, arg);
}

/* A sum of the sub-pools' figures, as an int: INT_MAX when it does not
 * fit (pools of INT_MAX each, ants' default size, are ordinary). */
static int sum_clamped(int64_t s) { return s > INT_MAX ? INT_MAX : s < INT_MIN ? INT_MIN : (int)s; }

int co_multipool_running(const co_multipool_t *mp) {
    if (!mp) return CO_EINVAL;
    MP_CHECK(mp, "co_multipool_running");
    int64_t s = 0;
    for (int i = 0; i < mp->n; i++) s += co_pool_running(mp->pools[i]);
    return sum_clamped(s);
}

int co_multipool_waiting(const co_multipool_t *mp) {
    if (!mp) return CO_EINVAL;
    MP_CHECK(mp, "co_multipool_waiting");
    int64_t s = 0;
    for (int i = 0; i < mp->n; i++) s += co_pool_waiting(mp->pools[i]);
    return sum_clamped(s);
}

/* -1 when the sub-pools are unlimited (ants would sum their -1s). */
int co_multipool_cap(const co_multipool_t *mp) {
    if (!mp) return CO_EINVAL;
    MP_CHECK(mp, "co_multipool_cap");
    int64_t s = 0;
    for (int i = 0; i < mp->n; i++) {
        int c = co_pool_cap(mp->pools[i]);
        if (c < 0) return -1;
        s += c;
    }
    return sum_clamped(s);
}

int co_multipool_available(const co_multipool_t *mp) {
    if (!mp) return CO_EINVAL;
    MP_CHECK(mp, "co_multipool_available");
    int64_t s = 0;
    for (int i = 0; i < mp->n; i++) {
        int f = co_pool_available(mp->pools[i]);
        if (f == -1 && co_pool_cap(mp->pools[i]) < 0) return -1;
        s += f;
    }
    return sum_clamped(s);
}

static co_pool_t *at(const co_multipool_t *mp, int i, const char *call) {
    if (!mp) return NULL;
    MP_CHECK(mp, call);
    return (i >= 0 && i < mp->n) ? mp->pools[i] : NULL;
}

int co_multipool_running_by_index(const co_multipool_t *mp, int i) {
    co_pool_t *p = at(mp, i, "co_multipool_running_by_index");
    return p ? co_pool_running(p) : CO_EINVAL; /* ErrInvalidPoolIndex */
}
int co_multipool_available_by_index(const co_multipool_t *mp, int i) {
    co_pool_t *p = at(mp, i, "co_multipool_available_by_index");
    return p ? co_pool_available(p) : CO_EINVAL;
}
int co_multipool_waiting_by_index(const co_multipool_t *mp, int i) {
    co_pool_t *p = at(mp, i, "co_multipool_waiting_by_index");
    return p ? co_pool_waiting(p) : CO_EINVAL;
}

void co_multipool_tune(co_multipool_t *mp, int cap_each) {
    if (!mp) co__fatal("co_multipool_tune(NULL): no multipool");
    MP_CHECK(mp, "co_multipool_tune");
    for (int i = 0; i < mp->n; i++) co_pool_tune(mp->pools[i], cap_each);
}

bool co_multipool_is_closed(const co_multipool_t *mp) {
    if (!mp) return true;
    MP_CHECK(mp, "co_multipool_is_closed");
    return __atomic_load_n(&mp->state, __ATOMIC_ACQUIRE) != CO__POOL_OPEN;
}

/* Release every sub-pool at once, then wait for all of them against one
 * deadline (ants runs one ReleaseTimeout(d) per sub-pool concurrently: the
 * same bound). The first error wins: CO_ETIMEDOUT if any sub-pool still had
 * busy workers at the deadline, CO_ECLOSED if one was already closed. */
int co_multipool_release_timeout(co_multipool_t *mp, int64_t ns) {
    if (!mp) return CO_EINVAL;
    MP_CHECK(mp, "co_multipool_release_timeout");
    bool *mine = calloc((size_t)mp->n, sizeof *mine);
    if (!mine) return CO_ENOMEM;
    co_mutex_lock(&mp->life);
    if (mp->state != CO__POOL_OPEN) {
        co_mutex_unlock(&mp->life);
        free(mine);
        return CO_ECLOSED;
    }
    __atomic_store_n(&mp->state, CO__POOL_CLOSED, __ATOMIC_RELEASE);
    int64_t deadline = co_deadline_after(ns);
    int err = 0;
    for (int i = 0; i < mp->n; i++) {
        int rc = co__pool_release_begin(mp->pools[i]);
        mine[i] = rc == 0;
        if (rc < 0 && !err) err = rc;
    }
    co_mutex_unlock(&mp->life); /* not held across the waits */
    for (int i = 0; i < mp->n; i++) {
        if (!mine[i]) continue;
        int rc = co__pool_drain_until(mp->pools[i], deadline);
        if (rc < 0 && (!err || rc == CO_ETIMEDOUT)) err = rc;
    }
    free(mine);
    return err;
}

void co_multipool_reboot(co_multipool_t *mp) {
    if (!mp) co__fatal("co_multipool_reboot(NULL): no multipool");
    MP_CHECK(mp, "co_multipool_reboot");
    co_mutex_lock(&mp->life);
    if (mp->state != CO__POOL_OPEN) {
        __atomic_store_n(&mp->rr, UINT32_MAX, __ATOMIC_RELAXED);
        for (int i = 0; i < mp->n; i++) co_pool_reboot(mp->pools[i]);
        __atomic_store_n(&mp->state, CO__POOL_OPEN, __ATOMIC_RELEASE);
    }
    co_mutex_unlock(&mp->life);
}

void co_multipool_destroy(co_multipool_t *mp) {
    if (!mp) return;
    MP_CHECK(mp, "co_multipool_destroy");
    for (int i = 0; i < mp->n; i++) co_pool_destroy(mp->pools[i]);
    free(mp->pools);
    CO__HANDLE_KILL(mp, CO__TAG_MPOOL);
    free(mp);
}
