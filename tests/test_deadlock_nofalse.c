/* Deadlock detection never fires falsely: in one child, at once, a plain
 * thread colony does not know wakes a coroutine after 1.5 s, a coroutine
 * sleeps 1.5 s, a coroutine reads an idle socket, and one sits in a
 * co_blocking call of 1.5 s; the child must finish with status 0. A second
 * child has only the unknown thread as waker (every coroutine waiting on a
 * channel, no timer). */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#define WAIT_NS 1500000000LL

static co_chan_t *ch;
static int sv[2];
static co_waitgroup_t wg;

static void nap(long long ns) {
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}
static void *late_sender(void *a) {
    (void)a;
    nap(WAIT_NS);
    int v = 7;
    co_chan_send(ch, &v, CO_FOREVER); /* a plain thread's send */
    return NULL;
}
static void *late_writer(void *a) {
    (void)a;
    nap(WAIT_NS);
    (void)!write(sv[1], "x", 1);
    return NULL;
}
static void sleeper(void *a) {
    (void)a;
    co_sleep(WAIT_NS);
    co_waitgroup_done(&wg);
}
static void reader(void *a) {
    (void)a;
    char c;
    CHECK_EQ(co_read(sv[0], &c, 1, CO_FOREVER), 1);
    co_waitgroup_done(&wg);
}
static void blocking_fn(void *a) {
    (void)a;
    nap(WAIT_NS);
}
static void blocker(void *a) {
    (void)a;
    CHECK_EQ(co_blocking(blocking_fn, NULL), 0);
    co_waitgroup_done(&wg);
}

static int all_main(void *a) {
    int only_thread = *(int *)a;
    co_chan_new(&ch, sizeof(int), 0);
    pthread_t t1, t2;
    pthread_create(&t1, NULL, late_sender, NULL);
    if (!only_thread) {
        socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
        pthread_create(&t2, NULL, late_writer, NULL);
        co_waitgroup_add(&wg, 3);
        co_go(sleeper, NULL);
        co_go(reader, NULL);
        co_go(blocker, NULL);
    }
    int v = 0;
    CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), 0); /* only t1 can wake this */
    CHECK_EQ(v, 7);
    if (!only_thread) co_waitgroup_wait(&wg);
    pthread_join(t1, NULL);
    if (!only_thread) pthread_join(t2, NULL);
    return t_checks_failed ? 1 : 0;
}

static int run_child(int only_thread, char *out, size_t cap) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        _exit(co_main(all_main, &only_thread));
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void test_wakers_in_parallel(void) {
    static char out[65536];
    int st = run_child(0, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "deadlock") == NULL);
}

static void test_unknown_thread_only(void) {
    static char out[65536];
    int st = run_child(1, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "deadlock") == NULL);
}

int main(void) {
    t_begin(50);
    T_RUN(test_wakers_in_parallel);
    T_RUN(test_unknown_thread_only);
    return t_end();
}
