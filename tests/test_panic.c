/* Panics: co_recover catches a co_panic from any depth of the same
 * coroutine or plain thread, nests, survives migrating between threads;
 * an unrecovered panic prints "colony: panic: ..." and aborts (checked in a
 * child process). */
#include <colony.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

#include "t_internal.h" /* co__getm: whether the M holds a P */
#include "t.h"

static int sanitized(void) { return t_sanitized(); }

static int reached_after_panic;

static void deep(void *arg) {
    long depth = (long)arg;
    if (depth < 0) return;
    if (depth == 0) {
        co_panic((void *)0x2a);
        reached_after_panic = 1; /* never */
    }
    deep((void *)(depth - 1));
}

static void returns(void *arg) { *(int *)arg = 7; }

static void test_recover_basic(void) {
    void *v = (void *)1;
    int x = 0;
    CHECK_EQ(co_recover(returns, &x, &v), 0);
    CHECK_EQ(x, 7);
    CHECK(v == NULL);
    CHECK_EQ(co_recover(deep, (void *)20, &v), 1);
    CHECK(v == (void *)0x2a);
    CHECK_EQ(reached_after_panic, 0);
    CHECK_EQ(co_recover(deep, (void *)0, NULL), 1); /* value may be NULL */
    CHECK_EQ(co_recover(NULL, NULL, &v), CO_EINVAL);
    /* The chain is clean again: a second round works the same. */
    CHECK_EQ(co_recover(deep, (void *)3, &v), 1);
    CHECK(v == (void *)0x2a);
}

static void inner_catches(void *arg) {
    void *v = NULL;
    int r = co_recover(deep, (void *)2, &v);
    *(int *)arg = r * 10 + (v == (void *)0x2a);
}

static void inner_then_panic(void *arg) {
    void *v = NULL;
    CHECK_EQ(co_recover(returns, arg, &v), 0);
    co_panic((void *)0x55); /* caught by the outer frame, not the popped inner one */
}

static void test_nested(void) {
    int r = 0;
    void *v = NULL;
    CHECK_EQ(co_recover(inner_catches, &r, &v), 0);
    CHECK_EQ(r, 11);
    int x = 0;
    CHECK_EQ(co_recover(inner_then_panic, &x, &v), 1);
    CHECK(v == (void *)0x55);
    CHECK_EQ(x, 7);
}

static atomic_int caught, clean;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static void migrate_then_panic(void *arg) {
    long i = (long)arg;
    for (int k = 0; k < 3; k++) {
        co_yield();
        co_sleep(1000 * (i % 3));
    }
    if (i % 2) co_panic((void *)(i + 1));
}

static void recovering_coroutine(void *arg) {
    long i = (long)arg;
    void *v = NULL;
    int r = co_recover(migrate_then_panic, arg, &v);
    if (r == 1 && v == (void *)(i + 1)) atomic_fetch_add(&caught, 1);
    if (r == 0 && v == NULL) atomic_fetch_add(&clean, 1);
    co_waitgroup_done(&wg);
}

static void test_coroutines_stress(void) {
    int n = sanitized() ? 200 : 2000;
    atomic_store(&caught, 0);
    atomic_store(&clean, 0);
    co_waitgroup_add(&wg, n);
    for (long i = 0; i < n; i++) CHECK_EQ(co_go(recovering_coroutine, (void *)i), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(atomic_load(&caught), n / 2);
    CHECK_EQ(atomic_load(&clean), n / 2);
}

/* The same with stacks of a non-default size, which are mapped for their
 * coroutine and unmapped when it ends: under ASan the shadow of the frames
 * a panic jumped over must not outlive the mapping (it used to greet the
 * next stack mapped at that address: a CHECK failure in ASan's no-return
 * handler or a false stack-use-after-scope, in a few runs of 20). */
static void test_odd_stacks_stress(void) {
    co_attr_t at = {.stack_size = 64 * 1024, .name = "odd"};
    for (int round = 0; round < 20; round++) {
        int n = 100;
        atomic_store(&caught, 0);
        atomic_store(&clean, 0);
        co_waitgroup_add(&wg, n);
        for (long i = 0; i < n; i++) CHECK_EQ(co_go_with(&at, recovering_coroutine, (void *)i), 0);
        co_waitgroup_wait(&wg);
        CHECK_EQ(atomic_load(&caught), n / 2);
        CHECK_EQ(atomic_load(&clean), n / 2);
    }
}

static void *thread_main(void *arg) {
    void *v = NULL;
    for (int i = 0; i < 100; i++) {
        if (co_recover(deep, (void *)5, &v) != 1 || v != (void *)0x2a) return (void *)1;
    }
    return NULL;
}

static void test_plain_threads(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread_main, NULL);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        CHECK(r == NULL);
    }
}

/* ---- unrecovered panics, in a child process --------------------------- */

static void child_coroutine_body(void *arg) { co_panic((void *)0x2a); }
static int child_coroutine(void *arg) {
    co_attr_t a = {0, "doomed"};
    co_go_with(&a, child_coroutine_body, NULL);
    co_sleep(5000000000LL); /* never woken: the panic aborts first */
    return 0;
}
static void spawned_body(void *arg) { co_panic((void *)0x77); }
static void spawns_inside_recover(void *arg) {
    co_attr_t a = {0, "orphan"};
    co_go_with(&a, spawned_body, NULL);
    co_sleep(5000000000LL);
}
static int child_not_inherited(void *arg) {
    /* A coroutine started inside a co_recover does not inherit its frame. */
    void *v;
    co_recover(spawns_inside_recover, NULL, &v);
    return 0;
}

/* co_panic out of co_blocking's fn, to a co_recover around the call: the
 * coroutine comes back holding a P (co_blocking had given its own up), as
 * after a return of fn. It used to go on without one, beside the M sysmon
 * gave its P to: more coroutines running than Ps, co_yield a no-op. Modes:
 * 0 panics at once (sysmon has not retaken the P yet), 1 after 30 ms
 * (sysmon has handed it on), 2 from a co_blocking nested in fn. */
static void blocking_panics(void *arg) {
    long mode = (long)arg;
    if (mode == 1) {
        struct timespec ts = {0, 30000000};
        nanosleep(&ts, NULL);
    }
    if (mode == 2) {
        co_blocking(blocking_panics, (void *)0L);
        return;
    }
    co_panic((void *)(0x100 + mode));
}
static void call_blocking(void *arg) {
    co_blocking(blocking_panics, arg);
    reached_after_panic = 1; /* never */
}
static atomic_int bp_ok;
static void blocking_panic_co(void *arg) {
    long mode = (long)arg % 3;
    void *v = NULL;
    int r = co_recover(call_blocking, (void *)mode, &v);
    CHECK_EQ(r, 1);
    CHECK(v == (void *)(0x100 + (mode == 2 ? 0 : mode)));
    co_m_t *m = co__getm();
    CHECK(m->p != NULL);
    CHECK(m->syscallp == NULL);
    co_yield();
    m = co__getm();
    CHECK(m->p != NULL);
    /* and co_blocking works as before */
    int x = 0;
    CHECK_EQ(co_blocking(returns, &x), 0);
    CHECK_EQ(x, 7);
    CHECK(co__getm()->p != NULL);
    atomic_fetch_add(&bp_ok, 1);
    co_waitgroup_done(&wg);
}
static void test_blocking_panic(void) {
    int n = sanitized() ? 30 : 150;
    atomic_store(&bp_ok, 0);
    co_waitgroup_add(&wg, n);
    for (long i = 0; i < n; i++) CHECK_EQ(co_go(blocking_panic_co, (void *)i), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(atomic_load(&bp_ok), n);
    CHECK_EQ(reached_after_panic, 0);
}

/* With no co_recover about, a panic in co_blocking's fn is fatal as any. */
static void blocking_panic_fatal(void *arg) { co_panic((void *)0x33); }
static int child_blocking(void *arg) {
    co_blocking(blocking_panic_fatal, NULL);
    return 0;
}

static int run_child(const char *self, const char *mode, char *out, size_t outsz) {
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    if (pid < 0) return -1;
    if (pid == 0) {
        t_execl(self, self, mode, (char *)NULL);
        _exit(127);
    }
    return t_drain_and_wait(fd, out, outsz, pid);
}

static const char *self_path;

static void test_unrecovered(void) {
    char out[4096];
    int st = run_child(self_path, "child-coroutine", out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(out, "colony: panic: 0x2a in coroutine ") != NULL);
    CHECK(strstr(out, "'doomed'") != NULL);

    st = run_child(self_path, "child-thread", out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(out, "colony: panic: 0x2a (not in a coroutine)") != NULL);

    st = run_child(self_path, "child-not-inherited", out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(out, "colony: panic: 0x77 in coroutine ") != NULL);
    CHECK(strstr(out, "'orphan'") != NULL);

    st = run_child(self_path, "child-blocking", out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(out, "colony: panic: 0x33 in coroutine ") != NULL);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        signal(SIGABRT, SIG_DFL);
        if (!strcmp(argv[1], "child-coroutine")) return co_main(child_coroutine, NULL);
        if (!strcmp(argv[1], "child-thread")) co_panic((void *)0x2a);
        if (!strcmp(argv[1], "child-not-inherited")) return co_main(child_not_inherited, NULL);
        if (!strcmp(argv[1], "child-blocking")) return co_main(child_blocking, NULL);
        return 2;
    }
    self_path = "/proc/self/exe";
    t_begin(110);
    T_RUN(test_unrecovered); /* first: forks before this process starts Ms */
    T_RUN(test_recover_basic);
    T_RUN(test_nested);
    T_RUN(test_plain_threads);
    T_RUN(test_coroutines_stress);
    T_RUN(test_odd_stacks_stress);
    T_RUN(test_blocking_panic);
    return t_end();
}
