/* The object cache (Go's sync.Pool): get/put, a constructor that fails,
 * release of idle objects over time (the victim cache), Go's pool_test.go
 * cases that apply, bad input, and a stress run from coroutines and threads
 * that counts every object made and destroyed. */
// ctest-timeout: 250
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MS (1000 * 1000LL)

static long made, freed; /* atomics */
static int fail_new;     /* the constructor fails while set */
typedef struct obj {
    uint64_t magic;
    long owner; /* set by whoever holds it, checked on put */
} obj_t;
#define MAGIC 0x6f626a6f626a6f62ull

static void *new_obj(void *arg) {
    (void)arg;
    if (__atomic_load_n(&fail_new, __ATOMIC_RELAXED)) return NULL;
    obj_t *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->magic = MAGIC;
    __atomic_add_fetch(&made, 1, __ATOMIC_RELAXED);
    return o;
}
static void free_obj(void *p, void *arg) {
    (void)arg;
    obj_t *o = p;
    if (o->magic != MAGIC) abort(); /* something not made by new_obj, or freed twice */
    o->magic = 0;
    free(o);
    __atomic_add_fetch(&freed, 1, __ATOMIC_RELAXED);
}

static void test_basic(void) {
    made = freed = 0;
    co_cache_t *c;
    CHECK_EQ(co_cache_new(&c, new_obj, free_obj, NULL), 0);
    obj_t *a = co_cache_get(c);
    CHECK(a && a->magic == MAGIC);
    CHECK_EQ(made, 1);
    co_cache_put(c, a);
    obj_t *b = co_cache_get(c); /* the same thread gets its own back */
    CHECK(b == a);
    CHECK_EQ(made, 1);
    co_cache_put(c, b);
    co_cache_put(c, NULL); /* ignored */
    /* more than a shard holds: the rest go to the shared stack */
    obj_t *many[100];
    for (int i = 0; i < 100; i++) many[i] = co_cache_get(c);
    for (int i = 0; i < 100; i++) CHECK(many[i] != NULL);
    long m = made;
    for (int i = 0; i < 100; i++) co_cache_put(c, many[i]);
    for (int i = 0; i < 100; i++) many[i] = co_cache_get(c);
    CHECK_EQ(made, m); /* all came back from the cache */
    for (int i = 0; i < 100; i++) co_cache_put(c, many[i]);
    co_cache_free(c); /* destroys what it holds */
    CHECK_EQ(made, freed);
    co_cache_free(NULL);
}

static void test_no_new(void) {
    co_cache_t *c;
    CHECK_EQ(co_cache_new(&c, NULL, NULL, NULL), 0);
    CHECK(co_cache_get(c) == NULL); /* Go's Get with New == nil */
    int x;
    co_cache_put(c, &x);
    CHECK(co_cache_get(c) == &x);
    co_cache_free(c); /* no free_fn: nothing called */
}

static void test_new_fails(void) {
    made = freed = 0;
    co_cache_t *c;
    CHECK_EQ(co_cache_new(&c, new_obj, free_obj, NULL), 0);
    __atomic_store_n(&fail_new, 1, __ATOMIC_RELAXED);
    CHECK(co_cache_get(c) == NULL);
    __atomic_store_n(&fail_new, 0, __ATOMIC_RELAXED);
    obj_t *o = co_cache_get(c);
    CHECK(o != NULL);
    co_cache_put(c, o);
    __atomic_store_n(&fail_new, 1, __ATOMIC_RELAXED);
    CHECK(co_cache_get(c) == o); /* a cached one needs no constructor */
    CHECK(co_cache_get(c) == NULL);
    __atomic_store_n(&fail_new, 0, __ATOMIC_RELAXED);
    co_cache_put(c, o);
    co_cache_free(c);
    CHECK_EQ(made, freed);
}

/* Go's TestPoolRelease, with sweeps for GCs: idle objects are destroyed
 * within two sweeps; one taken back in between survives. */
static void test_release(void) {
    made = freed = 0;
    co_cache_t *c;
    CHECK_EQ(co_cache_new(&c, new_obj, free_obj, NULL), 0);
    CHECK_EQ(co_cache_set_period(c, 20 * MS), 0);
    obj_t *o[40];
    for (int i = 0; i < 40; i++) o[i] = co_cache_get(c);
    for (int i = 0; i < 40; i++) co_cache_put(c, o[i]);
    CHECK_EQ(freed, 0);
    /* every object destroyed, without any call on the cache */
    for (int i = 0; i < 1000 && __atomic_load_n(&freed, __ATOMIC_RELAXED) < 40; i++) co_sleep(5 * MS);
    CHECK_EQ(__atomic_load_n(&freed, __ATOMIC_RELAXED), 40);
    /* an object used now and then is kept: it comes back from the caller's
     * shard while no sweep runs, or from the victims after one sweep. A get
     * on another thread than the put does not look in the put's shard, so
     * there it takes one sweep exactly, after the put and before the get.
     * Sweeps are counted and threads compared, not times: a loaded host may
     * sleep past two sweeps, and a coroutine moves between threads. */
    obj_t *k = co_cache_get(c);
    int one_sweep = 0;
    for (int i = 0; i < 2000 && one_sweep < 5; i++) {
        long m = __atomic_load_n(&made, __ATOMIC_RELAXED);
        uint64_t s0 = co__test_cache_sweeps(c);
        /* the thread's id by a system call: pthread_self() is a const
         * function, which the compiler may read once for both */
        long t0 = syscall(SYS_gettid); /* no switch from here to the put's end */
        co_cache_put(c, k);
        uint64_t s1 = co__test_cache_sweeps(c);
        co_sleep(10 * MS);
        uint64_t s2 = co__test_cache_sweeps(c);
        k = co_cache_get(c);
        long t1 = syscall(SYS_gettid);
        uint64_t s3 = co__test_cache_sweeps(c);
        CHECK(k != NULL);
        bool between = s3 - s0 == 1 && s2 - s1 == 1; /* the only sweep came between */
        if ((t0 == t1 && s3 - s0 <= 1) || between)
            CHECK_EQ(__atomic_load_n(&made, __ATOMIC_RELAXED), m);
        if (between) one_sweep++;
    }
    CHECK_EQ(one_sweep, 5); /* the victim path was taken, not only the shard */
    co_cache_put(c, k);
    co_cache_free(c);
    CHECK_EQ(made, freed);
}


/* ---- stress: coroutines and threads, exact accounting --------------------- */
static co_cache_t *sc;
static co_waitgroup_t swg = CO_WAITGROUP_INIT;
static int s_iters, s_bad;
static void stress_body(long id) {
    obj_t *held[4] = {0};
    uint64_t x = (uint64_t)id * 0x9e3779b97f4a7c15ull | 1;
    for (int i = 0; i < s_iters; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int j = (int)(x % 4);
        if (held[j]) {
            if (held[j]->owner != id || held[j]->magic != MAGIC) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
            held[j]->owner = 0;
            co_cache_put(sc, held[j]);
            held[j] = NULL;
        } else {
            obj_t *o = co_cache_get(sc);
            if (!o) continue;
            if (o->owner != 0 || o->magic != MAGIC) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
            o->owner = id; /* a plain write: TSan checks the hand-over */
            held[j] = o;
        }
        if ((i & 255) == 0) co_yield();
    }
    for (int j = 0; j < 4; j++)
        if (held[j]) held[j]->owner = 0, co_cache_put(sc, held[j]);
}
static void stress_co(void *a) {
    stress_body((long)(intptr_t)a);
    co_waitgroup_done(&swg);
}
static void *stress_th(void *a) {
    stress_body((long)(intptr_t)a);
    return NULL;
}
static void test_stress(void) {
    made = freed = 0;
    s_bad = 0;
    CHECK_EQ(co_cache_new(&sc, new_obj, free_obj, NULL), 0);
    CHECK_EQ(co_cache_set_period(sc, 1 * MS), 0); /* sweeps all along */
    s_iters = t_small() ? 20000 : 200000;
    co_waitgroup_add(&swg, 6);
    for (int i = 0; i < 6; i++) CHECK_EQ(co_go(stress_co, (void *)(intptr_t)(i + 1)), 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, stress_th, (void *)(intptr_t)(100 + i));
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&swg);
    CHECK_EQ(s_bad, 0);
    co_cache_free(sc);
    CHECK_EQ(made, freed); /* nothing lost, nothing destroyed twice (free_obj aborts) */
}

static int run_misuse(const char *name) {
    fprintf(stderr, "obj=NULL\n");
    if (!strcmp(name, "get_null")) co_cache_get(NULL);
    if (!strcmp(name, "put_null")) co_cache_put(NULL, NULL);
    return 0;
}
static void test_bad_input(void) {
    CHECK_EQ(co_cache_new(NULL, new_obj, free_obj, NULL), CO_EINVAL);
    CHECK_EQ(co_cache_set_period(NULL, 0), CO_EINVAL);
    co_cache_t *c;
    CHECK_EQ(co_cache_new(&c, NULL, NULL, NULL), 0);
    CHECK_EQ(co_cache_set_period(c, -1), CO_EINVAL);
    co_cache_free(c);
    t_expect_abort("test_cache", "get_null", "co_cache_get");
    t_expect_abort("test_cache", "put_null", "co_cache_put");
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_basic);
    T_RUN(test_no_new);
    T_RUN(test_new_fails);
    T_RUN(test_release);
    T_RUN(test_stress);
    T_RUN(test_bad_input);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--misuse")) return run_misuse(argv[2]);
    t_begin(t_small() ? 240 : 120);
    /* from a plain thread before the runtime: works, locked, no sweeps */
    co_cache_t *c;
    CHECK_EQ(co_cache_new(&c, new_obj, free_obj, NULL), 0);
    void *o = co_cache_get(c);
    CHECK(o != NULL);
    co_cache_put(c, o);
    CHECK(co_cache_get(c) == o);
    co_cache_put(c, o);
    co_cache_free(c);
    CHECK_EQ(co_main(run, NULL), 0);
    /* after every cache is freed, nothing holds the runtime */
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
