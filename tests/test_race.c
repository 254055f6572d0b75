/* The race detector (TSan builds only; skipped elsewhere). Coroutines are
 * TSan fibers that switch without implied synchronisation, so a data race
 * between two coroutines that run one after another on one thread is
 * reported, as Go's -race reports it between goroutines; what orders them
 * (a mutex, a channel, a waitgroup, a spawn) keeps a correct program
 * clean. Each scenario runs on one P in a child process (this binary again,
 * with --child NAME), with reports not fatal there, and its stderr is
 * checked. Then a million coroutines start and exit on one P, each a TSan
 * fiber of its own for its lifetime. */
// ctest-timeout: 600
// ctest-no-chaos (the scenarios pin one P; the million take long enough once)
#include <colony.h>
#include <stdlib.h>
#include <string.h>

#include "t.h"

#define RACE_REPORT "WARNING: ThreadSanitizer: data race"

/* ---- the scenarios (in the child) --------------------------------------- */

static int shared; /* written by two coroutines */
static co_waitgroup_t done = CO_WAITGROUP_INIT;

/* Out of line, so that each write is a store TSan sees where it is. */
static __attribute__((noinline)) void put(int v) { *(volatile int *)&shared = v; }

/* No synchronisation: the first writes and yields, the second writes. */
static void racy_first(void *arg) {
    (void)arg;
    put(1);
    co_yield();
    co_waitgroup_done(&done);
}
static void racy_second(void *arg) {
    (void)arg;
    put(2);
    co_waitgroup_done(&done);
}

/* No synchronisation either, the first gone before the second starts (on
 * its stack, which TSan must not take for an order). */
static void racy_whole(void *arg) {
    put((int)(intptr_t)arg);
    co_waitgroup_done(&done);
}

/* The same, each write under a mutex. */
static co_mutex_t mu = CO_MUTEX_INIT;
static void locked_write(void *arg) {
    co_mutex_lock(&mu);
    put((int)(intptr_t)arg);
    co_mutex_unlock(&mu);
    co_yield();
    co_waitgroup_done(&done);
}

/* Handed over by a channel: the receiver parks first (one P: it runs
 * first), the sender writes and sends, which wakes it; it writes after
 * its receive. */
static co_chan_t *ch;
static void chan_receiver(void *arg) {
    (void)arg;
    int v = 0;
    CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), 0);
    put(v + 1);
    co_waitgroup_done(&done);
}
static void chan_sender(void *arg) {
    (void)arg;
    put(1);
    int v = 1;
    CHECK_EQ(co_chan_send(ch, &v, CO_FOREVER), 0);
    co_yield();
    co_waitgroup_done(&done);
}

/* Handed over by a spawn: the first writes, then starts the second. */
static void spawned_second(void *arg) {
    (void)arg;
    put(2);
    co_waitgroup_done(&done);
}
static void spawning_first(void *arg) {
    (void)arg;
    put(1);
    CHECK_EQ(co_go(spawned_second, NULL), 0);
    co_yield();
    co_waitgroup_done(&done);
}

/* Handed over by a waitgroup: the second waits for the first's done. */
static co_waitgroup_t handoff = CO_WAITGROUP_INIT;
static void wg_first(void *arg) {
    (void)arg;
    put(1);
    co_yield();
    co_waitgroup_done(&handoff);
    co_waitgroup_done(&done);
}
static void wg_second(void *arg) {
    (void)arg;
    co_waitgroup_wait(&handoff);
    put(2);
    co_waitgroup_done(&done);
}

static int run_child(const char *name) {
    co_config_t cfg = {.procs = 1};
    if (co_init(&cfg) != 0) return 2;
    co_waitgroup_add(&done, 2);
    if (!strcmp(name, "race")) {
        co_go(racy_first, NULL);
        co_go(racy_second, NULL);
    } else if (!strcmp(name, "race-after-exit")) {
        co_go(racy_whole, (void *)1);
        co_go(racy_whole, (void *)2);
    } else if (!strcmp(name, "mutex")) {
        co_go(locked_write, (void *)1);
        co_go(locked_write, (void *)2);
    } else if (!strcmp(name, "chan")) {
        if (co_chan_new(&ch, sizeof(int), 0) != 0) return 2;
        co_go(chan_receiver, NULL);
        co_go(chan_sender, NULL);
    } else if (!strcmp(name, "spawn")) {
        co_go(spawning_first, NULL);
    } else if (!strcmp(name, "waitgroup")) {
        co_waitgroup_add(&handoff, 1);
        co_go(wg_second, NULL);
        co_go(wg_first, NULL);
    } else {
        return 2;
    }
    co_waitgroup_wait(&done);
    if (ch) co_chan_free(ch);
    return T_SHUTDOWN() == 0 && t_checks_failed == 0 ? 0 : 3;
}

/* ---- the checks (in the parent) ----------------------------------------- */

/* Run scenario `name` in a child: its wait status, its stderr in buf. */
static int child(const char *name, char *buf, size_t size) {
    return t_race_child("test_race", name, buf, size);
}

static char out[1 << 16];

static void test_race_reported(void) {
    int st = child("race", out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 66);
    CHECK(strstr(out, RACE_REPORT) != NULL);
    CHECK(strstr(out, "racy_first") != NULL && strstr(out, "racy_second") != NULL);
    if (!strstr(out, RACE_REPORT)) fprintf(stderr, "%s", out);
}

static void test_race_after_exit_reported(void) {
    int st = child("race-after-exit", out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 66);
    CHECK(t_count(out, RACE_REPORT) == 1);
    if (!strstr(out, RACE_REPORT)) fprintf(stderr, "%s", out);
}

static void expect_clean(const char *name) {
    int st = child(name, out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "ThreadSanitizer") == NULL);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || strstr(out, "ThreadSanitizer"))
        fprintf(stderr, "  %s (status %#x):\n%s", name, st, out);
}

static void test_mutex_clean(void) { expect_clean("mutex"); }
static void test_chan_clean(void) { expect_clean("chan"); }
static void test_spawn_clean(void) { expect_clean("spawn"); }
static void test_waitgroup_clean(void) { expect_clean("waitgroup"); }

/* A million coroutines start and exit on one P, in batches spawned by a
 * coroutine: their G records come back hot from the P's cache, each
 * hosting a hundred thousand lifetimes, every one a TSan fiber of its own
 * (a fiber kept by the record for all of them overflowed TSan's shadow
 * stack of its calls, and crashed, at about the 10^5th). */
enum { TOTAL = 1000000, BATCH = 10 };
static co_waitgroup_t batch = CO_WAITGROUP_INIT;
static long counted; /* atomic: the coroutines of a batch are not ordered */
static void one(void *arg) {
    (void)arg;
    __atomic_add_fetch(&counted, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&batch);
}
static int spawn_all(void *arg) {
    (void)arg;
    for (int b = 0; b < TOTAL / BATCH; b++) {
        co_waitgroup_add(&batch, BATCH);
        for (int i = 0; i < BATCH; i++) CHECK_EQ(co_go(one, NULL), 0);
        co_waitgroup_wait(&batch);
    }
    return 0;
}
static void test_million_one_p(void) {
    CHECK_EQ(co_main(spawn_all, NULL), 0);
    CHECK_EQ(__atomic_load_n(&counted, __ATOMIC_RELAXED), TOTAL);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return run_child(argv[2]);
    if (!t_tsan()) {
        fprintf(stderr, "test_race: not a TSan build: skipped\n");
        return 77;
    }
    t_begin(580);
    T_RUN(test_race_reported);
    T_RUN(test_race_after_exit_reported);
    T_RUN(test_mutex_clean);
    T_RUN(test_chan_clean);
    T_RUN(test_spawn_clean);
    T_RUN(test_waitgroup_clean);
    co_config_t cfg = {.procs = 1};
    CHECK_EQ(co_init(&cfg), 0);
    T_RUN(test_million_one_p);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
