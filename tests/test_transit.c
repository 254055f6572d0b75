/*
 * Ms in transit. An M that gives its P up is on its way to sleep for a
 * while (it looks at the queues once more, may become the poller); a P
 * that needs an M meanwhile waits for that M rather than for a new thread.
 * The window is widened here (CO__FAIL_SLOW_IDLE: such an M sleeps 200 us
 * before going on), so the hand-over happens many times per run.
 *
 * Checked: every blocking call and every timer wake-up still happens (no
 * wake-up is lost to a P left idle for an M that took another way), the
 * hand-over did happen, and the threads stay within the cap + procs +
 * sysmon: at no moment an M beyond those inside co_blocking and those
 * holding a P. Not rerun in chaos mode: there sysmon lends spare Ps after
 * 1 ms, each with an M of its own, which this bound does not count.
 */
// ctest-no-chaos
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <unistd.h>

#define CAP 8
#define MS 1000000LL
#define GIVE_UP (10000 * MS)

static int done_count, inside, max_inside, stop, beats;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static void sleepy(void *arg) {
    (void)arg;
    int in = __atomic_add_fetch(&inside, 1, __ATOMIC_RELAXED);
    int m = __atomic_load_n(&max_inside, __ATOMIC_RELAXED);
    while (in > m && !__atomic_compare_exchange_n(&max_inside, &m, in, false, __ATOMIC_RELAXED,
                                                  __ATOMIC_RELAXED)) {
    }
    usleep(1000);
    __atomic_sub_fetch(&inside, 1, __ATOMIC_RELAXED);
}
static void caller(void *arg) {
    (void)arg;
    CHECK_EQ(co_blocking(sleepy, NULL), 0);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}
/* timers: an idle M polls until the next one, and runs them without a P */
static void heartbeat(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
        co_sleep(MS);
        __atomic_add_fetch(&beats, 1, __ATOMIC_RELAXED);
    }
    co_waitgroup_done(&wg);
}

static int threads_now(void) {
    co_sched_stats_t st;
    co_sched_stats(&st);
    return st.threads; /* Ms + sysmon */
}

static void test_storm_in_transit(void) {
    /* rounds until the hand-over has been seen a few times: it needs a
     * wake-up inside the window, which a slow host may leave rare */
    int min_rounds = t_sanitized() ? 10 : 30, max_rounds = 400, per = 40, rounds = 0;
    int old = co_blocking_max(CAP);
    uint64_t taken0 = __atomic_load_n(&co__transit_taken, __ATOMIC_RELAXED);
    t_fail(CO__FAIL_SLOW_IDLE, true);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(heartbeat, NULL), 0);
    int max_threads = 0;
    for (int r = 0; r < max_rounds; r++) {
        if (r >= min_rounds && __atomic_load_n(&co__transit_taken, __ATOMIC_RELAXED) - taken0 >= 3) break;
        rounds = r + 1;
        int target = (r + 1) * per;
        for (int i = 0; i < per; i++) CHECK_EQ(co_go(caller, NULL), 0);
        int64_t t0 = co_now();
        while (__atomic_load_n(&done_count, __ATOMIC_ACQUIRE) < target && co_now() - t0 < GIVE_UP) {
            int t = threads_now();
            if (t > max_threads) max_threads = t;
            co_sleep(MS / 2);
        }
        CHECK_EQ(__atomic_load_n(&done_count, __ATOMIC_ACQUIRE), target);
    }
    int b0 = __atomic_load_n(&beats, __ATOMIC_RELAXED);
    while (__atomic_load_n(&beats, __ATOMIC_RELAXED) < b0 + 5) co_sleep(MS); /* it still beats */
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(GIVE_UP)), 0);
    t_fail(CO__FAIL_SLOW_IDLE, false);
    uint64_t taken = __atomic_load_n(&co__transit_taken, __ATOMIC_RELAXED) - taken0;
    fprintf(stderr, "transit: %d calls, max inside %d, max threads %d (procs %d), Ps taken in transit %llu\n",
            rounds * per, max_inside, max_threads, co_procs(), (unsigned long long)taken);
    CHECK(max_inside <= CAP);
    /* The hand-over needs a P wanted inside an M's transit window. Under
     * TSan every path but the window's 200 us pause runs several times
     * slower, and on a quiet host the woken caller's way to co_blocking
     * outlasts the window: 16,000 calls saw none (under load from other
     * tests, a few). The other builds require it; TSan still checks the
     * rest of the storm, and its races wherever the hand-over happens. */
    if (taken == 0 && t_tsan())
        fprintf(stderr, "   (no hand-over reached at TSan's speed: not required here)\n");
    else
        CHECK(taken > 0);
    CHECK(max_threads <= CAP + co_procs() + 1);
    co_blocking_max(old);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_storm_in_transit);
    return 0;
}

int main(void) {
    t_begin(110);
    t_start(2);
    int rc = co_main(run, NULL);
    CHECK_EQ(rc, 0);
    return t_end();
}
