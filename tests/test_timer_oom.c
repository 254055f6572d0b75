/* Timers when memory runs out: a P's timer run and heap that cannot grow
 * (test hook: CO__FAIL_TIMER_GROW) send timers to the P's
 * overflow list instead of aborting the process, as they used to. Sleeps
 * never return early and all return, deadlines fire or are deleted,
 * tickers tick, and once memory is back the run and heap take timers
 * again; co_shutdown then finds nothing pending. */
#include <colony.h>
#include <stdatomic.h>

#include "t.h"
#include "t_internal.h"


#define MS 1000000LL
#define US 1000LL

static void fail_timer_growth(bool on) {
    t_fail(CO__FAIL_TIMER_GROW, on);
}

/* ---- sleeps, in shuffled order ----------------------------------------- */
#define SLEEPERS 300
static co_waitgroup_t wg;
static atomic_int early, woke;
static atomic_llong max_listed;
/* Look at the overflow lists: keep the most timers seen there at once. */
static int64_t note_listed(void) {
    int64_t listed = co__test_timers_listed();
    if (listed > atomic_load(&max_listed)) atomic_store(&max_listed, listed);
    return listed;
}

static atomic_int started;
static void sleeper(void *arg) {
    atomic_fetch_add(&started, 1);
    int64_t d = (int64_t)(intptr_t)arg * 100 * US + 100 * MS;
    int64_t deadline = co_now() + d;
    CHECK_EQ(co_sleep(d), 0);
    if (co_now() < deadline) atomic_fetch_add(&early, 1);
    atomic_fetch_add(&woke, 1);
    co_waitgroup_done(&wg);
}

static void sleeps(void) {
    atomic_store(&early, 0);
    atomic_store(&woke, 0);
    co_waitgroup_add(&wg, SLEEPERS);
    for (int i = 0; i < SLEEPERS; i++) {
        int k = (i * 7919) % SLEEPERS; /* a permutation: 7919 is prime */
        CHECK_EQ(co_go(sleeper, (void *)(intptr_t)k), 0);
    }
    /* Watch the lists while they sleep (100-130 ms each): most are on
     * them at once, however slowly they were spawned (TSan, chaos). */
    while (atomic_load(&woke) < SLEEPERS) {
        note_listed();
        co_sleep(1 * MS);
    }
    co_waitgroup_wait(&wg);
    CHECK_EQ(atomic_load(&woke), SLEEPERS);
    CHECK_EQ(atomic_load(&early), 0);
}

/* ---- deadlines: deleted before they fire, and fired ------------------- */
static co_chan_t *ch, *never; /* never: nobody sends on it */
static atomic_int got, timedout;
static void receiver(void *arg) {
    int64_t ns = (int64_t)(intptr_t)arg;
    int v;
    int rc = co_chan_recv(ns > 1000 * MS ? ch : never, &v, co_deadline_after(ns));
    if (rc == 0) atomic_fetch_add(&got, 1);
    if (rc == CO_ETIMEDOUT) atomic_fetch_add(&timedout, 1);
    co_waitgroup_done(&wg);
}

static void deadlines(void) {
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&never, sizeof(int), 0), 0);
    atomic_store(&got, 0);
    atomic_store(&timedout, 0);
    /* 200 with a far deadline get a value each (their timers deleted),
     * 100 with 5-15 ms, on another channel, time out. */
    co_waitgroup_add(&wg, 300);
    for (int i = 0; i < 200; i++) CHECK_EQ(co_go(receiver, (void *)(intptr_t)(60000 * MS)), 0);
    for (int i = 0; i < 100; i++)
        CHECK_EQ(co_go(receiver, (void *)(intptr_t)((5 + i % 11) * MS)), 0);
    co_sleep(2 * MS);
    note_listed();
    for (int i = 0; i < 200; i++) {
        int v = i;
        CHECK_EQ(co_chan_send(ch, &v, co_deadline_after(60000 * MS)), 0);
    }
    co_waitgroup_wait(&wg);
    CHECK_EQ(atomic_load(&got), 200);
    CHECK_EQ(atomic_load(&timedout), 100);
    co_chan_free(ch);
    co_chan_free(never);
}

static void ticks(void) {
    co_ticker_t *t;
    CHECK_EQ(co_ticker_new(&t, 2 * MS), 0);
    int64_t prev = 0;
    for (int i = 0; i < 5; i++) {
        int64_t when;
        CHECK_EQ(co_chan_recv(co_ticker_chan(t), &when, co_deadline_after(10000 * MS)), 0);
        CHECK(when > prev);
        prev = when;
    }
    co_ticker_stop(t);
}

static int body(void *arg) {
    (void)arg;
    sleeps();
    deadlines();
    ticks();
    return 0;
}

/* Everything on the overflow lists (the runtime starts with the hook set,
 * so the run and heap never get their first array). */
static void no_memory_from_the_start(void) {
    atomic_store(&max_listed, 0);
    fail_timer_growth(true);
    CHECK_EQ(co_main(body, NULL), 0);
    CHECK(atomic_load(&max_listed) >= SLEEPERS / 2); /* the lists were used */
    fail_timer_growth(false);
    CHECK_EQ(co__test_timers_listed(), 0);
    int rc;
    for (int i = 0; i < 5000 && (rc = co_shutdown()) == CO_EBUSY; i++) co_sleep(1 * MS);
    CHECK_EQ(rc, 0);
}

/* Memory runs out with the run and heap already in use, and comes back
 * while timers sit on the lists: every timer still fires once. */
static int body_midway(void *arg) {
    (void)arg;
    atomic_store(&early, 0);
    atomic_store(&woke, 0);
    atomic_store(&started, 0);
    co_waitgroup_add(&wg, 2 * SLEEPERS);
    for (int i = 0; i < SLEEPERS; i++) CHECK_EQ(co_go(sleeper, (void *)(intptr_t)i), 0);
    co_sleep(2 * MS);
    fail_timer_growth(true);
    for (int i = 0; i < SLEEPERS; i++) {
        int k = (i * 7919) % SLEEPERS;
        CHECK_EQ(co_go(sleeper, (void *)(intptr_t)k), 0);
    }
    /* Watch the lists until every sleeper has started and some timers
     * are seen there: at once normally, later under TSan in chaos mode (a
     * single look after 2 ms missed them there). Each sleeps 100-130 ms, so
     * none has fired within this bound. */
    int64_t until = co_now() + 50 * MS;
    while (co_now() < until) {
        if (note_listed() > 0 && atomic_load(&started) == 2 * SLEEPERS) break;
        co_yield();
    }
    note_listed(); /* a last look, should this M have been held up past `until` */
    fail_timer_growth(false);
    co_waitgroup_wait(&wg);
    CHECK_EQ(atomic_load(&woke), 2 * SLEEPERS);
    CHECK_EQ(atomic_load(&early), 0);
    return 0;
}
static void no_memory_midway(void) {
    atomic_store(&max_listed, 0);
    CHECK_EQ(co_main(body_midway, NULL), 0);
    CHECK(atomic_load(&max_listed) > 0);
    CHECK_EQ(co__test_timers_listed(), 0);
    /* And the run and heap work again. */
    CHECK_EQ(co_main(body, NULL), 0);
    int rc;
    for (int i = 0; i < 5000 && (rc = co_shutdown()) == CO_EBUSY; i++) co_sleep(1 * MS);
    CHECK_EQ(rc, 0);
}

int main(void) {
    t_begin(110);
    T_RUN(no_memory_from_the_start);
    T_RUN(no_memory_midway);
    return t_end();
}
