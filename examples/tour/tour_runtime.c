/* Tour, part 1: coroutines, waiting for them, sleeping, the scheduler. */
#include "tour.h"

#include <stdio.h>

static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static long results[8];

static void square(void *arg) {
    long i = (long)arg;
    results[i] = i * i; /* each coroutine writes its own slot */
    co_waitgroup_done(&wg);
}

static void sleeper(void *arg) {
    co_sleep((int64_t)(long)arg * 1000000); /* milliseconds -> ns */
    printf("  coroutine %llu woke after %ld ms\n", (unsigned long long)co_id(), (long)arg);
    co_waitgroup_done(&wg);
}

static long spin_sum;
static void busy(void *arg) {
    long s = 0;
    for (long i = 0; i < 20000000; i++) s += i ^ (long)arg;
    __atomic_add_fetch(&spin_sum, s & 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

void tour_runtime(void) {
    printf("1. Coroutines\n");
    printf("  we run as coroutine %llu; co_go starts more, a waitgroup waits for them:\n",
           (unsigned long long)co_id());
    co_waitgroup_add(&wg, 8);
    for (long i = 0; i < 8; i++) co_go(square, (void *)i);
    co_waitgroup_wait(&wg);
    printf("  squares:");
    for (int i = 0; i < 8; i++) printf(" %ld", results[i]);
    printf("\n");

    printf("  co_sleep parks only the coroutine; three sleepers, shortest first:\n");
    co_waitgroup_add(&wg, 3);
    co_go(sleeper, (void *)30L);
    co_go(sleeper, (void *)10L);
    co_go(sleeper, (void *)20L);
    co_waitgroup_wait(&wg);

    co_attr_t attr = {.stack_size = 64 * 1024, .name = "small-stack"};
    co_waitgroup_add(&wg, 1);
    co_go_with(&attr, square, (void *)7L);
    co_waitgroup_wait(&wg);
    printf("  co_go_with: a named coroutine with a 64 KiB stack computed 7*7 = %ld\n", results[7]);

    printf("  CPU-bound coroutines spread over the Ps (work stealing); the scheduler:\n");
    co_waitgroup_add(&wg, 4);
    for (long i = 0; i < 4; i++) co_go(busy, (void *)i);
    co_sched_stats_t st;
    co_sched_stats(&st);
    printf("  co_sched_stats, the figures of Go's schedtrace line:\n");
    printf("    gomaxprocs=%d idleprocs=%d threads=%d spinningthreads=%d idlethreads=%d "
           "runqueue=%lld [",
           st.procs, st.idle_procs, st.threads, st.spinning_threads, st.idle_threads,
           (long long)st.global_runq);
    int lens[64];
    int np = co_sched_runq_lens(lens, 64);
    for (int i = 0; i < np; i++) printf(i ? " %d" : "%d", lens[i]);
    printf("], %lld coroutines alive\n", (long long)st.coroutines);
    co_waitgroup_wait(&wg);
    printf("  (run with COLONY_DEBUG=schedtrace=100 to see it every 100 ms)\n\n");
}
