/* A coroutine's first stack, when the caches have none, is mapped on the
 * M's g0 after the coroutine that switched away has finished its
 * post-switch action: a receiver parking on a channel holds the channel's
 * lock until then, and a batch's mapping (an mmap and two madvise calls)
 * must not happen under it, where every other coroutine using that
 * channel would wait (src/runtime/sched.c, gogo). On 1 P nothing else
 * takes the lock, so it must be free at every mapping. */
// ctest-no-chaos
// ctest-timeout: 60
#include <colony.h>
#include <stdatomic.h>
#include <stdio.h>

#include "t.h"
#include "t_internal.h"

/* The probe runs on the M's g0, which TSan sees as a fiber of its own
 * that nothing synchronises with: the channel's creation is handed to it
 * by hand. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#include <sanitizer/tsan_interface.h>
#define HAND_OVER(a) __tsan_release(a)
#define TAKE_OVER(a) __tsan_acquire(a)
#endif
#endif
#ifndef HAND_OVER
#define HAND_OVER(a) ((void)(a))
#define TAKE_OVER(a) ((void)(a))
#endif

static co_chan_t *ch;
static atomic_int probes, held;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static void probe(void) {
    TAKE_OVER(&ch);
    atomic_fetch_add(&probes, 1);
    if (co__lock_try_free(&ch->lock))
        co__unlock(&ch->lock);
    else
        atomic_fetch_add(&held, 1);
}

static void receiver(void *arg) {
    (void)arg;
    int v;
    CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), CO_ECLOSED);
    co_waitgroup_done(&wg);
}

static int spawner(void *arg) {
    int n = (int)(long)arg;
    co_waitgroup_add(&wg, n);
    for (int i = 0; i < n; i++) CHECK_EQ(co_go(receiver, NULL), 0);
    /* every receiver has parked once all have run: 1 P, and this one
     * goes behind them */
    while (co__test_chan_receivers(ch) < n) co_yield();
    __atomic_store_n(&co__test_stack_map_probe, NULL, __ATOMIC_RELAXED);
    CHECK_EQ(co_chan_close(ch), 0);
    co_waitgroup_wait(&wg);
    return 0;
}

static void test_mapped_with_the_lock_free(void) {
    CHECK_EQ(co_init(&(co_config_t){.procs = 1}), 0);
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    HAND_OVER(&ch);
    __atomic_store_n(&co__test_stack_map_probe, probe, __ATOMIC_RELAXED);
    int n = 600; /* several batches, whatever their size */
    CHECK_EQ(co_main(spawner, (void *)(long)n), 0);
    int np = atomic_load(&probes), nh = atomic_load(&held);
    fprintf(stderr, "  %d batches mapped, %d under the channel's lock\n", np, nh);
    CHECK(np >= 2);
    CHECK_EQ(nh, 0);
    co_chan_free(ch);
    CHECK_EQ(T_SHUTDOWN(), 0);
}

int main(void) {
    t_begin(50);
    T_RUN(test_mapped_with_the_lock_free);
    return t_end();
}
