/* co_blocking and sysmon on a single P: while one coroutine sits in a
 * blocking call (nanosleep) or computes without yielding, another
 * coroutine on the same (only) P keeps ticking every 1 ms.
 * Behaviour, not timing: the blocking call (or the loop) lasts until the
 * other coroutine has ticked more than MIN_TICKS times meanwhile, however
 * long that takes on a noisy machine; only if it has not after 10 s (the
 * ticker stranded behind the blocked coroutine) does the check fail. */
// ctest-timeout: 120
#include "t.h"

#include <colony.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MS 1000000LL
#define MIN_TICKS 5
#define GIVE_UP_NS (10000 * MS) /* a blocked/spinning side gives up after this */

static int ticks;        /* atomic */
static int stop_ticking; /* atomic */

static void ticker(void *arg) {
    co_waitgroup_t *wg = arg;
    while (!__atomic_load_n(&stop_ticking, __ATOMIC_ACQUIRE)) {
        co_sleep(MS);
        __atomic_add_fetch(&ticks, 1, __ATOMIC_RELAXED);
    }
    co_waitgroup_done(wg);
}

/* Both run until the ticker has reached *goal, or GIVE_UP_NS have passed:
 * the window is as long as the ticker needs, not a fixed 50 ms. */
static bool goal_reached(const int *goal) {
    return __atomic_load_n(&ticks, __ATOMIC_RELAXED) >= *goal;
}

static void sleep_until_goal(void *arg) { /* inside co_blocking: no P held */
    const int *goal = arg;
    int64_t end = co_now() + GIVE_UP_NS;
    while (!goal_reached(goal) && co_now() < end) {
        struct timespec ts = {0, MS};
        nanosleep(&ts, NULL);
    }
}

static void spin_until_goal(void *arg) { /* computes, never yields */
    const int *goal = arg;
    int64_t end = co_now() + GIVE_UP_NS;
    volatile uint64_t x = 0;
    while (!goal_reached(goal) && co_now() < end)
        x++;
}

typedef struct {
    int mode; /* 0: co_blocking(nanosleep), 1: CPU loop, no yield */
    int during;
    int64_t took;
    int rc;
    co_waitgroup_t *wg;
} blocker_t;

static void blocker(void *arg) {
    blocker_t *b = arg;
    /* let the ticker get going first */
    while (__atomic_load_n(&ticks, __ATOMIC_RELAXED) < 2)
        co_sleep(MS);
    int t0 = __atomic_load_n(&ticks, __ATOMIC_RELAXED);
    int goal = t0 + MIN_TICKS + 1;
    int64_t start = co_now();
    if (b->mode == 0)
        b->rc = co_blocking(sleep_until_goal, &goal);
    else
        spin_until_goal(&goal);
    b->took = co_now() - start;
    b->during = __atomic_load_n(&ticks, __ATOMIC_RELAXED) - t0;
    __atomic_store_n(&stop_ticking, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(b->wg);
}

static int run_case(int mode) {
    __atomic_store_n(&ticks, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&stop_ticking, 0, __ATOMIC_RELAXED);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    blocker_t b = {.mode = mode, .wg = &wg};
    co_waitgroup_add(&wg, 2);
    CHECK_EQ(co_go(ticker, &wg), 0);
    CHECK_EQ(co_go(blocker, &b), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(b.rc, 0);
    fprintf(stderr, "   (%d ticks of 1 ms during %lld ms of %s)\n", b.during,
            (long long)(b.took / MS), mode ? "CPU loop" : "co_blocking(nanosleep)");
    return b.during;
}

static void test_blocking_call_keeps_p_running(void) {
    CHECK(run_case(0) > MIN_TICKS);
}

static void test_cpu_loop_keeps_p_running(void) {
    CHECK(run_case(1) > MIN_TICKS);
}

/* ---- lending a P that is going idle ----------------------------------------
 * sysmon lends a spare P in place of one whose coroutine computes for 10 ms.
 * Here the computing coroutine stops right around 10 ms and parks, so its P
 * goes idle while sysmon may be lending it: the P must end up either lent
 * or idle, never both (the idle count stays within [0, procs]) and every
 * coroutine keeps running. */
static int lend_bad_stats; /* atomic */
static int lend_done;      /* atomic */

static void spin_then_park(void *arg) {
    co_waitgroup_t *wg = arg;
    for (int i = 0; i < 40; i++) {
        int64_t end = co_now() + 9 * MS + (i % 5) * 500000; /* 9 .. 11 ms */
        volatile uint64_t x = 0;
        while (co_now() < end)
            x++;
        co_sleep(200000);
    }
    __atomic_store_n(&stop_ticking, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(wg);
}

static void *stats_watcher(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&lend_done, __ATOMIC_ACQUIRE)) {
        co_sched_stats_t st;
        co_sched_stats(&st);
        if (st.idle_procs < 0 || st.idle_procs > st.procs)
            __atomic_add_fetch(&lend_bad_stats, 1, __ATOMIC_RELAXED);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_lend_while_going_idle(void) {
    __atomic_store_n(&ticks, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&stop_ticking, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&lend_done, 0, __ATOMIC_RELAXED);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, stats_watcher, NULL), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 2);
    CHECK_EQ(co_go(ticker, &wg), 0);
    CHECK_EQ(co_go(spin_then_park, &wg), 0);
    co_waitgroup_wait(&wg);
    __atomic_store_n(&lend_done, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECK_EQ(__atomic_load_n(&lend_bad_stats, __ATOMIC_RELAXED), 0);
    CHECK(__atomic_load_n(&ticks, __ATOMIC_RELAXED) > MIN_TICKS);
    co_sched_stats_t st;
    co_sched_stats(&st);
    CHECK(st.idle_procs >= 0 && st.idle_procs <= st.procs);
}

/* ---- lending chains keep every timer ----------------------------------------
 * Three coroutines compute 12 ms at a time without yielding, so sysmon
 * lends a spare P in place of the one they hold, then lends a spare in
 * place of that spare, and so on: a retiring P hands its timers to the P
 * now in its slot of allp, which may be retiring itself. Meanwhile sleepers
 * park on short timers, and so do the hogs between rounds. A timer left on
 * a retired P would never fire: every coroutine must finish (a deadline,
 * not a hang, reports it). In chaos mode (1 ms threshold, and a pause
 * before a retiring P hands its timers over) this failed about one run in
 * two before retired Ps were closed to timers. */
static void hog(void *arg) {
    co_waitgroup_t *wg = arg;
    /* just past sysmon's threshold (10 ms, or 1 ms in chaos mode), so the
     * Ps lent one after another also retire close together */
    const char *dbg = getenv("COLONY_DEBUG");
    bool chaos = dbg && strstr(dbg, "chaos");
    int rounds = chaos ? 150 : 25;
    for (int i = 0; i < rounds; i++) {
        int64_t end = co_now() + (chaos ? 1500000 : 12 * MS);
        volatile uint64_t x = 0;
        while (co_now() < end)
            x++;
        co_sleep(300000);
    }
    co_waitgroup_done(wg);
}

static void short_sleeper(void *arg) {
    co_waitgroup_t *wg = arg;
    for (int i = 0; i < 100; i++) co_sleep(200000 + (i % 7) * 100000);
    co_waitgroup_done(wg);
}

static void test_lend_chain_keeps_timers(void) {
    /* The baseline: earlier tests' coroutines have called their
     * waitgroup's done, but may still be on their way out (it read 1 once
     * and the check below failed for it): let them finish first. */
    for (int i = 0; i < 1000 && co_count() != 0; i++) co_sleep(MS);
    int count0 = co_count();
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 3 + 40);
    for (int i = 0; i < 3; i++) CHECK_EQ(co_go(hog, &wg), 0);
    for (int i = 0; i < 40; i++) CHECK_EQ(co_go(short_sleeper, &wg), 0);
    CHECK(co_count() >= 1);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(60000 * MS)), 0);
    /* Coroutines are counted per P, and a retiring P hands its count on:
     * once the last ones have returned, the count is back where it was. */
    for (int i = 0; i < 1000 && co_count() != count0; i++) co_sleep(MS);
    CHECK_EQ(co_count(), count0);
}

/* ---- errors and the plain-thread path ------------------------------------- */

static void set_flag(void *arg) {
    *(int *)arg = 42;
}

static void *thread_calls_blocking(void *arg) {
    int *rc = arg;
    int flag = 0;
    rc[0] = co_blocking(set_flag, &flag);
    rc[1] = flag;
    return NULL;
}

static void co_calls_blocking(void *arg) {
    int *rc = arg;
    int flag = 0;
    __atomic_store_n(&rc[0], co_blocking(set_flag, &flag), __ATOMIC_RELAXED);
    __atomic_store_n(&rc[1], flag, __ATOMIC_RELAXED);
    __atomic_store_n(&rc[2], co_blocking(NULL, NULL), __ATOMIC_RELEASE);
}

static void test_errors_and_threads(void) {
    CHECK_EQ(co_blocking(NULL, NULL), CO_EINVAL);
    int flag = 0;
    CHECK_EQ(co_blocking(set_flag, &flag), 0); /* plain thread: just runs fn */
    CHECK_EQ(flag, 42);
    int rc[2] = {-1, -1};
    pthread_t th;
    pthread_create(&th, NULL, thread_calls_blocking, rc);
    pthread_join(th, NULL);
    CHECK_EQ(rc[0], 0);
    CHECK_EQ(rc[1], 42);
    int rc3[3] = {-1, -1, -1};
    CHECK_EQ(co_go(co_calls_blocking, rc3), 0);
    for (int i = 0; i < 5000 && __atomic_load_n(&rc3[2], __ATOMIC_ACQUIRE) == -1; i++)
        co_sleep(MS);
    CHECK_EQ(__atomic_load_n(&rc3[0], __ATOMIC_RELAXED), 0);
    CHECK_EQ(__atomic_load_n(&rc3[1], __ATOMIC_RELAXED), 42);
    CHECK_EQ(rc3[2], CO_EINVAL);
}

/* ---- many blocking calls at once on one P ---------------------------------- */

static int done_blocking; /* atomic */

static void sleep_5ms(void *arg) {
    (void)arg;
    struct timespec ts = {0, 5 * MS};
    nanosleep(&ts, NULL);
}

static void many_blocker(void *arg) {
    co_waitgroup_t *wg = arg;
    for (int i = 0; i < 4; i++)
        if (co_blocking(sleep_5ms, NULL) == 0)
            __atomic_add_fetch(&done_blocking, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(wg);
}

static void test_many_blocking_calls(void) {
    enum { N = 16 };
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, N);
    for (int i = 0; i < N; i++)
        CHECK_EQ(co_go(many_blocker, &wg), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(done_blocking, 4 * N);
}

/* ---- co_blocking inside co_blocking ------------------------------------------ */

/* The inner call runs on an M that already gave its P up: it just runs fn
 * (it used to dereference the missing P and crash). Nested three deep, from
 * several coroutines at once on the one P, with a 5 ms sleep at the
 * bottom: every level runs, every call returns 0. */
static int nested_depth_seen; /* atomic */
static void nested_level(void *arg) {
    int depth = (int)(intptr_t)arg;
    __atomic_fetch_add(&nested_depth_seen, 1, __ATOMIC_RELAXED);
    if (depth > 1)
        CHECK_EQ(co_blocking(nested_level, (void *)(intptr_t)(depth - 1)), 0);
    else
        sleep_5ms(NULL);
}
static void nested_caller(void *arg) {
    co_waitgroup_t *wg = arg;
    CHECK_EQ(co_blocking(nested_level, (void *)(intptr_t)3), 0);
    co_waitgroup_done(wg);
}
static void test_nested_blocking(void) {
    enum { N = 8 };
    __atomic_store_n(&nested_depth_seen, 0, __ATOMIC_RELAXED);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, N);
    for (int i = 0; i < N; i++) CHECK_EQ(co_go(nested_caller, &wg), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&nested_depth_seen, __ATOMIC_RELAXED), 3 * N);
}

/* ---- a co_blocking fn that parks -----------------------------------------
 * Inside co_blocking's fn the coroutine holds no P: anything in fn that
 * waits (a sleep, a channel, a waitgroup, a mutex, co_yield, a spawn) waits
 * as a plain thread does, and co_blocking returns on a P as usual. The
 * coroutines are spread over every P, with a partner that feeds the
 * channel from another coroutine, many rounds. */
struct parks_in_fn {
    co_chan_t *ch;
    co_mutex_t *mu;
    int got;
    int spawned; /* atomic */
};
static void pif_spawned(void *arg) {
    struct parks_in_fn *a = arg;
    __atomic_add_fetch(&a->spawned, 1, __ATOMIC_RELAXED);
}
static void pif_fn(void *arg) {
    struct parks_in_fn *a = arg;
    co_sleep(1 * MS);
    co_yield();
    int v = 0;
    if (co_chan_recv(a->ch, &v, CO_FOREVER) == 0) a->got = v;
    co_mutex_lock(a->mu);
    co_mutex_unlock(a->mu);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 1);
    co_go(pif_spawned, a); /* runs on some P; counted below */
    co_sleep(100 * 1000);
    co_waitgroup_done(&wg);
    co_waitgroup_wait(&wg);
}
struct pif_pair {
    struct parks_in_fn a;
    co_waitgroup_t *done;
    int id;
};
static void pif_caller(void *arg) {
    struct pif_pair *p = arg;
    CHECK_EQ(co_blocking(pif_fn, &p->a), 0);
    CHECK_EQ(p->a.got, p->id + 1);
    co_yield(); /* back on a P: a real yield */
    co_waitgroup_done(p->done);
}
static void pif_feeder(void *arg) {
    struct pif_pair *p = arg;
    co_sleep(500 * 1000);
    CHECK_EQ(co_chan_send(p->a.ch, &(int){p->id + 1}, CO_FOREVER), 0);
    co_waitgroup_done(p->done);
}
static void test_blocking_fn_parks(void) {
    enum { N = 16 };
    int rounds = t_small() ? 3 : 20;
    co_mutex_t mu = CO_MUTEX_INIT;
    for (int r = 0; r < rounds; r++) {
        struct pif_pair pairs[N];
        co_waitgroup_t done = CO_WAITGROUP_INIT;
        co_waitgroup_add(&done, 2 * N);
        for (int i = 0; i < N; i++) {
            pairs[i] = (struct pif_pair){{NULL, &mu, 0, 0}, &done, i};
            CHECK_EQ(co_chan_new(&pairs[i].a.ch, sizeof(int), 0), 0);
            CHECK_EQ(co_go(pif_caller, &pairs[i]), 0);
            CHECK_EQ(co_go(pif_feeder, &pairs[i]), 0);
        }
        co_waitgroup_wait(&done);
        for (int i = 0; i < N; i++) {
            int64_t give_up = co_now() + GIVE_UP_NS;
            while (__atomic_load_n(&pairs[i].a.spawned, __ATOMIC_RELAXED) != 1 && co_now() < give_up)
                co_sleep(MS);
            CHECK_EQ(__atomic_load_n(&pairs[i].a.spawned, __ATOMIC_RELAXED), 1);
            co_chan_free(pairs[i].a.ch);
        }
    }
}

/* ---- the owner's batch behind a computation ------------------------------
 * A P whose ring holds 16 or more takes 8 entries from its head at once
 * (sched_impl.h's runqget) and runs the other 7 from a batch of its own, which
 * thieves do not read. Here the first of such a batch computes until every
 * other coroutine spawned with it has run, 7 of them in its batch: sysmon
 * must move them to the global queue when it lends the P away (10 ms), as
 * it moves the ring. Left in the batch, they would never run, and the
 * computation would give up after 10 s. */
#define BATCH_N 31
static int batch_ran;     /* atomic */
static int batch_hog_saw; /* atomic: the computation saw every other run */

static void batch_nop(void *arg) { co_waitgroup_done(arg); }

static void batch_inc(void *arg) {
    __atomic_add_fetch(&batch_ran, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(arg);
}

static void batch_hog(void *arg) {
    int64_t give_up = co_now() + GIVE_UP_NS;
    while (__atomic_load_n(&batch_ran, __ATOMIC_ACQUIRE) < BATCH_N && co_now() < give_up) {
    }
    if (__atomic_load_n(&batch_ran, __ATOMIC_ACQUIRE) == BATCH_N)
        __atomic_store_n(&batch_hog_saw, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(arg);
}

/* On the only P, in this order: the first spawn goes to runnext, the rest
 * to the ring, the computation at its head; none runs before the wait. */
static void batch_spawner(void *arg) {
    co_waitgroup_t inner = CO_WAITGROUP_INIT;
    co_waitgroup_add(&inner, BATCH_N + 2);
    CHECK_EQ(co_go(batch_nop, &inner), 0);
    CHECK_EQ(co_go(batch_hog, &inner), 0);
    for (int i = 0; i < BATCH_N; i++) CHECK_EQ(co_go(batch_inc, &inner), 0);
    co_waitgroup_wait(&inner);
    co_waitgroup_done(arg);
}

/* co_blocking_on_thread's way back with the only P busy (coroutines that
 * only yield): the call returns, on its own thread, without waiting for
 * the P to go idle (it never would). */
static int pin_back, pin_same; /* atomic */
static void pin_nap(void *arg) {
    (void)arg;
    usleep(5000);
}
static __attribute__((noinline)) long pin_tid(void) { return syscall(SYS_gettid); }
static void pin_caller(void *arg) {
    co_waitgroup_t *wg = arg;
    long before = pin_tid();
    co_blocking_on_thread(pin_nap, NULL);
    __atomic_store_n(&pin_same, pin_tid() == before, __ATOMIC_RELAXED);
    __atomic_store_n(&pin_back, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(wg);
}
static int pin_seen_back; /* atomic: a yielder saw the call back */
static void pin_yielder(void *arg) {
    co_waitgroup_t *wg = arg;
    int64_t end = co_now() + 10000 * MS;
    while (!__atomic_load_n(&pin_back, __ATOMIC_ACQUIRE) && co_now() < end) co_yield();
    if (__atomic_load_n(&pin_back, __ATOMIC_ACQUIRE)) __atomic_store_n(&pin_seen_back, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(wg);
}
static void test_pinned_back_while_busy(void) {
    for (int round = 0; round < 5; round++) {
        __atomic_store_n(&pin_back, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pin_seen_back, 0, __ATOMIC_RELAXED);
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        co_waitgroup_add(&wg, 3);
        CHECK_EQ(co_go(pin_caller, &wg), 0);
        co_yield(); /* the caller runs into its call */
        CHECK_EQ(co_go(pin_yielder, &wg), 0);
        CHECK_EQ(co_go(pin_yielder, &wg), 0);
        co_waitgroup_wait(&wg);
        CHECK_EQ(__atomic_load_n(&pin_seen_back, __ATOMIC_RELAXED), 1);
        CHECK_EQ(__atomic_load_n(&pin_same, __ATOMIC_RELAXED), 1);
    }
}

static void test_batch_behind_computation(void) {
    __atomic_store_n(&batch_ran, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&batch_hog_saw, 0, __ATOMIC_RELAXED);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(batch_spawner, &wg), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&batch_ran, __ATOMIC_RELAXED), BATCH_N);
    CHECK_EQ(__atomic_load_n(&batch_hog_saw, __ATOMIC_RELAXED), 1);
}

int main(void) {
    t_begin(100);
    co_config_t cfg = {.procs = 1};
    CHECK_EQ(co_init(&cfg), 0);
    CHECK_EQ(co_procs(), 1);
    T_RUN(test_errors_and_threads);
    T_RUN(test_blocking_call_keeps_p_running);
    T_RUN(test_cpu_loop_keeps_p_running);
    T_RUN(test_many_blocking_calls);
    T_RUN(test_nested_blocking);
    T_RUN(test_blocking_fn_parks);
    T_RUN(test_lend_while_going_idle);
    T_RUN(test_lend_chain_keeps_timers);
    T_RUN(test_batch_behind_computation);
    T_RUN(test_pinned_back_while_busy);
    return t_end();
}
