/* The concurrent map (Go's sync.Map): each call against a reference model,
 * Go's map_test.go cases that apply, Range while storing and deleting,
 * bad input, and a stress run from coroutines and threads with exact
 * accounting (ASan sees a node freed under a reader; TSan a missing edge). */
// ctest-timeout: 250
#include "colony.h"
#include "t.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define V(x) ((void *)(uintptr_t)(x))

static int key_of(char *buf, unsigned k) { return snprintf(buf, 32, "key-%u", k); }

/* ---- one call at a time, against a model --------------------------------- */
static void test_basic(void) {
    co_map_t *m = NULL;
    CHECK_EQ(co_map_new(&m), 0);
    void *v = V(99);
    CHECK(!co_map_load(m, "a", 1, &v));
    CHECK(v == NULL);
    CHECK_EQ(co_map_store(m, "a", 1, V(1)), 0);
    CHECK(co_map_load(m, "a", 1, &v) && v == V(1));
    CHECK(!co_map_load(m, "ab", 2, &v)); /* a prefix is another key */
    CHECK_EQ(co_map_store(m, "a", 1, V(2)), 0);
    CHECK(co_map_load(m, "a", 1, &v) && v == V(2));
    CHECK_EQ(co_map_len(m), (size_t)1);
    /* LoadOrStore */
    void *act = NULL;
    CHECK_EQ(co_map_load_or_store(m, "a", 1, V(3), &act), 1);
    CHECK(act == V(2));
    CHECK_EQ(co_map_load_or_store(m, "b", 1, V(4), &act), 0);
    CHECK(act == V(4));
    /* Swap */
    void *prev = V(7);
    CHECK_EQ(co_map_swap(m, "b", 1, V(5), &prev), 1);
    CHECK(prev == V(4));
    CHECK_EQ(co_map_swap(m, "c", 1, V(6), &prev), 0);
    CHECK(prev == NULL);
    /* CompareAndSwap / CompareAndDelete */
    CHECK(!co_map_compare_and_swap(m, "c", 1, V(5), V(8)));
    CHECK(co_map_compare_and_swap(m, "c", 1, V(6), V(8)));
    CHECK(co_map_load(m, "c", 1, &v) && v == V(8));
    CHECK(!co_map_compare_and_swap(m, "zz", 2, NULL, V(1))); /* absent: no insert */
    CHECK(!co_map_load(m, "zz", 2, NULL));
    CHECK(!co_map_compare_and_delete(m, "c", 1, V(6)));
    CHECK(co_map_compare_and_delete(m, "c", 1, V(8)));
    CHECK(!co_map_load(m, "c", 1, NULL));
    /* LoadAndDelete / Delete */
    CHECK(co_map_load_and_delete(m, "b", 1, &v) && v == V(5));
    CHECK(!co_map_load_and_delete(m, "b", 1, &v) && v == NULL);
    CHECK(co_map_delete(m, "a", 1));
    CHECK(!co_map_delete(m, "a", 1));
    CHECK_EQ(co_map_len(m), (size_t)0);
    /* the empty key, NULL values, binary keys with NUL bytes */
    CHECK_EQ(co_map_store(m, NULL, 0, V(11)), 0);
    CHECK(co_map_load(m, "", 0, &v) && v == V(11));
    CHECK_EQ(co_map_store(m, "x\0y", 3, NULL), 0);
    CHECK(co_map_load(m, "x\0y", 3, &v) && v == NULL);
    CHECK(!co_map_load(m, "x\0z", 3, NULL));
    co_map_free(m);
    co_map_free(NULL); /* as free(NULL) */
}

/* A long random sequence against an array model, through several resizes
 * and shrinking deletes (Go's TestMapMatchesRWMutex, deterministic). */
static void test_model(void) {
    enum { K = 5000 };
    static void *model[K];
    static char present[K];
    memset(present, 0, sizeof present);
    co_map_t *m;
    CHECK_EQ(co_map_new(&m), 0);
    uint64_t x = 88172645463325252ull;
    size_t live = 0;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned k = (unsigned)(x % K), op = (unsigned)((x >> 20) % 7);
        char kb[32];
        int kl = key_of(kb, k);
        void *nv = V((x >> 8) | 1), *got = NULL;
        switch (op) {
        case 0:
            CHECK_EQ(co_map_store(m, kb, kl, nv), 0);
            if (!present[k]) live++;
            present[k] = 1, model[k] = nv;
            break;
        case 1: {
            bool ok = co_map_load(m, kb, kl, &got);
            CHECK(ok == (bool)present[k]);
            if (ok) CHECK(got == model[k]);
            break;
        }
        case 2: {
            int rc = co_map_load_or_store(m, kb, kl, nv, &got);
            CHECK_EQ(rc, present[k] ? 1 : 0);
            CHECK(got == (present[k] ? model[k] : nv));
            if (!present[k]) present[k] = 1, model[k] = nv, live++;
            break;
        }
        case 3: {
            bool ok = co_map_load_and_delete(m, kb, kl, &got);
            CHECK(ok == (bool)present[k]);
            if (ok) {
                CHECK(got == model[k]);
                live--;
            }
            present[k] = 0;
            break;
        }
        case 4: {
            int rc = co_map_swap(m, kb, kl, nv, &got);
            CHECK_EQ(rc, present[k] ? 1 : 0);
            CHECK(got == (present[k] ? model[k] : NULL));
            if (!present[k]) live++;
            present[k] = 1, model[k] = nv;
            break;
        }
        case 5: {
            void *old = (x & 1) && present[k] ? model[k] : V(3);
            bool ok = co_map_compare_and_swap(m, kb, kl, old, nv);
            bool want = present[k] && model[k] == old;
            CHECK(ok == want);
            if (want) model[k] = nv;
            break;
        }
        case 6: {
            void *old = (x & 1) && present[k] ? model[k] : V(3);
            bool ok = co_map_compare_and_delete(m, kb, kl, old);
            bool want = present[k] && model[k] == old;
            CHECK(ok == want);
            if (want) present[k] = 0, live--;
            break;
        }
        }
    }
    CHECK_EQ(co_map_len(m), live);
    co_map_free(m);
}

/* ---- Range ---------------------------------------------------------------- */
struct rng {
    unsigned char seen[4096];
    int dup, n, stop_after;
};
static bool range_fn(const void *key, size_t len, void *value, void *arg) {
    struct rng *r = arg;
    unsigned k;
    char kb[32];
    if (len >= sizeof kb) return true;
    memcpy(kb, key, len);
    kb[len] = 0;
    if (sscanf(kb, "key-%u", &k) == 1 && k < 4096) {
        if (r->seen[k]++) r->dup++;
        if ((uintptr_t)value != k + 1u) r->dup += 1000; /* a value never stored for k */
    }
    r->n++;
    return r->stop_after == 0 || r->n < r->stop_after;
}
static void test_range_basic(void) {
    co_map_t *m;
    CHECK_EQ(co_map_new(&m), 0);
    char kb[32];
    for (unsigned k = 0; k < 1000; k++) CHECK_EQ(co_map_store(m, kb, key_of(kb, k), V(k + 1)), 0);
    static struct rng r;
    memset(&r, 0, sizeof r);
    co_map_range(m, range_fn, &r);
    CHECK_EQ(r.n, 1000);
    CHECK_EQ(r.dup, 0);
    for (unsigned k = 0; k < 1000; k++) CHECK_EQ(r.seen[k], 1);
    memset(&r, 0, sizeof r);
    r.stop_after = 10; /* fn returning false stops at once */
    co_map_range(m, range_fn, &r);
    CHECK_EQ(r.n, 10);
    co_map_free(m);
}

/* A Range callback that stores and deletes in the map it walks (Go allows
 * it): never a key twice, nothing freed under it. */
static co_map_t *rm;
static bool range_mutating(const void *key, size_t len, void *value, void *arg) {
    struct rng *r = arg;
    (void)value;
    char kb[32];
    unsigned k;
    if (len < sizeof kb) {
        memcpy(kb, key, len);
        kb[len] = 0;
        if (sscanf(kb, "key-%u", &k) == 1 && k < 4096 && r->seen[k]++) r->dup++;
    }
    r->n++;
    /* delete the visited key and add a new one (forcing resizes) */
    co_map_delete(rm, key, len);
    unsigned nk = 2000 + (unsigned)r->n;
    if (nk < 4096) co_map_store(rm, kb, key_of(kb, nk), V(nk + 1));
    if (r->n % 100 == 0) co_yield(); /* the callback may switch */
    return true;
}
static void test_range_mutating(void) {
    CHECK_EQ(co_map_new(&rm), 0);
    char kb[32];
    for (unsigned k = 0; k < 1500; k++) CHECK_EQ(co_map_store(rm, kb, key_of(kb, k), V(k + 1)), 0);
    static struct rng r;
    memset(&r, 0, sizeof r);
    co_map_range(rm, range_mutating, &r);
    CHECK_EQ(r.dup, 0);
    CHECK(r.n >= 1500); /* every key present at the start and never deleted by others */
    co_map_free(rm);
}

/* ---- stress ---------------------------------------------------------------- */
enum { SW = 6, SK = 512 };
static co_map_t *sm;
static co_waitgroup_t swg = CO_WAITGROUP_INIT;
static int s_iters;
static int s_bad;
static int s_stop;
static void stress_body(unsigned w) {
    char kb[32];
    void *mine[SK] = {0};
    uint64_t x = 0x9e3779b97f4a7c15ull * (w + 1);
    for (int i = 0; i < s_iters; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned j = (unsigned)(x % SK), k = w * SK + j;
        int kl = key_of(kb, k);
        void *got;
        switch ((x >> 32) % 6) {
        case 0:
        case 1: { /* own key: exact */
            bool ok = co_map_load(sm, kb, kl, &got);
            if (ok != (mine[j] != NULL) || (ok && got != mine[j])) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
            break;
        }
        case 2: {
            void *nv = V(((uint64_t)(w + 1) << 40) | (uint64_t)(i + 1));
            if (co_map_store(sm, kb, kl, nv) != 0) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
            mine[j] = nv;
            break;
        }
        case 3: {
            bool ok = co_map_load_and_delete(sm, kb, kl, &got);
            if (ok != (mine[j] != NULL) || (ok && got != mine[j])) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
            mine[j] = NULL;
            break;
        }
        case 4: { /* another worker's key: absent, or a value its owner wrote */
            unsigned o = (unsigned)((x >> 40) % SW);
            kl = key_of(kb, o * SK + j);
            if (co_map_load(sm, kb, kl, &got) && ((uintptr_t)got >> 40) != o + 1)
                __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
            break;
        }
        case 5: {
            void *nv = V(((uint64_t)(w + 1) << 40) | (uint64_t)(i + 1));
            bool ok = co_map_compare_and_swap(sm, kb, kl, mine[j], nv);
            if (ok != (mine[j] != NULL)) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
            if (ok) mine[j] = nv;
            break;
        }
        }
    }
    /* what is left is exactly what this worker believes; it leaves none */
    for (unsigned j = 0; j < SK; j++) {
        int kl = key_of(kb, w * SK + j);
        void *got;
        bool ok = co_map_load_and_delete(sm, kb, kl, &got);
        if (ok != (mine[j] != NULL) || (ok && got != mine[j])) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED);
    }
}
static void stress_co(void *a) {
    stress_body((unsigned)(uintptr_t)a);
    co_waitgroup_done(&swg);
}
static void *stress_th(void *a) {
    stress_body((unsigned)(uintptr_t)a);
    return NULL;
}
static bool range_count(const void *key, size_t len, void *value, void *arg) {
    (void)key, (void)len, (void)value;
    ++*(int *)arg;
    return true;
}
static void ranger(void *a) {
    (void)a;
    while (!__atomic_load_n(&s_stop, __ATOMIC_ACQUIRE)) {
        int n = 0;
        co_map_range(sm, range_count, &n);
        if (n > SW * SK) __atomic_add_fetch(&s_bad, 1, __ATOMIC_RELAXED); /* a key twice */
        co_yield();
    }
    co_waitgroup_done(&swg);
}
static void test_stress(void) {
    CHECK_EQ(co_map_new(&sm), 0);
    s_iters = t_small() ? 20000 : 100000;
    s_bad = 0;
    s_stop = 0;
    co_waitgroup_add(&swg, SW - 2);
    for (unsigned w = 0; w < SW - 2; w++) CHECK_EQ(co_go(stress_co, V(w)), 0);
    pthread_t th[2];
    for (unsigned i = 0; i < 2; i++) pthread_create(&th[i], NULL, stress_th, V(SW - 2 + i));
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&swg);
    co_waitgroup_add(&swg, 1);
    CHECK_EQ(co_go(ranger, NULL), 0);
    /* a second round with a Range running all along */
    co_waitgroup_add(&swg, SW - 2);
    for (unsigned w = 0; w < SW - 2; w++) CHECK_EQ(co_go(stress_co, V(w)), 0);
    for (unsigned i = 0; i < 2; i++) pthread_create(&th[i], NULL, stress_th, V(SW - 2 + i));
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    __atomic_store_n(&s_stop, 1, __ATOMIC_RELEASE);
    co_waitgroup_wait(&swg);
    CHECK_EQ(s_bad, 0);
    co_map_free(sm);
}

/* ---- bad input ------------------------------------------------------------ */
static int run_misuse(const char *name) {
    co_map_t *m = NULL;
    if (co_map_new(&m) != 0) return 3;
    fprintf(stderr, "obj=%p\n", !strcmp(name, "load_null") ? NULL : (void *)m);
    if (!strcmp(name, "load_null")) co_map_load(NULL, "a", 1, NULL);
    if (!strcmp(name, "key_null")) co_map_delete(m, NULL, 3);
    if (!strcmp(name, "range_null")) co_map_range(m, NULL, NULL);
    return 0;
}
static void test_bad_input(void) {
    CHECK_EQ(co_map_new(NULL), CO_EINVAL);
    co_map_t *m;
    CHECK_EQ(co_map_new(&m), 0);
    CHECK_EQ(co_map_store(NULL, "a", 1, NULL), CO_EINVAL);
    CHECK_EQ(co_map_store(m, NULL, 1, NULL), CO_EINVAL);
    CHECK_EQ(co_map_load_or_store(m, NULL, 2, NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_map_swap(NULL, "a", 1, NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_map_len(m), (size_t)0);
    co_map_free(m);
    t_expect_abort("test_map", "load_null", "co_map_load");
    t_expect_abort("test_map", "key_null", "co_map_delete");
    t_expect_abort("test_map", "range_null", "co_map_range");
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_basic);
    T_RUN(test_model);
    T_RUN(test_range_basic);
    T_RUN(test_range_mutating);
    T_RUN(test_stress);
    T_RUN(test_bad_input);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--misuse")) return run_misuse(argv[2]);
    t_begin(t_small() ? 240 : 120);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
