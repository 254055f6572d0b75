/* co_yield: order, and the yield slot (src/yslot.h), which keeps a yielder
 * where thieves never look when nothing else is queued on its P. Nothing
 * may be stranded there: not behind a coroutine that computes without
 * yielding, not behind one in a blocking call. */
#include "colony.h"
#include "t.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* ---- order: K coroutines on one P take turns, first in, first out ------- */

#define ORDER_ROUNDS 2000
/* Each turn takes its own entry (atomic index): if sysmon lends a second P
 * (below), two coroutines may run at once. */
static int order_log[8 * ORDER_ROUNDS];
static int64_t order_when[8 * ORDER_ROUNDS];
static int order_len; /* atomic */

typedef struct {
    int id;
    co_waitgroup_t *wg;
} order_arg_t;

static void order_worker(void *arg) {
    order_arg_t *a = arg;
    for (int i = 0; i < ORDER_ROUNDS; i++) {
        int i = __atomic_fetch_add(&order_len, 1, __ATOMIC_RELAXED);
        order_log[i] = a->id;
        order_when[i] = co_now();
        co_yield();
    }
    co_waitgroup_done(a->wg);
}

typedef struct {
    int k;
    co_waitgroup_t done;
} order_run_t;

/* Spawns the k workers from a coroutine, so that all of them are queued
 * on the P before the first runs (from a plain thread, the first could
 * finish before the main thread had spawned the second). */
static void order_launcher(void *arg) {
    order_run_t *run = arg;
    int k = run->k;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    order_arg_t args[8];
    co_waitgroup_add(&wg, k);
    for (int i = 0; i < k; i++) {
        args[i] = (order_arg_t){i, &wg};
        CHECK_EQ(co_go(order_worker, &args[i]), 0);
    }
    co_waitgroup_wait(&wg);
    co_waitgroup_done(&run->done);
}

static void check_order(int k) {
    order_len = 0;
    order_run_t run = {k, CO_WAITGROUP_INIT};
    co_waitgroup_add(&run.done, 1);
    CHECK_EQ(co_go(order_launcher, &run), 0);
    co_waitgroup_wait(&run.done);
    CHECK_EQ(order_len, k * ORDER_ROUNDS);
    /* Round robin: once every coroutine has run, each turn repeats the one k
     * turns before (a yielder goes behind every other runnable one; with
     * k = 2 that is the slot, with more the ring). The tail, as coroutines
     * finish, shrinks the period, so only full rounds are checked. */
    /* Sysmon lends a second P in place of one that has not scheduled for
     * 10 ms (1 ms in chaos mode); a loaded machine can stall the M that
     * long, and then two Ps share the coroutines and no order holds. Each
     * turn is a schedule: without a gap of 500 us between two turns no P
     * was lent, and the order must hold exactly. */
    int64_t gap = 0;
    for (int i = 1; i < k * ORDER_ROUNDS; i++)
        if (order_when[i] - order_when[i - 1] > gap) gap = order_when[i] - order_when[i - 1];
    if (gap > 500000) {
        fprintf(stderr, "k=%d: order not checked: a %lld us stall may have let sysmon lend a P\n",
                k, (long long)(gap / 1000));
        return;
    }
    /* The first turns run the new coroutines in spawn order (the P's
     * fresh deque, newest first, with every 61st schedule taking the ring
     * first): the round robin starts once all k have run. */
    int f = 0, seen = 0, was[8] = {0};
    for (; f < k * ORDER_ROUNDS && seen < k; f++)
        if (!was[order_log[f]]++) seen++;
    int bad = 0;
    for (int i = f - 1 + k; i < k * (ORDER_ROUNDS - 1); i++) {
        if (order_log[i] != order_log[i - k] && bad++ < 3) {
            fprintf(stderr, "k=%d: turn %d: ", k, i);
            for (int j = i - 2 * k; j < i + 2 * k; j++) fprintf(stderr, "%d ", j >= 0 ? order_log[j] : -1);
            fprintf(stderr, "\n");
        }
    }
    CHECK_EQ(bad, 0);
}

static void test_order(void) {
    t_start(1);
    for (int k = 1; k <= 5; k++) check_order(k);
    t_stop();
}

/* Runs a and b (each takes a waitgroup to finish) from a coroutine, so that
 * both are queued before either runs, and waits for them. */
typedef struct {
    void (*a)(void *), (*b)(void *);
    co_waitgroup_t done;
} pair_t;

static void pair_launcher(void *arg) {
    pair_t *pr = arg;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 2);
    CHECK_EQ(co_go(pr->a, &wg), 0);
    CHECK_EQ(co_go(pr->b, &wg), 0);
    co_waitgroup_wait(&wg);
    co_waitgroup_done(&pr->done);
}

static void run_pair(void (*a)(void *), void (*b)(void *)) {
    pair_t pr = {a, b, CO_WAITGROUP_INIT};
    co_waitgroup_add(&pr.done, 1);
    CHECK_EQ(co_go(pair_launcher, &pr), 0);
    co_waitgroup_wait(&pr.done);
}

/* ---- a hog never strands the yielder ------------------------------------
 * On one P, a and b take turns yielding, so each in turn waits in the
 * slot. Then b stops yielding and spins until a has finished: a is in the
 * slot, and only sysmon can take it out (it lends a spare P after 10 ms
 * without a schedule, 1 ms in chaos mode). Without that this hangs. */

static int hog_a_done; /* atomic */
static int hog_a_yields, hog_b_yields;

static void hog_a(void *arg) {
    for (int i = 0; i < 4000; i++) {
        co_yield();
        __atomic_add_fetch(&hog_a_yields, 1, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&hog_a_done, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(arg);
}

static void hog_b(void *arg) {
    for (int i = 0; i < 1000; i++) {
        co_yield();
        __atomic_add_fetch(&hog_b_yields, 1, __ATOMIC_RELAXED);
    }
    /* a is in the yield slot now (it yielded last; checked by hand) */
    while (!__atomic_load_n(&hog_a_done, __ATOMIC_ACQUIRE)) {
        /* spin without yielding: C cannot be preempted */
    }
    co_waitgroup_done(arg);
}

/* co_gosched is co_yield under Go's name: on 1 P, two coroutines that call
 * it in a loop interleave (the second runs before the first is done). */
static int gs_log[20], gs_n;
static void gs_body(void *arg, int id) {
    for (int i = 0; i < 5; i++) {
        gs_log[__atomic_fetch_add(&gs_n, 1, __ATOMIC_RELAXED)] = id;
        co_gosched();
    }
    co_waitgroup_done(arg);
}
static void gs_a(void *arg) { gs_body(arg, 1); }
static void gs_b(void *arg) { gs_body(arg, 2); }
static void test_gosched(void) {
    t_start(1);
    gs_n = 0;
    run_pair(gs_a, gs_b);
    CHECK_EQ(gs_n, 10);
    int last_a = -1, first_b = -1;
    for (int i = 0; i < gs_n; i++) {
        if (gs_log[i] == 1) last_a = i;
        if (gs_log[i] == 2 && first_b < 0) first_b = i;
    }
    CHECK(first_b >= 0 && first_b < last_a);
    co_gosched(); /* a plain thread: sched_yield */
    t_stop();
}

static void test_hog_behind_yielder(void) {
    t_start(1);
    for (int round = 0; round < 3; round++) {
        __atomic_store_n(&hog_a_done, 0, __ATOMIC_RELAXED);
        hog_a_yields = hog_b_yields = 0;
        run_pair(hog_a, hog_b);
        CHECK_EQ(__atomic_load_n(&hog_a_yields, __ATOMIC_RELAXED), 4000);
        CHECK_EQ(__atomic_load_n(&hog_b_yields, __ATOMIC_RELAXED), 1000);
    }
    t_stop();
}

/* ---- a blocking call never strands the yielder --------------------------
 * b enters co_blocking while a waits in the slot: the P must go to another
 * M (sysmon's retake sees the slot), and a run while b's call waits for it. */

static int blk_a_done; /* atomic */

static void blk_a(void *arg) {
    for (int i = 0; i < 2000; i++) co_yield();
    __atomic_store_n(&blk_a_done, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(arg);
}

static void blk_wait(void *arg) {
    (void)arg;
    struct timespec ts = {0, 100000};
    while (!__atomic_load_n(&blk_a_done, __ATOMIC_ACQUIRE)) nanosleep(&ts, NULL);
}

static void blk_b(void *arg) {
    for (int i = 0; i < 500; i++) co_yield();
    CHECK_EQ(co_blocking(blk_wait, NULL), 0);
    co_waitgroup_done(arg);
}

static void test_blocking_behind_yielder(void) {
    t_start(1);
    for (int round = 0; round < 3; round++) {
        __atomic_store_n(&blk_a_done, 0, __ATOMIC_RELAXED);
        run_pair(blk_a, blk_b);
    }
    t_stop();
}

/* ---- stress: yielders, parkers, spawners and hogs on many Ps ------------ */

#define ST_WORKERS 48
#define ST_ITERS 3000
static long long st_yields, st_spawned, st_children; /* atomic */
static co_waitgroup_t st_children_wg;

static void st_child(void *arg) {
    (void)arg;
    co_yield();
    __atomic_add_fetch(&st_children, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&st_children_wg);
}

static int st_worker(void *arg) {
    long id = (long)(intptr_t)arg;
    co_chan_t *ch = NULL;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    for (int i = 0; i < ST_ITERS; i++) {
        co_yield();
        __atomic_add_fetch(&st_yields, 1, __ATOMIC_RELAXED);
        switch ((i + id) % 97) {
        case 0: /* park on a timer */
            CHECK_EQ(co_sleep(1000), 0);
            break;
        case 1: /* spawn: something new on this P's queue */
            co_waitgroup_add(&st_children_wg, 1);
            if (co_go(st_child, NULL) == 0)
                __atomic_add_fetch(&st_spawned, 1, __ATOMIC_RELAXED);
            else
                co_waitgroup_done(&st_children_wg);
            break;
        case 2: { /* compute a while without yielding (sysmon may lend) */
            int64_t end = co_now() + 200000;
            while (co_now() < end) {
            }
            break;
        }
        case 3: { /* park on a channel nobody receives from: times out */
            int v = 1;
            CHECK_EQ(co_chan_send(ch, &v, co_deadline_after(1000)), CO_ETIMEDOUT);
            break;
        }
        default:
            break;
        }
    }
    co_chan_free(ch);
    return 0;
}

static void test_stress(void) {
    int procs[] = {2, 4};
    for (int r = 0; r < 2; r++) {
        t_start(procs[r]);
        __atomic_store_n(&st_yields, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&st_spawned, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&st_children, 0, __ATOMIC_RELAXED);
        co_group_t *g = NULL;
        CHECK_EQ(co_group_new(&g, NULL), 0);
        if (!g) return;
        for (long i = 0; i < ST_WORKERS; i++)
            CHECK_EQ(co_group_go(g, st_worker, (void *)(intptr_t)i), 0);
        CHECK_EQ(co_group_wait(g), 0);
        co_group_free(g);
        co_waitgroup_wait(&st_children_wg);
        CHECK_EQ(__atomic_load_n(&st_yields, __ATOMIC_RELAXED), (long long)ST_WORKERS * ST_ITERS);
        CHECK(__atomic_load_n(&st_spawned, __ATOMIC_RELAXED) > 0);
        CHECK_EQ(__atomic_load_n(&st_children, __ATOMIC_RELAXED),
                 __atomic_load_n(&st_spawned, __ATOMIC_RELAXED));
        t_stop();
    }
}

/* ---- two yielding computations on 2 Ps run on both -------------------- *
 * Two CPU-bound coroutines that yield after each chunk, on 2 Ps, must end
 * up on both Ps. A yield with a P idle goes to the ring (never the yield
 * slot), but nothing used to wake the idle P's M: when both started on the
 * same P before the other M looked, they took turns there for good and the
 * second P slept (bench_runtime spread_long: 1 run in 5 at 1 P's speed).
 * Each round starts a fresh pair and watches for the two being inside a
 * chunk at once, which needs them on different Ms (interleaved by the OS
 * or truly parallel); a pair stuck on one M never shows it. The first
 * stuck round ends the test. */
#define SPREAD_ROUNDS 30
/* A pair that has not run at once after this long is stuck (it takes
 * under a millisecond normally; chaos mode stalls spinning Ms for up to
 * 15 ms at a time). */
#define SPREAD_GIVE_UP_NS (5000 * 1000000LL)
static atomic_int spread_inside, spread_seen;
static co_waitgroup_t spread_wg;
static atomic_ulong spread_sink; /* keeps the work from being optimised away */

static atomic_int spread_chunks_max; /* the most chunks a worker ran before the overlap */
static int64_t spread_give_up;        /* this round's deadline (set before the spawns) */
static void spread_worker(void *arg) {
    (void)arg;
    int c = 0;
    for (; !atomic_load(&spread_seen) && (c % 64 || co_now() < spread_give_up); c++) {
        if (atomic_fetch_add(&spread_inside, 1) == 1) atomic_store(&spread_seen, 1);
        unsigned long x = (unsigned long)c;
        for (int i = 0; i < 2000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
        atomic_fetch_xor_explicit(&spread_sink, x, memory_order_relaxed);
        if (atomic_load(&spread_inside) == 2) atomic_store(&spread_seen, 1);
        atomic_fetch_sub(&spread_inside, 1);
        co_yield();
    }
    int m = atomic_load(&spread_chunks_max);
    while (c > m && !atomic_compare_exchange_weak(&spread_chunks_max, &m, c)) {
    }
    co_waitgroup_done(&spread_wg);
}

static int spread_stuck;
static void spread_main(void *arg) {
    co_waitgroup_t *done = arg;
    for (int r = 0; r < SPREAD_ROUNDS && !spread_stuck; r++) {
        atomic_store(&spread_seen, 0);
        spread_give_up = co_now() + SPREAD_GIVE_UP_NS;
        co_waitgroup_add(&spread_wg, 2);
        CHECK_EQ(co_go(spread_worker, NULL), 0);
        CHECK_EQ(co_go(spread_worker, NULL), 0);
        co_waitgroup_wait(&spread_wg);
        if (!atomic_load(&spread_seen)) spread_stuck++;
    }
    co_waitgroup_done(done);
}

static void test_yielders_spread(void) {
    t_start(2);
    co_waitgroup_t done = CO_WAITGROUP_INIT;
    co_waitgroup_add(&done, 1);
    CHECK_EQ(co_go(spread_main, &done), 0);
    co_waitgroup_wait(&done);
    fprintf(stderr, "   (at most %d chunks before the two ran at once)\n",
            atomic_load(&spread_chunks_max));
    CHECK_EQ(spread_stuck, 0);
    t_stop();
}

int main(void) {
    t_begin(110);
    T_RUN(test_order);
    T_RUN(test_gosched);
    T_RUN(test_hog_behind_yielder);
    T_RUN(test_blocking_behind_yielder);
    T_RUN(test_stress);
    T_RUN(test_yielders_spread);
    return t_end();
}
