/* A P handed off while no thread can be made to run it (pthread_create
 * failing for a while: a pids cgroup, RLIMIT_NPROC) goes idle. What only
 * its owner would run must not stay on it: the owner's batch (sched.c's
 * runqget takes 8 ring entries at once and keeps 7 where thieves do not
 * look) and its yield slot go to the global queue, which sysmon watches
 * and which any M takes from.
 *
 * On 2 Ps: a computation keeps one P busy, so the other claims a batch
 * when it starts the coroutines a spawner queued. The first of that
 * batch enters co_blocking; while it is there, thread creation fails
 * (test hook) and sysmon hands its P off, to no M. Thread creation then
 * works again, and, still inside co_blocking, the blocked coroutine waits
 * for every other coroutine of the burst to run on the other P. Left on
 * the idle P, the 7 of the batch never ran (it gave up after 10 s). */
// ctest-timeout: 60
#include "t.h"

#include <colony.h>

#include <semaphore.h>
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
    T_RUN(test_handoff_without_thread);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
