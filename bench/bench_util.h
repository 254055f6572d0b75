/*
 * bench_util.h — shared helpers of the colony benchmarks (bench/bench_*.c).
 *
 * Every benchmark program takes its sub-benchmark and parameters on the
 * command line, runs ONE measurement and prints ONE machine-readable line:
 *
 *   bench=<name> impl=colony procs=<P> ns_per_op=<x> ops=<n> peak_rss_kb=<k> [key=value ...]
 *
 * The Go peers in bench/go/ print the same format with impl=go, so
 * bench/run.sh can alternate the two processes and compare medians.
 * Only the public API (colony.h) is used here.
 */
#ifndef COLONY_BENCH_UTIL_H
#define COLONY_BENCH_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "colony.h"

/* Monotonic wall clock in nanoseconds (independent of co_now on purpose). */
static inline int64_t bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Peak resident set size of this process so far, in KiB (getrusage). */
static inline long bench_peak_rss_kb(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    return ru.ru_maxrss; /* Linux: KiB */
}

/* Current resident set size in KiB, from /proc/self/statm (-1 if unknown). */
static inline long bench_cur_rss_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2)
        res = -1;
    fclose(f);
    return res < 0 ? -1 : res * 4; /* pages of 4 KiB */
}

static inline int bench_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place and returns the q-quantile (0 <= q <= 1), nearest rank. */
static inline int64_t bench_quantile(int64_t *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof v[0], bench_cmp_i64);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static inline int64_t bench_median(int64_t *v, size_t n)
{
    return bench_quantile(v, n, 0.5);
}

/*
 * Prints the measurement line. extra (may be NULL) is a printf format for
 * additional " key=value" pairs.
 */
static inline void bench_report(const char *name, int procs, double ns_per_op, long long ops,
                                const char *extra, ...)
{
    printf("bench=%s impl=colony procs=%d ns_per_op=%.2f ops=%lld peak_rss_kb=%ld", name, procs,
           ns_per_op, ops, bench_peak_rss_kb());
    if (extra) {
        va_list ap;
        va_start(ap, extra);
        vprintf(extra, ap);
        va_end(ap);
    }
    printf("\n");
    fflush(stdout);
}

/* Argument helpers: argv[i] as a number, or the default when absent. */
static inline long long bench_arg(int argc, char **argv, int i, long long def)
{
    if (i < argc && argv[i][0] != '\0') {
        char *end;
        long long v = strtoll(argv[i], &end, 10);
        if (*end == '\0' && v > 0)
            return v;
        fprintf(stderr, "bad argument '%s'\n", argv[i]);
        exit(2);
    }
    return def;
}

/* Starts the runtime with exactly `procs` Ps; exits on failure. */
static inline void bench_init(int procs)
{
    int rc = co_init(&(co_config_t){.procs = procs});
    if (rc != 0) {
        fprintf(stderr, "co_init(procs=%d): %s\n", procs, co_strerror(rc));
        exit(1);
    }
    if (co_procs() != procs) {
        fprintf(stderr, "co_procs() = %d, wanted %d\n", co_procs(), procs);
        exit(1);
    }
}

/* Exits with a message when a colony call failed. */
#define BENCH_CHECK(expr)                                                                         \
    do {                                                                                          \
        int bench_rc_ = (expr);                                                                   \
        if (bench_rc_ < 0) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                         \
                    co_strerror(bench_rc_));                                                      \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* A sub-benchmark: name, usage text and entry (argc/argv after the name). */
typedef struct bench_cmd {
    const char *name;
    const char *usage;
    int (*run)(int argc, char **argv);
} bench_cmd_t;

static inline int bench_dispatch(const bench_cmd_t *cmds, int argc, char **argv)
{
    if (argc >= 2) {
        for (const bench_cmd_t *c = cmds; c->name; c++)
            if (strcmp(argv[1], c->name) == 0)
                return c->run(argc - 2, argv + 2);
    }
    fprintf(stderr, "usage: %s <benchmark> [args]\n", argc > 0 ? argv[0] : "bench");
    for (const bench_cmd_t *c = cmds; c->name; c++)
        fprintf(stderr, "  %-16s %s\n", c->name, c->usage);
    return 2;
}

#endif /* COLONY_BENCH_UTIL_H */
