/* The concurrent map against Concurrency Kit's ck_ht (when built with it):
 * 1M string keys ("k0000000"), T workers each doing N operations on random
 * keys, read% of them loads and the rest stores of a present key.
 *   bench_map colony|ck read_pct [workers=2] [keys=1000000] [ops=2000000]
 * Prints "map_<impl>_<read_pct> <ns per op>" (wall time / total ops).
 * colony's workers are coroutines on `workers` Ps; ck's are threads, with
 * its writers serialised by a mutex (ck_ht is single-writer). */
#include "colony.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef COLONY_BENCH_CK
#include <ck_ht.h>
#endif

static int nkeys, workers, readpct;
static long ops;
static char (*keys)[9];
static co_map_t *map;
static uintptr_t sink; /* keeps the loads; atomic adds */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void colony_worker(uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull | 1;
    uintptr_t acc = 0;
    for (long i = 0; i < ops; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *k = keys[x % (uint64_t)nkeys];
        if ((int)((x >> 40) % 100) < readpct) {
            void *v;
            if (co_map_load(map, k, 8, &v)) acc += (uintptr_t)v;
        } else {
            co_map_store(map, k, 8, (void *)(uintptr_t)i);
        }
    }
    __atomic_fetch_add(&sink, acc, __ATOMIC_RELAXED);
}

static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static void co_w(void *a) {
    colony_worker((uint64_t)(uintptr_t)a + 1);
    co_waitgroup_done(&wg);
}
static int colony_main(void *arg) {
    (void)arg;
    if (co_map_new(&map) != 0) return 1;
    for (int i = 0; i < nkeys; i++) co_map_store(map, keys[i], 8, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < nkeys; i++) co_map_load(map, keys[i], 8, NULL); /* as the Go peer's warm-up */
    int64_t t0 = now_ns();
    co_waitgroup_add(&wg, workers);
    for (int w = 0; w < workers; w++) co_go(co_w, (void *)(uintptr_t)w);
    co_waitgroup_wait(&wg);
    int64_t dt = now_ns() - t0;
    printf("map_colony_%d %.2f\n", readpct, (double)dt / (double)(ops * workers));
    co_map_free(map);
    return 0;
}

#ifdef COLONY_BENCH_CK
static ck_ht_t ht;
static pthread_mutex_t ck_mu = PTHREAD_MUTEX_INITIALIZER;
static void *ck_alloc(size_t n) { return malloc(n); }
static void ck_free(void *p, size_t n, bool defer) { (void)n, (void)defer; (void)p; /* never freed during the run: a grow is avoided by sizing */ }
static struct ck_malloc ck_m = {.malloc = ck_alloc, .free = ck_free};
static void *ck_worker(void *a) {
    uint64_t x = ((uint64_t)(uintptr_t)a + 1) * 0x9e3779b97f4a7c15ull | 1;
    uintptr_t acc = 0;
    for (long i = 0; i < ops; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *k = keys[x % (uint64_t)nkeys];
        ck_ht_entry_t e;
        ck_ht_hash_t h;
        ck_ht_hash(&h, &ht, k, 8);
        if ((int)((x >> 40) % 100) < readpct) {
            ck_ht_entry_key_set(&e, k, 8);
            if (ck_ht_get_spmc(&ht, h, &e)) acc += (uintptr_t)ck_ht_entry_value(&e);
        } else {
            ck_ht_entry_set(&e, h, k, 8, (void *)(uintptr_t)i);
            pthread_mutex_lock(&ck_mu);
            ck_ht_set_spmc(&ht, h, &e);
            pthread_mutex_unlock(&ck_mu);
        }
    }
    __atomic_fetch_add(&sink, acc, __ATOMIC_RELAXED);
    return NULL;
}
static int ck_run(void) {
    if (!ck_ht_init(&ht, CK_HT_MODE_BYTESTRING, NULL, &ck_m, (uint64_t)nkeys * 2, 6602834)) return 1;
    for (int i = 0; i < nkeys; i++) {
        ck_ht_entry_t e;
        ck_ht_hash_t h;
        ck_ht_hash(&h, &ht, keys[i], 8);
        ck_ht_entry_set(&e, h, keys[i], 8, (void *)(uintptr_t)(i + 1));
        ck_ht_put_spmc(&ht, h, &e);
    }
    pthread_t th[64];
    int64_t t0 = now_ns();
    for (int w = 0; w < workers; w++) pthread_create(&th[w], NULL, ck_worker, (void *)(uintptr_t)w);
    for (int w = 0; w < workers; w++) pthread_join(th[w], NULL);
    int64_t dt = now_ns() - t0;
    printf("map_ck_%d %.2f\n", readpct, (double)dt / (double)(ops * workers));
    return 0;
}
#endif

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_map colony|ck read_pct [workers=2] [keys=1000000] [ops=2000000]\n");
        return 2;
    }
    readpct = atoi(argv[2]);
    workers = argc > 3 ? atoi(argv[3]) : 2;
    nkeys = argc > 4 ? atoi(argv[4]) : 1000000;
    ops = argc > 5 ? atol(argv[5]) : 2000000;
    if (workers < 1 || workers > 64 || nkeys < 1) return 2;
    keys = malloc((size_t)nkeys * sizeof *keys);
    if (!keys) return 1;
    for (int i = 0; i < nkeys; i++) snprintf(keys[i], 9, "k%07d", i % 10000000);
    if (!strcmp(argv[1], "colony")) {
        co_config_t cfg = {.procs = workers};
        co_init(&cfg);
        return co_main(colony_main, NULL);
    }
#ifdef COLONY_BENCH_CK
    if (!strcmp(argv[1], "ck")) return ck_run();
#endif
    fprintf(stderr, "bench_map: %s not built in\n", argv[1]);
    return 2;
}
