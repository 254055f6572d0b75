/* libcolony_hook.so, preloaded: where the hook's O_NONBLOCK file must still
 * give a program that sees its fd as blocking libc's blocking answers.
 * A write writes everything, MSG_WAITALL waits for all, a failed dup2
 * leaves its target alone, poll of several fds sees every event name and
 * an fd listed twice, an accepted socket keeps its listener's SO_RCVTIMEO,
 * a Unix connect to a full backlog waits for room, and the standard fds
 * (shared with other processes) stay libc's. Each case failed before. */
// ctest-timeout: 60
// ctest-preload-hook
#define _GNU_SOURCE 1
#include "t.h"
#include "test_hook_servers.h"

#include <colony.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define MS 1000000LL

/* errno read afresh after a call that may park (docs/hook.md) */
static __attribute__((noinline)) int err_now(void) { return errno; }
static __attribute__((noinline)) void err_clear(void) { errno = 0; }

/* the kernel's own flags, past the hook's fcntl */
static int kernel_flags(int fd) { return (int)syscall(SYS_fcntl, fd, F_GETFL); }

/* ---- a reader that drains a pipe slowly, counting ---------------------- */
static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static size_t drained;
static uint32_t drained_sum;
static void slow_drain(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[4096];
    ssize_t n;
    co_sleep(20 * MS); /* the writer fills the pipe first */
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) drained_sum += (unsigned char)buf[i];
        drained += (size_t)n;
    }
    co_waitgroup_done(&wg);
}

static char big[1 << 20];
static uint32_t big_sum(size_t n) {
    uint32_t s = 0;
    for (size_t i = 0; i < n; i++) s += (unsigned char)big[i];
    return s;
}

/* A blocking write of 1 MiB to a pipe (64 KiB of room) writes all of it:
 * it used to answer the first 64 KiB. writev too. */
static void test_write_whole(void) {
    for (size_t i = 0; i < sizeof big; i++) big[i] = (char)(i * 7 + 1);
    for (int vec = 0; vec < 2; vec++) {
        int p[2];
        CHECK_EQ(pipe(p), 0);
        drained = 0;
        drained_sum = 0;
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(slow_drain, (void *)(intptr_t)p[0]), 0);
        ssize_t n;
        if (vec) {
            struct iovec iov[3] = {{big, 1000}, {big + 1000, 300000}, {big + 301000, sizeof big - 301000}};
            n = writev(p[1], iov, 3);
        } else {
            n = write(p[1], big, sizeof big);
        }
        CHECK_EQ(n, (ssize_t)sizeof big);
        CHECK_EQ(kernel_flags(p[1]) & O_NONBLOCK, O_NONBLOCK); /* it was the hook's file */
        close(p[1]);
        CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
        CHECK_EQ(drained, sizeof big);
        CHECK_EQ(drained_sum, big_sum(sizeof big));
        close(p[0]);
    }
}

/* a writer of 10 bytes now and 90 more after a while */
static void late_rest(void *arg) {
    int fd = (int)(intptr_t)arg;
    char b[90];
    memset(b, 'y', sizeof b);
    co_sleep(30 * MS);
    CHECK_EQ(write(fd, b, sizeof b), 90);
    co_waitgroup_done(&wg);
}

/* recv and recvmsg with MSG_WAITALL on a blocking stream socket wait for
 * all they asked for: they used to answer the 10 bytes already there. */
static void test_waitall(void) {
    for (int msg = 0; msg < 2; msg++) {
        int sv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        char c;
        /* hook it first: a read of nothing parks, MSG_DONTWAIT says so */
        err_clear();
        CHECK_EQ(recv(sv[0], &c, 1, MSG_DONTWAIT), -1);
        CHECK_EQ(err_now(), EAGAIN);
        CHECK_EQ(write(sv[1], "xxxxxxxxxx", 10), 10);
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(late_rest, (void *)(intptr_t)sv[1]), 0);
        char buf[100];
        ssize_t n;
        if (msg) {
            struct iovec iov[2] = {{buf, 40}, {buf + 40, 60}};
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};
            n = recvmsg(sv[0], &m, MSG_WAITALL);
        } else {
            n = recv(sv[0], buf, sizeof buf, MSG_WAITALL);
        }
        CHECK_EQ(n, 100);
        CHECK(memcmp(buf, "xxxxxxxxxx", 10) == 0 && buf[10] == 'y' && buf[99] == 'y');
        CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
        close(sv[0]);
        close(sv[1]);
    }
}

/* a reader parked on fd that must get its byte */
static int parked_got;
static void parked_reader(void *arg) {
    int fd = (int)(intptr_t)arg;
    char c = 0;
    ssize_t n = read(fd, &c, 1);
    __atomic_store_n(&parked_got, n == 1 && c == 'k' ? 1 : -1, __ATOMIC_RELEASE);
    co_waitgroup_done(&wg);
}

/* A dup2 or dup3 that fails leaves its target as it was: it used to
 * retire the target first, failing its parked reader with EBADF and
 * leaving the program's blocking socket O_NONBLOCK in its view. */
static void test_dup2_failed(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    parked_got = 0;
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(parked_reader, (void *)(intptr_t)sv[0]), 0);
    co_sleep(20 * MS); /* let it park (if not yet, it reads below anyway) */
    int bad = 4000; /* not open */
    err_clear();
    CHECK_EQ(dup2(bad, sv[0]), -1);
    CHECK_EQ(err_now(), EBADF);
    err_clear();
    CHECK_EQ(dup3(sv[1], sv[0], 12345), -1); /* bad flags */
    CHECK_EQ(err_now(), EINVAL);
    CHECK_EQ(fcntl(sv[0], F_GETFL) & O_NONBLOCK, 0);
    CHECK_EQ(write(sv[1], "k", 1), 1);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
    CHECK_EQ(__atomic_load_n(&parked_got, __ATOMIC_ACQUIRE), 1);
    close(sv[0]);
    close(sv[1]);
}

static void late_pipe_byte(void *arg) {
    co_sleep(20 * MS);
    CHECK_EQ(write((int)(intptr_t)arg, "x", 1), 1);
    co_waitgroup_done(&wg);
}
static void late_drain(void *arg) {
    int fd = (int)(intptr_t)arg;
    co_sleep(20 * MS);
    char buf[65536];
    while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
    co_waitgroup_done(&wg);
}

/* poll of several fds: POLLRDNORM waits for input, and one fd listed for
 * POLLIN and again for POLLOUT sees the POLLOUT; both used to sleep to
 * the timeout, here none (-1): for good. */
static void test_poll_many_events(void) {
    int a[2], b[2];
    CHECK_EQ(pipe(a), 0);
    CHECK_EQ(pipe(b), 0);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(late_pipe_byte, (void *)(intptr_t)a[1]), 0);
    struct pollfd p[2] = {{.fd = a[0], .events = POLLRDNORM}, {.fd = b[0], .events = POLLRDNORM}};
    CHECK_EQ(poll(p, 2, -1), 1);
    CHECK(p[0].revents & POLLRDNORM);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }

    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int sz = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    char fill[4096];
    memset(fill, 'f', sizeof fill);
    while (send(sv[0], fill, sizeof fill, MSG_DONTWAIT) > 0) {
    }
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(late_drain, (void *)(intptr_t)sv[1]), 0);
    struct pollfd q[2] = {{.fd = sv[0], .events = POLLIN}, {.fd = sv[0], .events = POLLOUT}};
    CHECK_EQ(poll(q, 2, -1), 1);
    CHECK(q[1].revents & POLLOUT);
    CHECK_EQ(q[0].revents, 0);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
    close(sv[0]);
    close(sv[1]);
}

static int dialed = -1;
static void dial_and_hold(void *arg) {
    int port = (int)(intptr_t)arg;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    __atomic_store_n(&dialed, c, __ATOMIC_RELEASE);
    co_waitgroup_done(&wg);
}

/* An accepted socket has its listener's SO_RCVTIMEO in the kernel: a read
 * with nothing coming ends with EAGAIN. The hook took it for "none", and
 * the read waited for good. */
static void test_accepted_keeps_timeout(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t sl = sizeof sa;
    CHECK_EQ(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    CHECK_EQ(listen(l, 4), 0);
    struct timeval tv = {0, 100000};
    /* set beneath the hook, as a library compiled to call the system
     * directly, or a parent process, would have */
    CHECK_EQ(syscall(SYS_setsockopt, l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(dial_and_hold, (void *)(intptr_t)ntohs(sa.sin_port)), 0);
    int s = accept(l, NULL, NULL);
    CHECK(s >= 0);
    char c;
    err_clear();
    CHECK_EQ(read(s, &c, 1), -1);
    CHECK(err_now() == EAGAIN || err_now() == EWOULDBLOCK);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
    close(__atomic_load_n(&dialed, __ATOMIC_ACQUIRE));
    close(s);
    close(l);
}

static int ux_listener;
static void late_accept_all(void *arg) {
    int want = (int)(intptr_t)arg; /* the backlog's and the blocking one */
    co_sleep(30 * MS);
    int fl = fcntl(ux_listener, F_GETFL);
    fcntl(ux_listener, F_SETFL, fl | O_NONBLOCK);
    int got = 0;
    int64_t t0 = co_now();
    while (got < want && co_now() - t0 < 20000 * MS) {
        int c = accept(ux_listener, NULL, NULL);
        if (c >= 0) {
            close(c);
            got++;
        } else {
            co_sleep(MS);
        }
    }
    co_waitgroup_done(&wg);
}

/* A blocking connect to a Unix listener whose backlog is full waits for
 * room (libc's); the hook answered EAGAIN at once. */
static void test_unix_connect_waits(void) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "/tmp/colony-hook-edges.%d", (int)getpid());
    unlink(a.sun_path);
    ux_listener = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK_EQ(bind(ux_listener, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(listen(ux_listener, 0), 0);
    /* fill the backlog with non-blocking connects */
    int held[8], nheld = 0, r = 0;
    while (nheld < 8) {
        int c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        r = connect(c, (struct sockaddr *)&a, sizeof a);
        if (r < 0) {
            close(c);
            break;
        }
        held[nheld++] = c;
    }
    CHECK(r < 0 && nheld >= 1);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(late_accept_all, (void *)(intptr_t)(nheld + 1)), 0);
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(30000 * MS)), 0);
    close(c);
    for (int i = 0; i < nheld; i++) close(held[i]);
    close(ux_listener);
    unlink(a.sun_path);
}

/* Standard input, when a coroutine reads it, stays the program's blocking
 * file: its open file is usually shared with other processes (a shell's
 * pipe), which the hook's O_NONBLOCK used to reach. */
static void test_stdio_left_alone(void) {
    int saved = dup(0);
    CHECK(saved >= 0);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    CHECK_EQ(dup2(p[0], 0), 0);
    close(p[0]);
    CHECK_EQ(write(p[1], "s", 1), 1);
    char c = 0;
    CHECK_EQ(read(0, &c, 1), 1);
    CHECK_EQ(c, 's');
    CHECK_EQ(kernel_flags(0) & O_NONBLOCK, 0);
    /* and a copy of it under another number (the shared file is the same) */
    int cp = dup(0);
    CHECK(cp > 2);
    CHECK_EQ(write(p[1], "t", 1), 1);
    CHECK_EQ(read(cp, &c, 1), 1);
    CHECK_EQ(kernel_flags(cp) & O_NONBLOCK, 0);
    close(cp);
    close(p[1]);
    CHECK_EQ(dup2(saved, 0), 0);
    close(saved);
}

/* a writer of 4 bytes with an fd after a while */
static int passed_fd;
static void late_fd(void *arg) {
    int fd = (int)(intptr_t)arg;
    co_sleep(30 * MS);
    char data[4] = {'b', 'b', 'b', 'b'};
    struct iovec iov = {data, 4};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                       .msg_controllen = sizeof u.b};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &passed_fd, sizeof(int));
    CHECK_EQ(sendmsg(fd, &m, 0), 4);
    co_waitgroup_done(&wg);
}

/* recvmsg with MSG_WAITALL whose second part brings an fd: the fd reaches
 * the caller's control buffer (it used to be dropped: the later part had
 * none). */
static void test_waitall_keeps_fd(void) {
    int sv[2], p[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    CHECK_EQ(pipe(p), 0);
    passed_fd = p[0];
    char c;
    err_clear();
    CHECK_EQ(recv(sv[0], &c, 1, MSG_DONTWAIT), -1); /* hooked */
    CHECK_EQ(write(sv[1], "aaaa", 4), 4);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(late_fd, (void *)(intptr_t)sv[1]), 0);
    char buf[8];
    struct iovec iov = {buf, sizeof buf};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                       .msg_controllen = sizeof u.b};
    CHECK_EQ(recvmsg(sv[0], &m, MSG_WAITALL), 8);
    CHECK(m.msg_controllen > 0);
    struct cmsghdr *ch = CMSG_FIRSTHDR(&m);
    int got = -1;
    if (ch && ch->cmsg_type == SCM_RIGHTS) memcpy(&got, CMSG_DATA(ch), sizeof got);
    CHECK(got >= 0);
    if (got >= 0) {
        CHECK_EQ(write(p[1], "z", 1), 1);
        char z = 0;
        CHECK_EQ(read(got, &z, 1), 1); /* the pipe's read end, passed */
        CHECK_EQ(z, 'z');
        close(got);
    }
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
}

static int trickle_stop;
static void trickler(void *arg) {
    int fd = (int)(intptr_t)arg;
    for (int i = 0; i < 10 && !__atomic_load_n(&trickle_stop, __ATOMIC_ACQUIRE); i++) {
        co_sleep(100 * MS);
        (void)!write(fd, "t", 1);
    }
    co_waitgroup_done(&wg);
}

/* MSG_WAITALL under SO_RCVTIMEO: one budget for the call, as the kernel
 * counts it, not a fresh one per part: a peer that trickles a byte each
 * 100 ms gives a 10-byte receive with a 300 ms budget a short count (it
 * used to wait for all 10). */
static void test_waitall_one_budget(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct timeval tv = {0, 300000};
    CHECK_EQ(setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    trickle_stop = 0;
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(trickler, (void *)(intptr_t)sv[1]), 0);
    char buf[10];
    ssize_t n = recv(sv[0], buf, sizeof buf, MSG_WAITALL);
    CHECK(n < 10);
    __atomic_store_n(&trickle_stop, 1, __ATOMIC_RELEASE);
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20000 * MS)), 0);
    close(sv[0]);
    close(sv[1]);
}

static int run(void *arg) {
    (void)arg;
    int fds0 = t_count_fds();
    T_RUN(test_write_whole);
    T_RUN(test_waitall);
    T_RUN(test_dup2_failed);
    T_RUN(test_poll_many_events);
    T_RUN(test_accepted_keeps_timeout);
    T_RUN(test_unix_connect_waits);
    T_RUN(test_stdio_left_alone);
    T_RUN(test_waitall_keeps_fd);
    T_RUN(test_waitall_one_budget);
    CHECK_EQ(t_count_fds(), fds0);
    return 0;
}

int main(void) {
    if (!dlsym(RTLD_DEFAULT, "colony_hook_active")) {
        fprintf(stderr, "skip: libcolony_hook.so is not preloaded (LD_PRELOAD)\n");
        return 77;
    }
    hs_preload_drop();
    t_begin(50);
    co_main(run, NULL);
    return t_end();
}
