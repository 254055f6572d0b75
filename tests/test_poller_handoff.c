/* co__startm hands a P to the M blocked in the netpoller when no M sleeps
 * on the idle list (proc.c): the P goes in that M's nextp and its poll is
 * broken; a seq_cst flag (poller_given) pairs with the poll's sleeping
 * flag, so a hand-over made before the poll blocks is not slept through.
 * With 1 P, a P handed over and not taken is every P: sysmon's net for a
 * lost wake-up needs an idle P, so the runtime would hang for good (the
 * watchdog fails the test). Here a plain thread wakes the idle runtime
 * over and over, each time after a pause of a different length, so the
 * hand-over lands before the poller blocks, while it blocks and after:
 *  - spawns (co_go from a plain thread: the injection stack, co__wakep);
 *  - wake-ups of a parked coroutine (a value sent by the thread);
 *  - with a coroutine parked on a socket all along, so that the poller
 *    also has a descriptor to watch.
 * On 1 P (the poller is usually the only M) and on 8 Ps (idle Ms asleep
 * on the idle list are found first; the poller only once they are all
 * woken). */
// ctest-timeout: 120
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#define ROUNDS 1500

static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static int spawned_ran; /* atomic */

static void child(void *arg) {
    (void)arg;
    __atomic_add_fetch(&spawned_ran, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

static co_chan_t *ch_in, *ch_out;
static int parked_rounds; /* atomic */

/* Parks on ch_in each round, answers on ch_out. */
static void parker(void *arg) {
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        int v = -1;
        CHECK_EQ(co_chan_recv(ch_in, &v, CO_FOREVER), 0);
        CHECK_EQ(v, r);
        __atomic_add_fetch(&parked_rounds, 1, __ATOMIC_RELAXED);
        CHECK_EQ(co_chan_send(ch_out, &v, CO_FOREVER), 0);
    }
}

static int sv[2];
static void reader(void *arg) {
    (void)arg;
    char c = 0;
    CHECK_EQ(co_read(sv[0], &c, 1, CO_FOREVER), 1); /* the end: one byte */
    co_waitgroup_done(&wg);
}

/* A pause of 0 to ~300 us, different each round: the runtime has gone
 * idle, or is going idle, or its M is already in the poll. */
static void pause_round(unsigned r) {
    unsigned x = r * 2654435761u;
    unsigned us = (x >> 16) % 300;
    if (us < 20) return;
    struct timespec ts = {0, (long)us * 1000};
    nanosleep(&ts, NULL);
}

static void handoff(int procs) {
    t_start(procs);
    __atomic_store_n(&spawned_ran, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&parked_rounds, 0, __ATOMIC_RELAXED);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    CHECK_EQ(co_chan_new(&ch_in, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&ch_out, sizeof(int), 0), 0);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(reader, NULL), 0);
    CHECK_EQ(co_go(parker, NULL), 0);
    for (int r = 0; r < ROUNDS; r++) {
        pause_round((unsigned)r);
        if (r % 2 == 0) {
            co_waitgroup_add(&wg, 1);
            CHECK_EQ(co_go(child, NULL), 0);
        }
        int v = r, back = -1;
        CHECK_EQ(co_chan_send(ch_in, &v, CO_FOREVER), 0);
        CHECK_EQ(co_chan_recv(ch_out, &back, CO_FOREVER), 0);
        CHECK_EQ(back, r);
    }
    CHECK_EQ(write(sv[1], "x", 1), 1);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&spawned_ran, __ATOMIC_RELAXED), ROUNDS / 2);
    CHECK_EQ(__atomic_load_n(&parked_rounds, __ATOMIC_RELAXED), ROUNDS);
    co_chan_free(ch_in);
    co_chan_free(ch_out);
    close(sv[0]);
    close(sv[1]);
    t_stop();
}

static void test_handoff_1p(void) { handoff(1); }
static void test_handoff_8p(void) { handoff(8); }

int main(void) {
    t_begin(110);
    T_RUN(test_handoff_1p);
    T_RUN(test_handoff_8p);
    return t_end();
}
