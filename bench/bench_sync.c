/*
 * bench_sync.c — sync benchmarks of issue 3, one measurement per run.
 *
 *   bench_sync mutex [procs=2] [workers=4] [locks_per_worker=1000000]
 *       `workers` coroutines each lock, increment a shared counter and unlock
 *       co_mutex_t; ns per lock+unlock = wall / (workers * locks_per_worker).
 *
 * The Go peer (bench/go/chan, name "mutex") does the same with sync.Mutex.
 */
#include "bench_util.h"

static long long mu_n;
static int mu_workers;
static co_mutex_t mu = CO_MUTEX_INIT;
static long long mu_counter; /* protected by mu */
static co_waitgroup_t mu_wg;

static void mutex_worker(void *arg)
{
    for (long long i = 0; i < mu_n; i++) {
        co_mutex_lock(&mu);
        mu_counter++;
        co_mutex_unlock(&mu);
    }
    co_waitgroup_done(&mu_wg);
}

static int mutex_main(void *arg)
{
    int procs = co_procs();
    co_waitgroup_add(&mu_wg, mu_workers);
    int64_t t0 = bench_now();
    for (int i = 0; i < mu_workers; i++)
        BENCH_CHECK(co_go(mutex_worker, NULL));
    co_waitgroup_wait(&mu_wg);
    int64_t dt = bench_now() - t0;
    long long ops = mu_n * mu_workers;
    if (mu_counter != ops) {
        fprintf(stderr, "mutex: counter %lld, want %lld\n", mu_counter, ops);
        exit(1);
    }
    char name[64];
    snprintf(name, sizeof name, "mutex_%dco", mu_workers);
    bench_report(name, procs, (double)dt / (double)ops, ops, NULL);
    return 0;
}

static int cmd_mutex(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    mu_workers = (int)bench_arg(argc, argv, 1, 4);
    mu_n = bench_arg(argc, argv, 2, 1000000);
    bench_init(procs);
    return co_main(mutex_main, NULL);
}

int main(int argc, char **argv)
{
    static const bench_cmd_t cmds[] = {
        {"mutex", "[procs=2] [workers=4] [locks_per_worker=1000000]", cmd_mutex},
        {NULL, NULL, NULL},
    };
    return bench_dispatch(cmds, argc, argv);
}
