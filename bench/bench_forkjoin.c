/*
 * bench_forkjoin — a CPU-bound fork-join: parallel fib(n), a coroutine per
 * call above a depth cut-off (fib(n) with n > cut-off), each parent joining
 * its children with a waitgroup; at or below the cut-off a plain recursive
 * fib. Cut-off 11 of fib(40)
 * is about 1.35M coroutines (fine grain), cut-off 22 about 6,800 (coarse).
 * The peer is bench/go/forkjoin; bench/run_forkjoin.sh runs them side by
 * side, with a plain-thread loop as the host's own 2-CPU speedup.
 *
 *   bench_forkjoin fib  [procs=1] [n=40] [cutoff=11] [reps=1]
 *
 * reps > 1 runs fib(n) that many times in one process and reports the
 * last (first_ms: the first): the rounds before it leave the G records
 * and stacks of the fan-out's peak in the runtime's caches.
 *   bench_forkjoin spin [threads=1] [iters=400000000]   (no coroutines)
 */
#include <pthread.h>

#include "bench_util.h"

static int cutoff;

static long fib_seq(int n) { return n < 2 ? n : fib_seq(n - 1) + fib_seq(n - 2); }

typedef struct fib_job {
    int n;
    long r;
    co_waitgroup_t *wg;
} fib_job_t;

static void fib_co(void *arg);

/* fib(n) in the calling coroutine: a child coroutine for each of fib(n-1)
 * and fib(n-2) that is above the cut-off, the other computed here. */
static long fib_par(int n)
{
    if (n <= cutoff)
        return fib_seq(n);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    fib_job_t a = {n - 1, 0, &wg}, b = {n - 2, 0, &wg};
    int kids = (a.n > cutoff) + (b.n > cutoff);
    co_waitgroup_add(&wg, kids);
    fib_job_t *j[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        if (j[i]->n > cutoff)
            BENCH_CHECK(co_go(fib_co, j[i]));
        else
            j[i]->r = fib_seq(j[i]->n);
    }
    co_waitgroup_wait(&wg);
    return a.r + b.r;
}

static void fib_co(void *arg)
{
    fib_job_t *j = arg;
    j->r = fib_par(j->n);
    co_waitgroup_done(j->wg);
}

static int fib_n;
/* coroutines spawned by fib_par(n): one per call above the cut-off but the first */
static long fib_ncalls(int n)
{
    return n <= cutoff ? 0 : (n - 1 > cutoff) + (n - 2 > cutoff) + fib_ncalls(n - 1) + fib_ncalls(n - 2);
}

static int fib_reps;

static int fib_main(void *arg)
{
    (void)arg;
    /* every round but the last warms the caches (records and stacks) */
    int64_t t0 = bench_now(), first_ns = 0;
    long r = 0;
    for (int i = 0; i < fib_reps; i++) {
        t0 = bench_now();
        r = fib_par(fib_n);
        if (i == 0)
            first_ns = bench_now() - t0;
    }
    int64_t ns = bench_now() - t0;
    long want = 0, next = 1; /* fib(n), iteratively */
    for (int i = 0; i < fib_n; i++) {
        long t = want + next;
        want = next;
        next = t;
    }
    if (r != want) {
        fprintf(stderr, "fib(%d) = %ld: wrong\n", fib_n, r);
        return 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu_ms = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
                    (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
    bench_report("forkjoin", co_procs(), (double)ns, 1,
                 " ms=%.1f first_ms=%.1f cpu_ms=%.1f coroutines=%ld n=%d cutoff=%d reps=%d result=%ld",
                 ns / 1e6, first_ns / 1e6, cpu_ms, fib_ncalls(fib_n), fib_n, cutoff, fib_reps, r);
    return 0;
}

static int cmd_fib(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 1);
    fib_n = (int)bench_arg(argc, argv, 1, 40);
    cutoff = (int)bench_arg(argc, argv, 2, 11);
    fib_reps = (int)bench_arg(argc, argv, 3, 1);
    bench_init(procs);
    return co_main(fib_main, NULL);
}

/* ---- the host's own speedup: the same work on 1 thread or 2 ---------- */

static long spin_iters;

static void *spin_thread(void *arg)
{
    volatile unsigned long x = (unsigned long)(uintptr_t)arg;
    for (long i = 0; i < spin_iters; i++)
        x = x * 6364136223846793005ul + 1442695040888963407ul;
    return NULL;
}

/* `threads` threads share 2 x iters of work: the wall time on 2 threads
 * over that on 1 is what the host gives a second CPU now. */
static int cmd_spin(int argc, char **argv)
{
    int threads = (int)bench_arg(argc, argv, 0, 1);
    long iters = (long)bench_arg(argc, argv, 1, 400000000);
    if (threads != 1 && threads != 2) {
        fprintf(stderr, "spin: threads is 1 or 2\n");
        return 2;
    }
    spin_iters = 2 * iters / threads;
    pthread_t t[2];
    int64_t t0 = bench_now();
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, spin_thread, (void *)(uintptr_t)(i + 1)) != 0) {
            fprintf(stderr, "spin: pthread_create failed\n");
            return 1;
        }
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    int64_t ns = bench_now() - t0;
    printf("bench=spin impl=threads procs=%d ns_per_op=%.2f ops=1 peak_rss_kb=%ld ms=%.1f\n",
           threads, (double)ns, bench_peak_rss_kb(), ns / 1e6);
    return 0;
}

int main(int argc, char **argv)
{
    static const bench_cmd_t cmds[] = {
        {"fib", "[procs=1] [n=40] [cutoff=11] [reps=1]", cmd_fib},
        {"spin", "[threads=1] [iters=400000000]", cmd_spin},
        {NULL, NULL, NULL},
    };
    return bench_dispatch(cmds, argc, argv);
}
