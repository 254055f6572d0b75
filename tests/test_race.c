/* The race detector (TSan builds only; skipped elsewhere): a million
 * coroutines start and exit on one P, each a TSan fiber of its own for its
 * lifetime. */
// ctest-timeout: 600
// ctest-no-chaos (the million take long enough once)
#include <colony.h>
#include <stdlib.h>
#include <string.h>

#include "t.h"

/* A million coroutines start and exit on one P, in batches spawned by a
 * coroutine: their G records come back hot from the P's cache, each
 * hosting a hundred thousand lifetimes, every one a TSan fiber of its own
 * (a fiber kept by the record for all of them overflowed TSan's shadow
 * stack of its calls, and crashed, at about the 10^5th). */
enum { TOTAL = 1000000, BATCH = 10 };
static co_waitgroup_t batch = CO_WAITGROUP_INIT;
static long counted; /* atomic: the coroutines of a batch are not ordered */
static void one(void *arg) {
    (void)arg;
    __atomic_add_fetch(&counted, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&batch);
}
static int spawn_all(void *arg) {
    (void)arg;
    for (int b = 0; b < TOTAL / BATCH; b++) {
        co_waitgroup_add(&batch, BATCH);
        for (int i = 0; i < BATCH; i++) CHECK_EQ(co_go(one, NULL), 0);
        co_waitgroup_wait(&batch);
    }
    return 0;
}
static void test_million_one_p(void) {
    CHECK_EQ(co_main(spawn_all, NULL), 0);
    CHECK_EQ(__atomic_load_n(&counted, __ATOMIC_RELAXED), TOTAL);
}

int main(void) {
    if (!t_tsan()) {
        fprintf(stderr, "test_race: not a TSan build: skipped\n");
        return 77;
    }
    t_begin(580);
    co_config_t cfg = {.procs = 1};
    CHECK_EQ(co_init(&cfg), 0);
    T_RUN(test_million_one_p);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
