/* Weighted semaphore: FIFO, a large waiter is not starved, deadlines,
 * try_acquire, errors and misuse. */
// ctest-timeout: 250
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


#define MS (1000 * 1000LL)

/* hidden test hook in src/sema.c */

/* ---- misuse in a fresh process ----------------------------------------- */
static void expect_abort(const char *name, const char *op) {
    t_expect_abort("test_sem", name, op);
}

static int run_misuse(const char *name) {
    static co_sem_t s;
    co_sem_init(&s, 4);
    fprintf(stderr, "obj=%p\n", (void *)&s);
    if (!strcmp(name, "release_unheld")) {
        co_sem_release(&s, 1);
    } else if (!strcmp(name, "release_too_many")) {
        CHECK_EQ(co_sem_acquire(&s, 2, CO_FOREVER), 0);
        co_sem_release(&s, 3);
    } else if (!strcmp(name, "acquire_negative")) {
        co_sem_acquire(&s, -1, CO_FOREVER);
    } else if (!strcmp(name, "try_negative")) {
        co_sem_try_acquire(&s, -2);
    } else if (!strcmp(name, "release_negative")) {
        co_sem_release(&s, -1);
    } else if (!strcmp(name, "init_negative")) {
        co_sem_init(&s, -5);
    } else {
        return 2;
    }
    return 0;
}

static void test_misuse(void) {
    expect_abort("release_unheld", "co_sem_release");
    expect_abort("release_too_many", "released 3 but only 2 held");
    expect_abort("acquire_negative", "co_sem_acquire");
    expect_abort("try_negative", "co_sem_try_acquire");
    expect_abort("release_negative", "co_sem_release");
    expect_abort("init_negative", "co_sem_init");
}

/* ---- basics -------------------------------------------------------------- */
static void test_basic(void) {
    co_sem_t s;
    co_sem_init(&s, 5);
    CHECK_EQ(co_sem_acquire(&s, 3, CO_FOREVER), 0);
    CHECK(co_sem_try_acquire(&s, 2));
    CHECK(!co_sem_try_acquire(&s, 1));
    CHECK_EQ(co_sem_acquire(&s, 1, 0), CO_ETIMEDOUT);                 /* past: try once */
    CHECK_EQ(co_sem_acquire(&s, 1, co_now() - 1), CO_ETIMEDOUT);
    CHECK_EQ(co_sem_acquire(&s, 1, co_deadline_after(5 * MS)), CO_ETIMEDOUT); /* waits, times out */
    CHECK(co_sem_try_acquire(&s, 0));                                 /* 0 always fits */
    CHECK_EQ(co_sem_acquire(&s, 0, 0), 0);
    co_sem_release(&s, 0);
    co_sem_release(&s, 5);
    CHECK(co_sem_try_acquire(&s, 5)); /* the timed-out waiters took nothing */
    co_sem_release(&s, 5);
    /* n > size can never succeed */
    CHECK_EQ(co_sem_acquire(&s, 6, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_sem_acquire(&s, 6, 0), CO_EINVAL);
    CHECK(!co_sem_try_acquire(&s, 6));
    /* zero-filled semaphore: size 0 */
    co_sem_t z;
    memset(&z, 0, sizeof z);
    CHECK_EQ(co_sem_acquire(&z, 1, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_sem_acquire(&z, 0, CO_FOREVER), 0);
    CHECK(!co_sem_try_acquire(&z, 1));
}

/* ---- FIFO and the large waiter -------------------------------------------- */
static co_sem_t fs;
static int order[8], norder;
static void record(int who) { order[__atomic_fetch_add(&norder, 1, __ATOMIC_RELAXED)] = who; }

/* Wait until someone is queued: with free tokens, try_acquire(1) fails only
 * when a waiter is ahead of it. True then; false if *gone (NULL: never)
 * was set first: a waiter with a deadline may leave before it is seen,
 * and nobody else would ever queue. */
static bool wait_queued(co_sem_t *s, const int *gone) {
    while (co_sem_try_acquire(s, 1)) {
        co_sem_release(s, 1);
        if (gone && __atomic_load_n(gone, __ATOMIC_ACQUIRE)) return false;
        co_sleep(MS / 2);
    }
    return true;
}

static void big_co(void *a) {
    CHECK_EQ(co_sem_acquire(&fs, 10, CO_FOREVER), 0);
    record(1);
    co_sleep(5 * MS);
    co_sem_release(&fs, 10);
    co_waitgroup_done(a);
}
static void *small_th(void *a) {
    CHECK_EQ(co_sem_acquire(&fs, 1, CO_FOREVER), 0);
    record(2);
    co_sem_release(&fs, 1);
    return NULL;
}
static void test_large_not_starved(void) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_sem_init(&fs, 10);
    norder = 0;
    CHECK_EQ(co_sem_acquire(&fs, 5, CO_FOREVER), 0); /* 5 held, 5 free */
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(big_co, &wg), 0); /* wants all 10: waits */
    wait_queued(&fs, NULL); /* (true: without `gone` it returns only then) */
    /* 5 tokens are free, yet a small request queues behind the large one */
    CHECK(!co_sem_try_acquire(&fs, 1));
    CHECK_EQ(co_sem_acquire(&fs, 1, 0), CO_ETIMEDOUT);
    pthread_t th;
    pthread_create(&th, NULL, small_th, NULL);
    co_sleep(5 * MS);
    CHECK_EQ(__atomic_load_n(&norder, __ATOMIC_RELAXED), 0); /* still nobody */
    co_sem_release(&fs, 5);
    pthread_join(th, NULL);
    co_waitgroup_wait(&wg);
    CHECK_EQ(norder, 2);
    CHECK_EQ(order[0], 1); /* the large one first */
    CHECK_EQ(order[1], 2);
    CHECK(co_sem_try_acquire(&fs, 10));
    co_sem_release(&fs, 10);
}

/* When the head waiter times out, those behind it that fit go ahead: not
 * before the head's deadline (they queue behind it), but without waiting
 * for a release. */
static int64_t head_deadline, behind_got;
static int head_gone; /* atomic: head_timeout returned */
static void head_timeout(void *a) {
    CHECK_EQ(co_sem_acquire(&fs, 10, head_deadline), CO_ETIMEDOUT);
    __atomic_store_n(&head_gone, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(a);
}
static void behind(void *a) {
    CHECK_EQ(co_sem_acquire(&fs, 2, CO_FOREVER), 0);
    behind_got = co_now();
    co_waitgroup_done(a);
}
static void test_head_timeout_unblocks(void) {
    co_waitgroup_t hwg = CO_WAITGROUP_INIT, bwg = CO_WAITGROUP_INIT;
    co_sem_init(&fs, 10);
    CHECK_EQ(co_sem_acquire(&fs, 5, CO_FOREVER), 0);
    /* The head must be seen queued before its deadline. A loaded machine
     * (sanitizers, chaos mode, parallel runs) may start it, or let us
     * look, only after that: then try again with a deadline twice as far. */
    bool queued = false;
    for (int k = 0; k < 8 && !queued; k++) {
        __atomic_store_n(&head_gone, 0, __ATOMIC_RELAXED);
        head_deadline = co_deadline_after((20 * MS) << k);
        co_waitgroup_add(&hwg, 1);
        CHECK_EQ(co_go(head_timeout, &hwg), 0);
        queued = wait_queued(&fs, &head_gone);
        if (!queued) co_waitgroup_wait(&hwg);
    }
    CHECK(queued);
    if (!queued) return;
    co_waitgroup_add(&bwg, 1);
    CHECK_EQ(co_go(behind, &bwg), 0);
    co_waitgroup_wait(&hwg);
    co_waitgroup_wait(&bwg); /* behind gets its 2 once the head leaves */
    CHECK(behind_got >= head_deadline);
    co_sem_release(&fs, 7);
    CHECK(co_sem_try_acquire(&fs, 10));
    co_sem_release(&fs, 10);
}

/* Every token held; the head waiter (n = 1) gives up at its deadline;
 * a waiter for 0 behind it fits now and is served then, with no release
 * (it waited for a release or its own deadline). */
static _Atomic int zero_done;
static void zero_behind(void *a) {
    CHECK_EQ(co_sem_acquire(&fs, 0, CO_FOREVER), 0);
    atomic_store(&zero_done, 1);
    co_waitgroup_done(a);
}
static void head_one(void *a) {
    CHECK_EQ(co_sem_acquire(&fs, 1, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    co_waitgroup_done(a);
}
static void test_head_timeout_zero_behind(void) {
    co_waitgroup_t head = CO_WAITGROUP_INIT, zero = CO_WAITGROUP_INIT;
    co_sem_init(&fs, 1);
    CHECK_EQ(co_sem_acquire(&fs, 1, CO_FOREVER), 0); /* all held */
    atomic_store(&zero_done, 0);
    co_waitgroup_add(&head, 1);
    co_waitgroup_add(&zero, 1);
    CHECK_EQ(co_go(head_one, &head), 0);
    co_sleep(2 * MS); /* queued first, most runs; either order must pass */
    CHECK_EQ(co_go(zero_behind, &zero), 0);
    co_waitgroup_wait(&head);
    for (int i = 0; i < 10000 && !atomic_load(&zero_done); i++) co_sleep(MS);
    CHECK(atomic_load(&zero_done)); /* served without a release */
    co_sem_release(&fs, 1);
    co_waitgroup_wait(&zero);
}

/* FIFO among equal waiters, coroutines and threads. */
static co_waitgroup_t fifo_wg = CO_WAITGROUP_INIT;
static void fifo_take(int who) {
    CHECK_EQ(co_sem_acquire(&fs, 1, CO_FOREVER), 0);
    record(who);
    co_sem_release(&fs, 1);
}
static void fifo_co(void *a) {
    fifo_take((int)(intptr_t)a);
    co_waitgroup_done(&fifo_wg);
}
static void *fifo_th(void *a) {
    fifo_take((int)(intptr_t)a);
    return NULL;
}
static void test_fifo(void) {
    co_sem_init(&fs, 1);
    norder = 0;
    CHECK_EQ(co_sem_acquire(&fs, 1, CO_FOREVER), 0);
    pthread_t th[2];
    int nth = 0;
    for (int i = 1; i <= 6; i++) {
        if (i % 3 == 0) {
            pthread_create(&th[nth++], NULL, fifo_th, (void *)(intptr_t)i);
        } else {
            co_waitgroup_add(&fifo_wg, 1);
            CHECK_EQ(co_go(fifo_co, (void *)(intptr_t)i), 0);
        }
        while (co__sem_waiters(&fs) < i) co_sleep(MS / 2); /* queued in this order */
    }
    co_sem_release(&fs, 1);
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&fifo_wg);
    CHECK_EQ(norder, 6);
    for (int i = 0; i < 6; i++) CHECK_EQ(order[i], i + 1);
    CHECK_EQ(co__sem_waiters(&fs), 0);
}

/* ---- stress -------------------------------------------------------------- */
typedef struct {
    co_sem_t s;
    int64_t size;
    int64_t in_use; /* atomic */
    int iters;
    int timeouts;
} st_t;
static void stress_body(st_t *t, unsigned seed) {
    for (int i = 0; i < t->iters; i++) {
        int64_t n = 1 + rand_r(&seed) % t->size;
        int64_t dl = (i % 3 == 0) ? co_deadline_after((int64_t)(rand_r(&seed) % 300) * 1000) : CO_FOREVER;
        int rc;
        if (i % 5 == 0)
            rc = co_sem_try_acquire(&t->s, n) ? 0 : CO_ETIMEDOUT;
        else
            rc = co_sem_acquire(&t->s, n, dl);
        if (rc == CO_ETIMEDOUT) {
            __atomic_add_fetch(&t->timeouts, 1, __ATOMIC_RELAXED);
            continue;
        }
        CHECK_EQ(rc, 0);
        int64_t u = __atomic_add_fetch(&t->in_use, n, __ATOMIC_ACQ_REL);
        CHECK(u <= t->size);
        if (i % 4 == 0) co_yield();
        __atomic_sub_fetch(&t->in_use, n, __ATOMIC_ACQ_REL);
        co_sem_release(&t->s, n);
    }
}
static st_t st;
static co_waitgroup_t st_wg = CO_WAITGROUP_INIT;
static void stress_co(void *a) {
    stress_body(&st, (unsigned)(intptr_t)a);
    co_waitgroup_done(&st_wg);
}
static void *stress_th(void *a) {
    stress_body(&st, (unsigned)(intptr_t)a);
    return NULL;
}
static void test_stress(void) {
    st.size = 7;
    co_sem_init(&st.s, st.size);
    st.iters = t_small() ? 1000 : 10000;
    co_waitgroup_add(&st_wg, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ(co_go(stress_co, (void *)(intptr_t)(i + 1)), 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, stress_th, (void *)(intptr_t)(100 + i));
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&st_wg);
    CHECK_EQ(st.in_use, 0);
    CHECK(co_sem_try_acquire(&st.s, st.size)); /* all tokens back */
    co_sem_release(&st.s, st.size);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--misuse")) return run_misuse(argv[2]);
    t_begin(t_small() ? 240 : 120);
    T_RUN(test_basic);
    T_RUN(test_large_not_starved);
    T_RUN(test_head_timeout_unblocks);
    T_RUN(test_head_timeout_zero_behind);
    T_RUN(test_fifo);
    T_RUN(test_stress);
    T_RUN(test_misuse);
    return t_end();
}
