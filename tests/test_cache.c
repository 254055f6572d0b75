/* The object cache (Go's sync.Pool): get/put, a constructor that fails,
 * release of idle objects over time (the victim cache), Go's pool_test.go
 * cases that apply, bad input, and a stress run from coroutines and threads
 * that counts every object made and destroyed. */
#include "colony.h"
#include "t.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    /* an object used now and then is kept */
    obj_t *k = co_cache_get(c);
    long m = made;
    for (int i = 0; i < 10; i++) {
        co_cache_put(c, k);
        co_sleep(10 * MS);
        k = co_cache_get(c);
    }
    CHECK(k != NULL);
    CHECK(made - m <= 2); /* a sweep between a put and the get may take it, rarely twice */
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
