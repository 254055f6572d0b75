/*
 * sysmon lends a spare P (and a thread) in place of one whose coroutine
 * has not scheduled for 10 ms only when that coroutine holds its thread:
 * asleep in the kernel, or computing. It lends none for an M whose thread
 * the host does not run: the spare would need a thread the host would not
 * run either.
 *
 * One P throughout: a coroutine queued behind the one that holds the P
 * runs before that one is done only if a spare P is lent. A timer armed
 * by the holder after the lend fires while it still holds that P.
 */
// ctest-timeout: 60
// ctest-no-chaos
#include "t.h"
#include "t_lend.h"

#include <colony.h>

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#define MS 1000000LL

static void test_asleep_in_kernel_gets_spare(void) { CHECK(hold_and_queue(sleep_in_kernel)); }

/* A coroutine that computes on after its P was lent away (it still holds
 * that P) and arms a timer meanwhile: the timer goes where sysmon and the
 * other Ms look, and fires while the coroutine is still computing. */
static int lent_fired, lent_armed; /* atomic */
static void on_lent_timer(void *arg) {
    (void)arg;
    __atomic_store_n(&lent_fired, 1, __ATOMIC_RELEASE);
}
static void compute_then_arm(void *arg) {
    co_waitgroup_t *wg = arg;
    int64_t end = co_now() + T_LEND_GIVE_UP_NS;
    while (!__atomic_load_n(&queued_ran, __ATOMIC_ACQUIRE) && co_now() < end) {}
    co_timer_t *t = NULL;
    if (__atomic_load_n(&queued_ran, __ATOMIC_ACQUIRE) &&
        co_after_func(&t, CO_MILLISECOND, on_lent_timer, NULL) == 0) {
        __atomic_store_n(&lent_armed, 1, __ATOMIC_RELAXED);
        end = co_now() + T_LEND_GIVE_UP_NS;
        while (!__atomic_load_n(&lent_fired, __ATOMIC_ACQUIRE) && co_now() < end) {}
        co_timer_free(t);
    }
    co_waitgroup_done(wg);
}
static void test_timer_armed_on_lent_p(void) {
    CHECK(hold_and_queue(compute_then_arm)); /* lent */
    CHECK_EQ(__atomic_load_n(&lent_armed, __ATOMIC_RELAXED), 1);
    CHECK_EQ(__atomic_load_n(&lent_fired, __ATOMIC_ACQUIRE), 1);
}

/* ---- a thread the host does not run ----------------------------------------
 * The holder's M is pinned to one CPU beside always-runnable hog threads
 * and made SCHED_IDLE (weight 3 against their 1024: it runs a small
 * fraction of a percent of the time), and it gives the CPU away at once
 * whenever it gets it (sched_yield): runnable throughout, running almost
 * never, so its coroutine consumes no CPU while it holds the P. However
 * loaded the host, that thread never runs half of any interval and is
 * never asleep in the kernel, so nothing may be lent for it. */
enum { NHOG = 2 };
#define HOLD_NS (300 * MS)
static int hogs_stop; /* atomic */
static int hog_cpu;
static int queued_ran_early; /* the queued coroutine ran while the holder held the P */
static int idle_ok;          /* the holder's M is pinned and SCHED_IDLE */

static void pin_self(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(hog_cpu, &set);
    CHECK_EQ(sched_setaffinity(0, sizeof set, &set), 0);
}

static void *hog(void *arg) {
    (void)arg;
    pin_self();
    volatile uint64_t x = 0;
    while (!__atomic_load_n(&hogs_stop, __ATOMIC_RELAXED)) x++;
    return NULL;
}

static void starved_holder(void *arg) {
    co_waitgroup_t *wg = arg;
    pin_self();
    struct sched_param sp = {0};
    idle_ok = sched_setscheduler(0, SCHED_IDLE, &sp) == 0;
    int64_t end = co_now() + HOLD_NS;
    while (idle_ok && co_now() < end) sched_yield();
    queued_ran_early = __atomic_load_n(&queued_ran, __ATOMIC_ACQUIRE);
    co_waitgroup_done(wg);
}

static void test_starved_thread_gets_no_spare(void) {
    cpu_set_t set;
    CHECK_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    hog_cpu = 0;
    while (hog_cpu < CPU_SETSIZE - 1 && !CPU_ISSET(hog_cpu, &set)) hog_cpu++;
    pthread_t hogs[NHOG];
    __atomic_store_n(&hogs_stop, 0, __ATOMIC_RELAXED);
    for (int i = 0; i < NHOG; i++) CHECK_EQ(pthread_create(&hogs[i], NULL, hog, NULL), 0);
    bool ran = hold_and_queue(starved_holder);
    __atomic_store_n(&hogs_stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < NHOG; i++) pthread_join(hogs[i], NULL);
    CHECK(ran);
    if (!idle_ok) { /* a seccomp filter, say: no way to starve the thread here */
        fprintf(stderr, "test_starved_thread_gets_no_spare: skipped: SCHED_IDLE refused\n");
        return;
    }
    CHECK_EQ(queued_ran_early, 0);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_asleep_in_kernel_gets_spare);
    T_RUN(test_timer_armed_on_lent_p);
    /* Last: the M that ran the holder stays SCHED_IDLE (an unprivileged
     * thread cannot go back); nothing runs after it but the exit. Under
     * qemu-user the emulator's own locks may put the thread to sleep in
     * the kernel, which is a block that earns a spare. */
    if (t_emulator())
        fprintf(stderr, "test_starved_thread_gets_no_spare: skipped under an emulator\n");
    else
        T_RUN(test_starved_thread_gets_no_spare);
    return 0;
}

int main(void) {
    t_begin(50);
    t_start(1);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
