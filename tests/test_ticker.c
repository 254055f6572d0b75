/* Tickers: errors, ticks arrive in order on a capacity-1 channel, a slow
 * reader misses ticks instead of queueing them, stop is safe while the
 * timer fires, select with a ticker and a deadline, a thread reads ticks. */
#include "t.h"

#include <colony.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

static void test_errors(void) {
    co_ticker_t *t = (co_ticker_t *)1;
    CHECK_EQ(co_ticker_new(NULL, 1000000), CO_EINVAL);
    CHECK_EQ(co_ticker_new(&t, 0), CO_EINVAL);
    CHECK(t == NULL);
    CHECK_EQ(co_ticker_new(&t, -5), CO_EINVAL);
    CHECK(co_ticker_chan(NULL) == NULL);
    co_ticker_stop(NULL); /* no-op */
}

static void test_ticks(void) {
    co_ticker_t *t;
    int64_t start = co_now();
    CHECK_EQ(co_ticker_new(&t, 2 * 1000000), 0);
    co_chan_t *ch = co_ticker_chan(t);
    CHECK(ch != NULL);
    CHECK_EQ(co_chan_cap(ch), 1);
    int64_t prev = start;
    for (int i = 0; i < 5; i++) {
        int64_t tick = 0;
        CHECK_EQ(co_chan_recv(ch, &tick, CO_FOREVER), 0);
        CHECK(tick >= prev + 1);       /* strictly later each time */
        CHECK(tick >= start + 2 * 1000000); /* never before the first period */
        CHECK(tick <= co_now());
        prev = tick;
    }
    co_ticker_stop(t);
}

/* A reader that sleeps through many periods finds at most one tick
 * waiting (the channel holds one), then gets fresh ones. */
static void test_slow_reader_drops(void) {
    co_ticker_t *t;
    CHECK_EQ(co_ticker_new(&t, 200 * 1000), 0);
    co_chan_t *ch = co_ticker_chan(t);
    co_sleep(20 * 1000000); /* ~100 periods */
    CHECK(co_chan_len(ch) <= 1);
    int64_t tick, prev = 0;
    int got = 0;
    int64_t t0 = co_now();
    while (co_chan_recv(ch, &tick, 0) == 0 && got < 100) { /* take what is there now */
        CHECK(tick > prev);
        prev = tick;
        got++;
    }
    /* ~100 ticks were due: the missed ones were dropped. (Plus one per
     * period the loop itself took, if this thread was held up in it.) */
    int64_t periods = (co_now() - t0) / (200 * 1000);
    CHECK(got >= 1 && got <= 3 + periods);
    CHECK_EQ(co_chan_recv(ch, &tick, CO_FOREVER), 0); /* and ticks keep coming */
    CHECK(tick > prev);
    co_ticker_stop(t);
}

/* Go's pattern: for { select { case <-tick: ...; case <-done: return } },
 * plus a deadline. */
static void test_select_with_ticker(void) {
    co_ticker_t *t;
    co_chan_t *done;
    CHECK_EQ(co_ticker_new(&t, 1000000), 0);
    CHECK_EQ(co_chan_new(&done, 0, 0), 0);
    int64_t tick;
    co_case_t c[2] = {{.ch = co_ticker_chan(t), .op = CO_RECV, .elem = &tick},
                      {.ch = done, .op = CO_RECV, .elem = NULL}};
    int ticks = 0;
    while (ticks < 5) {
        int rc = co_select(c, 2, co_deadline_after(10LL * 1000000000));
        CHECK_EQ(rc, 0);
        if (rc != 0) break;
        ticks++;
    }
    co_chan_close(done);
    CHECK_EQ(co_select(c, 2, CO_FOREVER) >= 0, 1);
    co_ticker_stop(t);
    co_chan_free(done);
}

/* Many tickers with a tiny period, stopped at random moments: stop never
 * races with a running callback (ASan/TSan would tell). */
static void test_stop_while_firing(void) {
    enum { N = 200 };
    for (int i = 0; i < N; i++) {
        co_ticker_t *t;
        CHECK_EQ(co_ticker_new(&t, 1000 + (i % 7) * 100), 0);
        if (i % 3 == 0) co_sleep(20 * 1000);
        if (i % 3 == 1) {
            int64_t tick;
            (void)co_chan_recv(co_ticker_chan(t), &tick, co_deadline_after(100 * 1000));
        }
        co_ticker_stop(t);
    }
}

static void *thread_reader(void *arg) {
    co_ticker_t *t = arg;
    for (int i = 0; i < 3; i++) {
        int64_t tick = 0;
        CHECK_EQ(co_chan_recv(co_ticker_chan(t), &tick, CO_FOREVER), 0);
        CHECK(tick > 0);
    }
    return NULL;
}

static void test_thread_reads_ticks(void) {
    co_ticker_t *t;
    CHECK_EQ(co_ticker_new(&t, 1000000), 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, thread_reader, t), 0);
    pthread_join(th, NULL);
    co_ticker_stop(t);
}

/* Durations past the end of time (now + ns overflows) mean "never": a
 * ticker of period INT64_MAX never ticks (its first expiry wrapped negative
 * and it ticked without pause), and co_sleep(INT64_MAX) does not return,
 * from a coroutine (it returned at once) or from a plain thread (it
 * returned CO_EINVAL). */
static _Atomic int ever_woke;
static void sleep_forever_co(void *arg) {
    co_sleep(INT64_MAX);
    atomic_store(&ever_woke, 1);
}
static void *sleep_forever_thread(void *arg) {
    co_sleep(INT64_MAX);
    atomic_store(&ever_woke, 2);
    return NULL;
}
static void test_end_of_time(void) {
    co_ticker_t *t;
    CHECK_EQ(co_ticker_new(&t, INT64_MAX), 0);
    int64_t v;
    CHECK_EQ(co_chan_recv(co_ticker_chan(t), &v, co_deadline_after(50 * 1000000)), CO_ETIMEDOUT);
    co_ticker_stop(t);
    CHECK_EQ(co_ticker_new(&t, INT64_MAX - 1000), 0);
    CHECK_EQ(co_chan_recv(co_ticker_chan(t), &v, co_deadline_after(20 * 1000000)), CO_ETIMEDOUT);
    co_ticker_stop(t);

    atomic_store(&ever_woke, 0);
    CHECK_EQ(co_go(sleep_forever_co, NULL), 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, sleep_forever_thread, NULL), 0);
    pthread_detach(th); /* sleeps until the process ends */
    co_sleep(50 * 1000000);
    CHECK_EQ(atomic_load(&ever_woke), 0);
}

static int run(void *arg) {
    T_RUN(test_errors);
    T_RUN(test_ticks);
    T_RUN(test_slow_reader_drops);
    T_RUN(test_select_with_ticker);
    T_RUN(test_stop_while_firing);
    T_RUN(test_thread_reads_ticks);
    T_RUN(test_end_of_time);
    return 0;
}

int main(void) {
    t_begin(60);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
