/* A million pending timers: co_after_func far in the future, each then
 * stopped (every stop must say it stopped it, and no function runs), then
 * freed. No thread per timer: they are entries on the runtime's per-P
 * timer heaps. */
// ctest-no-chaos
// ctest-timeout: 300
#include "t.h"

#include <colony.h>

/* A million everywhere but under TSan, where each timer costs ~50x (its
 * shadow memory and lock history): 200k there cover the same races. */
#if defined(__SANITIZE_THREAD__)
#define N (200 * 1000)
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define N (200 * 1000)
#endif
#endif
#ifndef N
#define N (1000 * 1000)
#endif

static uint32_t ran;
static void never(void *arg) {
    (void)arg;
    __atomic_add_fetch(&ran, 1, __ATOMIC_SEQ_CST);
}

static co_timer_t **timers;

static void test_million_pending(void) {
    timers = calloc(N, sizeof *timers);
    CHECK(timers != NULL);
    if (!timers) return;
    int made = 0;
    for (int i = 0; i < N; i++) {
        /* spread over an hour, not in order: the heap, not only the run */
        int64_t d = CO_HOUR + (int64_t)((uint32_t)i * 2654435761u % 3600u) * CO_SECOND;
        if (co_after_func(&timers[i], d, never, NULL) != 0) break;
        made++;
    }
    CHECK_EQ(made, N);
    int stopped = 0;
    for (int i = 0; i < made; i++) stopped += co_timer_stop(timers[i]);
    CHECK_EQ(stopped, made);
    for (int i = 0; i < made; i++) co_timer_free(timers[i]);
    CHECK_EQ(__atomic_load_n(&ran, __ATOMIC_SEQ_CST), 0);
    free(timers);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_million_pending);
    return 0;
}

int main(void) {
    t_begin(280);
    CHECK_EQ(co_main(run, NULL), 0);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
