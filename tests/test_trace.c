/* The execution trace (co_trace_start/stop, src/runtime/trace.c): a run of
 * channels, locks, sleeps, blocking calls and spawns over two Ps gives
 * JSON that parses, whose coroutine slices never overlap on one M and
 * whose coroutines' events come in a valid order (tests/trace_check.py);
 * buffers that run out drop events and say how many (in a record); the API twice over;
 * sessions restarted under load; bad paths. */
// ctest-no-chaos
// ctest-timeout: 60
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[] = "/tmp/colony-trace-XXXXXX";

static bool have_python(void) { return system("python3 -c 'import json' >/dev/null 2>&1") == 0; }

/* tests/trace_check.py on path; its exit status */
static int check(const char *path, const char *flag) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s/tests/trace_check.py %s %s", CO_SOURCE_DIR, path, flag);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- a workload ----------------------------------------------------------- */

static co_chan_t *ping, *pong;
static co_mutex_t mu = CO_MUTEX_INIT;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static long counter;

static void pinger(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) {
        int v = i;
        co_chan_send(ping, &v, CO_FOREVER);
        co_chan_recv(pong, &v, CO_FOREVER);
    }
    co_waitgroup_done(&wg);
}

static void ponger(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) {
        int v;
        co_chan_recv(ping, &v, CO_FOREVER);
        co_chan_send(pong, &v, CO_FOREVER);
    }
    co_waitgroup_done(&wg);
}

static void nap(void *arg) {
    (void)arg;
    usleep(2000);
}

static void locker(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) {
        co_mutex_lock(&mu);
        counter++;
        if (i % 10 == 0) co_yield();
        co_mutex_unlock(&mu);
    }
    co_sleep(1000000);
    co_blocking(nap, NULL);
    co_waitgroup_done(&wg);
}

static void leaf(void *arg) {
    (void)arg;
    co_waitgroup_done(&wg);
}

static void spawner(void *arg) {
    (void)arg;
    for (int i = 0; i < 300; i++) co_go(leaf, NULL);
    co_waitgroup_done(&wg);
}

static void workload(void) {
    CHECK_EQ(co_chan_new(&ping, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&pong, sizeof(int), 0), 0);
    co_waitgroup_add(&wg, 2 + 4 + 1 + 300);
    co_go(pinger, NULL);
    co_go(ponger, NULL);
    for (int i = 0; i < 4; i++) co_go(locker, NULL);
    co_go(spawner, NULL);
    co_waitgroup_wait(&wg);
    CHECK_EQ(counter % 100, 0);
    co_chan_free(ping);
    co_chan_free(pong);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_run_parses_and_holds(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/run.json", dir);
    CHECK_EQ(co_trace_start(path), 0);
    workload();
    CHECK_EQ(co_trace_stop(), 0);
    CHECK_EQ(co__trace_lost(), 0);
    CHECK_EQ(check(path, ""), 0);
}

static void spawn_many(void *arg) {
    (void)arg;
    for (int i = 0; i < 3000; i++) co_go(leaf, NULL);
    co_waitgroup_done(&wg);
}

/* Two chunks of 16 events, the writer held: the recorders run out of
 * buffers at once, drop and count; the counts are recorded once chunks are
 * free again (at the latest by the stop). The trace still parses, and
 * says what it lost. */
static void test_overflow_counted(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/lost.json", dir);
    CHECK_EQ(co__trace_start_with(path, 2, 16), 0);
    co__trace_hold_writer(true);
    co_waitgroup_add(&wg, 1 + 3000);
    co_go(spawn_many, NULL);
    co_waitgroup_wait(&wg);
    co__trace_hold_writer(false);
    CHECK_EQ(co_trace_stop(), 0);
    /* 3000 coroutines created, started and ended: 9000 events at least,
     * 32 kept */
    CHECK(co__trace_lost() > 8000);
    CHECK_EQ(check(path, "--lost"), 0);
}

static void test_api_twice(void) {
    char p1[128], p2[128];
    snprintf(p1, sizeof p1, "%s/a.json", dir);
    snprintf(p2, sizeof p2, "%s/b.json", dir);
    CHECK_EQ(co_trace_stop(), CO_EINVAL); /* none on */
    for (int round = 0; round < 2; round++) {
        CHECK_EQ(co_trace_start(p1), 0);
        CHECK_EQ(co_trace_start(p2), CO_EBUSY);
        workload();
        CHECK_EQ(co_trace_stop(), 0);
        CHECK_EQ(co_trace_stop(), CO_EINVAL);
        CHECK_EQ(check(p1, ""), 0);
    }
    struct stat st;
    CHECK(stat(p2, &st) < 0); /* the refused start wrote nothing */
}

/* Sessions started and stopped over and over while coroutines on two Ps
 * switch all the time: every trace holds (a thread's event delayed across
 * a stop and a start touches nothing of the next session's), and nothing
 * is kept from one session to the next (the sanitizer builds' leak check). */
static int churn_stop;
static long churn_rounds; /* atomic: round trips made */

/* one side of a ping-pong on two unbuffered channels: always switching */
static void churner(void *arg) {
    co_chan_t **c = arg;
    bool first = c[2] != NULL;
    for (;;) {
        int v = __atomic_load_n(&churn_stop, __ATOMIC_ACQUIRE);
        if (first) {
            co_chan_send(c[0], &v, CO_FOREVER);
            co_chan_recv(c[1], &v, CO_FOREVER);
            /* a pause now and then: traces of a few thousand events */
            if (__atomic_add_fetch(&churn_rounds, 1, __ATOMIC_RELAXED) % 4 == 0) co_sleep(200000);
        } else {
            co_chan_recv(c[0], &v, CO_FOREVER);
            co_chan_send(c[1], &v, CO_FOREVER);
        }
        if (v) break; /* the first side saw the stop and passed it on */
    }
    co_waitgroup_done(&wg);
}

static void test_restart_stress(void) {
    co_chan_t *c[2][3], *c2[2][3];
    __atomic_store_n(&churn_stop, 0, __ATOMIC_RELEASE);
    co_waitgroup_add(&wg, 4);
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(co_chan_new(&c[k][0], sizeof(int), 0), 0);
        CHECK_EQ(co_chan_new(&c[k][1], sizeof(int), 0), 0);
        c[k][2] = c[k][0];                     /* the first side */
        c2[k][0] = c[k][0], c2[k][1] = c[k][1], c2[k][2] = NULL;
        co_go(churner, c[k]);
        co_go(churner, c2[k]);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/restart.json", dir);
    for (int round = 0; round < 40; round++) {
        bool checked = round % 8 == 7;
        CHECK_EQ(co_trace_start(path), 0);
        long r0 = __atomic_load_n(&churn_rounds, __ATOMIC_RELAXED);
        usleep(round % 3 == 0 ? 0 : 300);
        /* a checked trace holds some switches, however loaded the machine */
        for (int i = 0; checked && i < 10000 && __atomic_load_n(&churn_rounds, __ATOMIC_RELAXED) - r0 < 100; i++)
            usleep(1000);
        CHECK_EQ(co_trace_stop(), 0);
        if (checked) CHECK_EQ(check(path, ""), 0);
    }
    __atomic_store_n(&churn_stop, 1, __ATOMIC_RELEASE);
    co_waitgroup_wait(&wg);
    for (int k = 0; k < 2; k++) {
        co_chan_free(c[k][0]);
        co_chan_free(c[k][1]);
    }
}

/* A coroutine's name goes into the JSON as it is (UTF-8 kept, quotes and
 * control bytes escaped, a broken sequence as U+FFFD), and the viewer's
 * page keeps its script whole whatever the name holds. */
/* 16 bytes: what a trace keeps of a name */
static const char odd_name[] = "\xc3\xa9<!--<script\"\\\x01";
static const char bad_utf8[] = "cut\xc3";
static void named(void *arg) {
    (void)arg;
    co_yield();
    co_waitgroup_done(&wg);
}
static void test_names_kept(void) {
    char path[128], cmd[1024];
    snprintf(path, sizeof path, "%s/names.json", dir);
    CHECK_EQ(co_trace_start(path), 0);
    co_waitgroup_add(&wg, 2);
    co_attr_t a = {0, odd_name};
    CHECK_EQ(co_go_with(&a, named, NULL), 0);
    co_attr_t b = {0, bad_utf8};
    CHECK_EQ(co_go_with(&b, named, NULL), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(co_trace_stop(), 0);
    /* tests/trace_names_check.py: both names in the file, the page whole */
    snprintf(cmd, sizeof cmd,
             "python3 %s/tools/colony-trace %s %s/names.html >/dev/null && "
             "python3 %s/tests/trace_names_check.py %s %s/names.html",
             CO_SOURCE_DIR, path, dir, CO_SOURCE_DIR, path, dir);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_bad_paths(void) {
    CHECK_EQ(co_trace_start(NULL), CO_EINVAL);
    CHECK_EQ(co_trace_start(""), CO_EINVAL);
    CHECK_EQ(co_trace_start("/nonexistent-colony-dir/x.json"), -ENOENT);
    CHECK_EQ(co_trace_start(dir), -EISDIR);
    CHECK_EQ(co__trace_start_with("/tmp/x.json", 1, 16), CO_EINVAL); /* too few chunks */
    CHECK_EQ(co_trace_stop(), CO_EINVAL); /* nothing started */
    /* and a good one works after them */
    char path[128];
    snprintf(path, sizeof path, "%s/after.json", dir);
    CHECK_EQ(co_trace_start(path), 0);
    CHECK_EQ(co_trace_stop(), 0);
}

int main(void) {
    if (!have_python()) {
        fprintf(stderr, "skip: python3 (with json) not found\n");
        return 77;
    }
    t_begin(50);
    CHECK(mkdtemp(dir) != NULL);
    co_config_t cfg = {.procs = 2};
    CHECK_EQ(co_init(&cfg), 0);
    T_RUN(test_run_parses_and_holds);
    T_RUN(test_overflow_counted);
    T_RUN(test_api_twice);
    T_RUN(test_restart_stress);
    T_RUN(test_names_kept);
    T_RUN(test_bad_paths);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
