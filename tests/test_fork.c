/* fork() with a live runtime. The child has one thread and none of the
 * runtime's: colony there is a fatal error with a line that says so, never
 * a call that returns 0 and drops its work or waits for ever. co_go and
 * co_submit in such a child used to return 0 and the work never ran; a
 * channel wait or co_read after a fork inside a coroutine hung (the
 * coroutine parked into a scheduler with no thread and no timer). exec
 * after fork works, and a runtime shut down before the fork may be started
 * again in the child. */
#include <colony.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

#include "t.h"

#define MS 1000000LL
#define FATAL "colony: fatal: colony used in a child of fork()"

static atomic_int ran;
static void mark(void *arg) {
    (void)arg;
    atomic_fetch_add(&ran, 1);
}

/* Something alive in the parent across the forks: a coroutine parked on a
 * channel receive (the child must never run it), and a pool with an idle
 * worker. */
static co_chan_t *park_ch;
static co_waitgroup_t parked_wg = CO_WAITGROUP_INIT;
static void parked(void *arg) {
    (void)arg;
    int v;
    co_chan_recv(park_ch, &v, CO_FOREVER);
    atomic_fetch_add(&ran, 100);
    co_waitgroup_done(&parked_wg);
}
static co_pool_t *user_pool;
static co_chan_t *empty_ch; /* nobody sends on it */

static void parent_setup(void) {
    CHECK_EQ(co_chan_new(&park_ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&empty_ch, sizeof(int), 0), 0);
    co_waitgroup_add(&parked_wg, 1);
    CHECK_EQ(co_go(parked, NULL), 0);
    CHECK_EQ(co_pool_new(&user_pool, 4, NULL), 0);
    CHECK_EQ(co_pool_submit(user_pool, mark, NULL), 0);
    CHECK_EQ(co_submit(mark, NULL), 0); /* the default pool, with an idle worker after */
    CHECK_EQ(co_pool_wait_idle(user_pool, co_deadline_after(10000 * MS)), 0);
    CHECK_EQ(co_pool_wait_idle(co_default_pool(), co_deadline_after(10000 * MS)), 0);
    /* the receiver parked */
    for (int i = 0; i < 1000 && co_count() > 1; i++) co_sleep(1 * MS);
}

static void parent_teardown(void) {
    int v = 1;
    CHECK_EQ(co_chan_send(park_ch, &v, co_deadline_after(10000 * MS)), 0);
    co_waitgroup_wait(&parked_wg);
    co_chan_free(park_ch);
    co_chan_free(empty_ch);
    co_pool_destroy(user_pool);
}

/* What the child does, by number, from a plain thread or a coroutine. */
enum {
    C_GO, C_GO_WITH, C_SUBMIT, C_POOL_SUBMIT, C_INIT, C_WAKE, C_RECV_DEADLINE, C_READ,
    C_COUNT_
};
static const char *const cname[] = {"co_go", "co_go_with", "co_submit", "co_pool_submit",
                                    "co_init", "chan send to a parked coroutine",
                                    "chan recv with a deadline", "co_read"};

/* Runs in the child. Returns only if colony did not stop it: then the
 * child reports what happened through its exit status. */
static void child_does(int what) {
    int rc = 0;
    int v = 7;
    switch (what) {
    case C_GO: rc = co_go(mark, NULL); break;
    case C_GO_WITH: rc = co_go_with(&(co_attr_t){.name = "child"}, mark, NULL); break;
    case C_SUBMIT: rc = co_submit(mark, NULL); break;
    case C_POOL_SUBMIT: rc = co_pool_submit(user_pool, mark, NULL); break;
    case C_INIT: rc = co_init(NULL); break;
    case C_WAKE: rc = co_chan_send(park_ch, &v, co_deadline_after(200 * MS)); break;
    case C_RECV_DEADLINE: rc = co_chan_recv(empty_ch, &v, co_deadline_after(50 * MS)); break;
    case C_READ: {
        int p[2];
        if (pipe(p) != 0) _exit(21);
        char c;
        rc = (int)co_read(p[0], &c, 1, co_deadline_after(50 * MS));
        break;
    }
    }
    /* Not stopped: did the work run? (It never may, with no thread.) */
    struct timespec ts = {0, 100 * MS};
    nanosleep(&ts, NULL);
    fprintf(stderr, "child: %s returned %d, ran %d\n", cname[what], rc, atomic_load(&ran));
    _exit(rc == 0 ? 3 : 4);
}

/* The child died of the fatal line, quickly (no hang). */
static void expect_fatal(int st, const char *out, int what) {
    if (!(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(out, FATAL))) {
        fprintf(stderr, "   %s in the child: status %d (%s), output:\n%s\n", cname[what], st,
                st == -1 ? "hung" : WIFEXITED(st) ? "exited" : "signal", out);
        CHECK(0);
    }
}

/* A plain thread forks; the child uses colony. */
static void fork_plain(void) {
    parent_setup();
    for (int what = 0; what < C_COUNT_; what++) {
        int fd = -1;
        pid_t pid = t_fork_piped(2, &fd);
        CHECK(pid >= 0);
        if (pid < 0) break;
        if (pid == 0) child_does(what);
        char out[2048];
        expect_fatal(t_child_wait(pid, fd, out, sizeof out, 20), out, what);
    }
    parent_teardown();
}

/* A coroutine forks; the child goes on on its stack, as a plain thread. */
static int fork_what;
static atomic_int fork_status;
static char fork_out[2048];
static void forking(void *arg) {
    co_waitgroup_t *wg = arg;
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    if (pid == 0) child_does(fork_what); /* never returns */
    if (pid < 0) {
        atomic_store(&fork_status, -2);
    } else {
        /* the child's output through co_read: this coroutine parks */
        size_t len = 0;
        for (;;) {
            ssize_t n = co_read(fd, fork_out + len, sizeof fork_out - 1 - len,
                                co_deadline_after(20000 * MS));
            if (n <= 0 || (len += (size_t)n) == sizeof fork_out - 1) break;
        }
        fork_out[len] = 0;
        close(fd);
        atomic_store(&fork_status, t_child_wait(pid, -1, NULL, 0, 20));
    }
    co_waitgroup_done(wg);
}

static void fork_in_coroutine(void) {
    parent_setup();
    for (int what = 0; what < C_COUNT_; what++) {
        fork_what = what;
        fork_out[0] = 0;
        atomic_store(&fork_status, -3);
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(forking, &wg), 0);
        co_waitgroup_wait(&wg);
        expect_fatal(atomic_load(&fork_status), fork_out, what);
    }
    parent_teardown();
}

/* What needs no thread of the runtime still works after a fork inside a
 * coroutine: a buffered channel with room and with a value, a sleep (a
 * plain thread's, now), and co_shutdown, which has nothing to stop there
 * (so a child's exit() that runs a co_shutdown from atexit is fine). */
static co_chan_t *buf_ch;
static void forking_quiet(void *arg) {
    co_waitgroup_t *wg = arg;
    fflush(NULL);
    pid_t pid = t_fork();
    if (pid == 0) {
        int v = 5, w = 0;
        if (co_chan_send(buf_ch, &v, CO_FOREVER) != 0) _exit(10);
        if (co_chan_recv(buf_ch, &w, CO_FOREVER) != 0 || w != 5) _exit(11);
        if (co_sleep(1 * MS) != 0) _exit(12);
        if (co_id() != 0) _exit(13); /* no coroutine here */
        if (co_count() != 0) _exit(14);
        if (co_shutdown() != 0) _exit(15);
        _exit(0);
    }
    int st = pid < 0 ? -2 : t_child_wait(pid, -1, NULL, 0, 20);
    atomic_store(&fork_status, st);
    co_waitgroup_done(wg);
}
static void fork_in_coroutine_quiet(void) {
    CHECK_EQ(co_chan_new(&buf_ch, sizeof(int), 1), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(forking_quiet, &wg), 0);
    co_waitgroup_wait(&wg);
    int st = atomic_load(&fork_status);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    co_chan_free(buf_ch);
}

/* exec after fork: the new program starts with nothing of the parent's and
 * may use colony (it runs coroutines below, in "exec-child" mode). */
static const char *self;
static void fork_exec(void) {
    CHECK_EQ(co_go(mark, NULL), 0); /* the runtime is up */
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    CHECK(pid >= 0);
    if (pid == 0) {
        t_execl(self, self, "exec-child", (char *)NULL);
        _exit(127);
    }
    char out[1024];
    int st = t_child_wait(pid, fd, out, sizeof out, 30);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "exec-child ran 1000") != NULL);
}
static co_waitgroup_t exec_wg = CO_WAITGROUP_INIT;
static void exec_mark(void *arg) {
    mark(arg);
    co_waitgroup_done(&exec_wg);
}
static int exec_child(void) {
    co_waitgroup_add(&exec_wg, 1000);
    for (int i = 0; i < 1000; i++)
        if (co_go(exec_mark, NULL) != 0) return 2;
    co_waitgroup_wait(&exec_wg);
    fprintf(stderr, "exec-child ran %d\n", atomic_load(&ran));
    return co_shutdown() == 0 ? 0 : 3;
}

/* co_shutdown before fork(): the child may start a runtime of its own. */
static void shutdown_then_fork(void) {
    if (t_tsan()) { /* TSan cannot start threads in a forked child */
        fprintf(stderr, "   skipped under TSan\n");
        return;
    }
    CHECK_EQ(co_go(mark, NULL), 0);
    CHECK_EQ(co_shutdown() == 0 || co_shutdown() == 0 || co_shutdown() == 0, 1);
    fflush(NULL);
    pid_t pid = t_fork();
    if (pid == 0) {
        atomic_store(&ran, 0);
        co_waitgroup_add(&exec_wg, 100);
        for (int i = 0; i < 100; i++)
            if (co_go(exec_mark, NULL) != 0) _exit(2);
        co_waitgroup_wait(&exec_wg);
        if (co_submit(mark, NULL) != 0) _exit(3);
        if (co_pool_wait_idle(co_default_pool(), co_deadline_after(10000 * MS)) != 0) _exit(4);
        if (atomic_load(&ran) != 101) _exit(5);
        _exit(co_shutdown() == 0 ? 0 : 6);
    }
    int st = t_child_wait(pid, -1, NULL, 0, 30);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

int main(int argc, char **argv) {
    self = argv[0];
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0) return exec_child();
    t_begin(110);
    T_RUN(fork_plain);
    T_RUN(fork_in_coroutine);
    T_RUN(fork_in_coroutine_quiet);
    T_RUN(fork_exec);
    T_RUN(shutdown_then_fork);
    return t_end();
}
