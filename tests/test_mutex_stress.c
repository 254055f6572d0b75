/* Mutex stress: 16 coroutines and 2 plain threads increment one counter
 * under the mutex; the count must be exact. Starvation mode: a waiter that
 * keeps losing to a greedy holder gets the lock handed to it. */
// ctest-timeout: 300
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* hidden counter in src/sync.c: times any mutex entered starvation mode */

#define MS (1000 * 1000LL)

static co_mutex_t mu = CO_MUTEX_INIT;
static long counter;
static int iters;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static void incr(void) {
    for (int i = 0; i < iters; i++) {
        if (i % 7 == 0) {
            while (co_mutex_trylock(&mu) != 0) co_yield();
        } else {
            co_mutex_lock(&mu);
        }
        counter++;
        co_mutex_unlock(&mu);
    }
}
static void incr_co(void *a) {
    incr();
    co_waitgroup_done(&wg);
}
static void *incr_th(void *a) {
    incr();
    return NULL;
}

static void test_counter(void) {
    iters = 100000; /* the figure, in every suite (TSan included) */
    counter = 0;
    co_waitgroup_add(&wg, 16);
    for (int i = 0; i < 16; i++) CHECK_EQ(co_go(incr_co, NULL), 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, incr_th, NULL);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&wg);
    CHECK_EQ(counter, 18L * iters);
    CHECK_EQ(co_mutex_trylock(&mu), 0); /* left unlocked, normal mode */
    co_mutex_unlock(&mu);
}

/* Starvation: a greedy holder relocks right after each unlock, faster than
 * a woken waiter can run. Go's TestMutexFairness: the other side must still
 * get the lock, because after 1 ms of waiting the mutex switches to handing
 * it over directly. */
static co_mutex_t fair = CO_MUTEX_INIT;
static int fair_stop;

static void greedy(void) {
    while (!__atomic_load_n(&fair_stop, __ATOMIC_ACQUIRE)) {
        co_mutex_lock(&fair);
        int64_t until = co_now() + 100 * 1000; /* hold ~100 us */
        while (co_now() < until) {
        }
        co_mutex_unlock(&fair);
    }
}
static void *greedy_th(void *a) {
    greedy();
    return NULL;
}
static void greedy_co(void *a) {
    greedy();
    co_waitgroup_done(a);
}

static uint64_t starve_before;
static void victim(void) {
    /* Lock repeatedly; stop once starvation mode was seen (usually within
     * a few ms), or after many rounds (the CHECK then fails). A round only
     * fails to starve when the OS deschedules the greedy side at the right
     * moment, so many rounds make the outcome certain in practice. */
    for (int i = 0; i < 5000; i++) {
        co_mutex_lock(&fair);
        co_mutex_unlock(&fair);
        if (i >= 10 && __atomic_load_n(&co__mutex_starvation_count, __ATOMIC_RELAXED) > starve_before) break;
        co_sleep(MS / 10);
    }
    __atomic_store_n(&fair_stop, 1, __ATOMIC_RELEASE);
}
static void victim_co(void *a) {
    victim();
    co_waitgroup_done(a);
}
static void *victim_th(void *a) {
    victim();
    return NULL;
}

/* greedy thread, victim coroutine */
static void test_starvation_victim_coroutine(void) {
    co_waitgroup_t w = CO_WAITGROUP_INIT;
    fair_stop = 0;
    starve_before = __atomic_load_n(&co__mutex_starvation_count, __ATOMIC_RELAXED);
    pthread_t g;
    pthread_create(&g, NULL, greedy_th, NULL);
    co_waitgroup_add(&w, 1);
    CHECK_EQ(co_go(victim_co, &w), 0);
    co_waitgroup_wait(&w);
    pthread_join(g, NULL);
    CHECK(__atomic_load_n(&co__mutex_starvation_count, __ATOMIC_RELAXED) > starve_before);
    CHECK_EQ(co_mutex_trylock(&fair), 0); /* back to normal, unlocked */
    co_mutex_unlock(&fair);
}

/* greedy coroutine, victim thread */
static void test_starvation_victim_thread(void) {
    co_waitgroup_t w = CO_WAITGROUP_INIT;
    fair_stop = 0;
    starve_before = __atomic_load_n(&co__mutex_starvation_count, __ATOMIC_RELAXED);
    co_waitgroup_add(&w, 1);
    CHECK_EQ(co_go(greedy_co, &w), 0);
    pthread_t v;
    pthread_create(&v, NULL, victim_th, NULL);
    pthread_join(v, NULL);
    co_waitgroup_wait(&w);
    CHECK(__atomic_load_n(&co__mutex_starvation_count, __ATOMIC_RELAXED) > starve_before);
    CHECK_EQ(co_mutex_trylock(&fair), 0);
    co_mutex_unlock(&fair);
}

/* Many waiters through starvation mode and back: every one gets the lock
 * the expected number of times and the mutex ends unlocked. */
static co_mutex_t sm = CO_MUTEX_INIT;
static long sm_count;
static void slow_holder(void *a) {
    int n = *(int *)a;
    for (int i = 0; i < n; i++) {
        co_mutex_lock(&sm);
        int64_t until = co_now() + 20 * 1000;
        while (co_now() < until) {
        }
        sm_count++;
        co_mutex_unlock(&sm);
    }
    co_waitgroup_done(&wg);
}
static void *slow_holder_th(void *a) {
    int n = *(int *)a;
    for (int i = 0; i < n; i++) {
        co_mutex_lock(&sm);
        sm_count++;
        co_mutex_unlock(&sm);
    }
    return NULL;
}
static void test_starvation_many(void) {
    int n = t_small() ? 100 : 500;
    co_waitgroup_add(&wg, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ(co_go(slow_holder, &n), 0);
    pthread_t th;
    pthread_create(&th, NULL, slow_holder_th, &n);
    pthread_join(th, NULL);
    co_waitgroup_wait(&wg);
    CHECK_EQ(sm_count, 9L * n);
    CHECK_EQ(co_mutex_trylock(&sm), 0);
    co_mutex_unlock(&sm);
}

/* The last one out frees: objects counted under their own mutex, each
 * shared by 3 coroutines and a plain thread that lock, drop their
 * reference and unlock; whoever drops the last frees the object right
 * after its unlock (POSIX allows this for its mutexes). An unlocker still
 * inside co_mutex_unlock must not touch the mutex once another party may
 * have freed it: the unlock's last touch is its CAS (src/sync.c). Run it
 * under ASan to see a use after free; here every object is freed exactly
 * once. */
typedef struct {
    co_mutex_t mu;
    int refs;
} robj_t;
#define ROBJ_N 256
#define ROBJ_PARTIES 4
static robj_t *robjs[ROBJ_N];
static atomic_int robj_freed;
static void robj_drop_all(int party) {
    for (int k = 0; k < ROBJ_N; k++) {
        robj_t *o = robjs[(k * 7 + party * 13) % ROBJ_N]; /* different orders */
        co_mutex_lock(&o->mu);
        int last = --o->refs == 0;
        co_mutex_unlock(&o->mu);
        if (last) {
            memset(o, 0xa5, sizeof *o); /* a stale toucher would see garbage */
            free(o);
            atomic_fetch_add(&robj_freed, 1);
        }
    }
}
static void robj_co(void *a) {
    robj_drop_all((int)(intptr_t)a);
    co_waitgroup_done(&wg);
}
static void *robj_th(void *a) {
    robj_drop_all((int)(intptr_t)a);
    return NULL;
}
static void test_last_one_frees(void) {
    int rounds = t_sanitized() ? 40 : 200;
    for (int r = 0; r < rounds; r++) {
        atomic_store(&robj_freed, 0);
        for (int k = 0; k < ROBJ_N; k++) {
            robjs[k] = calloc(1, sizeof(robj_t));
            robjs[k]->refs = ROBJ_PARTIES;
        }
        co_waitgroup_add(&wg, ROBJ_PARTIES - 1);
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, robj_th, (void *)(intptr_t)0), 0);
        for (int p = 1; p < ROBJ_PARTIES; p++) CHECK_EQ(co_go(robj_co, (void *)(intptr_t)p), 0);
        co_waitgroup_wait(&wg);
        pthread_join(th, NULL);
        CHECK_EQ(atomic_load(&robj_freed), ROBJ_N);
    }
}

int main(void) {
    t_begin(t_small() ? 280 : 200);
    T_RUN(test_counter);
    T_RUN(test_starvation_victim_coroutine);
    T_RUN(test_starvation_victim_thread);
    T_RUN(test_starvation_many);
    T_RUN(test_last_one_frees);
    return t_end();
}
