/* Stack compaction's offer lists (runtime/compact.c): sysmon looks only at
 * the waits offered now, so every way an offer ends must take it off its
 * list, and a list must never lose one. Here, with many coroutines: offers
 * withdrawn before the threshold (woken by a value, by a channel's close,
 * by data, EOF or co_close on a socket, then exiting and their records
 * reused), offers woken while sysmon scans and compacts them, and a few
 * opted-in coroutines among many that did not opt in (the few are
 * compacted, and counted), and waits too deep to compact, put back at
 * every try, next to a few that are not. co__test_compact_offered() counts the lists'
 * entries under their locks and checks each one. No timing is asserted:
 * waits for the runtime are bounded only so a broken build fails instead
 * of hanging. */
// ctest-timeout: 120
#include <colony.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "t.h"
#include "t_compact.h"
#include "t_internal.h"

#define HIGH_MS 600000 /* a threshold no test waits out: offered, never compacted */


/* Until the lists hold exactly n offers: true, or false after ~20 s (the
 * last count is printed). */
static bool wait_offered(int64_t n) {
    int64_t got = -2;
    for (int i = 0; i < 20000; i++) {
        got = co__test_compact_offered();
        if (got == n || got < 0) break;
        co_sleep(CO_MILLISECOND);
    }
    if (got != n) fprintf(stderr, "offered: %lld, expected %lld\n", (long long)got, (long long)n);
    return got == n;
}

/* Locals with a known pattern, live across the waits. */
#define PAT 32

static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static int bad; /* atomic: wrong values, wrong results, broken locals */
static void fail(void) { __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED); }

/* ---- withdrawn before the threshold ------------------------------------ */

enum { NW = 3000, WROUNDS = 3, WAVES = 3, NSOCK = 48 };
static co_chan_t *wch[NW];

/* Receives WROUNDS values on its own channel, then waits once more: for a
 * value (i % 3 == 0) or for the channel's close (the others). */
static void early_rx(void *arg) {
    int i = (int)(intptr_t)arg;
    volatile uint64_t pat[PAT];
    t_pattern_fill(pat, PAT, (uint64_t)i);
    CHECK_EQ(co_stack_compactable(1), 0);
    for (int r = 0; r <= WROUNDS; r++) {
        int v = -1;
        int rc = co_chan_recv(wch[i], &v, CO_FOREVER);
        if (r < WROUNDS || i % 3 == 0) {
            if (rc != 0 || v != i * 10 + r) fail();
        } else if (rc != CO_ECLOSED) {
            fail();
        }
    }
    if (t_pattern_bad(pat, PAT, (uint64_t)i)) fail();
    co_waitgroup_done(&wg);
}

/* A socket reader that opted in, woken by data (k % 3 == 0), by EOF (1) or
 * by co_close of its descriptor (2). */
static int ssock[NSOCK][2];
static void early_reader(void *arg) {
    int k = (int)(intptr_t)arg;
    CHECK_EQ(co_stack_compactable(1), 0);
    char buf[16];
    ssize_t n = co_read(ssock[k][0], buf, sizeof buf, CO_FOREVER);
    switch (k % 3) {
    case 0:
        if (n != 3 || memcmp(buf, "abc", 3) != 0) fail();
        break;
    case 1:
        if (n != 0) fail();
        break;
    default:
        if (n != CO_ECLOSED) fail();
        break;
    }
    co_waitgroup_done(&wg);
}

static void test_withdrawn_before_threshold(void) {
    co__test_compact_set_ms(HIGH_MS);
    uint64_t c0 = t_compactions();
    CHECK_EQ(co__test_compact_offered(), 0);
    /* waves: each one's coroutines exit, and the next reuses their records */
    for (int wave = 0; wave < WAVES; wave++) {
        for (int i = 0; i < NW; i++) CHECK_EQ(co_chan_new(&wch[i], sizeof(int), 0), 0);
        co_waitgroup_add(&wg, NW);
        for (int i = 0; i < NW; i++) CHECK_EQ(co_go(early_rx, (void *)(intptr_t)i), 0);
        for (int r = 0; r <= WROUNDS; r++) {
            CHECK(wait_offered(NW)); /* every one parked, each offered once */
            if (r == WROUNDS) break;
            for (int i = 0; i < NW; i++) {
                int v = i * 10 + r;
                CHECK_EQ(co_chan_send(wch[i], &v, CO_FOREVER), 0);
            }
        }
        for (int i = 0; i < NW; i++) {
            if (i % 3 == 0) {
                int v = i * 10 + WROUNDS;
                CHECK_EQ(co_chan_send(wch[i], &v, CO_FOREVER), 0);
            } else {
                CHECK_EQ(co_chan_close(wch[i]), 0);
            }
        }
        co_waitgroup_wait(&wg);
        CHECK_EQ(co__test_compact_offered(), 0);
        for (int i = 0; i < NW; i++) co_chan_free(wch[i]);
    }
    /* netpoll waits: data, EOF, co_close */
    for (int k = 0; k < NSOCK; k++) CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, ssock[k]), 0);
    co_waitgroup_add(&wg, NSOCK);
    for (int k = 0; k < NSOCK; k++) CHECK_EQ(co_go(early_reader, (void *)(intptr_t)k), 0);
    CHECK(wait_offered(NSOCK));
    for (int k = 0; k < NSOCK; k++) {
        if (k % 3 == 0)
            CHECK_EQ(write(ssock[k][1], "abc", 3), 3);
        else if (k % 3 == 1)
            CHECK_EQ(close(ssock[k][1]), 0);
        else
            CHECK_EQ(co_close(ssock[k][0]), 0);
    }
    co_waitgroup_wait(&wg);
    CHECK_EQ(co__test_compact_offered(), 0);
    for (int k = 0; k < NSOCK; k++) {
        if (k % 3 != 2) co_close(ssock[k][0]);
        if (k % 3 != 1) close(ssock[k][1]);
    }
    CHECK_EQ(__atomic_load_n(&bad, __ATOMIC_RELAXED), 0);
    CHECK_EQ(t_compactions() - c0, 0); /* none waited out the threshold */
    CHECK_EQ(co_stack_compacted(), 0);
}

/* ---- woken while sysmon scans and compacts them ------------------------ */

enum { NS = 2000, SROUNDS = 8, SWAKERS = 4 };
static co_chan_t *sch[NS];

/* SROUNDS values on its own channel; its last wait ends by a value (even
 * i) or by the channel's close (odd i). */
static void scan_rx(void *arg) {
    int i = (int)(intptr_t)arg;
    volatile uint64_t pat[PAT];
    t_pattern_fill(pat, PAT, (uint64_t)i + 5);
    CHECK_EQ(co_stack_compactable(1), 0);
    for (int r = 0; r < SROUNDS; r++) {
        int v = -1;
        int rc = co_chan_recv(sch[i], &v, CO_FOREVER);
        if (r < SROUNDS - 1 || i % 2 == 0) {
            if (rc != 0 || v != i + r) fail();
        } else if (rc != CO_ECLOSED) {
            fail();
        }
    }
    if (t_pattern_bad(pat, PAT, (uint64_t)i + 5)) fail();
    co_waitgroup_done(&wg);
}

/* Waker w serves i % SWAKERS == w round by round, pausing 0-2 ms between
 * rounds: some receivers are woken long parked (compacted), some while
 * offered, some while sysmon holds them. */
static void scan_waker(void *arg) {
    int w = (int)(intptr_t)arg;
    for (int r = 0; r < SROUNDS; r++) {
        for (int i = w; i < NS; i += SWAKERS) {
            int v = i + r;
            if (r == SROUNDS - 1 && i % 2) {
                if (co_chan_close(sch[i]) != 0) fail();
            } else if (co_chan_send(sch[i], &v, CO_FOREVER) != 0) {
                fail();
            }
            if ((i / SWAKERS) % 50 == 0) co_yield();
        }
        co_sleep((r % 3) * CO_MILLISECOND);
    }
    co_waitgroup_done(&wg);
}

static void test_woken_during_scans(void) {
    co__test_compact_set_ms(0);
    uint64_t c0 = t_compactions(), r0 = t_restores();
    for (int i = 0; i < NS; i++) CHECK_EQ(co_chan_new(&sch[i], sizeof(int), 0), 0);
    co_waitgroup_add(&wg, NS + SWAKERS);
    for (int i = 0; i < NS; i++) CHECK_EQ(co_go(scan_rx, (void *)(intptr_t)i), 0);
    CHECK(wait_compacted(1)); /* sysmon at work before the wakers start */
    for (int w = 0; w < SWAKERS; w++) CHECK_EQ(co_go(scan_waker, (void *)(intptr_t)w), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&bad, __ATOMIC_RELAXED), 0);
    CHECK_EQ(co__test_compact_offered(), 0);
    CHECK_EQ(co_stack_compacted(), 0);
    CHECK_EQ(t_restores() - r0, t_compactions() - c0);
    fprintf(stderr, "  %llu compactions\n", (unsigned long long)(t_compactions() - c0));
    for (int i = 0; i < NS; i++) co_chan_free(sch[i]);
}

/* ---- a few offered among many that are not ----------------------------- */

enum { NPLAIN = 20000, NFEW = 40, NTIMED = 100 };
static co_chan_t *plain_ch, *few_ch, *timed_ch;

static void plain_rx(void *arg) {
    (void)arg;
    int v;
    if (co_chan_recv(plain_ch, &v, CO_FOREVER) != CO_ECLOSED) fail();
    co_waitgroup_done(&wg);
}

/* Opted in, but in a wait that is not offered (a deadline). */
static void timed_rx(void *arg) {
    (void)arg;
    CHECK_EQ(co_stack_compactable(1), 0);
    int v;
    if (co_chan_recv(timed_ch, &v, co_now() + 60 * CO_SECOND) != 0 || v != 3) fail();
    co_waitgroup_done(&wg);
}

static uint8_t few_seen[NFEW];
static void few_rx(void *arg) {
    int i = (int)(intptr_t)arg;
    volatile uint64_t pat[PAT];
    t_pattern_fill(pat, PAT, (uint64_t)i + 99);
    CHECK_EQ(co_stack_compactable(1), 0);
    int v = -1;
    if (co_chan_recv(few_ch, &v, CO_FOREVER) != 0 || v < 0 || v >= NFEW) fail();
    else __atomic_add_fetch(&few_seen[v], 1, __ATOMIC_RELAXED);
    if (t_pattern_bad(pat, PAT, (uint64_t)i + 99)) fail();
    co_waitgroup_done(&wg);
}

static void test_few_offered_among_many(void) {
    co__test_compact_set_ms(0);
    CHECK_EQ(co_chan_new(&plain_ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&few_ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&timed_ch, sizeof(int), 0), 0);
    uint64_t c0 = t_compactions(), r0 = t_restores();
    co_waitgroup_add(&wg, NPLAIN + NTIMED + NFEW);
    for (int i = 0; i < NPLAIN / 2; i++) CHECK_EQ(co_go(plain_rx, NULL), 0);
    for (int i = 0; i < NTIMED; i++) CHECK_EQ(co_go(timed_rx, NULL), 0);
    for (int i = 0; i < NFEW; i++) CHECK_EQ(co_go(few_rx, (void *)(intptr_t)i), 0);
    for (int i = NPLAIN / 2; i < NPLAIN; i++) CHECK_EQ(co_go(plain_rx, NULL), 0);
    CHECK(wait_compacted(NFEW));
    co_sleep(50 * CO_MILLISECOND); /* more passes: nothing else is taken */
    CHECK_EQ(co_stack_compacted(), NFEW);
    CHECK_EQ(t_compactions() - c0, NFEW);
    CHECK_EQ(co__test_compact_offered(), 0); /* the few left the lists as they were compacted */
    CHECK_EQ(co__test_chan_receivers(few_ch), NFEW);
    for (int i = 0; i < NFEW; i++) CHECK_EQ(co_chan_send(few_ch, &i, CO_FOREVER), 0);
    int three = 3;
    for (int i = 0; i < NTIMED; i++) CHECK_EQ(co_chan_send(timed_ch, &three, CO_FOREVER), 0);
    CHECK_EQ(co_chan_close(plain_ch), 0);
    co_waitgroup_wait(&wg);
    for (int i = 0; i < NFEW; i++) CHECK_EQ(few_seen[i], 1);
    CHECK_EQ(__atomic_load_n(&bad, __ATOMIC_RELAXED), 0);
    CHECK_EQ(co_stack_compacted(), 0);
    CHECK_EQ(t_compactions() - c0, NFEW);
    CHECK_EQ(t_restores() - r0, NFEW);
    CHECK_EQ(co__test_compact_offered(), 0);
    co_chan_free(plain_ch);
    co_chan_free(few_ch);
    co_chan_free(timed_ch);
}

/* ---- waits that cannot be compacted are put back, and starve no one --- */

/* More than a round's claims (64) in every shard: each coroutine's live
 * part is over the 64 KiB that compaction takes, so every claim of it
 * fails and puts its offer back. The small ones spawned after them must
 * still be reached and compacted. */
enum { NBIG = 16 * 70, NSMALL = 32 };
static co_chan_t *big_ch, *small_ch;

static __attribute__((noinline)) void big_wait(int i) {
    volatile char frame[66 * 1024];
    frame[0] = (char)i;
    frame[sizeof frame - 1] = (char)(i + 1);
    int v;
    if (co_chan_recv(big_ch, &v, CO_FOREVER) != CO_ECLOSED) fail();
    if (frame[0] != (char)i || frame[sizeof frame - 1] != (char)(i + 1)) fail();
}
static void big_rx(void *arg) {
    CHECK_EQ(co_stack_compactable(1), 0);
    big_wait((int)(intptr_t)arg);
    co_waitgroup_done(&wg);
}
static void small_rx(void *arg) {
    (void)arg;
    CHECK_EQ(co_stack_compactable(1), 0);
    int v = -1;
    if (co_chan_recv(small_ch, &v, CO_FOREVER) != 0 || v != 8) fail();
    co_waitgroup_done(&wg);
}

static void test_put_back_starves_none(void) {
    if (t_sanitized()) { /* 74 MB of stack frames, times the sanitizer's shadow */
        fprintf(stderr, "  (skipped under a sanitizer: %d frames of 66 KiB)\n", NBIG);
        return;
    }
    co__test_compact_set_ms(0);
    CHECK_EQ(co_chan_new(&big_ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&small_ch, sizeof(int), 0), 0);
    uint64_t c0 = t_compactions();
    co_waitgroup_add(&wg, NBIG + NSMALL);
    for (int i = 0; i < NBIG; i++) CHECK_EQ(co_go(big_rx, (void *)(intptr_t)i), 0);
    CHECK(wait_offered(NBIG)); /* all parked first: the passes are busy with them */
    for (int i = 0; i < NSMALL; i++) CHECK_EQ(co_go(small_rx, NULL), 0);
    CHECK(wait_compacted(NSMALL));
    co_sleep(20 * CO_MILLISECOND);
    CHECK_EQ(co_stack_compacted(), NSMALL);
    CHECK_EQ(t_compactions() - c0, NSMALL);
    /* put back each time (a count taken while a round holds some of them
     * is lower: looked at until it is whole) */
    CHECK(wait_offered(NBIG));
    int eight = 8;
    for (int i = 0; i < NSMALL; i++) CHECK_EQ(co_chan_send(small_ch, &eight, CO_FOREVER), 0);
    CHECK_EQ(co_chan_close(big_ch), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&bad, __ATOMIC_RELAXED), 0);
    CHECK_EQ(co__test_compact_offered(), 0);
    CHECK_EQ(co_stack_compacted(), 0);
    co_chan_free(big_ch);
    co_chan_free(small_ch);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_withdrawn_before_threshold);
    T_RUN(test_woken_during_scans);
    T_RUN(test_few_offered_among_many);
    T_RUN(test_put_back_starves_none);
    return 0;
}

int main(void) {
    t_begin(110);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
