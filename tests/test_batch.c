/* The owner's batch (sched_impl.h's runqget): with 16 or more coroutines in its
 * ring and no P idle, a P takes 8 off the ring's head at once and keeps 7
 * where thieves do not look. Two ways they could be kept from the other
 * P; test_blocking checks a third (a computation holding its P for good:
 * sysmon takes them when it lends the P away).
 *
 * 1. A P that goes idle after the claim must get them: the owner gives
 *    the rest back to its ring at its next pop. On 2 Ps, a computation
 *    keeps one P busy while the other claims a batch of 8 computations of
 *    6 ms each (below sysmon's 10 ms, so it does not lend the P); the
 *    short ones after them in the ring keep the other P busy a moment
 *    more. Kept in the batch, the 8 ran one after another on one thread
 *    while the other P sat idle; given back, 3 or 4 of them run on another
 *    thread (the check asks for 2). The same through a pool, whose workers
 *    take the next task themselves (co__take_unstarted): 7 or 8 of them
 *    ran on one thread.
 *
 * 2. A P handed off while no thread can be made to run it (pthread_create
 *    failing for a while: a pids cgroup, RLIMIT_NPROC) goes idle. Its
 *    batch, yield slot and runnext go to the global queue, which sysmon
 *    watches and every M takes from. On 2 Ps: the first of a batch enters
 *    co_blocking; meanwhile thread creation fails (test hook) and sysmon
 *    hands its P off, to no M. Thread creation then works again, and,
 *    still inside co_blocking, the blocked coroutine waits for every
 *    other coroutine of the burst to run on the other P. Left on the idle
 *    P, the 7 of the batch never ran (it gave up after 10 s). The same for
 *    the coroutine in its runnext, with the other P computing until it
 *    ran. */
// ctest-timeout: 120
#include "t.h"

#include <colony.h>

#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "t_internal.h"

#define MS 1000000LL
#define NW 20

static sem_t posts;
static int got; /* written by the blocked coroutine's fn, read after the wait */

static void nop(void *arg) { co_waitgroup_done(arg); }

static void poster(void *arg) {
    sem_post(&posts);
    co_waitgroup_done(arg);
}

static void compute(void *arg) {
    int64_t end = co_now() + 30 * MS;
    while (co_now() < end) {
    }
    co_waitgroup_done(arg);
}

/* ---- 1. a P idle after the claim ---------------------------------------- */

#define NLONG 8
static pthread_t long_thread[NLONG]; /* the thread each long one ran on */
static int long_seen;                /* atomic */

typedef struct {
    co_waitgroup_t *wg;
    int64_t ns;
    int idx; /* -1: a short one */
} job_t;

static void job(void *arg) {
    job_t *j = arg;
    int64_t end = co_now() + j->ns;
    while (co_now() < end) {
    }
    if (j->idx >= 0) {
        long_thread[j->idx] = pthread_self();
        __atomic_add_fetch(&long_seen, 1, __ATOMIC_RELEASE);
    }
    co_waitgroup_done(j->wg);
}

/* runnext takes the first spawn; the claim, the next 8: the long ones */
static void burst(void *arg) {
    enum { N = 24 };
    static job_t jobs[N];
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, N);
    for (int i = 0; i < N; i++) {
        bool is_long = i >= 1 && i <= NLONG;
        jobs[i] = (job_t){&wg, is_long ? 6 * MS : MS / 10, is_long ? i - 1 : -1};
        CHECK_EQ(co_go(job, &jobs[i]), 0);
    }
    co_waitgroup_wait(&wg);
    co_waitgroup_done(arg);
}

/* Where the long jobs ran depends on when the OS runs the Ms: a host that
 * stalls the idle P's thread for the whole burst sees them on one thread.
 * The spread must show in one of a few tries; a scheduler that never
 * hands the batch over shows it in none. */
static int idle_p_try(void) {
    __atomic_store_n(&long_seen, 0, __ATOMIC_RELAXED);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 2);
    static job_t busy;
    busy = (job_t){&wg, 2 * MS, -1};
    CHECK_EQ(co_go(job, &busy), 0);
    struct timespec ts = {0, MS / 2}; /* it is running on one P */
    nanosleep(&ts, NULL);
    CHECK_EQ(co_go(burst, &wg), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&long_seen, __ATOMIC_ACQUIRE), NLONG);
    int others = 0;
    for (int i = 1; i < NLONG; i++) others += !pthread_equal(long_thread[i], long_thread[0]);
    return others;
}
static void test_idle_p_gets_batch(void) {
    int others = 0;
    for (int t = 0; t < 5 && others < 2; t++) {
        others = idle_p_try();
        if (others < 2) fprintf(stderr, "try %d: %d long jobs off the first one's thread\n", t + 1, others);
    }
    CHECK(others >= 2);
}

/* The same through a pool: a worker that finishes takes the next task off
 * its P's queue itself (co__take_unstarted), and must leave the batch to
 * the scheduler too when a P is idle. */
static co_pool_t *pool;
static pthread_t pool_long_thread[NLONG];

typedef struct {
    int64_t ns;
    int idx;
} ptask_t;

static void ptask(void *arg) {
    ptask_t *t = arg;
    int64_t end = co_now() + t->ns;
    while (co_now() < end) {
    }
    if (t->idx >= 0) pool_long_thread[t->idx] = pthread_self();
}

static void pool_burst(void *arg) {
    enum { N = 24 };
    static ptask_t tasks[N];
    for (int i = 0; i < N; i++) {
        bool is_long = i >= 1 && i <= NLONG;
        tasks[i] = (ptask_t){is_long ? 6 * MS : MS / 10, is_long ? i - 1 : -1};
        CHECK_EQ(co_pool_submit(pool, ptask, &tasks[i]), 0);
    }
    CHECK_EQ(co_pool_wait_idle(pool, co_now() + 10000 * MS), 0);
    co_waitgroup_done(arg);
}

/* As with idle_p_try, the OS may stall the idle P's thread for a whole
 * burst: the spread must show in one of a few tries. */
static int idle_p_pool_try(void) {
    CHECK_EQ(co_pool_new(&pool, 64, NULL), 0);
    memset(pool_long_thread, 0, sizeof pool_long_thread);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 2);
    static job_t busy;
    busy = (job_t){&wg, 2 * MS, -1};
    CHECK_EQ(co_go(job, &busy), 0);
    struct timespec ts = {0, MS / 2};
    nanosleep(&ts, NULL);
    CHECK_EQ(co_go(pool_burst, &wg), 0);
    co_waitgroup_wait(&wg);
    co_pool_destroy(pool);
    int others = 0;
    for (int i = 1; i < NLONG; i++)
        others += !pthread_equal(pool_long_thread[i], pool_long_thread[0]);
    return others;
}
static void test_idle_p_gets_pool_batch(void) {
    int others = 0;
    for (int t = 0; t < 5 && others < 2; t++) {
        others = idle_p_pool_try();
        if (others < 2) fprintf(stderr, "try %d: %d long tasks off the first one's thread\n", t + 1, others);
    }
    CHECK(others >= 2);
}

/* ---- 2. a P handed off to no thread ------------------------------------- */

/* Inside co_blocking: no thread can be made for 100 ms (sysmon hands our
 * P off meanwhile, to no M); then wait up to 10 s for `want` posts.
 * Returns how many came. */
static int no_threads_then_wait(int want) {
    t_fail(CO__FAIL_NO_M, true);
    struct timespec pause = {0, 100 * MS};
    nanosleep(&pause, NULL);
    t_fail(CO__FAIL_NO_M, false);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    int n = 0;
    while (n < want && sem_timedwait(&posts, &dl) == 0) n++;
    return n;
}

static void blocked_fn(void *arg) {
    (void)arg;
    __atomic_store_n(&got, no_threads_then_wait(NW), __ATOMIC_RELAXED);
}

static void blocked(void *arg) {
    CHECK_EQ(co_blocking(blocked_fn, NULL), 0);
    co_waitgroup_done(arg);
}

/* In this order on its P: the first spawn goes to runnext, the rest to
 * the ring, the blocking one at its head; none runs before the wait. */
static void spawner(void *arg) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, NW + 2);
    CHECK_EQ(co_go(nop, &wg), 0);
    CHECK_EQ(co_go(blocked, &wg), 0);
    for (int i = 0; i < NW; i++) CHECK_EQ(co_go(poster, &wg), 0);
    co_waitgroup_wait(&wg);
    co_waitgroup_done(arg);
}

static void test_handoff_without_thread(void) {
    CHECK_EQ(sem_init(&posts, 0, 0), 0);
    co_waitgroup_t cwg = CO_WAITGROUP_INIT, wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&cwg, 1);
    CHECK_EQ(co_go(compute, &cwg), 0);
    struct timespec ts = {0, 2 * MS}; /* it is running on one P */
    nanosleep(&ts, NULL);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(spawner, &wg), 0);
    co_waitgroup_wait(&wg);
    co_waitgroup_wait(&cwg);
    CHECK_EQ(__atomic_load_n(&got, __ATOMIC_RELAXED), NW);
    sem_destroy(&posts);
}

/* The same with a coroutine in the P's runnext (what it spawned last
 * before it entered co_blocking) while the other P computes and never
 * looks for work: sysmon's safety net watches the global queue and the
 * rings, not runnext, so it must not stay there. */
static int stop_computing; /* atomic */
static int next_ran;       /* atomic: 1 if it ran within the wait */

static void compute_until_told(void *arg) {
    int64_t give_up = co_now() + 30000 * MS;
    while (!__atomic_load_n(&stop_computing, __ATOMIC_ACQUIRE) && co_now() < give_up) {
    }
    co_waitgroup_done(arg);
}

static void next_fn(void *arg) {
    (void)arg;
    __atomic_store_n(&next_ran, no_threads_then_wait(1), __ATOMIC_RELAXED);
    __atomic_store_n(&stop_computing, 1, __ATOMIC_RELEASE);
}

static void spawn_then_block(void *arg) {
    CHECK_EQ(co_go(poster, arg), 0); /* this P's runnext */
    CHECK_EQ(co_blocking(next_fn, NULL), 0);
    co_waitgroup_done(arg);
}

static void test_handoff_keeps_runnext(void) {
    CHECK_EQ(sem_init(&posts, 0, 0), 0);
    __atomic_store_n(&stop_computing, 0, __ATOMIC_RELAXED);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 3);
    CHECK_EQ(co_go(compute_until_told, &wg), 0);
    struct timespec ts = {0, 2 * MS}; /* it is running on one P */
    nanosleep(&ts, NULL);
    CHECK_EQ(co_go(spawn_then_block, &wg), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&next_ran, __ATOMIC_RELAXED), 1);
    sem_destroy(&posts);
}

int main(void) {
    t_begin(100);
    co_config_t cfg = {.procs = 2};
    CHECK_EQ(co_init(&cfg), 0);
    T_RUN(test_idle_p_gets_batch);
    T_RUN(test_idle_p_gets_pool_batch);
    T_RUN(test_handoff_without_thread);
    T_RUN(test_handoff_keeps_runnext);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
