/* libcolony_hook.so, preloaded (CMake sets LD_PRELOAD for test_hook_ld*):
 * libc's blocking calls made from coroutines park the coroutine, not the
 * thread; plain threads and regular files get libc's behaviour; a
 * program's own O_NONBLOCK gives EAGAIN; SO_RCVTIMEO is a deadline; close
 * retires a number. Behaviour, not timing. */
// ctest-timeout: 60
// ctest-preload-hook
#define _GNU_SOURCE 1
#include "t.h"
#include "test_hook_servers.h"

#include <colony.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MS 1000000LL

/* errno read afresh: this file's own code may not cache &errno across a
 * call that parks (see docs/hook.md) */
static __attribute__((noinline)) int err_now(void) { return errno; }
static __attribute__((noinline)) void err_clear(void) { errno = 0; }
#define GIVE_UP (10000 * MS)

static int threads_now(void) {
    co_sched_stats_t st;
    co_sched_stats(&st);
    return st.threads;
}

/* 300 coroutines each in a blocking read() of its own socket: they park,
 * the threads stay few, and each gets its own bytes. */
enum { NR = 300 };
static int pairs[NR][2];
static int reads_ok, reads_done;
static void reader(void *arg) {
    int i = (int)(intptr_t)arg;
    char buf[16] = {0};
    ssize_t n = read(pairs[i][0], buf, sizeof buf);
    char want[16];
    snprintf(want, sizeof want, "m%d", i);
    if (n == (ssize_t)strlen(want) && memcmp(buf, want, (size_t)n) == 0)
        __atomic_add_fetch(&reads_ok, 1, __ATOMIC_RELAXED);
    else
        fprintf(stderr, "reader %d: n=%zd errno=%d\n", i, n, err_now());
    __atomic_add_fetch(&reads_done, 1, __ATOMIC_RELEASE);
}
static void test_reads_park(void) {
    reads_ok = reads_done = 0;
    for (int i = 0; i < NR; i++) CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pairs[i]), 0);
    int t0 = threads_now();
    for (int i = 0; i < NR; i++) CHECK_EQ(co_go(reader, (void *)(intptr_t)i), 0);
    co_sleep(50 * MS); /* they all sit in read() now */
    int t1 = threads_now();
    CHECK_EQ(__atomic_load_n(&reads_done, __ATOMIC_ACQUIRE), 0);
    fprintf(stderr, "threads: %d before, %d with %d readers parked\n", t0, t1, NR);
    /* not one per blocked read (NR more): at most a tenth of that, as
     * chaos mode's stalled Ms (their Ps lent to new ones) under TSan on a
     * loaded host gave 8 more than before with 3 Ps */
    CHECK(t1 <= t0 + NR / 10);
    for (int i = 0; i < NR; i++) {
        char m[16];
        int l = snprintf(m, sizeof m, "m%d", i);
        CHECK_EQ(write(pairs[i][1], m, (size_t)l), l);
    }
    int64_t s = co_now();
    while (__atomic_load_n(&reads_done, __ATOMIC_ACQUIRE) < NR && co_now() - s < GIVE_UP)
        co_sleep(MS);
    CHECK_EQ(reads_ok, NR);
    /* the kernel flag is set, the program's view is not */
    CHECK_EQ(fcntl(pairs[0][0], F_GETFL) & O_NONBLOCK, 0);
    for (int i = 0; i < NR; i++) {
        close(pairs[i][0]);
        close(pairs[i][1]);
    }
}

/* The program's own O_NONBLOCK: EAGAIN, never a park; cleared again: a park. */
static int writes_done; /* atomic: late_writer's writes (release), for joining */
static void late_writer(void *arg) {
    co_sleep(5 * MS);
    (void)!write((int)(intptr_t)arg, "z", 1);
    __atomic_add_fetch(&writes_done, 1, __ATOMIC_RELEASE);
}
/* Starts a late_writer on fd; join_writer(its result) waits for its write
 * to be over (the byte's arrival orders nothing for the race detector). */
static int spawn_writer(int fd) {
    int target = __atomic_load_n(&writes_done, __ATOMIC_RELAXED) + 1;
    CHECK_EQ(co_go(late_writer, (void *)(intptr_t)fd), 0);
    return target;
}
static void join_writer(int target) {
    int64_t t0 = co_now();
    while (__atomic_load_n(&writes_done, __ATOMIC_ACQUIRE) < target && co_now() - t0 < GIVE_UP)
        co_sleep(MS);
}
static void test_user_nonblock(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    char c;
    int fl = fcntl(sv[0], F_GETFL);
    CHECK_EQ(fcntl(sv[0], F_SETFL, fl | O_NONBLOCK), 0);
    CHECK(fcntl(sv[0], F_GETFL) & O_NONBLOCK);
    err_clear();
    CHECK_EQ(read(sv[0], &c, 1), -1);
    CHECK(err_now() == EAGAIN || err_now() == EWOULDBLOCK);
    err_clear();
    CHECK_EQ(recv(sv[0], &c, 1, 0), -1);
    CHECK_EQ(err_now(), EAGAIN);
    CHECK_EQ(fcntl(sv[0], F_SETFL, fl & ~O_NONBLOCK), 0);
    CHECK_EQ(fcntl(sv[0], F_GETFL) & O_NONBLOCK, 0);
    /* MSG_DONTWAIT on a blocking fd: EAGAIN too */
    err_clear();
    CHECK_EQ(recv(sv[0], &c, 1, MSG_DONTWAIT), -1);
    CHECK_EQ(err_now(), EAGAIN);
    int wj = spawn_writer(sv[1]);
    CHECK_EQ(read(sv[0], &c, 1), 1);
    CHECK_EQ(c, 'z');
    join_writer(wj);
    close(sv[0]);
    close(sv[1]);
}

/* A copy of a hooked socket (dup, dup2, dup3, F_DUPFD) is the program's
 * blocking socket as the original is: F_GETFL shows no O_NONBLOCK (the
 * kernel's, which the hook set, is shared by the copies), and a read on
 * the copy parks until data comes instead of failing with EAGAIN. */
static void test_dup_blocks(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    char c;
    int wj = spawn_writer(sv[1]);
    CHECK_EQ(read(sv[0], &c, 1), 1); /* hooked now: O_NONBLOCK in the kernel */
    join_writer(wj);
    int hi = sv[0] > sv[1] ? sv[0] : sv[1];
    int copies[4] = {dup(sv[0]), dup2(sv[0], hi + 10), dup3(sv[0], hi + 11, O_CLOEXEC),
                     fcntl(sv[0], F_DUPFD_CLOEXEC, hi + 12)};
    for (int i = 0; i < 4; i++) {
        int d = copies[i];
        CHECK(d >= 0);
        if (d < 0) continue;
        CHECK_EQ(fcntl(d, F_GETFL) & O_NONBLOCK, 0);
        wj = spawn_writer(sv[1]);
        err_clear();
        ssize_t n = read(d, &c, 1);
        if (n != 1) fprintf(stderr, "   copy %d (fd %d): read %zd, errno %d\n", i, d, n, err_now());
        CHECK_EQ(n, 1);
        join_writer(wj);
        close(d);
    }
    close(sv[0]);
    close(sv[1]);
}

/* The hook's select, and its poll of an fd it does not park on (an
 * eventfd), run inside co_blocking, which may park the coroutine (its cap
 * reached, or no P free when the call returns): like every other hooked
 * call, they return on the thread they were called on. */
enum { NHOMEW = 8, NHOMEC = 40 };
static int home_moved, home_calls;
static co_waitgroup_t home_wg = CO_WAITGROUP_INIT;
static __attribute__((noinline)) long tid_now(void) { return syscall(SYS_gettid); }
static void home_worker(void *arg) {
    int efd = (int)(intptr_t)arg;
    for (int i = 0; i < NHOMEC; i++) {
        long before = tid_now();
        if (i % 2) {
            struct timeval tv = {0, 1000};
            (void)select(0, NULL, NULL, NULL, &tv);
        } else {
            struct pollfd p = {.fd = efd, .events = POLLIN};
            (void)poll(&p, 1, 1);
        }
        if (tid_now() != before) __atomic_add_fetch(&home_moved, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&home_calls, 1, __ATOMIC_RELAXED);
        for (volatile int k = 0; k < 20000; k++) {}
    }
    co_waitgroup_done(&home_wg);
}
static void test_blocking_calls_home(void) {
    int efd = eventfd(0, EFD_CLOEXEC);
    CHECK(efd >= 0);
    co_waitgroup_add(&home_wg, NHOMEW);
    for (int i = 0; i < NHOMEW; i++) CHECK_EQ(co_go(home_worker, (void *)(intptr_t)efd), 0);
    CHECK_EQ(co_waitgroup_wait_until(&home_wg, co_deadline_after(GIVE_UP)), 0);
    CHECK_EQ(home_calls, NHOMEW * NHOMEC);
    if (home_moved) fprintf(stderr, "   %d calls returned on another thread\n", home_moved);
    CHECK_EQ(home_moved, 0);
    close(efd);
}

/* A coroutine sent home while its home thread is inside co_blocking: the
 * thread comes back from the call to find every P busy with coroutines
 * that only yield, and sleeps with the coroutine queued for it. A busy P
 * must hand itself over: no P would ever go idle for it. */
static int strand_flag, strand_stop; /* atomic */
static co_waitgroup_t strand_wg = CO_WAITGROUP_INIT;
static void strand_spin(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&strand_flag, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&strand_stop, __ATOMIC_ACQUIRE))
        co_yield();
    co_waitgroup_done(&strand_wg);
}
static void strand_block(void *arg) {
    (void)arg;
    usleep(60000); /* inside co_blocking: libc's */
}
static void strand_blocker(void *arg) {
    co_blocking(strand_block, NULL);
    strand_spin(arg);
}
static void *strand_writer(void *arg) {
    usleep(15000);
    (void)!write((int)(intptr_t)arg, "s", 1);
    return NULL;
}
static void strand_reader(void *arg) {
    int fd = (int)(intptr_t)arg;
    co_sched_stats_t st;
    co_sched_stats(&st);
    for (int i = 0; i < st.procs; i++) CHECK_EQ(co_go(strand_spin, NULL), 0);
    /* spawned last: likely to run on this thread once the read parks */
    CHECK_EQ(co_go(strand_blocker, NULL), 0);
    char c = 0;
    CHECK_EQ(read(fd, &c, 1), 1);
    CHECK_EQ(c, 's');
    __atomic_store_n(&strand_flag, 1, __ATOMIC_RELEASE);
    co_waitgroup_done(&strand_wg);
}
static void test_home_while_blocking(void) {
    for (int round = 0; round < 5; round++) {
        int sv[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        __atomic_store_n(&strand_flag, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&strand_stop, 0, __ATOMIC_RELAXED);
        co_sched_stats_t st;
        co_sched_stats(&st);
        co_waitgroup_add(&strand_wg, st.procs + 2);
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, strand_writer, (void *)(intptr_t)sv[1]), 0);
        CHECK_EQ(co_go(strand_reader, (void *)(intptr_t)sv[0]), 0);
        int64_t t0 = co_now();
        while (!__atomic_load_n(&strand_flag, __ATOMIC_ACQUIRE) && co_now() - t0 < GIVE_UP)
            co_sleep(MS);
        bool returned = __atomic_load_n(&strand_flag, __ATOMIC_ACQUIRE);
        if (!returned) fprintf(stderr, "   round %d: the read had not returned in 10 s\n", round);
        CHECK(returned);
        __atomic_store_n(&strand_stop, 1, __ATOMIC_RELEASE);
        CHECK_EQ(co_waitgroup_wait_until(&strand_wg, co_deadline_after(GIVE_UP)), 0);
        pthread_join(th, NULL);
        close(sv[0]);
        close(sv[1]);
    }
}

/* SO_RCVTIMEO: a read with nothing to read fails with EAGAIN once it passes. */
static void test_rcvtimeo(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct timeval tv = {0, 30000};
    CHECK_EQ(setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    char c;
    int64_t t0 = co_now();
    err_clear();
    CHECK_EQ(read(sv[0], &c, 1), -1);
    CHECK_EQ(err_now(), EAGAIN);
    CHECK(co_now() - t0 >= 30 * MS); /* not before the deadline */
    close(sv[0]);
    close(sv[1]);
}

/* close of a number a coroutine is blocked reading: the reader returns
 * (EBADF), never hangs; the number's next file starts afresh. */
static int closed_rc, closed_errno, closed_done;
static void blocked_reader(void *arg) {
    char c;
    closed_rc = (int)read((int)(intptr_t)arg, &c, 1);
    closed_errno = err_now();
    __atomic_store_n(&closed_done, 1, __ATOMIC_RELEASE);
}
static void test_close_retires(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    closed_done = 0;
    CHECK_EQ(co_go(blocked_reader, (void *)(intptr_t)sv[0]), 0);
    co_sleep(20 * MS);
    CHECK_EQ(close(sv[0]), 0);
    int64_t t0 = co_now();
    while (!__atomic_load_n(&closed_done, __ATOMIC_ACQUIRE) && co_now() - t0 < GIVE_UP)
        co_sleep(MS);
    CHECK(closed_done);
    CHECK_EQ(closed_rc, -1);
    CHECK_EQ(closed_errno, EBADF);
    /* the same number for a new socket: reads park and work */
    int sv2[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv2), 0);
    int wj = spawn_writer(sv2[1]);
    char c;
    CHECK_EQ(read(sv2[0], &c, 1), 1);
    join_writer(wj);
    close(sv2[0]);
    close(sv2[1]);
    close(sv[1]);
}

/* A TCP listener on 127.0.0.1 at a port of the kernel's choice (in *port),
 * through the hook's socket calls. */
static int listen_loopback(int *port) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    CHECK_EQ(listen(lfd, 64), 0);
    socklen_t l = sizeof a;
    CHECK_EQ(getsockname(lfd, (struct sockaddr *)&a, &l), 0);
    *port = ntohs(a.sin_port);
    return lfd;
}
/* TCP over loopback with blocking accept/connect/write/read, all parked. */
static int srv_port;
static void echo_server(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (int k = 0; k < 20; k++) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0) break;
        char b[64];
        ssize_t n = read(c, b, sizeof b);
        if (n > 0) (void)!write(c, b, (size_t)n);
        close(c);
    }
}
static int echo_ok;
static void echo_client(void *arg) {
    (void)arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)srv_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "hello", 5) == 5) {
        char b[8];
        if (read(fd, b, sizeof b) == 5 && memcmp(b, "hello", 5) == 0)
            __atomic_add_fetch(&echo_ok, 1, __ATOMIC_RELAXED);
    }
    close(fd);
}
static void test_tcp_echo(void) {
    int lfd = listen_loopback(&srv_port);
    echo_ok = 0;
    CHECK_EQ(co_go(echo_server, (void *)(intptr_t)lfd), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    (void)wg;
    for (int i = 0; i < 20; i++) CHECK_EQ(co_go(echo_client, NULL), 0);
    int64_t t0 = co_now();
    while (__atomic_load_n(&echo_ok, __ATOMIC_RELAXED) < 20 && co_now() - t0 < GIVE_UP)
        co_sleep(MS);
    CHECK_EQ(echo_ok, 20);
    close(lfd);
}

/* Request/response over loopback TCP, as libpq and hiredis do it: the
 * servers read and write blocking sockets; the clients set O_NONBLOCK and
 * wait in poll(POLLIN) before each recv, or read a blocking socket, each
 * wait parked on the edge count loaded before its try (while other
 * coroutines keep the Ps busy part of the time): every reply must come,
 * and a poll with nothing to come must time out. */
enum { PP_CONNS = 16, PP_ROUNDS = 60 };
static int pp_port, pp_ok, pp_bad, pp_busy_stop;
static void pp_handler(void *arg) {
    int c = (int)(intptr_t)arg;
    char b[32];
    for (;;) {
        ssize_t n = read(c, b, sizeof b - 1);
        if (n <= 0) break;
        b[0] = 'r';
        if (write(c, b, (size_t)n) != n) break;
    }
    close(c);
}
static void pp_server(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (int k = 0; k < PP_CONNS; k++) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0) break;
        if (co_go(pp_handler, (void *)(intptr_t)c) != 0) close(c);
    }
}
static void pp_client(void *arg) {
    int id = (int)(intptr_t)arg;
    bool nb = id % 2 == 0; /* half as libpq (O_NONBLOCK, poll, recv), half as hiredis */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)pp_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (ok && nb) ok = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0;
    for (int r = 0; ok && r < PP_ROUNDS; r++) {
        char q[32], want[32], b[32];
        int len = snprintf(q, sizeof q, "q%d.%d", id, r);
        memcpy(want, q, (size_t)len + 1);
        want[0] = 'r';
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (nb && r % 10 == 5 && poll(&p, 1, 2) != 0) { /* nothing is coming */
            fprintf(stderr, "pingpong %d: a poll with nothing to come said ready\n", id);
            ok = false;
            break;
        }
        if (send(fd, q, (size_t)len, 0) != len) {
            ok = false;
            break;
        }
        ssize_t n;
        if (nb) {
            n = 0;
            while (n < len) { /* a reply may come in pieces */
                if (poll(&p, 1, 10000) != 1 || !(p.revents & POLLIN)) break;
                ssize_t k = recv(fd, b + n, sizeof b - 1 - (size_t)n, 0);
                if (k < 0 && (err_now() == EAGAIN || err_now() == EWOULDBLOCK)) continue;
                if (k <= 0) break;
                n += k;
            }
        } else {
            n = 0;
            while (n < len) {
                ssize_t k = read(fd, b + n, sizeof b - 1 - (size_t)n);
                if (k <= 0) break;
                n += k;
            }
        }
        if (n != len || memcmp(b, want, (size_t)len) != 0) {
            fprintf(stderr, "pingpong %d round %d: n=%zd errno=%d\n", id, r, n, err_now());
            ok = false;
        }
    }
    if (fd >= 0) close(fd);
    __atomic_add_fetch(ok ? &pp_ok : &pp_bad, 1, __ATOMIC_RELEASE);
}
/* keeps run queues non-empty part of the time; sleeps between bursts, so
 * that Ms run out of work and poll (a P that never does is looked at by
 * sysmon only, every 10 ms) */
static void pp_busy(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&pp_busy_stop, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < 20; i++) co_yield();
        co_sleep(MS / 5);
    }
}
static void test_tcp_pingpong(void) {
    int lfd = listen_loopback(&pp_port);
    pp_ok = pp_bad = pp_busy_stop = 0;
    CHECK_EQ(co_go(pp_server, (void *)(intptr_t)lfd), 0);
    for (int i = 0; i < 4; i++) CHECK_EQ(co_go(pp_busy, NULL), 0);
    for (int i = 0; i < PP_CONNS; i++) CHECK_EQ(co_go(pp_client, (void *)(intptr_t)i), 0);
    int64_t t0 = co_now();
    while (__atomic_load_n(&pp_ok, __ATOMIC_ACQUIRE) + __atomic_load_n(&pp_bad, __ATOMIC_ACQUIRE) <
               PP_CONNS &&
           co_now() - t0 < GIVE_UP)
        co_sleep(MS);
    __atomic_store_n(&pp_busy_stop, 1, __ATOMIC_RELEASE);
    CHECK_EQ(pp_ok, PP_CONNS);
    CHECK_EQ(pp_bad, 0);
    close(lfd);
    co_sleep(20 * MS); /* the handlers see EOF and close */
}

/* poll() of one fd with a timeout parks; a timeout says 0. */
static void test_poll_one(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct pollfd p = {.fd = sv[0], .events = POLLIN};
    CHECK_EQ(poll(&p, 1, 20), 0);
    int wj = spawn_writer(sv[1]);
    CHECK_EQ(poll(&p, 1, 10000), 1);
    CHECK(p.revents & POLLIN);
    join_writer(wj);
    close(sv[0]);
    close(sv[1]);
}

/* After a short read of a TCP stream the next wait for input parks on the
 * next edge without trying first (io.h's CO__IO_NEEDS_INPUT). It must
 * still see input that came after the read (here 5 ms later, from another
 * coroutine), and a peek, which leaves the bytes where they are, must not
 * count as a read that emptied the stream: a poll after it would otherwise
 * park on an edge that never comes and time out with the bytes there. */
static void test_drained_skip(void) {
    int port;
    int lfd = listen_loopback(&port);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    int s = accept(lfd, NULL, NULL);
    CHECK(s >= 0);
    char buf[64];
    for (int round = 0; round < 20; round++) {
        /* a reply later than the read that found the stream empty */
        CHECK_EQ(write(s, "abc", 3), 3);
        CHECK_EQ(recv(c, buf, sizeof buf, 0), 3); /* short: drained */
        int wj = spawn_writer(s);
        struct pollfd p = {.fd = c, .events = POLLIN};
        CHECK_EQ(poll(&p, 1, 10000), 1);
        CHECK(p.revents & POLLIN);
        CHECK_EQ(read(c, buf, sizeof buf), 1); /* short again */
        join_writer(wj);
        /* a blocking read after a short one parks until the next byte */
        wj = spawn_writer(s);
        CHECK_EQ(read(c, buf, sizeof buf), 1);
        CHECK_EQ(buf[0], 'z');
        join_writer(wj);
        /* bytes peeked at are still there: poll and read see them at once */
        CHECK_EQ(write(s, "xyz", 3), 3);
        int64_t t0 = co_now();
        while (recv(c, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT) < 3 && co_now() - t0 < GIVE_UP)
            co_sleep(MS / 5);
        CHECK_EQ(recv(c, buf, sizeof buf, MSG_PEEK), 3);
        p.revents = 0;
        CHECK_EQ(poll(&p, 1, 2000), 1);
        CHECK_EQ(recv(c, buf, sizeof buf, MSG_PEEK), 3);
        CHECK_EQ(read(c, buf, sizeof buf), 3);
        /* a read of nothing answers at once, drained or not */
        CHECK_EQ(read(c, buf, 0), 0);
    }
    close(c);
    close(s);
    close(lfd);
}

/* poll() of several fds parks until one is ready; a timeout says 0. */
static void test_poll_many(void) {
    int a[2], b[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    struct pollfd p[3] = {{.fd = a[0], .events = POLLIN}, {.fd = -1}, {.fd = b[0], .events = POLLIN}};
    CHECK_EQ(poll(p, 3, 20), 0);
    int t0 = threads_now();
    int wj = spawn_writer(b[1]);
    CHECK_EQ(poll(p, 3, 10000), 1);
    CHECK_EQ(p[0].revents, 0);
    CHECK(p[2].revents & POLLIN);
    join_writer(wj);
    CHECK(threads_now() <= t0 + 1);
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(b[1]);
}

/* Sleeps in coroutines are co_sleep: 200 of them, few threads. */
static int slept;
static void sleeper(void *arg) {
    (void)arg;
    usleep(20000);
    struct timespec ts = {0, 5 * MS};
    nanosleep(&ts, NULL);
    __atomic_add_fetch(&slept, 1, __ATOMIC_RELEASE);
}
static void test_sleeps(void) {
    slept = 0;
    int t0 = threads_now();
    for (int i = 0; i < 200; i++) CHECK_EQ(co_go(sleeper, NULL), 0);
    co_sleep(10 * MS);
    CHECK(threads_now() <= t0 + co_procs() + 4);
    int64_t s = co_now();
    while (__atomic_load_n(&slept, __ATOMIC_ACQUIRE) < 200 && co_now() - s < GIVE_UP)
        co_sleep(MS);
    CHECK_EQ(slept, 200);
}

/* A regular file: libc's (no O_NONBLOCK set on it, reads as usual). */
static void test_regular_file(void) {
    char path[] = "/tmp/colony_hook_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    CHECK_EQ(write(fd, "abc", 3), 3);
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    char b[4];
    CHECK_EQ(read(fd, b, 4), 3);
    CHECK_EQ(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    close(fd);
    /* bad input: libc's answers */
    err_clear();
    CHECK_EQ(read(-1, b, 1), -1);
    CHECK_EQ(err_now(), EBADF);
    err_clear();
    CHECK_EQ(read(1 << 20, b, 1), -1);
    CHECK_EQ(err_now(), EBADF);
}

/* A plain thread: a blocking read of a socket a coroutine used (and the
 * hook made O_NONBLOCK in the kernel) still blocks, as libc's. */
static int plain_sv[2];
static void *plain_reader(void *arg) {
    (void)arg;
    char c = 0;
    ssize_t n = read(plain_sv[0], &c, 1);
    return (void *)(intptr_t)(n == 1 && c == 'p');
}
static void touch(void *arg) {
    char c;
    int fl = fcntl((int)(intptr_t)arg, F_GETFL);
    (void)fl;
    (void)recv((int)(intptr_t)arg, &c, 1, MSG_DONTWAIT); /* hooks it */
}
static void test_plain_thread(void) {
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, plain_sv), 0);
    co_go(touch, (void *)(intptr_t)plain_sv[0]);
    co_sleep(5 * MS);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, plain_reader, NULL), 0);
    co_sleep(10 * MS);
    CHECK_EQ(write(plain_sv[1], "p", 1), 1);
    void *ok = NULL;
    pthread_join(t, &ok);
    CHECK(ok != NULL);
    close(plain_sv[0]);
    close(plain_sv[1]);
}

/* ---- the race detector through the hook (TSan builds) -----------------
 * tests/tsan_hook.supp hides what TSan cannot see of the hook (a close of
 * a number a coroutine is parked on): a memory race between coroutines in
 * the same program must still be reported. Each scenario runs in a child
 * (this program again, the hook preloaded, reports not fatal: exit 66 if
 * any) with that file: a coroutine parks in read(2), another closes the
 * number; in "race" both also write one variable unordered. */
static int racy; /* written by the reader and the closer, unordered in "race" */
static __attribute__((noinline)) void racy_put(int v) { *(volatile int *)&racy = v; }
static co_waitgroup_t race_wg = CO_WAITGROUP_INIT;
static void race_reader(void *arg) {
    int *a = arg;
    if (a[1]) racy_put(1);
    char c;
    ssize_t n = read(a[0], &c, 1);
    if (n != -1 || err_now() != EBADF) {
        fprintf(stderr, "race_reader: n=%zd errno=%d\n", n, err_now());
        a[0] = -1; /* the child fails */
    }
    co_waitgroup_done(&race_wg);
}
static int race_child(void *arg) {
    int a[2] = {-1, !strcmp(arg, "race")}, sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 2;
    a[0] = sv[0];
    co_waitgroup_add(&race_wg, 1);
    co_go(race_reader, a);
    co_sleep(20 * MS); /* (orders nothing: the close is unordered either way) */
    if (a[1]) racy_put(2);
    close(sv[0]);
    co_waitgroup_wait(&race_wg);
    close(sv[1]);
    return a[0] == -1 ? 3 : 0;
}
static char hook_path[4096]; /* LD_PRELOAD as this program got it */
static char race_out[1 << 16];
static int race_run(const char *name) {
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    CHECK(pid >= 0);
    if (pid < 0) return -1;
    if (pid == 0) {
        setenv("LD_PRELOAD", hook_path, 1);
        setenv("TSAN_OPTIONS",
               "halt_on_error=0:exitcode=66:print_suppressions=1:suppressions=" CO_SOURCE_DIR
               "/tests/tsan_hook.supp", 1);
        t_execl("/proc/self/exe", "test_hook_ld", "--race", name, (char *)NULL);
        _exit(127);
    }
    return t_drain_and_wait(fd, race_out, sizeof race_out, pid);
}
static void test_race_seen(void) {
    if (!t_tsan()) {
        fprintf(stderr, "skipped: not a TSan build\n");
        return;
    }
    /* the close alone: suppressed (and matched), nothing reported */
    int st = race_run("close");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(race_out, "WARNING: ThreadSanitizer") == NULL);
    CHECK(strstr(race_out, "race_top:__interceptor_close$") != NULL);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || strstr(race_out, "WARNING: ThreadSanitizer"))
        fprintf(stderr, "close (status %#x):\n%s", st, race_out);
    /* with a memory race beside it: that one reported, and only it */
    st = race_run("race");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 66);
    CHECK_EQ(t_count(race_out, "WARNING: ThreadSanitizer: data race"), 1);
    CHECK(strstr(race_out, "racy_put") != NULL && strstr(race_out, "race_reader") != NULL);
    CHECK(strstr(race_out, "file descriptor") == NULL);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 66 || !strstr(race_out, "racy_put"))
        fprintf(stderr, "race (status %#x):\n%s", st, race_out);
}

static int run(void *arg) {
    (void)arg;
    int fds0 = t_count_fds();
    T_RUN(test_reads_park);
    T_RUN(test_user_nonblock);
    T_RUN(test_dup_blocks);
    T_RUN(test_blocking_calls_home);
    T_RUN(test_home_while_blocking);
    T_RUN(test_rcvtimeo);
    T_RUN(test_close_retires);
    T_RUN(test_tcp_echo);
    T_RUN(test_tcp_pingpong);
    T_RUN(test_poll_one);
    T_RUN(test_poll_many);
    T_RUN(test_drained_skip);
    T_RUN(test_sleeps);
    T_RUN(test_regular_file);
    T_RUN(test_plain_thread);
    T_RUN(test_race_seen);
    CHECK_EQ(t_count_fds(), fds0);
    return 0;
}

int main(int argc, char **argv) {
    if (!dlsym(RTLD_DEFAULT, "colony_hook_active")) {
        fprintf(stderr, "skip: libcolony_hook.so is not preloaded (LD_PRELOAD)\n");
        return 77;
    }
    const char *pre = getenv("LD_PRELOAD");
    snprintf(hook_path, sizeof hook_path, "%s", pre ? pre : "");
    hs_preload_drop();
    if (argc == 3 && !strcmp(argv[1], "--race")) {
        co_config_t cfg = {.procs = 1};
        if (co_init(&cfg) != 0) return 2;
        return co_main(race_child, argv[2]);
    }
    /* the hook, loaded into a program before any runtime: libc's calls */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0) {
        char c = 0;
        if (write(sv[1], "q", 1) != 1 || read(sv[0], &c, 1) != 1 || c != 'q') return 1;
        close(sv[0]);
        close(sv[1]);
    }
    t_begin(50);
    co_main(run, NULL);
    return t_end();
}
