/* Foreign descriptors without the hook: co_fd_forget, and co_wait_fd on a
 * number that a library closed with close(2) and reopened (same number, a
 * new file). Behaviour, not timing: a wait that would hang until its
 * deadline is caught by a deadline far beyond any load. */
// ctest-timeout: 60
#define _GNU_SOURCE 1
#include "t.h"
#include "t_internal.h"

#include <colony.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define MS 1000000LL
/* a wait that hangs "until its deadline" runs into this: far beyond load */
#define LONG_WAIT (20000 * MS)

static int fd_open(int fd) { return fcntl(fd, F_GETFD) >= 0; }

/* Replaces the file behind number `num` with a fresh socket pair's end,
 * as a library reconnecting does (close(2), then a new socket that gets
 * the same number); *peer gets the other end. */
static void reopen_as_pair(int num, int *peer) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) abort();
    /* dup2 closes num's file behind colony's back and puts the new one
     * there in one step (a close(2) first would let another thread's new
     * file take the number meanwhile) */
    if (dup2(sv[0], num) < 0) abort();
    close(sv[0]);
    *peer = sv[1];
}

struct writer {
    int fd;
    int64_t delay;
};
static void late_write(void *arg) {
    struct writer *w = arg;
    co_sleep(w->delay);
    (void)!write(w->fd, "x", 1);
}

/* 200 reconnects: each time the number is closed with close(2) and names
 * a new socket, a coroutine waits on it and a peer writes after a moment.
 * Every wait must see the byte; none may run into its deadline. */
static int storm_fails, storm_done;
static void storm(void *arg) {
    (void)arg;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) abort();
    int num = sv[0], peer = sv[1];
    for (int i = 0; i < 200; i++) {
        struct writer w = {peer, (i % 4) * MS / 2};
        co_go(late_write, &w);
        int r = co_wait_fd(num, CO_READABLE, co_deadline_after(LONG_WAIT));
        if (r != CO_READABLE) {
            fprintf(stderr, "reconnect %d: co_wait_fd = %d\n", i, r);
            __atomic_add_fetch(&storm_fails, 1, __ATOMIC_RELAXED);
        }
        char c;
        if (read(num, &c, 1) != 1) __atomic_add_fetch(&storm_fails, 1, __ATOMIC_RELAXED);
        co_sleep(MS); /* let the writer finish with w */
        close(peer);
        reopen_as_pair(num, &peer);
    }
    close(peer);
    close(num);
    __atomic_store_n(&storm_done, 1, __ATOMIC_RELEASE);
}
static void test_reconnect_storm(void) {
    storm_fails = storm_done = 0;
    CHECK_EQ(co_go(storm, NULL), 0);
    while (!__atomic_load_n(&storm_done, __ATOMIC_ACQUIRE)) co_sleep(MS);
    CHECK_EQ(storm_fails, 0);
}

/* The write side too: a new pipe's write end on a number that was a
 * socket's: writable at once. */
static void test_reopen_write_side(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    CHECK_EQ(co_wait_fd(sv[0], CO_WRITABLE, co_deadline_after(LONG_WAIT)), CO_WRITABLE);
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    CHECK(dup2(p[1], sv[0]) == sv[0]); /* closes the socket behind colony's back */
    close(p[1]);
    CHECK_EQ(co_wait_fd(sv[0], CO_WRITABLE, co_deadline_after(LONG_WAIT)), CO_WRITABLE);
    /* and its readiness to read never comes: a try says so at once */
    CHECK_EQ(co_wait_fd(p[0], CO_READABLE, 0), CO_ETIMEDOUT);
    close(sv[0]);
    close(sv[1]);
    close(p[0]);
}

/* A number closed behind colony's back and not reopened: libc's answer. */
static void test_closed_behind(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    CHECK_EQ(co_wait_fd(sv[0], CO_WRITABLE, 0), CO_WRITABLE);
    close(sv[0]);
    CHECK_EQ(co_wait_fd(sv[0], CO_READABLE, co_deadline_after(LONG_WAIT)), -EBADF);
    close(sv[1]);
}

/* co_fd_forget wakes a parked waiter with CO_ECLOSED and leaves the file
 * open for its owner. */
struct parked {
    int fd;
    int rc;
    int done;
};
static void park_on(void *arg) {
    struct parked *pk = arg;
    pk->rc = co_wait_fd(pk->fd, CO_READABLE, co_deadline_after(LONG_WAIT));
    __atomic_store_n(&pk->done, 1, __ATOMIC_RELEASE);
}
static void test_forget_wakes(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    struct parked pk = {sv[0], 1, 0};
    CHECK_EQ(co_go(park_on, &pk), 0);
    co_sleep(20 * MS); /* it parks (if not, it still must end with ECLOSED or READABLE) */
    int64_t t0 = co_now();
    CHECK_EQ(co_fd_forget(sv[0]), 0);
    while (!__atomic_load_n(&pk.done, __ATOMIC_ACQUIRE) && co_now() - t0 < LONG_WAIT)
        co_sleep(MS);
    CHECK(pk.done);
    CHECK_EQ(pk.rc, CO_ECLOSED);
    CHECK(fd_open(sv[0])); /* not closed: its owner's */
    /* the number goes on working afterwards, for a new wait */
    struct writer w = {sv[1], 2 * MS};
    CHECK_EQ(co_go(late_write, &w), 0);
    CHECK_EQ(co_wait_fd(sv[0], CO_READABLE, co_deadline_after(LONG_WAIT)), CO_READABLE);
    char c;
    CHECK_EQ(co_read(sv[0], &c, 1, co_deadline_after(LONG_WAIT)), 1);
    /* forget, close with close(2), reopen: co_read works on the new file */
    CHECK_EQ(co_fd_forget(sv[0]), 0);
    int peer;
    close(sv[1]);
    reopen_as_pair(sv[0], &peer);
    struct writer w2 = {peer, 2 * MS};
    CHECK_EQ(co_go(late_write, &w2), 0);
    CHECK_EQ(co_read(sv[0], &c, 1, co_deadline_after(LONG_WAIT)), 1);
    co_sleep(5 * MS);
    CHECK_EQ(co_close(sv[0]), 0);
    close(peer);
}

/* A plain thread's co_wait_fd is woken by a forget from a coroutine. */
static void *thread_wait(void *arg) {
    park_on(arg);
    return NULL;
}
static void test_forget_plain_thread(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    struct parked pk = {sv[0], 1, 0};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, thread_wait, &pk), 0);
    /* A forget before its call began would forget nothing, and the call
     * would then wait on the open socket: wait until it is under way. */
    co_alive_t a = {0};
    for (int i = 0; i < 100000 && a.plain_io == 0; i++) {
        CHECK_EQ(co_alive(&a), 0);
        if (a.plain_io == 0) co_sleep(MS);
    }
    CHECK_EQ(a.plain_io, 1);
    co_sleep(20 * MS); /* most likely parked by now; on its way in works too */
    CHECK_EQ(co_fd_forget(sv[0]), 0);
    pthread_join(t, NULL);
    /* ECLOSED if it was parked (or on its way in); never a timeout */
    CHECK_EQ(pk.rc, CO_ECLOSED);
    close(sv[0]);
    close(sv[1]);
}

/* co_fd_forget returns only once the operations under way on the number
 * have left: its caller (the hook's close) closes the number next, and a
 * new file that takes it must not find the old file's close still
 * pending, or the new file's operations fail with CO_ECLOSED. The
 * operation is held inside its call, past its write, as a thread
 * preempted there is (co__io_hooked: the hook's path). */
static int op_held, op_go, op_rc, forget_done;
static ssize_t held_write(int fd, void *arg) {
    (void)arg;
    ssize_t r = write(fd, "x", 1);
    int e = errno;
    __atomic_store_n(&op_held, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&op_go, __ATOMIC_ACQUIRE)) usleep(1000);
    return r < 0 ? -e : r;
}
static ssize_t plain_write(int fd, void *arg) {
    (void)arg;
    ssize_t r = write(fd, "y", 1);
    return r < 0 ? -errno : r;
}
static void *held_op_thread(void *arg) {
    int fd = *(int *)arg;
    __atomic_store_n(&op_rc, (int)co__io_hooked(fd, CO__IO_WRITE, held_write, NULL, 0, 0),
                     __ATOMIC_RELEASE);
    return NULL;
}
static void *forget_close_thread(void *arg) {
    int fd = *(int *)arg;
    if (co_fd_forget(fd) != 0) abort();
    close(fd);
    __atomic_store_n(&forget_done, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void test_forget_waits_for_ops(void) {
    op_held = op_go = forget_done = 0;
    op_rc = 0;
    int sv[2], nv[2], mv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pthread_t op, fg;
    CHECK_EQ(pthread_create(&op, NULL, held_op_thread, &sv[1]), 0);
    while (!__atomic_load_n(&op_held, __ATOMIC_ACQUIRE)) co_sleep(MS);
    CHECK_EQ(pthread_create(&fg, NULL, forget_close_thread, &sv[1]), 0);
    co_sleep(50 * MS); /* a forget that does not wait has returned by now */
    CHECK(!__atomic_load_n(&forget_done, __ATOMIC_ACQUIRE));
    /* a new file meanwhile does not get the number, and works */
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, nv), 0);
    CHECK(nv[0] != sv[1] && nv[1] != sv[1]);
    CHECK_EQ(co__io_hooked(nv[0], CO__IO_WRITE, plain_write, NULL, 0, 0), 1);
    CHECK_EQ(co__io_hooked(nv[1], CO__IO_WRITE, plain_write, NULL, 0, 0), 1);
    __atomic_store_n(&op_go, 1, __ATOMIC_RELEASE);
    pthread_join(op, NULL);
    pthread_join(fg, NULL);
    CHECK_EQ(__atomic_load_n(&op_rc, __ATOMIC_ACQUIRE), 1);
    CHECK(forget_done);
    char c;
    CHECK_EQ(read(sv[0], &c, 1), 1);
    /* the number, free now, names a new file at once, which works */
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, mv), 0);
    int peer = mv[1];
    if (mv[1] == sv[1]) {
        peer = mv[0];
    } else if (mv[0] != sv[1]) {
        CHECK_EQ(dup2(mv[0], sv[1]), sv[1]);
        close(mv[0]);
    }
    CHECK_EQ(co__io_hooked(sv[1], CO__IO_WRITE, plain_write, NULL, 0, 0), 1);
    CHECK_EQ(read(peer, &c, 1), 1);
    CHECK_EQ(c, 'y');
    CHECK_EQ(co_close(sv[1]), 0);
    close(peer);
    close(sv[0]);
    CHECK_EQ(co_close(nv[0]), 0);
    CHECK_EQ(co_close(nv[1]), 0);
}

/* Bad input: a negative fd; a number colony never saw; twice in a row. */
static void test_forget_bad_input(void) {
    CHECK_EQ(co_fd_forget(-1), -EBADF);
    CHECK_EQ(co_fd_forget(1 << 30), 0);
    int p[2];
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    CHECK_EQ(co_fd_forget(p[0]), 0);
    CHECK_EQ(co_fd_forget(p[0]), 0);
    CHECK(fd_open(p[0]));
    close(p[0]);
    close(p[1]);
}

/* Many coroutines, each with its own reconnecting number, at once. */
static int many_fails;
static void reconnector(void *arg) {
    struct writer *out = arg;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) abort();
    int num = sv[0], peer = sv[1];
    for (int i = 0; i < 20; i++) {
        if (i & 1) co_fd_forget(num);
        if (write(peer, "y", 1) != 1) __atomic_add_fetch(&many_fails, 1, __ATOMIC_RELAXED);
        if (co_wait_fd(num, CO_READABLE, co_deadline_after(LONG_WAIT)) != CO_READABLE)
            __atomic_add_fetch(&many_fails, 1, __ATOMIC_RELAXED);
        char c;
        if (read(num, &c, 1) != 1) __atomic_add_fetch(&many_fails, 1, __ATOMIC_RELAXED);
        /* and once more with nothing there yet: parks, a peer wakes it */
        struct writer w = {peer, MS / 4};
        co_go(late_write, &w);
        if (co_wait_fd(num, CO_READABLE, co_deadline_after(LONG_WAIT)) != CO_READABLE)
            __atomic_add_fetch(&many_fails, 1, __ATOMIC_RELAXED);
        if (read(num, &c, 1) != 1) __atomic_add_fetch(&many_fails, 1, __ATOMIC_RELAXED);
        co_sleep(MS);
        close(peer);
        reopen_as_pair(num, &peer);
    }
    close(peer);
    co_fd_forget(num);
    close(num);
    __atomic_add_fetch(&out->fd, 1, __ATOMIC_RELEASE);
}
static void test_many_reconnecting(void) {
    enum { N = 50 };
    struct writer done = {0, 0};
    many_fails = 0;
    for (int i = 0; i < N; i++) CHECK_EQ(co_go(reconnector, &done), 0);
    while (__atomic_load_n(&done.fd, __ATOMIC_ACQUIRE) < N) co_sleep(MS);
    CHECK_EQ(many_fails, 0);
}

static int run(void *arg) {
    (void)arg;
    int fds0 = t_count_fds();
    T_RUN(test_reconnect_storm);
    T_RUN(test_reopen_write_side);
    T_RUN(test_closed_behind);
    T_RUN(test_forget_wakes);
    T_RUN(test_forget_plain_thread);
    T_RUN(test_forget_waits_for_ops);
    T_RUN(test_forget_bad_input);
    T_RUN(test_many_reconnecting);
    CHECK_EQ(t_count_fds(), fds0);
    return 0;
}

int main(void) {
    t_begin(50);
    co_main(run, NULL);
    return t_end();
}
