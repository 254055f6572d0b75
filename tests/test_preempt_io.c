/*
 * A coroutine whose I/O calls never wait (the data is always there) still
 * lets the others on its P run: sysmon asks it to yield, and it does at
 * its next I/O call (a safe point at the end of every co_* I/O operation),
 * before any spare P and thread would be lent in its place.
 */
// ctest-timeout: 60
#include "t.h"
#include "t_internal.h"

#include <sys/socket.h>

static int sv[2];
static int other_ran;        /* atomic: set by the coroutine queued behind the loop */
static long loops;

/* write a byte, read it back: neither call ever waits */
static void io_loop(void *arg) {
    co_waitgroup_t *wg = arg;
    char c = 'x';
    while (!__atomic_load_n(&other_ran, __ATOMIC_ACQUIRE)) {
        CHECK_EQ(co_write(sv[0], &c, 1, CO_FOREVER), 1);
        CHECK_EQ(co_read(sv[1], &c, 1, CO_FOREVER), 1);
        loops++;
    }
    co_waitgroup_done(wg);
}

static void other(void *arg) {
    co_waitgroup_t *wg = arg;
    __atomic_store_n(&other_ran, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(wg);
}

static void test_io_loop_yields(void) {
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    uint64_t y0 = __atomic_load_n(&co__preempt_yields, __ATOMIC_RELAXED);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 2);
    /* one P: the other coroutine is queued behind the loop, which never
     * parks; it runs only if the loop yields (or a spare P is lent) */
    __atomic_store_n(&other_ran, 0, __ATOMIC_RELAXED);
    CHECK_EQ(co_go(io_loop, &wg), 0);
    co_yield(); /* the loop starts first */
    CHECK_EQ(co_go(other, &wg), 0);
    co_waitgroup_wait(&wg);
    CHECK(loops > 0);
    /* it yielded at a safe point at least once: the request always comes
     * before any lend, and a loop whose P was lent meanwhile still yields
     * at its next call (the request stays on its old P until then) */
    CHECK(__atomic_load_n(&co__preempt_yields, __ATOMIC_RELAXED) > y0);
    close(sv[0]);
    close(sv[1]);
}

/* Many such loops on the one P, with sleepers beside them that must all
 * wake: every loop stops when all sleepers are back. */
enum { NLOOP = 8, NSLEEP = 50 };
static int sleepers_left; /* atomic */
static void busy_loop(void *arg) {
    co_waitgroup_t *wg = arg;
    int p[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
    char c = 'y';
    while (__atomic_load_n(&sleepers_left, __ATOMIC_ACQUIRE) > 0) {
        CHECK_EQ(co_write(p[0], &c, 1, CO_FOREVER), 1);
        CHECK_EQ(co_read(p[1], &c, 1, CO_FOREVER), 1);
    }
    close(p[0]);
    close(p[1]);
    co_waitgroup_done(wg);
}
static void sleeper(void *arg) {
    co_waitgroup_t *wg = arg;
    for (int i = 0; i < 3; i++) co_sleep(2 * 1000000);
    __atomic_sub_fetch(&sleepers_left, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(wg);
}
static void test_stress(void) {
    for (int round = 0; round < 3; round++) {
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        __atomic_store_n(&sleepers_left, NSLEEP, __ATOMIC_RELAXED);
        co_waitgroup_add(&wg, NLOOP + NSLEEP);
        for (int i = 0; i < NLOOP; i++) CHECK_EQ(co_go(busy_loop, &wg), 0);
        for (int i = 0; i < NSLEEP; i++) CHECK_EQ(co_go(sleeper, &wg), 0);
        co_waitgroup_wait(&wg);
        CHECK_EQ(__atomic_load_n(&sleepers_left, __ATOMIC_RELAXED), 0);
    }
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_io_loop_yields);
    T_RUN(test_stress);
    return 0;
}

int main(void) {
    t_begin(50);
    t_start(1);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
