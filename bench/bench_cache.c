/* The object cache against Go's sync.Pool (bench/go/cache) and malloc/free.
 *   bench_cache getput [workers=2] [ops=20000000]   get+put of one object per op
 *   bench_cache buf1k  [workers=2] [ops=10000000]   a 1 KiB buffer per "request"
 *   bench_cache malloc [workers=2] [ops=10000000]   the same with malloc/free
 * Workers are coroutines on `workers` Ps. Prints "<name> <ns per op>". */
#include "colony.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int workers;
static long ops;
static const char *mode;
static co_cache_t *cache;
static uint64_t sink; /* atomic adds */
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static void *new_buf(void *arg) {
    (void)arg;
    return malloc(1024);
}
static void free_buf(void *p, void *arg) {
    (void)arg;
    free(p);
}
/* a request's use of its buffer: fill a header and read it back */
static inline uint64_t use(unsigned char *b, long i) {
    memset(b, (int)i, 64);
    b[1023] = (unsigned char)i;
    return b[0] + b[1023];
}
static void worker(void *a) {
    (void)a;
    uint64_t acc = 0;
    if (!strcmp(mode, "getput")) {
        for (long i = 0; i < ops; i++) {
            void *o = co_cache_get(cache);
            acc += (uintptr_t)o & 1;
            co_cache_put(cache, o);
        }
    } else if (!strcmp(mode, "buf1k")) {
        for (long i = 0; i < ops; i++) {
            unsigned char *b = co_cache_get(cache);
            acc += use(b, i);
            co_cache_put(cache, b);
        }
    } else {
        for (long i = 0; i < ops; i++) {
            unsigned char *b = malloc(1024);
            __asm__ volatile("" : : "r"(b) : "memory"); /* keeps the compiler from eliding the pair */
            acc += use(b, i);
            free(b);
        }
    }
    __atomic_fetch_add(&sink, acc, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}
static int run(void *arg) {
    (void)arg;
    if (co_cache_new(&cache, new_buf, free_buf, NULL) != 0) return 1;
    int64_t t0 = now_ns();
    co_waitgroup_add(&wg, workers);
    for (int w = 0; w < workers; w++) co_go(worker, NULL);
    co_waitgroup_wait(&wg);
    int64_t dt = now_ns() - t0;
    printf("cache_%s %.2f\n", mode, (double)dt / (double)(ops * workers));
    co_cache_free(cache);
    return 0;
}
int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "getput") && strcmp(argv[1], "buf1k") && strcmp(argv[1], "malloc"))) {
        fprintf(stderr, "usage: bench_cache getput|buf1k|malloc [workers=2] [ops]\n");
        return 2;
    }
    mode = argv[1];
    workers = argc > 2 ? atoi(argv[2]) : 2;
    ops = argc > 3 ? atol(argv[3]) : (!strcmp(mode, "getput") ? 20000000 : 10000000);
    if (workers < 1 || ops < 1) return 2;
    co_config_t cfg = {.procs = workers};
    co_init(&cfg);
    return co_main(run, NULL);
}
