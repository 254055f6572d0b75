/* A waitgroup released with many waiters at once: coroutines, plain
 * threads and waiters whose deadline races the release, through the
 * release's array and through its list fallback (no memory for the array);
 * and the last waiter freeing the waitgroup right after it returns. */
#include <colony.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "t.h"

#include "t_internal.h"

enum { NCO = 1500, NTIMED = 60, NTHREADS = 3, ROUNDS = 6 };

static co_waitgroup_t gate = CO_WAITGROUP_INIT;    /* the release under test */
static co_waitgroup_t started = CO_WAITGROUP_INIT; /* every waiter is about to wait */
static co_waitgroup_t finished = CO_WAITGROUP_INIT;
static atomic_long passed;      /* waits that returned 0 */
static atomic_long timed;       /* waits that returned CO_ETIMEDOUT */
static atomic_long forever_bad; /* a wait without deadline that returned non-zero */

static void waiter(void *arg) {
    intptr_t us = (intptr_t)arg; /* 0: no deadline */
    co_waitgroup_done(&started);
    int rc = co_waitgroup_wait_until(&gate, us ? co_deadline_after(us * 1000) : CO_FOREVER);
    if (rc == 0)
        atomic_fetch_add(&passed, 1);
    else if (rc == CO_ETIMEDOUT && us)
        atomic_fetch_add(&timed, 1);
    else
        atomic_fetch_add(&forever_bad, 1);
    co_waitgroup_done(&finished);
}

static void *thread_waiter(void *arg) {
    waiter(arg);
    return NULL;
}

static void test_release_many(void) {
    for (int round = 0; round < ROUNDS; round++) {
        /* odd rounds: the release finds no memory for its array */
        t_fail(CO__FAIL_WG_ARRAY, round & 1);
        atomic_store(&passed, 0);
        atomic_store(&timed, 0);
        int total = NCO + NTIMED + NTHREADS;
        co_waitgroup_add(&gate, 1);
        co_waitgroup_add(&started, total);
        co_waitgroup_add(&finished, total);
        for (int i = 0; i < NCO; i++) CHECK_EQ(co_go(waiter, NULL), 0);
        /* deadlines from 50 us to 3 ms: some fire before the release, some
         * race it, some come after it */
        for (int i = 0; i < NTIMED; i++)
            CHECK_EQ(co_go(waiter, (void *)(intptr_t)(50 + 50 * i)), 0);
        pthread_t th[NTHREADS];
        for (int i = 0; i < NTHREADS; i++)
            CHECK_EQ(pthread_create(&th[i], NULL, thread_waiter, NULL), 0);
        co_waitgroup_wait(&started);
        co_sleep(1000000 * (round % 3)); /* let 0, 1 or 2 ms of deadlines pass */
        co_waitgroup_done(&gate);
        co_waitgroup_wait(&finished);
        for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
        if (getenv("T_VERBOSE"))
            fprintf(stderr, "round %d: passed %ld timed %ld\n", round, atomic_load(&passed),
                    atomic_load(&timed));
        CHECK_EQ(atomic_load(&forever_bad), 0);
        CHECK_EQ(atomic_load(&passed) + atomic_load(&timed), total);
        /* every waiter without a deadline got through */
        CHECK(atomic_load(&passed) >= NCO + NTHREADS);
        /* the waitgroup is reusable at once */
        co_waitgroup_add(&gate, 1);
        co_waitgroup_done(&gate);
        CHECK_EQ(co_waitgroup_wait_until(&gate, 0), 0);
    }
    t_fail(CO__FAIL_WG_ARRAY, false);
}

/* The last waiter to return frees the waitgroup: the releaser must not
 * touch it after the waiters may return (ASan checks). */
struct freed {
    co_waitgroup_t *wg;
    atomic_int left;
    co_waitgroup_t done;
};

static void free_waiter(void *arg) {
    struct freed *f = arg;
    co_waitgroup_wait(f->wg);
    if (atomic_fetch_sub(&f->left, 1) == 1) free(f->wg);
    co_waitgroup_done(&f->done);
}

static void release(void *arg) { co_waitgroup_done(arg); }

static void test_last_waiter_frees(void) {
    int sizes[] = {1, 5, 16, 17, 200};
    for (int k = 0; k < 10; k++) {
        int n = sizes[k % 5];
        t_fail(CO__FAIL_WG_ARRAY, k >= 5);
        struct freed f;
        f.wg = malloc(sizeof *f.wg);
        CHECK(f.wg != NULL);
        if (!f.wg) return;
        *f.wg = (co_waitgroup_t)CO_WAITGROUP_INIT;
        atomic_store(&f.left, n);
        f.done = (co_waitgroup_t)CO_WAITGROUP_INIT;
        co_waitgroup_add(f.wg, 1);
        co_waitgroup_add(&f.done, n);
        for (int i = 0; i < n; i++) CHECK_EQ(co_go(free_waiter, &f), 0);
        co_yield(); /* let some of them park first */
        CHECK_EQ(co_go(release, f.wg), 0);
        co_waitgroup_wait(&f.done);
        CHECK_EQ(atomic_load(&f.left), 0);
    }
    t_fail(CO__FAIL_WG_ARRAY, false);
}

static int run_all(void *arg) {
    (void)arg;
    T_RUN(test_release_many);
    T_RUN(test_last_waiter_frees);
    return 0;
}

int main(void) {
    t_begin(110);
    CHECK_EQ(co_main(run_all, NULL), 0);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
