/*
 * bench_pool.c — the pool benchmarks, one measurement per process,
 * printing the bench_util.h line. The Go peers are in bench/go/pool.
 *
 *   bench_pool sleep    [procs=2] [n=1000000] [cap=50000] [ms=10]
 *       n tasks of co_sleep(ms) through a blocking pool of `cap`, submitted
 *       from one coroutine; wall time from the first submit until every task
 *       finished; peak RSS; RSS per worker = (peak - RSS before) / cap.
 *   bench_pool raw_sleep [procs=2] [n=1000000] [ms=10]
 *       the same with one co_go per task (colony's "raw goroutines").
 *   bench_pool tiny     [procs=2] [n=1000000] [cap=1000] [thread=0]
 *       n tasks that do one atomic add, through a blocking pool of `cap`,
 *       submitted from one coroutine (thread=0) or one plain thread
 *       (thread=1); ns_per_op is wall / n.
 *   bench_pool latency  [procs=2] [n=200000] [cap=1000] [us=1000]
 *       the pool kept full of tasks sleeping `us` microseconds; one
 *       coroutine submits n more; every submit's duration is recorded:
 *       p50 / p99 / max of a blocking submit on a full pool.
 * The output's lock= names the pool lock the library was built with:
 * yield (the default), spin (-DCOLONY_POOL_SPINLOCK, ants' spinlock) or
 * futex (-DCOLONY_POOL_FUTEXLOCK, co__lock_t); bench/run_pool.sh builds
 * the two alternatives itself to compare them.
 */
#include "bench_util.h"

#include <pthread.h>

/* Starts the runtime with `procs` Ps and, if $BENCH_STACK_KB is set, that
 * default coroutine stack size (the pool's workers use the default). */
static void pool_bench_init(int procs) {
    const char *e = getenv("BENCH_STACK_KB");
    size_t ss = e ? (size_t)atol(e) * 1024 : 0;
    int rc = co_init(&(co_config_t){.procs = procs, .stack_size = ss});
    if (rc != 0) {
        fprintf(stderr, "co_init(procs=%d, stack %zu): %s\n", procs, ss, co_strerror(rc));
        exit(1);
    }
}
static size_t stack_kb(void) {
    const char *e = getenv("BENCH_STACK_KB");
    return e ? (size_t)atol(e) : 256;
}

#if defined(COLONY_POOL_SPINLOCK)
#define LOCK_NAME "spin"
#elif defined(COLONY_POOL_FUTEXLOCK)
#define LOCK_NAME "futex"
#else
#define LOCK_NAME "yield"
#endif

static int64_t counter;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

/* ---- sleep / raw_sleep ---------------------------------------------------- */

static int64_t g_n, g_cap, g_ms, g_us, g_thread;

/* CPU time (user + system) of the whole process so far, in ns. */
static int64_t cpu_ns(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000 +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}
static int64_t g_cpu0, g_cpu;
static int64_t g_wall;
static long g_rss_before;

static void sleep_task(void *arg) {
    (void)arg;
    co_sleep(g_ms * 1000000);
}

static int sleep_main(void *arg) {
    (void)arg;
    co_pool_t *p;
    BENCH_CHECK(co_pool_new(&p, (int)g_cap, NULL));
    g_rss_before = bench_cur_rss_kb();
    int64_t t0 = bench_now();
    g_cpu0 = cpu_ns();
    for (int64_t i = 0; i < g_n; i++) BENCH_CHECK(co_pool_submit(p, sleep_task, NULL));
    BENCH_CHECK(co_pool_wait_idle(p, CO_FOREVER));
    g_wall = bench_now() - t0;
    g_cpu = cpu_ns() - g_cpu0;
    co_pool_destroy(p);
    return 0;
}

static int run_sleep(int argc, char **argv) {
    int procs = (int)bench_arg(argc, argv, 0, 2);
    g_n = bench_arg(argc, argv, 1, 1000000);
    g_cap = bench_arg(argc, argv, 2, 50000);
    g_ms = bench_arg(argc, argv, 3, 10);
    pool_bench_init(procs);
    co_main(sleep_main, NULL);
    long peak = bench_peak_rss_kb();
    double floor_ms = (double)((g_n + g_cap - 1) / g_cap) * (double)g_ms;
    bench_report("pool_sleep", procs, (double)g_wall / (double)g_n, g_n,
                 " lock=%s stack_kb=%zu cap=%lld task_ms=%lld wall_ms=%.1f cpu_ns_per_op=%.0f floor_ms=%.0f rss_per_worker_b=%.0f",
                 LOCK_NAME, stack_kb(), (long long)g_cap, (long long)g_ms, (double)g_wall / 1e6, (double)g_cpu / (double)g_n, floor_ms,
                 (double)(peak - g_rss_before) * 1024.0 / (double)g_cap);
    return 0;
}

static void raw_sleep_task(void *arg) {
    (void)arg;
    co_sleep(g_ms * 1000000);
    co_waitgroup_done(&wg);
}

static int raw_sleep_main(void *arg) {
    (void)arg;
    int64_t t0 = bench_now();
    g_cpu0 = cpu_ns();
    co_waitgroup_add(&wg, (int)g_n);
    for (int64_t i = 0; i < g_n; i++) BENCH_CHECK(co_go(raw_sleep_task, NULL));
    co_waitgroup_wait(&wg);
    g_wall = bench_now() - t0;
    g_cpu = cpu_ns() - g_cpu0;
    return 0;
}

static int run_raw_sleep(int argc, char **argv) {
    int procs = (int)bench_arg(argc, argv, 0, 2);
    g_n = bench_arg(argc, argv, 1, 1000000);
    g_ms = bench_arg(argc, argv, 2, 10);
    pool_bench_init(procs);
    co_main(raw_sleep_main, NULL);
    bench_report("raw_sleep", procs, (double)g_wall / (double)g_n, g_n,
                 " stack_kb=%zu task_ms=%lld wall_ms=%.1f cpu_ns_per_op=%.0f", stack_kb(), (long long)g_ms,
                 (double)g_wall / 1e6, (double)g_cpu / (double)g_n);
    return 0;
}

/* ---- tiny ------------------------------------------------------------------- */

static void tiny_task(void *arg) {
    (void)arg;
    __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
}

static void tiny_submit_all(void) {
    co_pool_t *p;
    BENCH_CHECK(co_pool_new(&p, (int)g_cap, NULL));
    int64_t t0 = bench_now();
    g_cpu0 = cpu_ns();
    for (int64_t i = 0; i < g_n; i++) BENCH_CHECK(co_pool_submit(p, tiny_task, NULL));
    BENCH_CHECK(co_pool_wait_idle(p, CO_FOREVER));
    g_wall = bench_now() - t0;
    g_cpu = cpu_ns() - g_cpu0;
    co_pool_destroy(p);
}

static int tiny_main(void *arg) {
    (void)arg;
    tiny_submit_all();
    return 0;
}

static int run_tiny(int argc, char **argv) {
    int procs = (int)bench_arg(argc, argv, 0, 2);
    g_n = bench_arg(argc, argv, 1, 1000000);
    g_cap = bench_arg(argc, argv, 2, 1000);
    g_thread = argc > 3 ? atoll(argv[3]) : 0;
    pool_bench_init(procs);
    if (g_thread)
        tiny_submit_all(); /* this plain thread is the submitter */
    else
        co_main(tiny_main, NULL);
    if (counter != g_n) {
        fprintf(stderr, "tiny: %lld tasks ran, wanted %lld\n", (long long)counter, (long long)g_n);
        return 1;
    }
    bench_report(g_thread ? "pool_tiny_thread" : "pool_tiny_co", procs, (double)g_wall / (double)g_n,
                 g_n, " lock=%s cap=%lld wall_ms=%.1f cpu_ns_per_op=%.0f mtasks_per_s=%.2f", LOCK_NAME,
                 (long long)g_cap, (double)g_wall / 1e6, (double)g_cpu / (double)g_n,
                 (double)g_n / ((double)g_wall / 1e9) / 1e6);
    return 0;
}

/* ---- latency ----------------------------------------------------------------- */

static int64_t *lat;

static void lat_task(void *arg) {
    (void)arg;
    co_sleep(g_us * 1000);
}

static int latency_main(void *arg) {
    (void)arg;
    co_pool_t *p;
    BENCH_CHECK(co_pool_new(&p, (int)g_cap, NULL));
    for (int64_t i = 0; i < g_cap; i++) BENCH_CHECK(co_pool_submit(p, lat_task, NULL)); /* fill */
    int64_t t0 = bench_now();
    g_cpu0 = cpu_ns();
    for (int64_t i = 0; i < g_n; i++) {
        int64_t a = bench_now();
        BENCH_CHECK(co_pool_submit(p, lat_task, NULL));
        lat[i] = bench_now() - a;
    }
    g_wall = bench_now() - t0;
    g_cpu = cpu_ns() - g_cpu0;
    BENCH_CHECK(co_pool_wait_idle(p, CO_FOREVER));
    co_pool_destroy(p);
    return 0;
}

static int run_latency(int argc, char **argv) {
    int procs = (int)bench_arg(argc, argv, 0, 2);
    g_n = bench_arg(argc, argv, 1, 200000);
    g_cap = bench_arg(argc, argv, 2, 1000);
    g_us = bench_arg(argc, argv, 3, 1000);
    lat = malloc((size_t)g_n * sizeof *lat);
    if (!lat) return 1;
    pool_bench_init(procs);
    co_main(latency_main, NULL);
    int64_t p50 = bench_quantile(lat, (size_t)g_n, 0.50);
    int64_t p99 = bench_quantile(lat, (size_t)g_n, 0.99);
    int64_t mx = bench_quantile(lat, (size_t)g_n, 1.0);
    bench_report("pool_latency", procs, (double)g_wall / (double)g_n, g_n,
                 " lock=%s cap=%lld task_us=%lld p50_ns=%lld p99_ns=%lld max_ns=%lld", LOCK_NAME,
                 (long long)g_cap, (long long)g_us, (long long)p50, (long long)p99, (long long)mx);
    return 0;
}

int main(int argc, char **argv) {
    static const bench_cmd_t cmds[] = {
        {"sleep", "[procs=2] [n=1000000] [cap=50000] [ms=10]", run_sleep},
        {"raw_sleep", "[procs=2] [n=1000000] [ms=10]", run_raw_sleep},
        {"tiny", "[procs=2] [n=1000000] [cap=1000] [thread=0|1]", run_tiny},
        {"latency", "[procs=2] [n=200000] [cap=1000] [us=1000]", run_latency},
        {NULL, NULL, NULL},
    };
    return bench_dispatch(cmds, argc, argv);
}
