/*
 * bench_runtime.c — runtime benchmarks of issue 2, one measurement per run.
 *
 *   bench_runtime yield  [procs=1] [yields=5000000]   two coroutines ping-pong co_yield
 *   bench_runtime spawn  [procs=2] [n=1000000]        spawn+run+exit, joined by a waitgroup
 *   bench_runtime park   [procs=2] [n=1000000]        n coroutines parked at once: RSS per coroutine
 *   bench_runtime sleep  [procs=2] [n=100000] [ms=10] n parked coroutines released at once,
 *                                                     each sleeps ms: wall time release->all done
 *   bench_runtime timer  [procs=2] [n=1000] [us=100]  overshoot of a us-long sleep (p50/p99)
 *   bench_runtime spread [procs] [tasks=20000] [work=20000]   2 streams of small CPU tasks
 *   bench_runtime spread_long [procs] [chunks=2000] [work=20000] 2 long computations that yield
 *
 * The Go peer (bench/go/runtime) implements the same names and arguments.
 * Each prints one line (see bench_util.h); bench/run.sh alternates them.
 */
#include "bench_util.h"


/* ---- yield: two coroutines on one P hand the P back and forth ---------- */

static long long yield_n;
static co_waitgroup_t yield_wg;
static uint64_t yield_last;      /* id of the coroutine that ran last (1 P: no race) */
static long long yield_switches; /* times the running coroutine changed */

static void yield_worker(void *arg)
{
    uint64_t me = co_id();
    for (long long i = 0; i < yield_n; i++) {
        if (yield_last != me) {
            yield_last = me;
            yield_switches++;
        }
        co_yield();
    }
    co_waitgroup_done(&yield_wg);
}

static int yield_main(void *arg)
{
    int procs = co_procs();
    co_waitgroup_add(&yield_wg, 2);
    int64_t t0 = bench_now();
    BENCH_CHECK(co_go(yield_worker, NULL));
    BENCH_CHECK(co_go(yield_worker, NULL));
    co_waitgroup_wait(&yield_wg);
    int64_t dt = bench_now() - t0;
    long long ops = 2 * yield_n; /* every co_yield is one switch when both alternate */
    bench_report("yield", procs, (double)dt / (double)ops, ops, " switches=%lld", yield_switches);
    return 0;
}

static int cmd_yield(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 1);
    yield_n = bench_arg(argc, argv, 1, 5000000);
    bench_init(procs);
    return co_main(yield_main, NULL);
}

/* ---- spawn: n empty coroutines, joined by one waitgroup ---------------- */

static long long spawn_n;
/* On a cache line of its own, so that the figure does not depend on where
 * the linker puts its neighbours: every coroutine writes it, and a
 * neighbour the spawner read each iteration would cost a miss per spawn. */
static struct {
    _Alignas(64) co_waitgroup_t wg; /* (the struct's size rounds up to the line) */
} spawn_line;
#define spawn_wg (spawn_line.wg)

static void spawn_empty(void *arg) { co_waitgroup_done(&spawn_wg); }

static int spawn_main(void *arg)
{
    int procs = co_procs();
    long long n = spawn_n; /* a local, as the Go peer's loop bound */
    int64_t t0 = bench_now();
    co_waitgroup_add(&spawn_wg, (int)n);
    for (long long i = 0; i < n; i++)
        BENCH_CHECK(co_go(spawn_empty, NULL));
    co_waitgroup_wait(&spawn_wg);
    int64_t dt = bench_now() - t0;
    bench_report("spawn", procs, (double)dt / (double)spawn_n, spawn_n, NULL);
    return 0;
}

static int cmd_spawn(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    spawn_n = bench_arg(argc, argv, 1, 1000000);
    bench_init(procs);
    return co_main(spawn_main, NULL);
}

/* ---- park: n coroutines alive at once, each parked on a waitgroup ------ */

static long long park_n;
static co_waitgroup_t park_started, park_gate, park_finished;

static void park_worker(void *arg)
{
    co_waitgroup_done(&park_started);
    co_waitgroup_wait(&park_gate); /* parked until every coroutine exists */
    co_waitgroup_done(&park_finished);
}

static int park_main(void *arg)
{
    int procs = co_procs();
    long base_kb = bench_cur_rss_kb();
    co_waitgroup_add(&park_started, (int)park_n);
    co_waitgroup_add(&park_finished, (int)park_n);
    co_waitgroup_add(&park_gate, 1);
    int64_t t0 = bench_now();
    for (long long i = 0; i < park_n; i++)
        BENCH_CHECK(co_go(park_worker, NULL));
    co_waitgroup_wait(&park_started);
    int64_t dt = bench_now() - t0;
    int alive = co_count() - 1; /* minus this (main) coroutine */
    long parked_kb = bench_cur_rss_kb();
    co_waitgroup_done(&park_gate);
    co_waitgroup_wait(&park_finished);
    long peak_kb = bench_peak_rss_kb();
    double per_co = (double)(peak_kb - base_kb) * 1024.0 / (double)park_n;
    bench_report("park", procs, (double)dt / (double)park_n, park_n,
                 " bytes_per_co=%.0f base_rss_kb=%ld parked_rss_kb=%ld alive=%d", per_co, base_kb,
                 parked_kb, alive);
    return 0;
}

static int cmd_park(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    park_n = bench_arg(argc, argv, 1, 1000000);
    bench_init(procs);
    return co_main(park_main, NULL);
}

/* ---- sleep: n coroutines each sleeping ms, all timers pending at once -- */

static long long sleep_n;
static int64_t sleep_ns;
static co_waitgroup_t sleep_started, sleep_gate, sleep_wg;
static long long sleep_pending;     /* sleepers now; relaxed atomics (a statistic) */
static long long sleep_max_pending; /* most sleepers seen at once; relaxed CAS */
static long long sleep_errors;      /* co_sleep failures or early returns; relaxed */

static void sleep_worker(void *arg)
{
    co_waitgroup_done(&sleep_started);
    co_waitgroup_wait(&sleep_gate); /* every coroutine exists before the first timer is armed */
    long long p = __atomic_add_fetch(&sleep_pending, 1, __ATOMIC_RELAXED);
    long long m = __atomic_load_n(&sleep_max_pending, __ATOMIC_RELAXED);
    while (p > m && !__atomic_compare_exchange_n(&sleep_max_pending, &m, p, true, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
    }
    int64_t t = bench_now();
    int rc = co_sleep(sleep_ns);
    if (rc != 0 || bench_now() - t < sleep_ns)
        __atomic_add_fetch(&sleep_errors, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&sleep_pending, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&sleep_wg);
}

static int sleep_main(void *arg)
{
    int procs = co_procs();
    co_waitgroup_add(&sleep_started, (int)sleep_n);
    co_waitgroup_add(&sleep_gate, 1);
    co_waitgroup_add(&sleep_wg, (int)sleep_n);
    int64_t t0 = bench_now();
    for (long long i = 0; i < sleep_n; i++)
        BENCH_CHECK(co_go(sleep_worker, NULL));
    co_waitgroup_wait(&sleep_started);
    int64_t spawned = bench_now() - t0;
    int64_t t1 = bench_now();
    co_waitgroup_done(&sleep_gate);
    co_waitgroup_wait(&sleep_wg);
    int64_t dt = bench_now() - t1;
    bench_report("sleep", procs, (double)dt / (double)sleep_n, sleep_n,
                 " wall_ms=%.2f spawn_ms=%.2f max_pending=%lld errors=%lld", (double)dt / 1e6,
                 (double)spawned / 1e6, sleep_max_pending, sleep_errors);
    return 0;
}

static int cmd_sleep(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    sleep_n = bench_arg(argc, argv, 1, 100000);
    sleep_ns = bench_arg(argc, argv, 2, 10) * 1000000;
    bench_init(procs);
    return co_main(sleep_main, NULL);
}

/* ---- timer: how late does a short sleep return? ------------------------ */

static long long timer_n;
static int64_t timer_ns;

static int timer_main(void *arg)
{
    int procs = co_procs();
    int64_t *over = calloc((size_t)timer_n, sizeof *over);
    if (!over)
        return 1;
    long long early = 0;
    for (long long i = 0; i < timer_n; i++) {
        int64_t t = bench_now();
        BENCH_CHECK(co_sleep(timer_ns));
        int64_t o = bench_now() - t - timer_ns;
        if (o < 0)
            early++;
        over[i] = o;
    }
    int64_t p50 = bench_quantile(over, (size_t)timer_n, 0.50);
    int64_t p99 = bench_quantile(over, (size_t)timer_n, 0.99);
    bench_report("timer", procs, (double)p50, timer_n,
                 " sleep_ns=%lld p50_ns=%lld p99_ns=%lld min_ns=%lld max_ns=%lld early=%lld",
                 (long long)timer_ns, (long long)p50, (long long)p99, (long long)over[0],
                 (long long)over[timer_n - 1], early);
    free(over);
    return 0;
}

static int cmd_timer(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    timer_n = bench_arg(argc, argv, 1, 1000);
    timer_ns = bench_arg(argc, argv, 2, 100) * 1000;
    bench_init(procs);
    return co_main(timer_main, NULL);
}

/* ---- spread: 2 CPU-bound streams on 1 P vs 2 Ps ------------------------ */

#define SPREAD_BATCH 64

static long long spread_tasks, spread_work;
static uint64_t spread_sink; /* keeps the work alive; relaxed atomic xor */

/* A serial xorshift chain: the same instructions in C and in Go. */
static uint64_t spread_compute(uint64_t x, long long iters)
{
    for (long long i = 0; i < iters; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    return x;
}

typedef struct spread_batch {
    co_waitgroup_t wg;
    uint64_t seed;
} spread_batch_t;

static void spread_task(void *arg)
{
    spread_batch_t *b = arg;
    uint64_t r = spread_compute(b->seed | 1, spread_work);
    __atomic_xor_fetch(&spread_sink, r, __ATOMIC_RELAXED);
    co_waitgroup_done(&b->wg);
}

static co_waitgroup_t spread_streams;

/* One stream: spawns its tasks in batches and waits for each batch. */
static void spread_stream(void *arg)
{
    long long todo = spread_tasks / 2;
    spread_batch_t b = {.wg = CO_WAITGROUP_INIT, .seed = (uintptr_t)arg};
    while (todo > 0) {
        int k = todo < SPREAD_BATCH ? (int)todo : SPREAD_BATCH;
        co_waitgroup_add(&b.wg, k);
        for (int i = 0; i < k; i++)
            BENCH_CHECK(co_go(spread_task, &b));
        co_waitgroup_wait(&b.wg);
        todo -= k;
    }
    co_waitgroup_done(&spread_streams);
}

/* One long computation split in chunks, yielding between chunks. */
static void spread_long_stream(void *arg)
{
    uint64_t x = (uintptr_t)arg | 1;
    for (long long c = 0; c < spread_tasks / 2; c++) {
        x = spread_compute(x, spread_work);
        co_yield();
    }
    __atomic_xor_fetch(&spread_sink, x, __ATOMIC_RELAXED);
    co_waitgroup_done(&spread_streams);
}

static int spread_run(void (*stream)(void *), const char *name)
{
    int procs = co_procs();
    int64_t t0 = bench_now();
    co_waitgroup_add(&spread_streams, 2);
    BENCH_CHECK(co_go(stream, (void *)(uintptr_t)12345));
    BENCH_CHECK(co_go(stream, (void *)(uintptr_t)67890));
    co_waitgroup_wait(&spread_streams);
    int64_t dt = bench_now() - t0;
    long long ops = spread_tasks / 2 * 2;
    bench_report(name, procs, (double)dt / (double)ops, ops,
                 " tasks_per_s=%.0f work=%lld sink=%llu", (double)ops * 1e9 / (double)dt,
                 spread_work, (unsigned long long)(spread_sink & 0xff));
    return 0;
}

static int spread_main(void *arg) { return spread_run(spread_stream, "spread"); }
static int spread_long_main(void *arg) { return spread_run(spread_long_stream, "spread_long"); }

static int cmd_spread(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    spread_tasks = bench_arg(argc, argv, 1, 20000);
    spread_work = bench_arg(argc, argv, 2, 20000);
    bench_init(procs);
    return co_main(spread_main, NULL);
}

static int cmd_spread_long(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    spread_tasks = bench_arg(argc, argv, 1, 2000);
    spread_work = bench_arg(argc, argv, 2, 200000);
    bench_init(procs);
    return co_main(spread_long_main, NULL);
}

int main(int argc, char **argv)
{
    static const bench_cmd_t cmds[] = {
        {"yield", "[procs=1] [yields=5000000]", cmd_yield},
        {"spawn", "[procs=2] [n=1000000]", cmd_spawn},
        {"park", "[procs=2] [n=1000000]", cmd_park},
        {"sleep", "[procs=2] [n=100000] [ms=10]", cmd_sleep},
        {"timer", "[procs=2] [n=1000] [us=100]", cmd_timer},
        {"spread", "[procs=2] [tasks=20000] [work=20000]", cmd_spread},
        {"spread_long", "[procs=2] [chunks=2000] [work=200000]", cmd_spread_long},
        {NULL, NULL, NULL},
    };
    return bench_dispatch(cmds, argc, argv);
}
