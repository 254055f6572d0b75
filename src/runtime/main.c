/*
 * co_main: run fn as a coroutine named "main" and wait for it, from a plain
 * thread or a coroutine.
 *
 * The caller waits on its own parker. The coroutine finds that parker only
 * under `lock`, where the caller publishes it just before it parks, and the
 * park releases the lock only once the caller can no longer run: so the
 * coroutine never readies a caller that still runs, and a caller that
 * finds `done` set returns at once, the coroutine being past its last
 * touch of the arguments (its unlock).
 */
#include "runtime/proc.h"

struct main_args {
    int (*fn)(void *);
    void *arg;
    co__lock_t lock;   /* protects result, done and pk */
    bool done;         /* fn returned; result holds its value */
    int result;
    co__parker_t *pk;  /* the caller's parker, once it parks */
};

static void main_tramp(void *a_) {
    struct main_args *a = a_;
    int r = a->fn(a->arg);
    co__debug_leaks(); /* COLONY_DEBUG=leaks=1: who is still alive */
    co__lock(&a->lock);
    a->result = r;
    a->done = true;
    co__parker_t *pk = a->pk;
    co__unlock(&a->lock); /* last touch of *a: a caller not parked may return now */
    /* A parked caller stays parked until this unpark: pk outlives it. */
    if (pk && co__claim(pk, NULL)) co__unpark(pk);
}

int co_main(int (*fn)(void *arg), void *arg) {
    if (!fn) return CO_EINVAL;
    struct main_args a = {.fn = fn, .arg = arg};
    co_attr_t attr = {0, "main"};
    int rc = co_go_with(&attr, main_tramp, &a);
    if (rc < 0) return rc;
    co__parker_t pk;
    co__parker_init(&pk, CO__WR_MAIN);
    co__lock(&a.lock);
    if (a.done) {
        co__unlock(&a.lock);
    } else {
        a.pk = &pk;
        /* No deadline: only main_tramp claims pk, after it set the result.
         * The park releases a.lock once this caller can no longer run. */
        (void)co__park_lock(&pk, CO_FOREVER, &a.lock);
    }
    return a.result;
}
