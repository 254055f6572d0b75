/* co_blocking's cap: never more than the cap inside at once, callers
 * beyond it wait in FIFO order, a raised cap lets waiters in, a panic out
 * of fn gives the slot back, and a storm of 1,000 blocking calls all
 * complete with a bounded thread count. Behaviour, not timing: every wait
 * for a condition gives up only after 10 s. */
// ctest-timeout: 60
#include "t.h"

#include <colony.h>

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define MS 1000000LL
#define GIVE_UP (10000 * MS)

static int inside, max_inside, done_count;

static void note_in(void) {
    int n = __atomic_add_fetch(&inside, 1, __ATOMIC_SEQ_CST);
    int m = __atomic_load_n(&max_inside, __ATOMIC_RELAXED);
    while (n > m && !__atomic_compare_exchange_n(&max_inside, &m, n, false, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
    }
}
static void note_out(void) { __atomic_sub_fetch(&inside, 1, __ATOMIC_SEQ_CST); }

/* Waits (the thread: this runs inside co_blocking) for cond, up to 10 s. */
static int wait_flag(const int *flag, int want) {
    int64_t t0 = co_now();
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < want) {
        if (co_now() - t0 > GIVE_UP) return -1;
        usleep(200);
    }
    return 0;
}
/* The same from a coroutine. */
static int co_wait_flag(const int *flag, int want) {
    int64_t t0 = co_now();
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < want) {
        if (co_now() - t0 > GIVE_UP) return -1;
        co_sleep(MS / 5);
    }
    return 0;
}

static void sleepy(void *arg) {
    note_in();
    usleep((useconds_t)(uintptr_t)arg);
    note_out();
}
static void call_sleepy(void *arg) {
    CHECK_EQ(co_blocking(sleepy, arg), 0);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}

static void test_knob(void) {
    int def = co_blocking_max(0);
    CHECK(def > 0);
    const char *e = getenv("COLONY_BLOCKING_MAX");
    if (!e) CHECK_EQ(def, 128);
    CHECK_EQ(co_blocking_max(-1), CO_EINVAL);
    CHECK_EQ(co_blocking_max(7), def);
    CHECK_EQ(co_blocking_max(0), 7);
    int busy = -1, waiting = -1;
    CHECK_EQ(co_blocking_stats(&busy, &waiting), 7);
    CHECK_EQ(busy, 0);
    CHECK_EQ(waiting, 0);
    CHECK_EQ(co_blocking_stats(NULL, NULL), 7);
    CHECK_EQ(co_blocking_max(def), 7);
}

/* 40 calls, cap 4: never more than 4 inside, all complete. */
static void test_cap_holds(void) {
    int old = co_blocking_max(4);
    inside = max_inside = done_count = 0;
    for (int i = 0; i < 40; i++) CHECK_EQ(co_go(call_sleepy, (void *)(uintptr_t)2000), 0);
    CHECK_EQ(co_wait_flag(&done_count, 40), 0);
    CHECK(max_inside <= 4);
    CHECK(max_inside >= 1);
    int busy = -1, waiting = -1;
    co_blocking_stats(&busy, &waiting);
    CHECK_EQ(busy, 0);
    CHECK_EQ(waiting, 0);
    co_blocking_max(old);
}

/* Cap 1, a holder inside; A, B, C queue in that order and enter in it. */
static int release_holder, holder_in;
static int order[3], norder;
static void holder_fn(void *arg) {
    (void)arg;
    __atomic_store_n(&holder_in, 1, __ATOMIC_RELEASE);
    CHECK_EQ(wait_flag(&release_holder, 1), 0);
}
static void call_holder(void *arg) {
    (void)arg;
    co_blocking(holder_fn, NULL);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}
static void record_fn(void *arg) {
    order[__atomic_fetch_add(&norder, 1, __ATOMIC_RELAXED)] = (int)(uintptr_t)arg;
}
static void call_record(void *arg) {
    co_blocking(record_fn, arg);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}
static int waiting_now(void) {
    int w = 0;
    co_blocking_stats(NULL, &w);
    return w;
}
static void test_fifo(void) {
    int old = co_blocking_max(1);
    done_count = norder = release_holder = holder_in = 0;
    CHECK_EQ(co_go(call_holder, NULL), 0);
    CHECK_EQ(co_wait_flag(&holder_in, 1), 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(co_go(call_record, (void *)(uintptr_t)(i + 1)), 0);
        int64_t t0 = co_now();
        while (waiting_now() < i + 1 && co_now() - t0 < GIVE_UP) co_sleep(MS / 5);
        CHECK_EQ(waiting_now(), i + 1);
    }
    __atomic_store_n(&release_holder, 1, __ATOMIC_RELEASE);
    CHECK_EQ(co_wait_flag(&done_count, 4), 0);
    CHECK_EQ(norder, 3);
    CHECK_EQ(order[0], 1);
    CHECK_EQ(order[1], 2);
    CHECK_EQ(order[2], 3);
    co_blocking_max(old);
}

/* Cap 1 with a holder and three waiters: raising the cap to 4 lets all
 * three in while the holder is still inside. */
static int entered;
static void enter_fn(void *arg) {
    (void)arg;
    __atomic_add_fetch(&entered, 1, __ATOMIC_RELEASE);
}
static void call_enter(void *arg) {
    co_blocking(enter_fn, arg);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}
static void test_raise_lets_in(void) {
    int old = co_blocking_max(1);
    done_count = entered = release_holder = holder_in = 0;
    CHECK_EQ(co_go(call_holder, NULL), 0);
    CHECK_EQ(co_wait_flag(&holder_in, 1), 0);
    for (int i = 0; i < 3; i++) CHECK_EQ(co_go(call_enter, NULL), 0);
    int64_t t0 = co_now();
    while (waiting_now() < 3 && co_now() - t0 < GIVE_UP) co_sleep(MS / 5);
    CHECK_EQ(waiting_now(), 3);
    CHECK_EQ(entered, 0);
    CHECK_EQ(co_blocking_max(4), 1);
    CHECK_EQ(co_wait_flag(&entered, 3), 0);
    CHECK_EQ(__atomic_load_n(&release_holder, __ATOMIC_ACQUIRE), 0); /* holder still in */
    __atomic_store_n(&release_holder, 1, __ATOMIC_RELEASE);
    CHECK_EQ(co_wait_flag(&done_count, 4), 0);
    co_blocking_max(old);
}

/* A panic out of fn gives the slot back. */
static void panicky(void *arg) {
    (void)arg;
    co_panic((void *)"boom");
}
static void blocking_panicky(void *arg) { co_blocking(panicky, arg); }
static void test_panic_gives_back(void) {
    int old = co_blocking_max(1);
    for (int i = 0; i < 5; i++) {
        void *v = NULL;
        CHECK_EQ(co_recover(blocking_panicky, NULL, &v), 1);
        CHECK(v != NULL);
    }
    int busy = -1;
    co_blocking_stats(&busy, NULL);
    CHECK_EQ(busy, 0);
    done_count = 0;
    CHECK_EQ(co_go(call_sleepy, (void *)(uintptr_t)100), 0);
    CHECK_EQ(co_wait_flag(&done_count, 1), 0);
    co_blocking_max(old);
}

/* 1,000 concurrent blocking calls under a cap of 16: all complete, at most
 * 16 inside at once, and the threads stay within cap + procs + a few
 * (sysmon, an M spinning or idle): far below one per call. */
static void test_storm(void) {
    int n = t_sanitized() ? 300 : 1000;
    int old = co_blocking_max(16);
    inside = max_inside = done_count = 0;
    for (int i = 0; i < n; i++) CHECK_EQ(co_go(call_sleepy, (void *)(uintptr_t)1000), 0);
    int max_threads = 0;
    int64_t t0 = co_now();
    while (__atomic_load_n(&done_count, __ATOMIC_ACQUIRE) < n && co_now() - t0 < 3 * GIVE_UP) {
        co_sched_stats_t st;
        co_sched_stats(&st);
        if (st.threads > max_threads) max_threads = st.threads;
        co_sleep(MS);
    }
    CHECK_EQ(done_count, n);
    CHECK(max_inside <= 16);
    fprintf(stderr, "storm: %d calls, max inside %d, max threads %d (procs %d)\n", n,
            max_inside, max_threads, co_procs());
    CHECK(max_threads <= 16 + co_procs() + 8);
    co_blocking_max(old);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_knob);
    T_RUN(test_storm);
    T_RUN(test_cap_holds);
    T_RUN(test_fifo);
    T_RUN(test_raise_lets_in);
    T_RUN(test_panic_gives_back);
    return 0;
}

int main(void) {
    t_begin(50);
    co_main(run, NULL);
    return t_end();
}
