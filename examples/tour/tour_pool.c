/* Tour, part 3: the pool — a port of ants' "How to use" program (the
 * default pool, a pool bound to a function, multipools with both
 * load-balancing strategies), then a million 10 ms tasks through a pool of
 * 50,000 workers, and what colony adds: panics, deadlines, wait_idle, stats. */
#include "tour.h"

#include <stdio.h>

static int32_t sum;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static int hello_printed;

static void my_func(void *arg) { /* ants' myFunc: add i to the sum */
    __atomic_add_fetch(&sum, (int32_t)(intptr_t)arg, __ATOMIC_RELAXED);
}

static void demo_func(void) { /* ants' demoFunc: sleep 10 ms, say hello */
    co_sleep(10 * 1000000);
    /* ants prints this 1,000 times; three are enough here */
    if (__atomic_fetch_add(&hello_printed, 1, __ATOMIC_RELAXED) < 3) printf("  Hello World!\n");
}

static void sync_calculate_sum(void *arg) {
    demo_func();
    co_waitgroup_done(&wg);
}

static void sum_and_done(void *arg) {
    my_func(arg);
    co_waitgroup_done(&wg);
}

/* The million-task run. */
static int64_t done_10ms;
static void sleep_10ms(void *arg) {
    co_sleep(10 * 1000000);
    __atomic_add_fetch(&done_10ms, 1, __ATOMIC_RELAXED);
}

static void progress(int64_t done, int64_t total, int64_t t0) {
    char bar[41];
    int n = (int)(done * 40 / total);
    for (int i = 0; i < 40; i++) bar[i] = i < n ? '#' : '.';
    bar[40] = 0;
    printf("\r  [%s] %7lld/%lld done, %5.2f s", bar, (long long)done, (long long)total,
           (double)(co_now() - t0) / 1e9);
    fflush(stdout);
}

static void print_stats(const char *what, co_pool_t *p) {
    co_pool_stats_t st;
    co_pool_stats(p, &st);
    printf("  %s: running %d, available %d, waiting %d\n", what, co_pool_running(p),
           co_pool_available(p), co_pool_waiting(p));
    printf("  stats: busy %lld, idle %lld, submitted %lld, completed %lld, rejected %lld, "
           "panicked %lld\n",
           (long long)st.busy, (long long)st.idle, (long long)st.submitted,
           (long long)st.completed, (long long)st.rejected, (long long)st.panicked);
}

static void oops(void *arg) { co_panic(arg); }
static void on_panic(void *value, void *ctx) {
    printf("  panic handler: task panicked with %p (ctx %s)\n", value, (const char *)ctx);
}
static void parked(void *arg) { co_sleep(50 * 1000000); }
static co_pool_t *self_pool;
static int self_rc;
static void submits_to_itself(void *arg) { self_rc = co_pool_submit(self_pool, parked, NULL); }

void tour_pool(void) {
    const int run_times = 1000;
    printf("3. The pool (ants)\n");

    /* Use the common pool. */
    for (int i = 0; i < run_times; i++) {
        co_waitgroup_add(&wg, 1);
        co_submit(sync_calculate_sum, NULL);
    }
    co_waitgroup_wait(&wg);
    printf("  (... %d tasks in all)\n", run_times);
    printf("  running workers: %d\n", co_pool_running(co_default_pool()));
    printf("  finish all tasks.\n");

    /* Use the pool with a function: capacity 10. */
    co_pool_t *p;
    co_pool_new_func(&p, 10, sum_and_done, NULL);
    for (int i = 0; i < run_times; i++) {
        co_waitgroup_add(&wg, 1);
        co_pool_invoke(p, (void *)(intptr_t)i);
    }
    co_waitgroup_wait(&wg);
    printf("  running workers: %d\n", co_pool_running(p));
    printf("  finish all tasks, result is %d%s\n", sum, sum == 499500 ? "" : "  WRONG");
    co_pool_release(p);

    /* Multipool: 10 unlimited pools, round-robin. */
    co_multipool_t *mp;
    co_multipool_new(&mp, 10, -1, CO_LB_ROUND_ROBIN, NULL);
    for (int i = 0; i < run_times; i++) {
        co_waitgroup_add(&wg, 1);
        co_multipool_submit(mp, sync_calculate_sum, NULL);
    }
    co_waitgroup_wait(&wg);
    printf("  multipool (round-robin): running workers: %d\n", co_multipool_running(mp));
    printf("  finish all tasks.\n");

    /* Multipool with a function: 10 pools of run_times/10, least-tasks. */
    co_multipool_t *mpf;
    co_multipool_new_func(&mpf, 10, run_times / 10, sum_and_done, CO_LB_LEAST_TASKS, NULL);
    for (int i = 0; i < run_times; i++) {
        co_waitgroup_add(&wg, 1);
        co_multipool_invoke(mpf, (void *)(intptr_t)i);
    }
    co_waitgroup_wait(&wg);
    printf("  multipool (least-tasks): running workers: %d\n", co_multipool_running(mpf));
    printf("  finish all tasks, result is %d%s\n", sum, sum == 499500 * 2 ? "" : "  WRONG");
    co_multipool_release_timeout(mp, 5000000000LL);
    co_multipool_release_timeout(mpf, 5000000000LL);
    co_multipool_destroy(mp);
    co_multipool_destroy(mpf);
    co_pool_destroy(p);

    /* A million 10 ms tasks through 50,000 workers. */
    const int64_t total = 1000000;
    printf("  %lld tasks of 10 ms through a pool of 50,000 workers:\n", (long long)total);
    co_pool_t *big;
    co_pool_new(&big, 50000, NULL);
    int64_t t0 = co_now();
    for (int64_t i = 0; i < total; i++) {
        co_pool_submit(big, sleep_10ms, NULL); /* blocks while all 50,000 are busy */
        if ((i + 1) % (total / 10) == 0)
            progress(__atomic_load_n(&done_10ms, __ATOMIC_RELAXED), total, t0);
    }
    co_pool_wait_idle(big, CO_FOREVER); /* colony: wait for every task, pool stays open */
    progress(__atomic_load_n(&done_10ms, __ATOMIC_RELAXED), total, t0);
    printf("\n");
    print_stats("after the run", big);
    co_pool_destroy(big);

    /* What colony adds. */
    co_pool_opts_t o = {.panic_handler = on_panic, .ctx = "tour"};
    co_pool_t *small;
    co_pool_new(&small, 1, &o);
    co_pool_submit(small, oops, (void *)0xdead);
    co_pool_wait_idle(small, CO_FOREVER);
    self_pool = small;
    co_pool_submit(small, submits_to_itself, NULL);
    co_pool_wait_idle(small, CO_FOREVER);
    printf("  a task submitting to its own full pool: %s\n", co_strerror(self_rc));
    co_pool_submit(small, parked, NULL);
    int rc = co_pool_submit_until(small, parked, NULL, co_deadline_after(5 * 1000000));
    printf("  a submit with a 5 ms deadline on a full pool: %s\n", co_strerror(rc));
    print_stats("small pool", small);
    co_pool_destroy(small);
    printf("\n");
}
