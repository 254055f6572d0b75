/* G records come from slabs (src/runtime/gslab.c): a burst of coroutines
 * maps a few slabs, not one allocation per record; records given back by
 * the trim are taken again from their slab's free list; a slab is
 * unmapped once every record in it is back (all of them at shutdown); a
 * record given back is poisoned under ASan until it is taken again. */
// ctest-timeout: 60
#include <colony.h>
#include <stdatomic.h>
#include <stdint.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "t.h"
#include "t_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif
#ifdef T_ASAN
#include <sanitizer/asan_interface.h>
#endif

static co_waitgroup_t gate = CO_WAITGROUP_INIT, done = CO_WAITGROUP_INIT;
static atomic_long sum;
static atomic_int started;

static void parker(void *arg) {
    atomic_fetch_add(&started, 1);
    co_waitgroup_wait(&gate);
    atomic_fetch_add(&sum, (long)(intptr_t)arg);
    co_waitgroup_done(&done);
}

/* n coroutines, all alive at once, then all gone; each ran once. */
static void wave(int n) {
    atomic_store(&sum, 0);
    atomic_store(&started, 0);
    co_waitgroup_add(&gate, 1);
    co_waitgroup_add(&done, n);
    for (int i = 1; i <= n; i++) CHECK_EQ(co_go(parker, (void *)(intptr_t)i), 0);
    while (atomic_load(&started) < n) co_yield();
    co_waitgroup_done(&gate);
    co_waitgroup_wait(&done);
    CHECK_EQ(atomic_load(&sum), (long)n * (n + 1) / 2);
}

/* Every dead record in the global cache goes back to its slab: the trim
 * frees what stayed there through a whole period, so two calls. */
static void trim_all(void) {
    co__gfree_trim(0);
    co__gfree_trim(0);
}

static void test_burst_maps_few_slabs(void) {
    int n = t_small() ? 2000 : 20000;
    int64_t before = co__gslab_slabs();
    wave(n);
    int64_t after = co__gslab_slabs();
    fprintf(stderr, "  %d live coroutines: %lld slabs mapped (%lld before)\n", n,
            (long long)after, (long long)before);
    /* 64 KiB doubling to 1 MiB: four slabs of less than 1 MiB, then one
     * per MiB of records (a G is larger in a ucontext build); one
     * allocation per record would be thousands */
    int64_t bound = (int64_t)((size_t)n * sizeof(co_g_t) / (1024 * 1024)) + 8;
    CHECK(after - before <= bound);
    CHECK(after >= 1);
}

static void test_records_recycled_after_trim(void) {
    int n = t_small() ? 1000 : 10000;
    for (int r = 0; r < 4; r++) {
        wave(n);
        trim_all(); /* records back to their slabs' free lists, or slabs unmapped */
    }
    int64_t slabs = co__gslab_slabs();
    wave(n); /* taken from the free lists and the slabs' tails again */
    CHECK(co__gslab_slabs() <= slabs + (int64_t)((size_t)n * sizeof(co_g_t) / (1024 * 1024)) + 8);
}

/* Two coroutines spawning and reaping in waves on 2 Ps while a plain
 * thread trims, as sysmon does: records move between the caches and the
 * slabs from three threads at once, and every coroutine runs once. */
static atomic_int stop_trim;
static atomic_long ran;
static void one(void *arg) {
    atomic_fetch_add(&ran, 1);
    co_waitgroup_done(arg);
}
static void spawner(void *arg) {
    int rounds = (int)(intptr_t)arg;
    for (int r = 0; r < rounds; r++) {
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        int k = 50 + (r * 37) % 400;
        co_waitgroup_add(&wg, k);
        for (int i = 0; i < k; i++) CHECK_EQ(co_go(one, &wg), 0);
        co_waitgroup_wait(&wg);
    }
    co_waitgroup_done(&done);
}
static void *trimmer(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_trim)) {
        co__gfree_trim(0);
        sched_yield();
    }
    return NULL;
}
static void test_stress_with_trims(void) {
    int rounds = t_small() ? 100 : 500;
    long want = 0;
    for (int r = 0; r < rounds; r++) want += 50 + (r * 37) % 400;
    atomic_store(&ran, 0);
    atomic_store(&stop_trim, 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, trimmer, NULL), 0);
    co_waitgroup_add(&done, 2);
    CHECK_EQ(co_go(spawner, (void *)(intptr_t)rounds), 0);
    CHECK_EQ(co_go(spawner, (void *)(intptr_t)rounds), 0);
    co_waitgroup_wait(&done);
    atomic_store(&stop_trim, 1);
    pthread_join(th, NULL);
    CHECK_EQ(atomic_load(&ran), 2 * want);
}

/* Before the runtime starts: a record given back is poisoned (ASan) and
 * comes back zeroed, from the same slab, at the same address (the free
 * list is last in, first out). */
static void test_record_reuse(void) {
    co_g_t *keep = co__gslab_get(), *a = co__gslab_get();
    CHECK(keep && a);
    if (!keep || !a) return;
    CHECK(a->slab != NULL && a->slab == keep->slab);
    CHECK_EQ(a->status, CO_G_IDLE);
    a->id = 42;
    a->arg = a;
    co__gslab_put(a);
#ifdef T_ASAN
    CHECK(__asan_address_is_poisoned(&a->id));
#endif
    co_g_t *b = co__gslab_get();
    CHECK(b == a);
    if (b) {
        CHECK_EQ(b->id, 0);
        CHECK(b->arg == NULL);
        CHECK(b->slab == keep->slab);
        co__gslab_put(b);
    }
    co__gslab_put(keep);
    co__gslab_fini();
    CHECK_EQ(co__gslab_slabs(), 0);
}

int main(void) {
    t_begin(50);
    T_RUN(test_record_reuse);
    co_config_t c = {.procs = 2};
    CHECK_EQ(co_init(&c), 0);
    T_RUN(test_burst_maps_few_slabs);
    T_RUN(test_records_recycled_after_trim);
    T_RUN(test_stress_with_trims);
    CHECK_EQ(T_SHUTDOWN(), 0);
    /* every record is back at shutdown: no slab stays */
    CHECK_EQ(co__gslab_slabs(), 0);
    return t_end();
}
