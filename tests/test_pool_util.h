/* Helpers shared by the pool tests (not a test program itself). */
#ifndef COLONY_TEST_POOL_UTIL_H
#define COLONY_TEST_POOL_UTIL_H
#include <colony.h>
#include <pthread.h>
#include <stdatomic.h>

#include "t.h"

static inline int sanitized(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    return 1;
#endif
#endif
    return 0;
}
/* Scale a stress size down under sanitizers and in CI. */
static inline int scaled(int n, int small) {
    return (sanitized() || getenv("COLONY_CI")) ? small : n;
}

#define MS ((int64_t)1000000)

/* Run one test; with a name in $POOL_TEST, only that one. */
#define T_RUN_SEL(fn)                                                                       \
    do {                                                                                    \
        const char *sel_ = getenv("POOL_TEST");                                             \
        if (!sel_ || !strcmp(sel_, #fn)) {                                                  \
            int64_t t0_ = co_now();                                                         \
            T_RUN(fn);                                                                      \
            fprintf(stderr, "   %s: %lld ms\n", #fn, (long long)((co_now() - t0_) / 1000000)); \
        }                                                                                   \
    } while (0)

/* Poll cond until true or 10 s pass (behaviour, not timing). The value is
 * what the last poll saw: a condition that holds only between events (every
 * P idle between sysmon's retries, say) is not read a second time, where an
 * event could fall between the two reads. */
#define WAIT_FOR(cond)                                                                      \
    ({                                                                                      \
        int64_t wf_end_ = co_now() + 10000 * MS;                                            \
        bool wf_ok_;                                                                        \
        while (!(wf_ok_ = (cond)) && co_now() < wf_end_) co_sleep(1 * MS);                  \
        wf_ok_;                                                                             \
    })

/* A gate tasks wait on until the test opens it. */
typedef struct gate {
    co_waitgroup_t wg;
} gate_t;
static inline void gate_init(gate_t *g) {
    memset(g, 0, sizeof *g);
    co_waitgroup_add(&g->wg, 1);
}
static inline void gate_open(gate_t *g) { co_waitgroup_done(&g->wg); }
static inline void gate_wait(gate_t *g) { co_waitgroup_wait(&g->wg); }

/* A submit run in its own coroutine, so the test can watch it block. */
typedef struct bg_submit {
    co_pool_t *p;
    void (*fn)(void *);
    void *arg;
    int64_t deadline;
    atomic_int rc;
    atomic_int done;
} bg_submit_t;
static void bg_submit_main(void *a) {
    bg_submit_t *b = a;
    int rc = co_pool_submit_until(b->p, b->fn, b->arg, b->deadline);
    atomic_store(&b->rc, rc);
    atomic_store(&b->done, 1);
}
static inline void bg_submit_start(bg_submit_t *b, co_pool_t *p, void (*fn)(void *), void *arg) {
    b->p = p;
    b->fn = fn;
    b->arg = arg;
    b->deadline = CO_FOREVER;
    atomic_store(&b->rc, 1);
    atomic_store(&b->done, 0);
    CHECK_EQ(co_go(bg_submit_main, b), 0);
}
#endif
