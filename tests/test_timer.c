/* One-shot timers (co_timer_new, co_after, co_after_func): Go 1.19's
 * time/sleep_test.go Timer, Reset, Stop and AfterFunc tests that apply,
 * Go 1.23's no-stale-value Stop/Reset, bad input, and a stress of
 * co_after_func racing co_timer_stop with exact accounting.
 * No timing assertions: a timer may fire late, never early, so a value's
 * time is checked against its arming only from below. */
#include "t.h"

#include <colony.h>
#include <pthread.h>
#include <sys/wait.h>

#define MS CO_MILLISECOND

static int64_t recv_time(co_chan_t *ch, int64_t deadline) {
    int64_t v = -1;
    int rc = co_chan_recv(ch, &v, deadline);
    return rc == 0 ? v : rc;
}

/* ---- constants ------------------------------------------------------------ */

static void test_durations(void) {
    CHECK_EQ(CO_NANOSECOND, 1);
    CHECK_EQ(CO_MICROSECOND, 1000LL);
    CHECK_EQ(CO_MILLISECOND, 1000000LL);
    CHECK_EQ(CO_SECOND, 1000000000LL);
    CHECK_EQ(CO_MINUTE, 60000000000LL);
    CHECK_EQ(CO_HOUR, 3600000000000LL);
    CHECK_EQ(sizeof(CO_HOUR), sizeof(int64_t));
}

/* ---- TestAfter, TestZeroTimer ------------------------------------------- */

static void test_after(void) {
    int64_t t0 = co_now();
    co_timer_t *t = NULL;
    CHECK_EQ(co_after(&t, 10 * MS), 0);
    int64_t v = recv_time(co_timer_chan(t), CO_FOREVER);
    CHECK(v >= t0 + 10 * MS); /* never early */
    CHECK(co_now() >= v);
    CHECK(!co_timer_stop(t)); /* fired and received */
    co_timer_free(t);

    /* zero and negative: fire at once (Go) */
    int64_t durs[] = {0, -1, -CO_HOUR, INT64_MIN};
    for (int i = 0; i < 4; i++) {
        t0 = co_now();
        CHECK_EQ(co_timer_new(&t, durs[i]), 0);
        v = recv_time(co_timer_chan(t), CO_FOREVER);
        CHECK(v >= t0);
        CHECK_EQ(co_chan_len(co_timer_chan(t)), 0);
        co_timer_free(t);
    }
}

/* ---- TestOverflowSleep ---------------------------------------------------- */

static void test_overflow(void) {
    co_timer_t *big = NULL, *small = NULL;
    CHECK_EQ(co_after(&big, INT64_MAX), 0);
    CHECK_EQ(co_after(&small, 25 * MS), 0);
    co_case_t c[2] = {{.ch = co_timer_chan(big), .op = CO_RECV},
                      {.ch = co_timer_chan(small), .op = CO_RECV}};
    CHECK_EQ(co_select(c, 2, CO_FOREVER), 1); /* the big one never fires */
    CHECK(co_timer_stop(big));
    co_timer_free(big);
    co_timer_free(small);
}

/* ---- TestAfterFunc: a chain of 10 co_after_func(0) ------------------------ */

static co_chan_t *af_done;
static int af_left;
static void af_step(void *arg) {
    (void)arg;
    static co_timer_t *timers[12];
    int i = __atomic_sub_fetch(&af_left, 1, __ATOMIC_SEQ_CST);
    if (i >= 0) {
        CHECK_EQ(co_after_func(&timers[i], 0, af_step, NULL), 0);
    } else {
        for (int k = 0; k < 10; k++) co_timer_free(timers[k]); /* each fired: no wait */
        CHECK_EQ(co_chan_send(af_done, &(int){1}, CO_FOREVER), 0);
    }
}

static void test_after_func_chain(void) {
    CHECK_EQ(co_chan_new(&af_done, sizeof(int), 0), 0);
    af_left = 10;
    co_timer_t *t = NULL;
    CHECK_EQ(co_after_func(&t, 0, af_step, NULL), 0);
    CHECK_EQ(co_timer_chan(t), NULL);
    int v = 0;
    CHECK_EQ(co_chan_recv(af_done, &v, CO_FOREVER), 0);
    CHECK_EQ(v, 1);
    CHECK(!co_timer_stop(t)); /* it ran */
    co_timer_free(t);
    co_chan_free(af_done);
}

/* ---- TestAfterStop -------------------------------------------------------- */

static int as_ran;
static void as_fn(void *arg) {
    (void)arg;
    __atomic_add_fetch(&as_ran, 1, __ATOMIC_SEQ_CST);
}

static void test_after_stop(void) {
    co_timer_t *f = NULL, *t0 = NULL, *c1 = NULL, *c2 = NULL;
    CHECK_EQ(co_after_func(&f, 100 * MS, as_fn, NULL), 0);
    CHECK_EQ(co_timer_new(&t0, 50 * MS), 0);
    CHECK_EQ(co_after(&c1, 200 * MS), 0);
    CHECK(co_timer_stop(f));
    CHECK(co_timer_stop(t0));
    CHECK(!co_timer_stop(f)); /* stop of a stopped timer */
    CHECK(!co_timer_stop(t0));
    CHECK(recv_time(co_timer_chan(c1), CO_FOREVER) > 0);
    CHECK_EQ(__atomic_load_n(&as_ran, __ATOMIC_SEQ_CST), 0);
    CHECK_EQ(co_chan_recv(co_timer_chan(t0), NULL, 0), CO_ETIMEDOUT);
    /* co_timer_reset of a stopped timer arms it again */
    CHECK_EQ(co_timer_reset(t0, 1 * MS), 0);
    CHECK(recv_time(co_timer_chan(t0), CO_FOREVER) > 0);
    CHECK_EQ(co_after(&c2, 1 * MS), 0);
    CHECK(recv_time(co_timer_chan(c2), CO_FOREVER) > 0);
    CHECK_EQ(__atomic_load_n(&as_ran, __ATOMIC_SEQ_CST), 0);
    co_timer_free(f);
    co_timer_free(t0);
    co_timer_free(c1);
    co_timer_free(c2);
}

/* ---- TestReset, and Go 1.23's no stale value ------------------------------ */

static void test_reset(void) {
    co_timer_t *t = NULL;
    CHECK_EQ(co_timer_new(&t, 40 * MS), 0);
    CHECK_EQ(co_sleep(5 * MS), 0);
    int64_t tr = co_now();
    CHECK_EQ(co_timer_reset(t, 60 * MS), 1); /* an unfired timer */
    int64_t v = recv_time(co_timer_chan(t), CO_FOREVER);
    CHECK(v >= tr + 60 * MS); /* the reset's deadline, not the first one */
    CHECK_EQ(co_chan_len(co_timer_chan(t)), 0);
    CHECK_EQ(co_timer_reset(t, 50 * MS), 0); /* an expired, received timer */
    CHECK(co_timer_stop(t));
    co_timer_free(t);
}

/* Wait until the timer's value sits unreceived in its channel. */
static void await_buffered(co_timer_t *t) {
    while (co_chan_len(co_timer_chan(t)) != 1) co_sleep(100 * 1000);
}

static void test_no_stale_value(void) {
    co_timer_t *t = NULL;
    /* fired, not received: stop takes it back and says it stopped it */
    CHECK_EQ(co_timer_new(&t, 0), 0);
    await_buffered(t);
    CHECK(co_timer_stop(t));
    CHECK_EQ(co_chan_len(co_timer_chan(t)), 0);
    CHECK_EQ(co_chan_recv(co_timer_chan(t), NULL, 0), CO_ETIMEDOUT);
    CHECK(!co_timer_stop(t));
    /* reset after an unreceived fire: only the new arming's value comes */
    CHECK_EQ(co_timer_reset(t, 0), 0);
    await_buffered(t);
    int64_t tr = co_now();
    CHECK_EQ(co_timer_reset(t, 20 * MS), 1);
    CHECK_EQ(co_chan_len(co_timer_chan(t)), 0);
    int64_t v = recv_time(co_timer_chan(t), CO_FOREVER);
    CHECK(v >= tr + 20 * MS);
    /* TestTimerModifiedEarlier: far off, stopped, reset near */
    CHECK_EQ(co_timer_reset(t, 10 * CO_HOUR), 0);
    CHECK(co_timer_stop(t));
    CHECK_EQ(co_timer_reset(t, 5 * MS), 0);
    CHECK(recv_time(co_timer_chan(t), CO_FOREVER) > 0);
    co_timer_free(t);
}

/* ---- TestTimerStopStress -------------------------------------------------- */

static void test_stop_stress(void) {
    enum { N = 100 };
    co_timer_t *t[N];
    for (int i = 0; i < N; i++) CHECK_EQ(co_timer_new(&t[i], CO_HOUR + i), 0);
    for (int i = 0; i < N; i++) CHECK(co_timer_stop(t[i]));
    for (int i = 0; i < N; i++) {
        CHECK_EQ(co_chan_len(co_timer_chan(t[i])), 0);
        co_timer_free(t[i]);
    }
}

/* ---- co_after_func racing co_timer_stop: exact accounting ---------------- */

#define RACE_N 4000
static uint32_t race_ran[RACE_N];
static bool race_stopped[RACE_N];
static co_timer_t *race_t[RACE_N];
static uint32_t race_total;

static void race_fn(void *arg) {
    uintptr_t i = (uintptr_t)arg;
    __atomic_add_fetch(&race_ran[i], 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&race_total, 1, __ATOMIC_SEQ_CST);
}

typedef struct {
    int lo, hi;
    co_waitgroup_t *wg;
} race_part_t;

static void race_stopper(void *arg) {
    race_part_t *rp = arg;
    for (int i = rp->lo; i < rp->hi; i++) {
        if (i % 7 == 0) co_gosched();
        race_stopped[i] = co_timer_stop(race_t[i]);
    }
    co_waitgroup_done(rp->wg);
}

static void *race_thread(void *arg) {
    race_part_t *rp = arg;
    for (int i = rp->lo; i < rp->hi; i++) race_stopped[i] = co_timer_stop(race_t[i]);
    co_waitgroup_done(rp->wg);
    return NULL;
}

static void test_after_func_stop_race(void) {
    /* deadlines spread over the time the stops take, so some fire before
     * their stop, some during it, some are stopped pending */
    for (int i = 0; i < RACE_N; i++)
        CHECK_EQ(co_after_func(&race_t[i], (int64_t)(i % 64) * 100 * CO_MICROSECOND, race_fn,
                               (void *)(uintptr_t)i),
                 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    race_part_t parts[4];
    pthread_t th;
    co_waitgroup_add(&wg, 4);
    for (int k = 0; k < 4; k++) parts[k] = (race_part_t){k * RACE_N / 4, (k + 1) * RACE_N / 4, &wg};
    for (int k = 0; k < 3; k++) CHECK_EQ(co_go(race_stopper, &parts[k]), 0);
    CHECK_EQ(pthread_create(&th, NULL, race_thread, &parts[3]), 0); /* a plain thread too */
    co_waitgroup_wait(&wg);
    pthread_join(th, NULL);
    int stopped = 0;
    for (int i = 0; i < RACE_N; i++) stopped += race_stopped[i];
    /* every function that was not stopped runs (wait for the last ones) */
    while (__atomic_load_n(&race_total, __ATOMIC_SEQ_CST) < (uint32_t)(RACE_N - stopped))
        co_sleep(1 * MS);
    for (int i = 0; i < RACE_N; i++) co_timer_free(race_t[i]); /* waits for any callback */
    CHECK_EQ(co_sleep(2 * MS), 0);
    CHECK_EQ(__atomic_load_n(&race_total, __ATOMIC_SEQ_CST), RACE_N - stopped);
    int bad = 0;
    for (int i = 0; i < RACE_N; i++)
        if (race_ran[i] + (race_stopped[i] ? 1 : 0) != 1) bad++;
    CHECK_EQ(bad, 0);
    fprintf(stderr, "   %d of %d stopped before they ran\n", stopped, RACE_N);
}

/* Channel timers: reset racing the firing; after every reset returns the
 * channel holds nothing, and exactly one value comes per final arming. */
static void test_reset_stress(void) {
    co_timer_t *t = NULL;
    CHECK_EQ(co_timer_new(&t, 0), 0);
    int stale = 0;
    for (int i = 0; i < 3000; i++) {
        int64_t d = (i % 3 == 0) ? 0 : (int64_t)(i % 40) * CO_MICROSECOND;
        int64_t tr = co_now(); /* before the reset: its arming fires at tr + d or later */
        int r = co_timer_reset(t, d);
        CHECK(r == 0 || r == 1);
        if (i % 5 == 0 && d > 0) {
            /* a stale value (an earlier arming's, fired before this reset
             * drained it) would carry a time before tr + d */
            int64_t v = recv_time(co_timer_chan(t), CO_FOREVER);
            if (v < tr + d) stale++;
        }
        if (i % 11 == 0) co_gosched();
    }
    (void)co_timer_stop(t); /* either answer: it may have fired */
    CHECK_EQ(co_chan_len(co_timer_chan(t)), 0);
    CHECK_EQ(stale, 0);
    co_timer_free(t);
}

/* co_after_func and reset: a fired function timer runs again after a
 * reset; a pending one, reset, runs once. */
static int rf_ran;
static void rf_fn(void *arg) {
    (void)arg;
    __atomic_add_fetch(&rf_ran, 1, __ATOMIC_SEQ_CST);
}
static void test_after_func_reset(void) {
    co_timer_t *t = NULL;
    CHECK_EQ(co_after_func(&t, 0, rf_fn, NULL), 0);
    while (__atomic_load_n(&rf_ran, __ATOMIC_SEQ_CST) != 1) co_sleep(100 * 1000);
    CHECK(!co_timer_stop(t)); /* it ran */
    CHECK_EQ(co_timer_reset(t, CO_HOUR), 0); /* stopped: nothing pending */
    CHECK_EQ(co_timer_reset(t, 0), 1);       /* pending: stopped, armed at once */
    while (__atomic_load_n(&rf_ran, __ATOMIC_SEQ_CST) != 2) co_sleep(100 * 1000);
    CHECK_EQ(co_timer_reset(t, 0), 0); /* fired: runs again */
    while (__atomic_load_n(&rf_ran, __ATOMIC_SEQ_CST) != 3) co_sleep(100 * 1000);
    co_timer_free(t);
    CHECK_EQ(co_sleep(2 * MS), 0);
    CHECK_EQ(__atomic_load_n(&rf_ran, __ATOMIC_SEQ_CST), 3);
}

/* Stops and resets of one channel timer from threads and coroutines at
 * once, with a receiver taking what fires: they serialize, nothing
 * crashes or hangs, and a final stop leaves the channel empty. */
static co_timer_t *hs_t;
static int hs_stop_flag;
static co_waitgroup_t hs_wg;
static void hs_body(int k) {
    for (int i = 0; i < 2000; i++) {
        if ((i + k) % 3 == 0)
            (void)co_timer_stop(hs_t);
        else
            CHECK(co_timer_reset(hs_t, (int64_t)(i % 20) * CO_MICROSECOND) >= 0);
        if (i % 50 == 49) co_sleep(100 * CO_MICROSECOND); /* let some fire and be received */
    }
}
static void hs_co(void *arg) {
    hs_body((int)(intptr_t)arg);
    co_waitgroup_done(&hs_wg);
}
static void *hs_thread(void *arg) {
    hs_body((int)(intptr_t)arg);
    co_waitgroup_done(&hs_wg);
    return NULL;
}
static int hs_got;
static void hs_recv(void *arg) {
    co_waitgroup_t *rwg = arg;
    while (!__atomic_load_n(&hs_stop_flag, __ATOMIC_SEQ_CST)) {
        int64_t v;
        if (co_chan_recv(co_timer_chan(hs_t), &v, co_deadline_after(200 * CO_MICROSECOND)) == 0)
            hs_got++;
    }
    co_waitgroup_done(rwg);
}
static void test_stop_reset_concurrent(void) {
    CHECK_EQ(co_timer_new(&hs_t, 0), 0);
    pthread_t th;
    co_waitgroup_add(&hs_wg, 3);
    CHECK_EQ(co_go(hs_co, (void *)1), 0);
    CHECK_EQ(co_go(hs_co, (void *)2), 0);
    CHECK_EQ(pthread_create(&th, NULL, hs_thread, (void *)0), 0);
    static co_waitgroup_t rwg;
    co_waitgroup_add(&rwg, 1);
    CHECK_EQ(co_go(hs_recv, &rwg), 0);
    co_waitgroup_wait(&hs_wg); /* the three hammers */
    __atomic_store_n(&hs_stop_flag, 1, __ATOMIC_SEQ_CST);
    co_waitgroup_wait(&rwg);
    pthread_join(th, NULL);
    (void)co_timer_stop(hs_t);
    CHECK_EQ(co_chan_len(co_timer_chan(hs_t)), 0);
    CHECK_EQ(co_chan_recv(co_timer_chan(hs_t), NULL, 0), CO_ETIMEDOUT);
    fprintf(stderr, "   receiver got %d values\n", hs_got);
    co_timer_free(hs_t);
}

/* ---- bad input ------------------------------------------------------------- */

static void test_bad_input(void) {
    co_timer_t *t = (co_timer_t *)&t;
    CHECK_EQ(co_timer_new(NULL, MS), CO_EINVAL);
    CHECK_EQ(co_after(NULL, MS), CO_EINVAL);
    CHECK_EQ(co_after_func(NULL, MS, as_fn, NULL), CO_EINVAL);
    CHECK_EQ(co_after_func(&t, MS, NULL, NULL), CO_EINVAL);
    CHECK(t == NULL);
    CHECK_EQ(co_timer_reset(NULL, MS), CO_EINVAL);
    CHECK(co_timer_chan(NULL) == NULL);
    co_timer_free(NULL); /* nothing */
    /* co_timer_stop(NULL) is fatal, with a message */
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    CHECK(pid >= 0);
    if (pid == 0) {
        t_execl("/proc/self/exe", "test_timer", "--stop-null", (char *)NULL);
        _exit(127);
    }
    if (pid > 0) {
        char buf[4096];
        int st = t_drain_and_wait(fd, buf, sizeof buf, pid);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
        CHECK(strstr(buf, "colony: fatal: co_timer_stop(NULL)") != NULL);
    }
    /* a timer holds the runtime: co_shutdown is refused meanwhile (from a
     * coroutine it is refused anyway, so only check the timer works) */
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_durations);
    T_RUN(test_after);
    T_RUN(test_overflow);
    T_RUN(test_after_func_chain);
    T_RUN(test_after_stop);
    T_RUN(test_reset);
    T_RUN(test_no_stale_value);
    T_RUN(test_stop_stress);
    T_RUN(test_after_func_stop_race);
    T_RUN(test_reset_stress);
    T_RUN(test_after_func_reset);
    T_RUN(test_stop_reset_concurrent);
    T_RUN(test_bad_input);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--stop-null")) {
        (void)co_timer_stop(NULL);
        return 0;
    }
    t_begin(60);
    CHECK_EQ(co_main(run, NULL), 0);
    /* every timer was freed: nothing holds the runtime */
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
