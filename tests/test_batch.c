/* The owner's batch (sched.c's runqget): with 16 or more coroutines in its
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
 *    while the other P sat idle.
 *
 * 2. A P handed off while no thread can be made to run it (pthread_create
 *    failing for a while: a pids cgroup, RLIMIT_NPROC) goes idle. Its
 *    batch and yield slot go to the global queue, which sysmon watches
 *    and every M takes from. On 2 Ps: the first of a batch enters
 *    co_blocking; meanwhile thread creation fails (test hook) and sysmon
 *    hands its P off, to no M. Thread creation then works again, and,
 *    still inside co_blocking, the blocked coroutine waits for every
 *    other coroutine of the burst to run on the other P. Left on the idle
 *    P, the 7 of the batch never ran (it gave up after 10 s). */
// ctest-timeout: 60
#include "t.h"

#include <colony.h>

#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

extern int co__test_fail_alloc; /* library test hook: bit 5, no M for a P */

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

static void test_idle_p_gets_batch(void) {
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
    CHECK(others > 0);
}

/* ---- 2. a P handed off to no thread ------------------------------------- */

static void blocked_fn(void *arg) {
    (void)arg;
    __atomic_store_n(&co__test_fail_alloc, 32, __ATOMIC_RELAXED);
    struct timespec pause = {0, 100 * MS}; /* sysmon hands our P off meanwhile */
    nanosleep(&pause, NULL);
    __atomic_store_n(&co__test_fail_alloc, 0, __ATOMIC_RELAXED);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    int n = 0;
    while (n < NW && sem_timedwait(&posts, &dl) == 0) n++;
    __atomic_store_n(&got, n, __ATOMIC_RELAXED);
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

int main(void) {
    t_begin(50);
    co_config_t cfg = {.procs = 2};
    CHECK_EQ(co_init(&cfg), 0);
    T_RUN(test_idle_p_gets_batch);
    T_RUN(test_handoff_without_thread);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
