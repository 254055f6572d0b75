/* The fresh deque (sched_impl.h's "work-first") where it meets the rest of
 * the scheduler: fairness for many spawns below a loop that never lets the
 * deque empty, and entries on deques while Ps are lent, handed off and the
 * runtime stops.
 *  - many old spawns below a fork-join loop on 1 P: each one runs after a
 *    bounded number of the loop's rounds (counted, not timed);
 *  - fork-join trees whose nodes now and then compute past sysmon's
 *    10 ms (1 ms in chaos mode) without entering the scheduler, on 1 P and
 *    on 8 Ps (more Ps than CPUs): sysmon lends spares while deques hold
 *    spawns (co__flifo_move to the spare, the retiring owner's drain,
 *    thieves on both), and every node must run exactly once;
 *  - co_main's function returning with hundreds of spawns still queued on
 *    its P's deque and ring: each runs once, and co_shutdown then finds
 *    nothing alive.
 */
// ctest-timeout: 120
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <stdint.h>
#include <time.h>

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

/* ---- exactly once while Ps are lent away --------------------------------- */

/* A binary tree of coroutines joined by waitgroups; node i's children are
 * 2i+1 and 2i+2 (the first takes runnext, the second the deque). Each
 * node counts its runs in tree_ran[i]: an entry taken by both an owner
 * and a thief, or moved to a spare and left on the lent P too, runs
 * twice; one lost on the way never runs, and its parent's wait hangs
 * (the watchdog fails it). Every LEND_EVERY-th inner node first computes
 * for LEND_SPIN_NS without entering the scheduler, so sysmon lends its P
 * away with the spawns above it queued on its deque (moved to the spare),
 * and then spawns its own children onto the lent P's deque, which its M
 * must drain when it retires the P at the wait. */
#define TREE_DEPTH 11
#define TREE_NODES ((1 << (TREE_DEPTH + 1)) - 1)
#define LEND_EVERY 173
#define LEND_SPIN_NS 12000000
static unsigned char tree_ran[TREE_NODES]; /* atomic */
static int tree_twice, tree_spins;         /* atomic */

typedef struct {
    int i;
    co_waitgroup_t *wg;
} tnode_t;

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void tree_co(void *arg);

static void tree_run(int i) {
    if (__atomic_add_fetch(&tree_ran[i], 1, __ATOMIC_RELAXED) != 1)
        __atomic_add_fetch(&tree_twice, 1, __ATOMIC_RELAXED);
    int l = 2 * i + 1;
    if (l >= TREE_NODES) return;
    if (i % LEND_EVERY == 5) {
        __atomic_add_fetch(&tree_spins, 1, __ATOMIC_RELAXED);
        for (int64_t t0 = mono_ns(); mono_ns() - t0 < LEND_SPIN_NS;) {
        }
    }
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 2);
    tnode_t a = {l, &wg}, b = {l + 1, &wg};
    CHECK_EQ(co_go(tree_co, &a), 0);
    CHECK_EQ(co_go(tree_co, &b), 0);
    co_waitgroup_wait(&wg);
}

static void tree_co(void *arg) {
    tnode_t *n = arg;
    tree_run(n->i);
    co_waitgroup_done(n->wg);
}

static int tree_main(void *arg) {
    (void)arg;
    tree_run(0);
    return 0;
}

static void tree_lent(int procs, int rounds) {
    t_start(procs);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < TREE_NODES; i++) __atomic_store_n(&tree_ran[i], 0, __ATOMIC_RELAXED);
        CHECK_EQ(co_main(tree_main, NULL), 0);
        int missing = 0;
        for (int i = 0; i < TREE_NODES; i++) missing += __atomic_load_n(&tree_ran[i], __ATOMIC_RELAXED) == 0;
        CHECK_EQ(missing, 0);
    }
    CHECK_EQ(__atomic_load_n(&tree_twice, __ATOMIC_RELAXED), 0);
    fprintf(stderr, "   %d P: %d rounds of %d nodes, %d long ones in all\n", procs, rounds, TREE_NODES,
            __atomic_load_n(&tree_spins, __ATOMIC_RELAXED));
    t_stop();
}

static void test_tree_lent_1p(void) { tree_lent(1, 3); }
static void test_tree_lent_8p(void) { tree_lent(8, 3); }

/* ---- co_main returns with its spawns still queued ------------------------ */

/* The main coroutine spawns QN children and returns at once: the first
 * takes runnext, CO_FLIFO (256) the deque, the rest the ring. Every child
 * runs exactly once, and co_shutdown (t_stop: it retries while anything
 * is alive) succeeds. On 1 P they run only after co_main has returned. */
#define QN 400
static int q_ran[QN]; /* atomic */
static void q_child(void *arg) { __atomic_add_fetch(&q_ran[(intptr_t)arg], 1, __ATOMIC_RELAXED); }
static int q_main(void *arg) {
    (void)arg;
    for (intptr_t i = 0; i < QN; i++) CHECK_EQ(co_go(q_child, (void *)i), 0);
    return 0;
}

static void queued_at_return(int procs) {
    t_start(procs);
    for (int r = 0; r < 20; r++) {
        for (int i = 0; i < QN; i++) __atomic_store_n(&q_ran[i], 0, __ATOMIC_RELAXED);
        CHECK_EQ(co_main(q_main, NULL), 0);
        /* they finish by themselves: wait (bounded) for all to have run */
        int done = 0;
        for (int k = 0; k < 20000; k++) {
            done = 0;
            for (int i = 0; i < QN; i++) done += __atomic_load_n(&q_ran[i], __ATOMIC_RELAXED) != 0;
            if (done == QN) break;
            usleep(100);
        }
        CHECK_EQ(done, QN);
        int twice = 0;
        for (int i = 0; i < QN; i++) twice += __atomic_load_n(&q_ran[i], __ATOMIC_RELAXED) > 1;
        CHECK_EQ(twice, 0);
    }
    t_stop();
}

static void test_queued_at_return_1p(void) { queued_at_return(1); }
static void test_queued_at_return_8p(void) { queued_at_return(8); }

int main(void) {
    t_begin(110);
    T_RUN(test_many_old_spawns_run);
    T_RUN(test_tree_lent_1p);
    T_RUN(test_tree_lent_8p);
    T_RUN(test_queued_at_return_1p);
    T_RUN(test_queued_at_return_8p);
    return t_end();
}
