/* Stack compaction against a channel freed right after it woke its
 * waiters (docs/hacking.md, "Freeing right after a wake": co_ctx_free
 * closes a context's done channel and frees it at once). An offer names
 * the lock of the queue its waiter is in; the waiter popped and its
 * coroutine readied but not run yet, the offer stays listed, and the
 * channel may be gone. sysmon's scan must never take that lock then: here
 * on 1 P, coroutines that opted in wait on channels of their own; the
 * closer closes and frees every channel right after they park (younger
 * than the threshold, 4 ms), then computes for 8 ms without entering the
 * scheduler, so the woken coroutines sit queued, still offered, while
 * sysmon's scans (one a ms) find them past the threshold.
 * A scan that trylocks an offer's lock after its channel was freed is a
 * use after free: the ASan build reports it; the other builds go on
 * (the freed word is usually still zero), so their run checks only the
 * values and the lists. */
// ctest-timeout: 120
// ctest-no-chaos (one P, and the scan's timing is the point)
#include <colony.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "t.h"
#include "t_internal.h"

enum { NRX = 48, ROUNDS = 40, THRESHOLD_MS = 4, BUSY_NS = 8000000 };
static co_chan_t *ch[NRX];
static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static int bad; /* atomic: a receive that did not see the close */

static void rx(void *arg) {
    int i = (int)(intptr_t)arg;
    CHECK_EQ(co_stack_compactable(1), 0);
    int v = 0;
    if (co_chan_recv(ch[i], &v, CO_FOREVER) != CO_ECLOSED) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int closer_main(void *arg) {
    (void)arg;
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < NRX; i++) CHECK_EQ(co_chan_new(&ch[i], sizeof(int), 0), 0);
        co_waitgroup_add(&wg, NRX);
        /* before the spawns: a receiver may park and be compacted before
         * the last spawn returns */
        int64_t c0 = co_stack_compacted(), seen = 0;
        for (int i = 0; i < NRX; i++) CHECK_EQ(co_go(rx, (void *)(intptr_t)i), 0);
        /* every receiver parked and offered (1 P: they ran while this
         * one slept; on a loaded host some may be compacted already) */
        /* (the count is read once per look: while a scan holds a batch,
         * claimed and not yet compacted, the batch is in neither count) */
        for (int k = 0; k < 20000 && (seen = co__test_compact_offered() + co_stack_compacted() - c0) < NRX;
             k++)
            co_sleep(CO_MILLISECOND);
        CHECK_EQ(seen, NRX);
        /* wake each, then free its channel at once: legal, none is
         * blocked on it any more */
        for (int i = 0; i < NRX; i++) {
            CHECK_EQ(co_chan_close(ch[i]), 0);
            co_chan_free(ch[i]);
            ch[i] = NULL;
        }
        /* the woken ones stay queued here, still offered, past the
         * threshold, for a few sysmon passes (below sysmon's 10 ms, so
         * no P is lent) */
        for (int64_t t0 = mono_ns(); mono_ns() - t0 < BUSY_NS;) {
        }
        co_waitgroup_wait(&wg);
    }
    return 0;
}

static void test_free_after_close_while_offered(void) {
    t_start(1);
    co__test_compact_set_ms(THRESHOLD_MS);
    CHECK_EQ(co_main(closer_main, NULL), 0);
    CHECK_EQ(__atomic_load_n(&bad, __ATOMIC_RELAXED), 0);
    CHECK_EQ(co__test_compact_offered(), 0);
    fprintf(stderr, "   %llu compactions\n", (unsigned long long)t_compactions());
    co__test_compact_set_ms(1000);
    t_stop();
}

int main(void) {
    t_begin(110);
    T_RUN(test_free_after_close_while_offered);
    return t_end();
}
