/* The fresh deque (sched_impl.h's "work-first") where it meets the rest of
 * the scheduler: fairness for many spawns below a loop that never lets the
 * deque empty, and entries on deques while Ps are lent, handed off and the
 * runtime stops.
 *  - many old spawns below a fork-join loop on 1 P: each one runs after a
 *    bounded number of the loop's rounds (counted, not timed);
 */
// ctest-timeout: 120
#include "colony.h"
#include "t.h"
#include "t_internal.h"

/* ---- many old spawns below a loop that forks and joins for ever --------- */

/* On 1 P a coroutine spawns a child that takes runnext, then OLD_N more
 * that go on the deque, then forks two leaves and joins them, round after
 * round, until every old one has run: their rounds are all pushed above
 * the old ones, so those leave only by the fairness moves (flifo_fair).
 * The first moves after about 21,000 rounds (1,024 looks, a look per 61
 * schedules, 3 schedules a round). Were the limit to double after every
 * move without bound, the k-th old spawn would wait 2^k times that, and
 * the twelfth 43M rounds; capped, each waits at most CO_FLIFO_AGE_MAX
 * looks more than the one before it: all twelve within 2.2M rounds. The
 * loop gives up at 10M rounds (a count of the loop's own rounds, the same
 * on a fast or a loaded host) and the check fails. */
#define OLD_N 12
#define OLD_ROUNDS_MAX 10000000L
static int old_ran; /* atomic: how many old spawns have run */
static int old_ran_looping; /* how many had when the loop stopped */
static long old_rounds;

static void old_leaf(void *arg) { co_waitgroup_done(arg); }
static void old_one(void *arg) {
    (void)arg;
    __atomic_add_fetch(&old_ran, 1, __ATOMIC_RELEASE);
}
static void old_nop(void *arg) { (void)arg; }

static void old_spawner(void *arg) {
    co_waitgroup_t *done = arg;
    CHECK_EQ(co_go(old_nop, NULL), 0); /* takes runnext: the rest go on the deque */
    for (int i = 0; i < OLD_N; i++) CHECK_EQ(co_go(old_one, NULL), 0);
    while (__atomic_load_n(&old_ran, __ATOMIC_ACQUIRE) < OLD_N && old_rounds < OLD_ROUNDS_MAX) {
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        co_waitgroup_add(&wg, 2);
        CHECK_EQ(co_go(old_leaf, &wg), 0);
        CHECK_EQ(co_go(old_leaf, &wg), 0);
        co_waitgroup_wait(&wg);
        old_rounds++;
    }
    /* (once the loop stops, the rest run anyway: count them here) */
    old_ran_looping = __atomic_load_n(&old_ran, __ATOMIC_ACQUIRE);
    co_waitgroup_done(done);
}

static int old_main(void *arg) {
    (void)arg;
    co_waitgroup_t done = CO_WAITGROUP_INIT;
    co_waitgroup_add(&done, 1);
    CHECK_EQ(co_go(old_spawner, &done), 0);
    co_waitgroup_wait(&done);
    return 0;
}

static void test_many_old_spawns_run(void) {
    t_start(1);
    CHECK_EQ(co_main(old_main, NULL), 0);
    CHECK_EQ(old_ran_looping, OLD_N);
    fprintf(stderr, "   %d old spawns ran within %ld rounds\n", old_ran_looping, old_rounds);
    t_stop();
}

int main(void) {
    t_begin(110);
    T_RUN(test_many_old_spawns_run);
    return t_end();
}
