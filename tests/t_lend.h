/*
 * An episode of sysmon's lending, for tests run on one P: a holder takes
 * the only P, a coroutine is queued behind it, and the queued one runs
 * before the holder is done only if sysmon lends a spare P in the
 * holder's place. sleep_in_kernel is the holder whose thread sleeps in
 * the kernel with the P held (plain nanosleep, not co_blocking), which
 * sysmon must judge blocked and lend for.
 */
#ifndef COLONY_TESTS_T_LEND_H
#define COLONY_TESTS_T_LEND_H

#include "t.h"

#include <colony.h>
#include <time.h>

#define T_LEND_MS 1000000LL
#define T_LEND_GIVE_UP_NS (10000 * T_LEND_MS)

static int queued_ran; /* atomic: set by the coroutine queued behind the holder */

static void queued(void *arg) {
    co_waitgroup_t *wg = arg;
    __atomic_store_n(&queued_ran, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(wg);
}

/* Sleeps 1 ms at a time, the P held, until the queued coroutine has run
 * (through a lend) or T_LEND_GIVE_UP_NS. */
__attribute__((unused)) static void sleep_in_kernel(void *arg) {
    co_waitgroup_t *wg = arg;
    int64_t end = co_now() + T_LEND_GIVE_UP_NS;
    while (!__atomic_load_n(&queued_ran, __ATOMIC_ACQUIRE) && co_now() < end) {
        struct timespec ts = {0, T_LEND_MS};
        nanosleep(&ts, NULL);
    }
    co_waitgroup_done(wg);
}

/* holder takes the only P, a coroutine is queued behind it, and both are
 * waited for: whether the queued one ran (a spare P was lent). */
__attribute__((unused)) static bool hold_and_queue(void (*holder)(void *)) {
    __atomic_store_n(&queued_ran, 0, __ATOMIC_RELAXED);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 2);
    CHECK_EQ(co_go(holder, &wg), 0);
    co_yield(); /* the holder takes the P first */
    CHECK_EQ(co_go(queued, &wg), 0);
    co_waitgroup_wait(&wg);
    return __atomic_load_n(&queued_ran, __ATOMIC_ACQUIRE);
}

#endif
