/* Group (errgroup): first error, context canceled on error and on wait,
 * limit, use from threads, errors and misuse. */
// ctest-timeout: 250
#include "colony.h"
#include "t.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


#define MS (1000 * 1000LL)

/* ---- misuse in a fresh process ----------------------------------------- */
static void expect_abort(const char *name, const char *op) {
    t_expect_abort("test_group", name, op);
}

static int block_on_done(void *a) {
    char x;
    co_chan_recv(co_ctx_done(co_group_ctx(a)), &x, CO_FOREVER);
    return 0;
}

static int run_misuse(const char *name) {
    co_group_t *g;
    if (co_group_new(&g, NULL) != 0) return 3;
    fprintf(stderr, "obj=%p\n", (void *)g);
    if (co_group_go(g, block_on_done, g) != 0) return 3;
    if (!strcmp(name, "limit_active"))
        co_group_limit(g, 2);
    else if (!strcmp(name, "free_running"))
        co_group_free(g);
    else
        return 2;
    return 0;
}

static void test_misuse(void) {
    expect_abort("limit_active", "co_group_limit");
    expect_abort("free_running", "co_group_free");
}

/* ---- basics ----------------------------------------------------------------- */
static int ret_arg(void *a) { return (int)(intptr_t)a; }

static int sum;
static int add_one(void *a) {
    __atomic_add_fetch(&sum, 1, __ATOMIC_RELAXED);
    return 0;
}

static void test_einval(void) {
    co_group_t *g = (co_group_t *)0x1;
    CHECK_EQ(co_group_new(NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_group_go(NULL, add_one, NULL), CO_EINVAL);
    CHECK_EQ(co_group_wait(NULL), CO_EINVAL);
    CHECK(co_group_ctx(NULL) == NULL);
    co_group_free(NULL); /* co_group_limit(NULL, n) aborts: test_null */
    CHECK_EQ(co_group_new(&g, NULL), 0);
    CHECK_EQ(co_group_go(g, NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_group_wait(g), 0); /* nothing ran */
    co_group_free(g);
}

static void test_all_ok(void) {
    co_group_t *g;
    CHECK_EQ(co_group_new(&g, NULL), 0);
    co_ctx_t *ctx = co_group_ctx(g);
    CHECK(ctx != NULL);
    CHECK_EQ(co_ctx_err(ctx), 0);
    sum = 0;
    for (int i = 0; i < 100; i++) CHECK_EQ(co_group_go(g, add_one, NULL), 0);
    CHECK_EQ(co_group_wait(g), 0);
    CHECK_EQ(sum, 100);
    /* canceled when wait returns, as errgroup.WithContext */
    CHECK_EQ(co_ctx_err(ctx), CO_ECANCELED);
    /* reusable after wait */
    CHECK_EQ(co_group_go(g, add_one, NULL), 0);
    CHECK_EQ(co_group_wait(g), 0);
    CHECK_EQ(sum, 101);
    co_group_free(g);
}

/* The first error wins; the context is canceled so the others stop. */
static int wait_then_fail(void *a) {
    co_group_t *g = a;
    char x;
    CHECK_EQ(co_chan_recv(co_ctx_done(co_group_ctx(g)), &x, CO_FOREVER), CO_ECLOSED);
    return co_ctx_err(co_group_ctx(g)); /* a later, different error */
}
static int fail_later(void *a) {
    co_sleep(5 * MS);
    return -77;
}
static void test_first_error(void) {
    co_group_t *g;
    CHECK_EQ(co_group_new(&g, NULL), 0);
    for (int i = 0; i < 10; i++) CHECK_EQ(co_group_go(g, wait_then_fail, g), 0);
    CHECK_EQ(co_group_go(g, ret_arg, (void *)0), 0);
    CHECK_EQ(co_group_go(g, fail_later, NULL), 0);
    CHECK_EQ(co_group_wait(g), -77);
    CHECK_EQ(co_ctx_err(co_group_ctx(g)), CO_ECANCELED);
    co_group_free(g);
}

/* The group's context is a child of the parent given. */
static const char pkey[] = "k";
static char pval[] = "v";
static void test_parent_ctx(void) {
    co_ctx_t *parent;
    CHECK_EQ(co_ctx_with_value(&parent, co_ctx_background(), pkey, pval), 0);
    co_group_t *g;
    CHECK_EQ(co_group_new(&g, parent), 0);
    CHECK(co_ctx_value(co_group_ctx(g), pkey) == pval);
    for (int i = 0; i < 3; i++) CHECK_EQ(co_group_go(g, wait_then_fail, g), 0);
    co_sleep(2 * MS);
    co_ctx_cancel(parent); /* tasks see the group ctx canceled */
    CHECK_EQ(co_group_wait(g), CO_ECANCELED);
    co_group_free(g);
    co_ctx_free(parent);
}

/* ---- limit --------------------------------------------------------------- */
static int running, max_running;
static int counted(void *a) {
    int r = __atomic_add_fetch(&running, 1, __ATOMIC_ACQ_REL);
    int m = __atomic_load_n(&max_running, __ATOMIC_RELAXED);
    while (r > m && !__atomic_compare_exchange_n(&max_running, &m, r, false, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
    }
    co_sleep(MS / 2);
    co_yield();
    __atomic_sub_fetch(&running, 1, __ATOMIC_ACQ_REL);
    return 0;
}
static void test_limit(void) {
    co_group_t *g;
    CHECK_EQ(co_group_new(&g, NULL), 0);
    co_group_limit(g, 3);
    running = max_running = 0;
    for (int i = 0; i < 60; i++) CHECK_EQ(co_group_go(g, counted, NULL), 0);
    CHECK_EQ(co_group_wait(g), 0);
    CHECK(max_running <= 3);
    CHECK(max_running >= 1);
    /* limit may change once idle; <= 0 is unlimited */
    co_group_limit(g, 0);
    running = max_running = 0;
    for (int i = 0; i < 20; i++) CHECK_EQ(co_group_go(g, counted, NULL), 0);
    CHECK_EQ(co_group_wait(g), 0);
    co_group_limit(g, -4);
    co_group_limit(g, 1);
    running = max_running = 0;
    for (int i = 0; i < 10; i++) CHECK_EQ(co_group_go(g, counted, NULL), 0);
    CHECK_EQ(co_group_wait(g), 0);
    CHECK_EQ(max_running, 1);
    co_group_free(g);
}

/* A co_group_go over the limit blocks until a slot frees: from a plain
 * thread and from a coroutine. */
static co_chan_t *gate;
static int gated(void *a) {
    int v;
    CHECK_EQ(co_chan_recv(gate, &v, CO_FOREVER), 0);
    return 0;
}
typedef struct {
    co_group_t *g;
    int returned;
} gogo_t;
static void *go_from_thread(void *a) {
    gogo_t *x = a;
    CHECK_EQ(co_group_go(x->g, add_one, NULL), 0);
    __atomic_add_fetch(&x->returned, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void go_from_co(void *a) {
    gogo_t *x = a;
    CHECK_EQ(co_group_go(x->g, add_one, NULL), 0);
    __atomic_add_fetch(&x->returned, 10, __ATOMIC_RELEASE);
}
static void test_limit_blocks_go(void) {
    CHECK_EQ(co_chan_new(&gate, sizeof(int), 0), 0);
    co_group_t *g;
    CHECK_EQ(co_group_new(&g, NULL), 0);
    co_group_limit(g, 2);
    sum = 0;
    CHECK_EQ(co_group_go(g, gated, NULL), 0);
    CHECK_EQ(co_group_go(g, gated, NULL), 0);
    gogo_t x = {g, 0};
    pthread_t th;
    pthread_create(&th, NULL, go_from_thread, &x);
    co_sleep(5 * MS);
    CHECK_EQ(co_go(go_from_co, &x), 0);
    co_sleep(10 * MS);
    CHECK_EQ(__atomic_load_n(&x.returned, __ATOMIC_ACQUIRE), 0); /* both still blocked */
    int one = 1;
    CHECK_EQ(co_chan_send(gate, &one, CO_FOREVER), 0); /* frees a slot */
    pthread_join(th, NULL); /* whichever was first in line, the other follows */
    CHECK_EQ(co_chan_send(gate, &one, CO_FOREVER), 0);
    while (__atomic_load_n(&x.returned, __ATOMIC_ACQUIRE) != 11) co_sleep(MS);
    CHECK_EQ(co_group_wait(g), 0);
    CHECK_EQ(sum, 2);
    co_group_free(g);
    co_chan_free(gate);
}

/* Group used entirely from a coroutine, waiting there too. */
static void co_driver(void *a) {
    co_group_t *g;
    CHECK_EQ(co_group_new(&g, NULL), 0);
    co_group_limit(g, 4);
    for (int i = 1; i <= 30; i++) CHECK_EQ(co_group_go(g, ret_arg, (void *)(intptr_t)(i == 17 ? -17 : 0)), 0);
    CHECK_EQ(co_group_wait(g), -17);
    co_group_free(g);
    co_waitgroup_done(a);
}
static void test_from_coroutine(void) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(co_driver, &wg), 0);
    co_waitgroup_wait(&wg);
}

/* Stress: several groups, threads and coroutines adding tasks, random
 * errors. */
typedef struct {
    int n;
    unsigned seed;
} gs_t;
static int maybe_fail(void *a) {
    intptr_t v = (intptr_t)a;
    if (v % 5 == 0) co_yield();
    return v % 97 == 0 ? -1 : 0;
}
static void gstress(gs_t *s) {
    for (int round = 0; round < s->n; round++) {
        co_group_t *g;
        CHECK_EQ(co_group_new(&g, NULL), 0);
        int lim = rand_r(&s->seed) % 4;
        co_group_limit(g, lim);
        int fail = 0;
        for (int i = 0; i < 20; i++) {
            intptr_t v = rand_r(&s->seed) % 1000 + 1;
            if (v % 97 == 0) fail = 1;
            CHECK_EQ(co_group_go(g, maybe_fail, (void *)v), 0);
        }
        CHECK_EQ(co_group_wait(g), fail ? -1 : 0);
        co_group_free(g);
    }
}
static co_waitgroup_t gs_wg = CO_WAITGROUP_INIT;
static void gstress_co(void *a) {
    gstress(a);
    co_waitgroup_done(&gs_wg);
}
static void *gstress_th(void *a) {
    gstress(a);
    return NULL;
}
static void test_stress(void) {
    int n = t_small() ? 20 : 200;
    gs_t s[6];
    for (int i = 0; i < 6; i++) s[i] = (gs_t){n, (unsigned)i * 31u + 7u};
    co_waitgroup_add(&gs_wg, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(co_go(gstress_co, &s[i]), 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, gstress_th, &s[4 + i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&gs_wg);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--misuse")) return run_misuse(argv[2]);
    t_begin(t_small() ? 240 : 120);
    T_RUN(test_einval);
    T_RUN(test_all_ok);
    T_RUN(test_first_error);
    T_RUN(test_parent_ctx);
    T_RUN(test_limit);
    T_RUN(test_limit_blocks_go);
    T_RUN(test_from_coroutine);
    T_RUN(test_stress);
    T_RUN(test_misuse);
    return t_end();
}
