/* I/O on the netpoller: co_read, co_write, co_accept, co_connect,
 * co_wait_fd, co_close from coroutines and plain threads, over socket
 * pairs and loopback TCP (127.0.0.1 only). Behaviour, not timing. */
// ctest-timeout: 180
#define _GNU_SOURCE 1 /* pipe2, O_DIRECT */
#include "t.h"
#include "t_internal.h"

#include <colony.h>

/* internal: tests link the static library, where hidden symbols resolve */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/netlink.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <limits.h>
#include <sys/socket.h>
#include <unistd.h>

#define MS 1000000LL

static int scale_small(void) { return getenv("COLONY_CI") != NULL || t_sanitized(); }

static int count_fds(void) { return t_count_fds(); }

static bool fd_open(int fd) {
    return fcntl(fd, F_GETFD) >= 0;
}

/* Reads fd to its end: the byte count, or the error that stopped it. */
static long drain_count(int fd) {
    char b[16384];
    long total = 0;
    ssize_t n;
    while ((n = co_read(fd, b, sizeof b, co_deadline_after(10000 * MS))) > 0) total += n;
    return n < 0 ? n : total;
}

/* A listening TCP socket on 127.0.0.1, ephemeral port. */
static int listen_tcp(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4096) < 0) {
        close(fd);
        return -1;
    }
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    *port = ntohs(a.sin_port);
    return fd;
}

static int connect_tcp(int port, int64_t deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int rc = co_connect(fd, (struct sockaddr *)&a, sizeof a, deadline);
    if (rc < 0) {
        co_close(fd);
        return rc;
    }
    return fd;
}

static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int nofile(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_cur > 1000000 ? 1000000 : (int)rl.rlim_cur;
}

/* ---- error paths ---------------------------------------------------------- */

static void test_errors(void) {
    char b[8] = {0};
    /* negative fds */
    CHECK_EQ(co_read(-1, b, 1, CO_FOREVER), -EBADF);
    CHECK_EQ(co_write(-1, b, 1, CO_FOREVER), -EBADF);
    CHECK_EQ(co_accept(-1, NULL, NULL, CO_FOREVER), -EBADF);
    struct sockaddr_in a = {.sin_family = AF_INET};
    CHECK_EQ(co_connect(-1, (struct sockaddr *)&a, sizeof a, CO_FOREVER), -EBADF);
    CHECK_EQ(co_wait_fd(-1, CO_READABLE, CO_FOREVER), -EBADF);
    CHECK_EQ(co_close(-1), -EBADF);
    /* an fd number that is not open */
    int sp[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    int dead = dup(sp[0]);
    close(dead); /* never used with co_*: a plain close is fine */
    CHECK_EQ(co_read(dead, b, 1, CO_FOREVER), -EBADF);
    CHECK_EQ(co_write(dead, b, 1, CO_FOREVER), -EBADF);
    CHECK_EQ(co_wait_fd(dead, CO_WRITABLE, CO_FOREVER), -EBADF);
    CHECK_EQ(co_close(dead), -EBADF);
    CHECK_EQ(co_close(1 << 30), -EBADF); /* beyond the table */
    CHECK_EQ(co_read(1 << 30, b, 1, 0), -EBADF);
    /* invalid arguments */
    CHECK_EQ(co_read(sp[0], NULL, 1, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_write(sp[0], NULL, 1, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_read(sp[0], b, (size_t)SSIZE_MAX + 1, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_write(sp[0], b, (size_t)SSIZE_MAX + 1, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_accept(sp[0], (struct sockaddr *)&a, NULL, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_connect(sp[0], NULL, 0, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_wait_fd(sp[0], 0, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_wait_fd(sp[0], 4, CO_FOREVER), CO_EINVAL);
    /* zero lengths */
    CHECK_EQ(co_read(sp[0], NULL, 0, CO_FOREVER), 0);
    CHECK_EQ(co_write(sp[0], NULL, 0, CO_FOREVER), 0);
    /* the syscall's own errors come back as -errno */
    CHECK_EQ(co_accept(sp[0], NULL, NULL, 0), -EINVAL); /* not listening */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_EQ(co_accept(lfd, NULL, NULL, 0), -EINVAL);
    CHECK_EQ(co_connect(sp[0], (struct sockaddr *)&a, sizeof a, 0), -EINVAL); /* wrong family for AF_UNIX? */
    co_close(lfd);
    /* a peer that is gone: EOF on read, EPIPE (and no SIGPIPE) on write */
    CHECK_EQ(co_close(sp[1]), 0);
    CHECK_EQ(co_read(sp[0], b, sizeof b, CO_FOREVER), 0);
    CHECK_EQ(co_write(sp[0], "x", 1, CO_FOREVER), -EPIPE);
    CHECK_EQ(co_wait_fd(sp[0], CO_READABLE, CO_FOREVER), CO_READABLE);
    /* double close */
    CHECK_EQ(co_close(sp[0]), 0);
    CHECK_EQ(co_close(sp[0]), -EBADF);
    CHECK(!fd_open(sp[0]));
    /* connection refused: a port we just closed */
    int port;
    int l = listen_tcp(&port);
    close(l);
    CHECK_EQ(connect_tcp(port, co_deadline_after(2000 * MS)), -ECONNREFUSED);
}

/* A connect that cannot complete: the listener's accept queue is full, so
 * the kernel drops our SYN and our deadline passes first. */
static void test_connect_timeout(void) {
    int before = count_fds();
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 0) == 0);
    socklen_t al = sizeof a;
    getsockname(l, (struct sockaddr *)&a, &al);
    int filler[4], nf = 0, rc = 0;
    /* fill the queue (never accepted) until a connect times out */
    for (int i = 0; i < 4; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        rc = co_connect(fd, (struct sockaddr *)&a, sizeof a, co_deadline_after(50 * MS));
        filler[nf++] = fd;
        if (rc == CO_ETIMEDOUT)
            break;
        CHECK_EQ(rc, 0);
    }
    CHECK_EQ(rc, CO_ETIMEDOUT);
    /* a past deadline gives up at once too */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_EQ(co_connect(fd, (struct sockaddr *)&a, sizeof a, 0), CO_ETIMEDOUT);
    co_close(fd);
    for (int i = 0; i < nf; i++)
        CHECK_EQ(co_close(filler[i]), 0);
    co_close(l);
    CHECK_EQ(count_fds(), before);
}

/* Regular files cannot be polled: the calls fall back to plain syscalls. */
static void test_regular_file(void) {
    char path[] = "/tmp/colony_io_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    CHECK_EQ(co_write(fd, "hello", 5, CO_FOREVER), 5);
    CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
    char b[8] = {0};
    CHECK_EQ(co_read(fd, b, sizeof b, CO_FOREVER), 5);
    CHECK(memcmp(b, "hello", 5) == 0);
    CHECK_EQ(co_wait_fd(fd, CO_READABLE | CO_WRITABLE, 0), CO_READABLE | CO_WRITABLE);
    CHECK_EQ(co_close(fd), 0);
    CHECK(!fd_open(fd));
}

/* ---- ping-pong ------------------------------------------------------------- */

typedef struct {
    int fd, rounds, first;
    co_waitgroup_t *wg;
    int64_t sum;
    int err;
} pp_t;

/* A (first) sends v and expects v + 1 back; B answers every value + 1. */
static void pinger(void *arg) {
    pp_t *p = arg;
    int64_t v = 0, got;
    for (int i = 0; i < p->rounds; i++) {
        if (p->first) {
            if (co_write(p->fd, &v, sizeof v, CO_FOREVER) != sizeof v ||
                co_read(p->fd, &got, sizeof got, CO_FOREVER) != sizeof got)
                break;
            if (got != v + 1)
                p->err++;
            v = got + 1;
        } else {
            if (co_read(p->fd, &got, sizeof got, CO_FOREVER) != sizeof got)
                break;
            got++;
            if (co_write(p->fd, &got, sizeof got, CO_FOREVER) != sizeof got)
                break;
        }
        p->sum++;
    }
    co_waitgroup_done(p->wg);
}

static void pingpong(int a, int b, int rounds) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    pp_t x = {.fd = a, .rounds = rounds, .first = 1, .wg = &wg};
    pp_t y = {.fd = b, .rounds = rounds, .first = 0, .wg = &wg};
    co_waitgroup_add(&wg, 2);
    CHECK_EQ(co_go(pinger, &x), 0);
    CHECK_EQ(co_go(pinger, &y), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(x.sum, rounds);
    CHECK_EQ(y.sum, rounds);
    CHECK_EQ(x.err, 0);
}

static void test_pingpong_socketpair(void) {
    int before = count_fds();
    int sp[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    pingpong(sp[0], sp[1], scale_small() ? 2000 : 20000);
    CHECK_EQ(co_close(sp[0]), 0);
    CHECK_EQ(co_close(sp[1]), 0);
    CHECK_EQ(count_fds(), before);
}

static void test_pingpong_tcp(void) {
    int before = count_fds();
    int port;
    int l = listen_tcp(&port);
    CHECK(l >= 0);
    int c = connect_tcp(port, co_deadline_after(5000 * MS));
    CHECK(c >= 0);
    int s = co_accept(l, NULL, NULL, co_deadline_after(5000 * MS));
    CHECK(s >= 0);
    int fl = fcntl(s, F_GETFL), fdf = fcntl(s, F_GETFD);
    CHECK(fl & O_NONBLOCK);   /* accepted fds are non-blocking */
    CHECK(fdf & FD_CLOEXEC);  /* and close-on-exec */
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pingpong(c, s, scale_small() ? 1000 : 10000);
    CHECK_EQ(co_close(c), 0);
    CHECK_EQ(co_close(s), 0);
    CHECK_EQ(co_close(l), 0);
    CHECK_EQ(count_fds(), before);
}

/* ---- deadlines ------------------------------------------------------------- */

typedef struct {
    int fd;
    int64_t rc;
    co_waitgroup_t wg;
} one_t;

static void read_with_deadline(void *arg) {
    one_t *o = arg;
    char b[4];
    o->rc = co_read(o->fd, b, sizeof b, co_deadline_after(30 * MS));
    co_waitgroup_done(&o->wg);
}

static void test_deadlines(void) {
    int sp[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    char b[64];
    /* from a coroutine */
    one_t o = {.fd = sp[0], .wg = CO_WAITGROUP_INIT};
    co_waitgroup_add(&o.wg, 1);
    co_go(read_with_deadline, &o);
    co_waitgroup_wait(&o.wg);
    CHECK_EQ(o.rc, CO_ETIMEDOUT);
    /* from this plain thread */
    int64_t t0 = co_now();
    CHECK_EQ(co_read(sp[0], b, sizeof b, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    CHECK(co_now() - t0 >= 20 * MS);
    /* a past deadline means "try once": no data -> timeout, data -> data */
    CHECK_EQ(co_read(sp[0], b, sizeof b, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_wait_fd(sp[0], CO_READABLE, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_wait_fd(sp[0], CO_READABLE, co_deadline_after(10 * MS)), CO_ETIMEDOUT);
    CHECK_EQ(co_write(sp[1], "abc", 3, 0), 3);
    CHECK_EQ(co_wait_fd(sp[0], CO_READABLE, 0), CO_READABLE);
    CHECK_EQ(co_wait_fd(sp[0], CO_READABLE | CO_WRITABLE, 0), CO_READABLE | CO_WRITABLE);
    CHECK_EQ(co_read(sp[0], b, sizeof b, 0), 3);
    CHECK_EQ(co_wait_fd(sp[0], CO_READABLE | CO_WRITABLE, 0), CO_WRITABLE);
    /* a writer whose peer never reads: the buffer fills, the deadline hits */
    size_t big = 8 << 20;
    char *blob = calloc(1, big);
    CHECK_EQ(co_write(sp[0], blob, big, co_deadline_after(30 * MS)), CO_ETIMEDOUT);
    CHECK_EQ(co_write(sp[0], blob, big, 0), CO_ETIMEDOUT);
    free(blob);
    /* accept with a deadline and nobody connecting */
    int port;
    int l = listen_tcp(&port);
    CHECK_EQ(co_accept(l, NULL, NULL, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    CHECK_EQ(co_accept(l, NULL, NULL, 0), CO_ETIMEDOUT);
    co_close(l);
    co_close(sp[0]);
    co_close(sp[1]);
}

/* ---- close while waiting -------------------------------------------------- */

typedef struct {
    int fd;
    int mode; /* 0 read, 1 write (into a full buffer), 2 wait_fd, 3 accept */
    volatile int parked;
    int64_t rc;
    co_waitgroup_t *wg;
} waiter_t;

static void do_wait(waiter_t *w) {
    char b[16];
    __atomic_store_n(&w->parked, 1, __ATOMIC_RELEASE);
    switch (w->mode) {
    case 0: w->rc = co_read(w->fd, b, sizeof b, CO_FOREVER); break;
    case 1: {
        size_t big = 16 << 20;
        char *blob = calloc(1, big);
        w->rc = co_write(w->fd, blob, big, CO_FOREVER);
        free(blob);
        break;
    }
    case 2: w->rc = co_wait_fd(w->fd, CO_READABLE, CO_FOREVER); break;
    case 3: w->rc = co_accept(w->fd, NULL, NULL, CO_FOREVER); break;
    }
}

static void waiter_co(void *arg) {
    waiter_t *w = arg;
    do_wait(w);
    co_waitgroup_done(w->wg);
}

static void *waiter_thread(void *arg) {
    do_wait(arg);
    return NULL;
}

/* Until every operation of the test is parked on the netpoller. */
static void wait_parked(void) {
    while (!co__netpoll_has_waiters())
        usleep(1000);
}

static void closer_co(void *arg) {
    waiter_t *w = arg;
    wait_parked();
    CHECK_EQ(co_close(w->fd), 0);
    co_waitgroup_done(w->wg);
}

static void *closer_thread(void *arg) {
    waiter_t *w = arg;
    wait_parked();
    CHECK_EQ(co_close(w->fd), 0);
    return NULL;
}

/* waiter: coroutine or thread; closer: coroutine or thread */
static void close_case(int mode, bool waiter_is_thread, bool closer_is_thread) {
    int before = count_fds();
    int sp[2], port = 0, fd;
    if (mode == 3) {
        fd = listen_tcp(&port);
        sp[0] = fd;
        sp[1] = -1;
    } else {
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
        fd = sp[0];
    }
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    waiter_t w = {.fd = fd, .mode = mode, .wg = &wg};
    waiter_t cl = {.fd = fd, .wg = &wg};
    pthread_t tw, tc;
    if (waiter_is_thread) {
        pthread_create(&tw, NULL, waiter_thread, &w);
    } else {
        co_waitgroup_add(&wg, 1);
        co_go(waiter_co, &w);
    }
    while (!__atomic_load_n(&w.parked, __ATOMIC_ACQUIRE))
        usleep(1000);
    if (closer_is_thread) {
        pthread_create(&tc, NULL, closer_thread, &cl);
    } else {
        co_waitgroup_add(&wg, 1);
        co_go(closer_co, &cl);
    }
    if (waiter_is_thread)
        pthread_join(tw, NULL);
    if (closer_is_thread)
        pthread_join(tc, NULL);
    co_waitgroup_wait(&wg);
    if (mode == 1) {
        /* a write cut by the close says how much went out: the peer gets
         * exactly that, then the end of the stream */
        CHECK(w.rc > 0 && w.rc < (16 << 20));
        CHECK_EQ(drain_count(sp[1]), w.rc);
    } else {
        CHECK_EQ(w.rc, CO_ECLOSED);
    }
    CHECK(!fd_open(fd) || fd == sp[1]);
    if (sp[1] >= 0)
        CHECK_EQ(co_close(sp[1]), 0);
    CHECK_EQ(count_fds(), before);
}

static void test_close_while_waiting(void) {
    for (int mode = 0; mode < 4; mode++)
        for (int wt = 0; wt < 2; wt++)
            for (int ct = 0; ct < 2; ct++) {
                close_case(mode, wt, ct);
                if (t_cur_failed) {
                    fprintf(stderr, "   (mode %d waiter %s closer %s)\n", mode,
                            wt ? "thread" : "coroutine", ct ? "thread" : "coroutine");
                    return;
                }
            }
}

/* How many coroutines co_dump shows parked on I/O. */
static int io_waiting(void) {
    char *d = t_dump();
    int n = d ? t_count(d, "[waiting, IO wait") : -1;
    free(d);
    return n;
}

/* Several coroutines parked on one fd are all woken by one co_close, and an
 * operation started after it fails at once. */
static void test_close_many_waiters(void) {
    int before = count_fds();
    int sp[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    enum { N = 16 };
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    waiter_t w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (waiter_t){.fd = sp[0], .mode = i % 3 == 2 ? 2 : 0, .wg = &wg};
        co_waitgroup_add(&wg, 1);
        co_go(waiter_co, &w[i]);
    }
    /* all N parked on the poller (co_dump shows them waiting on I/O): a
     * fixed sleep after their `parked` flags was not enough on a loaded
     * machine, and an operation that starts after the close fails with
     * -EBADF, not CO_ECLOSED */
    for (int i = 0; i < 10000 && io_waiting() < N; i++) usleep(1000);
    CHECK_EQ(io_waiting(), N);
    CHECK_EQ(co_close(sp[0]), 0);
    co_waitgroup_wait(&wg);
    for (int i = 0; i < N; i++)
        CHECK_EQ(w[i].rc, CO_ECLOSED);
    CHECK(!fd_open(sp[0]));
    co_close(sp[1]);
    CHECK_EQ(count_fds(), before);
}

/* ---- many connections ------------------------------------------------------- */

typedef struct {
    int fd;
    co_waitgroup_t *wg;
} conn_t;

static void echo_conn(void *arg) {
    conn_t *c = arg;
    char b[256];
    for (;;) {
        ssize_t n = co_read(c->fd, b, sizeof b, co_deadline_after(10000 * MS));
        if (n <= 0)
            break;
        if (co_write(c->fd, b, (size_t)n, co_deadline_after(10000 * MS)) != n)
            break;
    }
    co_close(c->fd);
    co_waitgroup_done(c->wg);
    free(c);
}

typedef struct {
    int lfd, expect;
    co_waitgroup_t *conns;
    co_waitgroup_t *done;
    int accepted;
} acceptor_t;

static void acceptor(void *arg) {
    acceptor_t *a = arg;
    while (a->accepted < a->expect) {
        int fd = co_accept(a->lfd, NULL, NULL, co_deadline_after(20000 * MS));
        if (fd < 0) {
            fprintf(stderr, "accept: %s\n", co_strerror(fd));
            break;
        }
        conn_t *c = malloc(sizeof *c);
        c->fd = fd;
        c->wg = a->conns;
        co_waitgroup_add(a->conns, 1);
        co_go(echo_conn, c);
        a->accepted++;
    }
    co_waitgroup_done(a->done);
}

typedef struct {
    int port, id, rounds;
    int ok;
    co_waitgroup_t *wg;
} client_t;

static void client_once(client_t *c) {
    int fd = connect_tcp(c->port, co_deadline_after(20000 * MS));
    if (fd < 0) {
        fprintf(stderr, "client %d connect: %s\n", c->id, co_strerror(fd));
        return;
    }
    char msg[64], got[64];
    int good = 1;
    for (int r = 0; r < c->rounds && good; r++) {
        int n = snprintf(msg, sizeof msg, "client %d round %d", c->id, r);
        if (co_write(fd, msg, (size_t)n, co_deadline_after(20000 * MS)) != n) {
            good = 0;
            break;
        }
        int have = 0;
        while (have < n) {
            ssize_t k = co_read(fd, got + have, (size_t)(n - have), co_deadline_after(20000 * MS));
            if (k <= 0) {
                good = 0;
                break;
            }
            have += (int)k;
        }
        if (good && memcmp(msg, got, (size_t)n) != 0)
            good = 0;
    }
    c->ok = good;
    co_close(fd);
}

static void client_co(void *arg) {
    client_t *c = arg;
    client_once(c);
    co_waitgroup_done(c->wg);
}

static void *client_thread(void *arg) {
    client_once(arg);
    return NULL;
}

/* nco coroutine clients and nth thread clients against a coroutine server */
static void run_clients(int nco, int nth, int rounds) {
    int before = count_fds();
    int cnt_before = co_count();
    int port;
    int l = listen_tcp(&port);
    CHECK(l >= 0);
    co_waitgroup_t conns = CO_WAITGROUP_INIT, done = CO_WAITGROUP_INIT, cl = CO_WAITGROUP_INIT;
    acceptor_t a = {.lfd = l, .expect = nco + nth, .conns = &conns, .done = &done};
    co_waitgroup_add(&done, 1);
    co_go(acceptor, &a);
    client_t *cs = calloc((size_t)(nco + nth), sizeof *cs);
    pthread_t *ts = calloc((size_t)(nth ? nth : 1), sizeof *ts);
    for (int i = 0; i < nco + nth; i++) {
        cs[i] = (client_t){.port = port, .id = i, .rounds = rounds, .wg = &cl};
        if (i < nco) {
            co_waitgroup_add(&cl, 1);
            CHECK_EQ(co_go(client_co, &cs[i]), 0);
        } else {
            pthread_create(&ts[i - nco], NULL, client_thread, &cs[i]);
        }
    }
    for (int i = 0; i < nth; i++)
        pthread_join(ts[i], NULL);
    co_waitgroup_wait(&cl);
    co_waitgroup_wait(&done);
    co_waitgroup_wait(&conns);
    int ok = 0;
    for (int i = 0; i < nco + nth; i++)
        ok += cs[i].ok;
    CHECK_EQ(ok, nco + nth);
    CHECK_EQ(a.accepted, nco + nth);
    free(cs);
    free(ts);
    CHECK_EQ(co_close(l), 0);
    CHECK_EQ(count_fds(), before);
    /* every coroutine of this test has returned (co_count may lag: up to
     * 1000 handlers may still be on their way out, so allow up to 10 s on
     * a loaded machine; it ends as soon as the count is back) */
    for (int i = 0; i < 1000 && co_count() > cnt_before; i++)
        usleep(10000);
    CHECK(co_count() <= cnt_before);
}

static void test_1000_connections(void) {
    raise_nofile();
    int n = scale_small() ? 200 : 1000;
    if (nofile() < 2 * n + 64)
        n = (nofile() - 64) / 2;
    run_clients(n, 0, 3);
}

static void test_thread_coroutine_mix(void) {
    run_clients(scale_small() ? 20 : 100, 8, 20);
}

/* A plain-thread server (blocking co_* calls) with coroutine clients. */
typedef struct {
    int lfd, n;
} tserver_t;

static void *thread_server(void *arg) {
    tserver_t *t = arg;
    for (int i = 0; i < t->n; i++) {
        int fd = co_accept(t->lfd, NULL, NULL, co_deadline_after(20000 * MS));
        if (fd < 0)
            break;
        char b[128];
        ssize_t k;
        while ((k = co_read(fd, b, sizeof b, co_deadline_after(20000 * MS))) > 0)
            if (co_write(fd, b, (size_t)k, CO_FOREVER) != k)
                break;
        co_close(fd);
    }
    return NULL;
}

static void test_thread_server(void) {
    int before = count_fds();
    int port;
    int l = listen_tcp(&port);
    enum { N = 10 };
    tserver_t t = {.lfd = l, .n = N};
    pthread_t th;
    pthread_create(&th, NULL, thread_server, &t);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    client_t cs[N];
    for (int i = 0; i < N; i++) {
        cs[i] = (client_t){.port = port, .id = i, .rounds = 10, .wg = &wg};
        co_waitgroup_add(&wg, 1);
        co_go(client_co, &cs[i]);
        co_waitgroup_wait(&wg); /* one at a time: the server is sequential */
        CHECK(cs[i].ok);
    }
    pthread_join(th, NULL);
    co_close(l);
    CHECK_EQ(count_fds(), before);
}

/* ---- half-close, reset, write-all ------------------------------------------- */

static void big_writer(void *arg) {
    one_t *o = arg;
    size_t big = 4 << 20;
    unsigned char *blob = malloc(big);
    for (size_t i = 0; i < big; i++)
        blob[i] = (unsigned char)(i * 7);
    o->rc = co_write(o->fd, blob, big, co_deadline_after(30000 * MS));
    shutdown(o->fd, SHUT_WR);
    free(blob);
    co_waitgroup_done(&o->wg);
}

static void test_write_all_and_half_close(void) {
    int sp[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    one_t o = {.fd = sp[0], .wg = CO_WAITGROUP_INIT};
    co_waitgroup_add(&o.wg, 1);
    co_go(big_writer, &o);
    size_t total = 0;
    int bad = 0;
    unsigned char b[65536];
    for (;;) {
        ssize_t n = co_read(sp[1], b, sizeof b, co_deadline_after(30000 * MS));
        if (n <= 0) {
            CHECK_EQ(n, 0); /* EOF after the writer's shutdown */
            break;
        }
        for (ssize_t i = 0; i < n; i++)
            bad += b[i] != (unsigned char)((total + (size_t)i) * 7);
        total += (size_t)n;
    }
    co_waitgroup_wait(&o.wg);
    CHECK_EQ(o.rc, 4 << 20);
    CHECK_EQ(total, 4 << 20);
    CHECK_EQ(bad, 0);
    /* half-closed: we can still write back */
    CHECK_EQ(co_write(sp[1], "back", 4, CO_FOREVER), 4);
    char r[4];
    CHECK_EQ(co_read(sp[0], r, 4, CO_FOREVER), 4);
    co_close(sp[0]);
    co_close(sp[1]);
}

static void test_reset(void) {
    int port;
    int l = listen_tcp(&port);
    int c = connect_tcp(port, co_deadline_after(5000 * MS));
    int s = co_accept(l, NULL, NULL, co_deadline_after(5000 * MS));
    CHECK(c >= 0 && s >= 0);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    CHECK_EQ(co_close(c), 0); /* RST */
    char b[8];
    CHECK_EQ(co_read(s, b, sizeof b, co_deadline_after(5000 * MS)), -ECONNRESET);
    co_close(s);
    co_close(l);
}

/* ---- short reads that did not drain the buffer ------------------------------- */

/* After a short read of a byte stream, co_read may wait for the next edge
 * without trying read(2) (docs/io.md, "No read(2) that must fail"). That
 * holds only where a short read means an empty buffer; here it does not,
 * and the second read must return the bytes already there at once instead
 * of waiting for an edge that never comes: a packet-mode pipe (one read,
 * one write), TCP urgent data (a read stops at the mark), and a Unix
 * stream socket (a read stops after a segment carrying SCM_RIGHTS). An M
 * sleeps in the poller meanwhile (a sleeping coroutine), as in a server. */
static _Atomic int sr_stop;
static void sr_sleeper(void *arg) {
    while (!atomic_load(&sr_stop)) co_sleep(20 * MS);
}
static void sr_expect(int r, int w, const char *want1, const char *want2, const char *what) {
    char b[100];
    ssize_t n1 = co_read(r, b, sizeof b, co_deadline_after(5000 * MS));
    CHECK_EQ(n1, (ssize_t)strlen(want1));
    if (n1 > 0) CHECK(memcmp(b, want1, (size_t)n1) == 0);
    ssize_t n2 = co_read(r, b, sizeof b, co_deadline_after(2000 * MS));
    if (n2 != (ssize_t)strlen(want2)) fprintf(stderr, "  %s: second read %zd\n", what, n2);
    CHECK_EQ(n2, (ssize_t)strlen(want2));
    if (n2 > 0) CHECK(memcmp(b, want2, (size_t)n2) == 0);
    (void)w;
}
static void test_short_read_not_drained(void) {
    int before = count_fds();
    atomic_store(&sr_stop, 0);
    CHECK_EQ(co_go(sr_sleeper, NULL), 0);
    struct timespec settle = {0, 20 * 1000 * 1000};
    char b[8];
    for (int round = 0; round < 3; round++) {
        /* a packet-mode pipe */
        int p[2];
        CHECK_EQ(pipe2(p, O_DIRECT | O_CLOEXEC), 0);
        CHECK_EQ(co_read(p[0], b, sizeof b, 0), CO_ETIMEDOUT); /* first use: registered */
        CHECK_EQ(write(p[1], "ab", 2), 2);
        CHECK_EQ(write(p[1], "cd", 2), 2);
        nanosleep(&settle, NULL);
        sr_expect(p[0], p[1], "ab", "cd", "O_DIRECT pipe");
        co_close(p[0]);
        co_close(p[1]);

        /* TCP urgent data */
        int port, l = listen_tcp(&port);
        CHECK(l >= 0);
        int c = connect_tcp(port, co_deadline_after(5000 * MS));
        int s = co_accept(l, NULL, NULL, co_deadline_after(5000 * MS));
        CHECK(c >= 0 && s >= 0);
        CHECK_EQ(co_read(s, b, sizeof b, 0), CO_ETIMEDOUT);
        CHECK_EQ(send(c, "abc", 3, 0), 3);
        CHECK_EQ(send(c, "X", 1, MSG_OOB), 1);
        CHECK_EQ(send(c, "def", 3, 0), 3);
        nanosleep(&settle, NULL);
        sr_expect(s, c, "abc", "def", "TCP urgent");
        co_close(c);
        co_close(s);
        co_close(l);

        /* a Unix stream socket, a segment with SCM_RIGHTS first */
        int sp[2];
        CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
        CHECK_EQ(co_read(sp[0], b, sizeof b, 0), CO_ETIMEDOUT);
        int passed = dup(1);
        char cbuf[CMSG_SPACE(sizeof(int))];
        memset(cbuf, 0, sizeof cbuf);
        struct iovec iov = {.iov_base = "AAA", .iov_len = 3};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                            .msg_controllen = sizeof cbuf};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &passed, sizeof(int));
        CHECK_EQ(sendmsg(sp[1], &mh, 0), 3);
        close(passed);
        CHECK_EQ(write(sp[1], "BBB", 3), 3);
        nanosleep(&settle, NULL);
        sr_expect(sp[0], sp[1], "AAA", "BBB", "Unix SCM_RIGHTS");
        co_close(sp[0]);
        co_close(sp[1]);
    }
    atomic_store(&sr_stop, 1);
    CHECK_EQ(count_fds(), before);
}

/* An fd from co_accept closed with close(2) before any other co_* call:
 * the next file to take its number is set up as any other (a blocking
 * pipe: co_read used to block the thread past its deadline), and a
 * non-blocking one that is no socket is written with write(2) (co_write
 * used to answer -ENOTSOCK). */
static void test_accepted_then_plain_close(void) {
    int before = count_fds();
    int port, l = listen_tcp(&port);
    CHECK(l >= 0);
    for (int round = 0; round < 2; round++) {
        int c = connect_tcp(port, co_deadline_after(5000 * MS));
        int s = co_accept(l, NULL, NULL, co_deadline_after(5000 * MS));
        CHECK(c >= 0 && s >= 0);
        int q[2], r, w;
        if (round == 0) {
            close(s); /* plain close: never used with co_* */
            CHECK_EQ(pipe2(q, O_CLOEXEC), 0);
            r = q[0];
            w = q[1];
        } else {
            CHECK_EQ(pipe2(q, O_CLOEXEC | O_NONBLOCK), 0);
            close(s); /* plain close, then the pipe's write end takes the number */
            CHECK_EQ(dup3(q[1], s, O_CLOEXEC), s);
            close(q[1]);
            r = q[0];
            w = s;
        }
        if (round == 0) {
            CHECK_EQ(r, s); /* the lowest free number */
            char b[8];
            int64_t t0 = co_now();
            CHECK_EQ(co_read(r, b, sizeof b, co_deadline_after(50 * MS)), CO_ETIMEDOUT);
            CHECK(co_now() - t0 < 5000 * MS);
        } else {
            CHECK_EQ(co_write(w, "hi", 2, co_deadline_after(5000 * MS)), 2);
            char b[8];
            CHECK_EQ(co_read(r, b, sizeof b, co_deadline_after(5000 * MS)), 2);
        }
        co_close(r);
        co_close(w);
        co_close(c);
    }
    co_close(l);
    CHECK_EQ(count_fds(), before);
}

/* The same with a non-blocking datagram socket taking the number: it is no
 * TCP stream, so a short read says nothing about what is queued. co_read
 * used to inherit the listener's TCP flag, take the first datagram's short
 * read for "drained" and wait for an edge that never came, with the second
 * datagram queued. In a coroutine that slept, so that the poller has been
 * visited lately (the skip's condition). */
typedef struct {
    int ok;
    co_waitgroup_t *wg;
} adg_t;
static void accepted_then_dgram(void *arg) {
    adg_t *a = arg;
    int port, l = listen_tcp(&port);
    int c = connect_tcp(port, co_deadline_after(5000 * MS));
    int s = co_accept(l, NULL, NULL, co_deadline_after(5000 * MS));
    CHECK(l >= 0 && c >= 0 && s >= 0);
    close(s); /* plain close: never used with co_* */
    int dg[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, dg), 0);
    CHECK_EQ(dg[0], s); /* the lowest free number */
    CHECK_EQ(co_wait_fd(dg[0], CO_WRITABLE, co_deadline_after(5000 * MS)), CO_WRITABLE);
    CHECK_EQ(send(dg[1], "one", 3, 0), 3);
    CHECK_EQ(send(dg[1], "two", 3, 0), 3);
    co_sleep(2 * MS);
    char b[64];
    CHECK_EQ(co_read(dg[0], b, sizeof b, co_deadline_after(5000 * MS)), 3);
    CHECK_EQ(co_read(dg[0], b, sizeof b, co_deadline_after(5000 * MS)), 3);
    CHECK(memcmp(b, "two", 3) == 0);
    co_close(dg[0]);
    co_close(dg[1]);
    co_close(c);
    co_close(l);
    a->ok = 1;
    co_waitgroup_done(a->wg);
}

static void test_accepted_then_dgram(void) {
    int before = count_fds();
    for (int round = 0; round < 3; round++) {
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        adg_t a = {.ok = 0, .wg = &wg};
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(accepted_then_dgram, &a), 0);
        co_waitgroup_wait(&wg);
        CHECK(a.ok);
    }
    CHECK_EQ(count_fds(), before);
}

/* A socket whose protocol number is 6 but which is no TCP stream (a
 * NETLINK_XFRM socket: 6 is IPPROTO_TCP only in the IP families): two
 * queued messages, two reads. Taken for TCP, its first short read would
 * read as "drained" and the second wait for an edge that never comes.
 * Skipped where netlink sockets cannot be made or bound. */
typedef struct {
    int a, b;
    unsigned bport;
    int ok;
    co_waitgroup_t *wg;
} p6_t;
static void proto6_reader(void *arg) {
    p6_t *t = arg;
    char buf[4096];
    (void)co_read(t->b, buf, sizeof buf, 0); /* registered now: a try */
    co_sleep(2 * MS);
    struct sockaddr_nl to = {.nl_family = AF_NETLINK, .nl_pid = t->bport};
    char msg[64] = {0};
    struct nlmsghdr *h = (struct nlmsghdr *)msg;
    h->nlmsg_len = sizeof msg;
    h->nlmsg_type = 0x20;
    for (int i = 0; i < 2; i++)
        CHECK_EQ(sendto(t->a, msg, sizeof msg, 0, (struct sockaddr *)&to, sizeof to),
                 (ssize_t)sizeof msg);
    co_sleep(2 * MS);
    CHECK_EQ(co_read(t->b, buf, sizeof buf, co_deadline_after(5000 * MS)), (ssize_t)sizeof msg);
    CHECK_EQ(co_read(t->b, buf, sizeof buf, co_deadline_after(5000 * MS)), (ssize_t)sizeof msg);
    t->ok = 1;
    co_waitgroup_done(t->wg);
}
static void test_proto6_not_tcp(void) {
    int a = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_XFRM);
    int b = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_XFRM);
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    socklen_t l = sizeof sa;
    if (a < 0 || b < 0 || bind(a, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        bind(b, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(b, (struct sockaddr *)&sa, &l) != 0) {
        fprintf(stderr, "   (no NETLINK_XFRM sockets here: skipped)\n");
        if (a >= 0) close(a);
        if (b >= 0) close(b);
        return;
    }
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    p6_t t = {.a = a, .b = b, .bport = sa.nl_pid, .ok = 0, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(proto6_reader, &t), 0);
    co_waitgroup_wait(&wg);
    CHECK(t.ok);
    close(a);
    co_close(b);
}

/* co_shutdown while a plain thread waits in co_read (or is anywhere in an
 * I/O call): CO_EBUSY, and the thread is woken by its data afterwards. It
 * used to return 0 and close the poller under the thread, which then
 * slept past its data for good. */
typedef struct {
    int fd;
    ssize_t got;
} tw_t;
static void *thread_reader(void *arg) {
    tw_t *t = arg;
    char c;
    t->got = co_read(t->fd, &c, 1, co_deadline_after(20000 * MS));
    return NULL;
}
static void test_shutdown_while_thread_waits(void) {
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    for (int round = 0; round < 3; round++) {
        tw_t t = {.fd = sp[0], .got = -1};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, thread_reader, &t), 0);
        for (int i = 0; i < 10000 && !co__netpoll_has_waiters(); i++) usleep(1000);
        CHECK(co__netpoll_has_waiters());
        CHECK_EQ(co_shutdown(), CO_EBUSY);
        CHECK_EQ(co_write(sp[1], "x", 1, co_deadline_after(5000 * MS)), 1);
        pthread_join(th, NULL);
        CHECK_EQ(t.got, 1);
    }
    co_close(sp[0]);
    co_close(sp[1]);
}

/* Whole writes never interleave (Go's Write holds the fd's write lock): 6
 * coroutines and 2 plain threads each write one frame of 256 KiB, more
 * than the socket buffers hold, of their own byte to one socket; the
 * reader sees 8 runs, one per frame. They used to come out mixed. */
#define WF_SIZE (256 * 1024)
#define WF_N 8
typedef struct {
    int fd;
    int id;
    ssize_t rc;
    co_waitgroup_t *wg;
} wf_t;
static void wf_write(wf_t *w) {
    char *b = malloc(WF_SIZE);
    memset(b, 'a' + w->id, WF_SIZE);
    w->rc = co_write(w->fd, b, WF_SIZE, co_deadline_after(20000 * MS));
    free(b);
}
static void wf_co(void *arg) {
    wf_t *w = arg;
    wf_write(w);
    co_waitgroup_done(w->wg);
}
static void *wf_thread(void *arg) {
    wf_t *w = arg;
    wf_write(w);
    co_waitgroup_done(w->wg);
    return NULL;
}
static void test_whole_writes(void) {
    int before = count_fds();
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    for (int round = 0; round < 3; round++) {
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        wf_t w[WF_N];
        pthread_t th[2];
        co_waitgroup_add(&wg, WF_N);
        for (int i = 0; i < WF_N; i++) {
            w[i] = (wf_t){.fd = sp[0], .id = i, .rc = -1, .wg = &wg};
            if (i < 2)
                CHECK_EQ(pthread_create(&th[i], NULL, wf_thread, &w[i]), 0);
            else
                CHECK_EQ(co_go(wf_co, &w[i]), 0);
        }
        char *all = malloc((size_t)WF_SIZE * WF_N);
        size_t got = 0;
        while (got < (size_t)WF_SIZE * WF_N) {
            ssize_t n = co_read(sp[1], all + got, (size_t)WF_SIZE * WF_N - got,
                                co_deadline_after(20000 * MS));
            CHECK(n > 0);
            if (n <= 0) break;
            got += (size_t)n;
        }
        co_waitgroup_wait(&wg);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < WF_N; i++) CHECK_EQ(w[i].rc, WF_SIZE);
        int runs = got ? 1 : 0, seen[WF_N] = {0};
        for (size_t i = 1; i < got; i++) runs += all[i] != all[i - 1];
        for (int k = 0; k < WF_N && got == (size_t)WF_SIZE * WF_N; k++) {
            int id = all[(size_t)k * WF_SIZE] - 'a';
            CHECK(id >= 0 && id < WF_N && !seen[id]);
            if (id >= 0 && id < WF_N) seen[id] = 1;
        }
        CHECK_EQ(got, (size_t)WF_SIZE * WF_N);
        CHECK_EQ(runs, WF_N);
        free(all);
    }
    co_close(sp[0]);
    co_close(sp[1]);
    CHECK_EQ(count_fds(), before);
}

/* Waiting for the write lock: a deadline that passes first gives
 * CO_ETIMEDOUT with nothing written, a co_close gives CO_ECLOSED. A
 * writer holds the lock, stuck: nobody reads the other end; the close
 * cuts its write, which returns how much went out. */
static void wl_holder(void *arg) {
    wf_t *w = arg;
    char *b = calloc(1, 4 << 20);
    w->rc = co_write(w->fd, b, 4 << 20, co_deadline_after(20000 * MS));
    free(b);
    co_waitgroup_done(w->wg);
}
static void test_write_lock_wait(void) {
    int before = count_fds();
    int sp[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    wf_t h = {.fd = sp[0], .rc = 0, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(wl_holder, &h), 0);
    /* the holder is parked once the buffers are full */
    for (int i = 0; i < 10000 && !co__netpoll_has_waiters(); i++) usleep(1000);
    CHECK(co__netpoll_has_waiters());
    int64_t t0 = co_now();
    CHECK_EQ(co_write(sp[0], "x", 1, co_deadline_after(50 * MS)), CO_ETIMEDOUT);
    CHECK(co_now() - t0 >= 50 * MS);
    CHECK_EQ(co_write(sp[0], "x", 1, 0), CO_ETIMEDOUT); /* a try */
    CHECK_EQ(co_close(sp[0]), 0);
    co_waitgroup_wait(&wg);
    CHECK(h.rc > 0 && h.rc < (4 << 20));
    /* nothing of the refused writes went out: only zero bytes, the
     * holder's, as many as it said */
    char b[4096];
    ssize_t n;
    long nonzero = 0, total = 0;
    while ((n = co_read(sp[1], b, sizeof b, co_deadline_after(5000 * MS))) > 0) {
        total += n;
        for (ssize_t i = 0; i < n; i++) nonzero += b[i] != 0;
    }
    CHECK_EQ(n, 0);
    CHECK_EQ(nonzero, 0);
    CHECK_EQ(total, h.rc);
    co_close(sp[1]);
    CHECK_EQ(count_fds(), before);
}

/* ---- co_close against co_write's lock ---------------------------------------- */

/* A connected TCP pair on 127.0.0.1 with small buffers (the writer's send
 * buffer, the reader's receive buffer), so that a writer fills them soon. */
static int tcp_pair(int *wfd, int *rfd, int buf) {
    int port;
    int l = listen_tcp(&port);
    if (l < 0)
        return -1;
    setsockopt(l, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf); /* the accepted one inherits it */
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0) {
        co_close(l);
        return -1;
    }
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int rc = co_connect(c, (struct sockaddr *)&a, sizeof a, co_deadline_after(5000 * MS));
    int s = rc == 0 ? co_accept(l, NULL, NULL, co_deadline_after(5000 * MS)) : -1;
    co_close(l);
    if (s < 0) {
        co_close(c);
        return -1;
    }
    *wfd = c;
    *rfd = s;
    return 0;
}

/* Reads fd until `limit` bytes came (to its end if limit < 0): the count
 * (or the error that stopped it); *other counts the bytes other than
 * `expect`. */
static long read_counting(int fd, long limit, char expect, long *other) {
    char b[16384];
    long total = 0;
    while (limit < 0 || total < limit) {
        size_t want = sizeof b;
        if (limit >= 0 && (size_t)(limit - total) < want)
            want = (size_t)(limit - total);
        ssize_t n = co_read(fd, b, want, co_deadline_after(20000 * MS));
        if (n < 0)
            return n;
        if (n == 0)
            break;
        for (ssize_t i = 0; i < n; i++) *other += b[i] != expect;
        total += n;
    }
    return total;
}

/* Until cond() holds (10 s at most: the CHECK after it tells). */
#define WAIT_FOR(cond)                                                                        \
    do {                                                                                      \
        for (int wf_i_ = 0; wf_i_ < 10000 && !(cond); wf_i_++) usleep(1000);                  \
    } while (0)

typedef struct {
    int fd;
    char byte;
    size_t len;
    bool close_after; /* co_close(fd) once the write returned */
    ssize_t rc;
    int close_rc;
    int64_t t_ret;   /* co_now() when co_write returned */
    int64_t t_close; /* co_now() just before the co_close */
    co_waitgroup_t *wg;
} cw_t;
static void cw_write(cw_t *c) {
    char *b = malloc(c->len);
    memset(b, c->byte, c->len);
    c->rc = co_write(c->fd, b, c->len, co_deadline_after(30000 * MS));
    c->t_ret = co_now();
    if (c->close_after) {
        c->t_close = co_now();
        c->close_rc = co_close(c->fd);
    }
    free(b);
}
static void cw_co(void *arg) {
    cw_t *c = arg;
    cw_write(c);
    co_waitgroup_done(c->wg);
}
static void *cw_thread(void *arg) {
    cw_write(arg);
    return NULL;
}

/* A writer holds the lock, parked on a full socket (the peer does not
 * read); another is queued on the lock; co_close. The queued one sends
 * nothing (CO_ECLOSED); the cut one returns how many bytes went out, and
 * the peer gets exactly those, then the end of the stream. It used to get
 * CO_ECLOSED, with a part of its buffer sent and no count. */
static void test_close_cuts_write(void) {
    int before = count_fds();
    for (int a_thread = 0; a_thread < 2; a_thread++) {
        int w, r;
        CHECK_EQ(tcp_pair(&w, &r, 32 * 1024), 0);
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        cw_t a = {.fd = w, .byte = 'a', .len = 1 << 20, .wg = &wg};
        cw_t b = {.fd = w, .byte = 'b', .len = 1000, .wg = &wg};
        pthread_t th;
        if (a_thread) {
            CHECK_EQ(pthread_create(&th, NULL, cw_thread, &a), 0);
        } else {
            co_waitgroup_add(&wg, 1);
            CHECK_EQ(co_go(cw_co, &a), 0);
        }
        bool on = false;
        WAIT_FOR((on = co__netpoll_has_waiters())); /* a: parked, the buffers full */
        CHECK(on);
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(cw_co, &b), 0);
        int want = a_thread ? 1 : 2, parked = 0; /* co_dump shows coroutines only */
        WAIT_FOR((parked = io_waiting()) == want); /* b: queued on the lock */
        CHECK_EQ(parked, want);
        CHECK_EQ(co_close(w), 0);
        if (a_thread)
            pthread_join(th, NULL);
        co_waitgroup_wait(&wg);
        CHECK(a.rc > 0 && a.rc < (ssize_t)a.len);
        CHECK_EQ(b.rc, CO_ECLOSED);
        long other = 0;
        CHECK_EQ(read_counting(r, -1, 'a', &other), a.rc);
        CHECK_EQ(other, 0);
        CHECK_EQ(co_close(r), 0);
        if (t_cur_failed) {
            fprintf(stderr, "   (cut writer: %s)\n", a_thread ? "thread" : "coroutine");
            break;
        }
    }
    CHECK_EQ(count_fds(), before);
}

/* The unlock's wake against co_close. On one P: writer A holds the lock,
 * parked on a full socket; writer B is queued on the lock. The peer takes
 * A's bytes; A's write ends, its unlock wakes B (or an edge woke it), and
 * A closes the fd at once, before B runs (the one P is A's). B must not
 * send now: it used to take the lock and send its whole buffer after
 * co_close had returned. (B may run first only if sysmon lends A's queue
 * to another M while A's thread is descheduled; then its write ends
 * before the close begins, and is whole.) */
static void test_close_after_unlock(void) {
    int before = count_fds();
    CHECK_EQ(T_SHUTDOWN(), 0);
    CHECK_EQ(co_init(&(co_config_t){.procs = 1}), 0);
    CHECK_EQ(co_procs(), 1);
    for (int round = 0; round < 3 && !t_cur_failed; round++) {
        int w, r;
        CHECK_EQ(tcp_pair(&w, &r, 32 * 1024), 0);
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        cw_t a = {.fd = w, .byte = 'a', .len = 1 << 20, .close_after = true, .wg = &wg};
        cw_t b = {.fd = w, .byte = 'b', .len = 1000, .wg = &wg};
        co_waitgroup_add(&wg, 2);
        CHECK_EQ(co_go(cw_co, &a), 0);
        bool on = false;
        WAIT_FOR((on = co__netpoll_has_waiters()));
        CHECK(on);
        CHECK_EQ(co_go(cw_co, &b), 0);
        int parked = 0;
        WAIT_FOR((parked = io_waiting()) == 2);
        CHECK_EQ(parked, 2);
        long other = 0;
        CHECK_EQ(read_counting(r, (long)a.len, 'a', &other), (long)a.len);
        CHECK_EQ(other, 0);
        co_waitgroup_wait(&wg);
        CHECK_EQ(a.rc, (ssize_t)a.len);
        CHECK_EQ(a.close_rc, 0);
        long rest = read_counting(r, -1, 'b', &other);
        bool b_first = b.rc == (ssize_t)b.len && b.t_ret < a.t_close;
        if (b_first) {
            CHECK_EQ(rest, (long)b.len);
        } else {
            CHECK_EQ(b.rc, CO_ECLOSED);
            CHECK_EQ(rest, 0);
        }
        CHECK_EQ(other, 0);
        CHECK_EQ(co_close(r), 0);
    }
    CHECK_EQ(T_SHUTDOWN(), 0);
    CHECK_EQ(co_init(NULL), 0);
    CHECK_EQ(count_fds(), before);
}

/* A storm of framed writes and a co_close: 3 coroutines and 3 threads
 * write frames (header with writer, sequence number and length; payload;
 * checksum) to one TCP socket with small buffers until a call fails; a
 * closer (coroutine or thread) closes it once the peer has read a random
 * amount; the peer reads to the end of the stream. Every frame that
 * arrived is whole, in its writer's order, and was reported written;
 * every write reported whole arrived; the only bytes after the last whole
 * frame are the start of the one write the close cut, as many as its
 * writer was told; no write begun after co_close returned sent a byte. */
#define SF_NW 6
#define SF_MAGIC 0x53464d31u
static uint64_t sf_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* Frame seq of writer id into f (fmax bytes): its length. Deterministic,
 * so the reader rebuilds any frame to compare. */
static size_t sf_build(char *f, int id, uint32_t seq, size_t fmax) {
    uint64_t s = sf_mix(((uint64_t)(uint32_t)id << 32) | seq);
    size_t len = 20 + (size_t)(s % (fmax - 20 + 1));
    uint32_t h[4] = {SF_MAGIC, (uint32_t)id, seq, (uint32_t)len};
    memcpy(f, h, sizeof h);
    for (size_t i = 16; i < len - 4; i += 8) {
        s = sf_mix(s);
        memcpy(f + i, &s, len - 4 - i < 8 ? len - 4 - i : 8);
    }
    uint32_t c = 2166136261u;
    for (size_t i = 0; i < len - 4; i++) c = (c ^ (uint8_t)f[i]) * 16777619u;
    memcpy(f + len - 4, &c, 4);
    return len;
}
typedef struct {
    int fd, id;
    size_t fmax;
    _Atomic int *stop;
    uint32_t ok;          /* frames written whole: sequence numbers 0 to ok - 1 */
    int64_t ok_start;     /* co_now() before the last of them */
    bool ended;           /* a call failed or came back short: */
    ssize_t end_rc;       /* its result, */
    size_t end_len;       /* its frame's length (sequence number ok), */
    int64_t end_start;    /* co_now() before it */
    co_waitgroup_t *wg;
} sf_writer_t;
static void sf_write(sf_writer_t *w) {
    char *f = malloc(w->fmax);
    for (uint32_t seq = 0; !atomic_load(w->stop); seq++) {
        size_t len = sf_build(f, w->id, seq, w->fmax);
        int64_t t = co_now();
        ssize_t rc = co_write(w->fd, f, len, co_deadline_after(30000 * MS));
        if (rc == (ssize_t)len) {
            w->ok++;
            w->ok_start = t;
            continue;
        }
        w->ended = true;
        w->end_rc = rc;
        w->end_len = len;
        w->end_start = t;
        break;
    }
    free(f);
}
static void sf_write_co(void *arg) {
    sf_writer_t *w = arg;
    sf_write(w);
    co_waitgroup_done(w->wg);
}
static void *sf_write_thread(void *arg) {
    sf_write(arg);
    return NULL;
}
typedef struct {
    int fd;
    char *buf;
    size_t len, cap;
    _Atomic long progress;
    ssize_t end; /* what stopped it: 0 at the end of the stream */
    uint64_t rng;
} sf_reader_t;
static void *sf_read(void *arg) {
    sf_reader_t *rd = arg;
    for (int i = 0;; i++) {
        if (rd->cap - rd->len < 8192) {
            rd->cap *= 2;
            rd->buf = realloc(rd->buf, rd->cap);
        }
        rd->rng = sf_mix(rd->rng);
        ssize_t n = co_read(rd->fd, rd->buf + rd->len, 1 + rd->rng % 8192,
                            co_deadline_after(30000 * MS));
        if (n <= 0) {
            rd->end = n;
            break;
        }
        rd->len += (size_t)n;
        atomic_store(&rd->progress, (long)rd->len);
        if (i % 8 == 7)
            usleep(200); /* a slow peer: the writers fill the buffers and park */
    }
    return NULL;
}
typedef struct {
    int fd;
    long target;
    sf_reader_t *rd;
    _Atomic int *stop;
    int rc;
    int64_t t_closed; /* co_now() once co_close returned */
    co_waitgroup_t *wg;
} sf_closer_t;
static void sf_close(sf_closer_t *c, bool co) {
    while (atomic_load(&c->rd->progress) < c->target) {
        if (co)
            co_sleep(100 * 1000);
        else
            usleep(100);
    }
    atomic_store(c->stop, 1);
    c->rc = co_close(c->fd);
    c->t_closed = co_now();
}
static void sf_close_co(void *arg) {
    sf_closer_t *c = arg;
    sf_close(c, true);
    co_waitgroup_done(c->wg);
}
static void *sf_close_thread(void *arg) {
    sf_close(arg, false);
    return NULL;
}
static void sf_check(const sf_reader_t *rd, const sf_writer_t *w, size_t fmax, int64_t t_closed) {
    char *f = malloc(fmax);
    uint32_t next[SF_NW] = {0};
    size_t off = 0;
    bool bad = false;
    while (rd->len - off >= 16) {
        uint32_t h[4];
        memcpy(h, rd->buf + off, sizeof h);
        if (h[0] != SF_MAGIC || h[1] >= SF_NW) {
            bad = true;
            break;
        }
        int id = (int)h[1];
        size_t len = sf_build(f, id, next[id], fmax);
        if (h[2] != next[id] || h[3] != len) {
            bad = true;
            break;
        }
        if (rd->len - off < len)
            break; /* the cut one, if it is the last */
        if (memcmp(rd->buf + off, f, len) != 0) {
            bad = true;
            break;
        }
        next[id]++;
        off += len;
    }
    if (bad)
        fprintf(stderr, "   stream broken at byte %zu of %zu\n", off, rd->len);
    CHECK(!bad);
    int cut = -1, ncut = 0;
    for (int i = 0; i < SF_NW; i++) {
        /* every write reported whole arrived whole, and before the close returned */
        CHECK_EQ(next[i], w[i].ok);
        CHECK(w[i].ok == 0 || w[i].ok_start <= t_closed);
        if (!w[i].ended)
            continue;
        if (w[i].end_rc >= 0) {
            /* cut by the close: how much went out */
            CHECK(w[i].end_rc > 0 && w[i].end_rc < (ssize_t)w[i].end_len);
            CHECK(w[i].end_start <= t_closed);
            cut = i;
            ncut++;
        } else {
            /* refused: by the close, or begun once the fd was gone */
            CHECK(w[i].end_rc == CO_ECLOSED || w[i].end_rc == -EBADF);
        }
    }
    CHECK(ncut <= 1);
    size_t tail = rd->len - off;
    if (!bad && tail > 0) {
        /* the bytes after the last whole frame: the cut write's, as many as it said */
        CHECK_EQ(ncut, 1);
        if (cut >= 0) {
            CHECK_EQ((ssize_t)tail, w[cut].end_rc);
            size_t len = sf_build(f, cut, w[cut].ok, fmax);
            CHECK(tail <= len && memcmp(rd->buf + off, f, tail) == 0);
        }
    } else if (!bad) {
        CHECK_EQ(ncut, 0);
    }
    free(f);
}
static void test_close_write_storm(void) {
    int before = count_fds();
    bool small = t_small();
    int rounds = small ? 6 : 20;
    size_t fmax = small ? 16 * 1024 : 64 * 1024;
    long tmax = small ? 256 * 1024 : 2 << 20;
    uint64_t rng = 0x5eed;
    int cuts = 0;
    for (int round = 0; round < rounds && !t_cur_failed; round++) {
        int wfd, rfd;
        CHECK_EQ(tcp_pair(&wfd, &rfd, 16 * 1024), 0);
        _Atomic int stop = 0;
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        sf_writer_t w[SF_NW];
        pthread_t th[SF_NW], rth, cth;
        rng = sf_mix(rng);
        sf_reader_t rd = {.fd = rfd, .cap = 1 << 20, .rng = rng};
        rd.buf = malloc(rd.cap);
        CHECK_EQ(pthread_create(&rth, NULL, sf_read, &rd), 0);
        for (int i = 0; i < SF_NW; i++) {
            w[i] = (sf_writer_t){.fd = wfd, .id = i, .fmax = fmax, .stop = &stop, .wg = &wg};
            if (i % 2) {
                CHECK_EQ(pthread_create(&th[i], NULL, sf_write_thread, &w[i]), 0);
            } else {
                co_waitgroup_add(&wg, 1);
                CHECK_EQ(co_go(sf_write_co, &w[i]), 0);
            }
        }
        rng = sf_mix(rng);
        sf_closer_t cl = {.fd = wfd, .target = (long)(rng % (uint64_t)tmax), .rd = &rd,
                          .stop = &stop, .rc = 1, .wg = &wg};
        bool co_closer = round % 2 == 0;
        if (co_closer) {
            co_waitgroup_add(&wg, 1);
            CHECK_EQ(co_go(sf_close_co, &cl), 0);
        } else {
            CHECK_EQ(pthread_create(&cth, NULL, sf_close_thread, &cl), 0);
        }
        for (int i = 1; i < SF_NW; i += 2) pthread_join(th[i], NULL);
        if (!co_closer)
            pthread_join(cth, NULL);
        co_waitgroup_wait(&wg);
        pthread_join(rth, NULL);
        CHECK_EQ(cl.rc, 0);
        CHECK_EQ(rd.end, 0);
        sf_check(&rd, w, fmax, cl.t_closed);
        for (int i = 0; i < SF_NW; i++) cuts += w[i].ended && w[i].end_rc > 0;
        if (t_cur_failed)
            fprintf(stderr, "   (round %d, closer %s, target %ld, read %zu)\n", round,
                    co_closer ? "coroutine" : "thread", cl.target, rd.len);
        free(rd.buf);
        CHECK_EQ(co_close(rfd), 0);
    }
    fprintf(stderr, "   %d of %d closes cut a write\n", cuts, rounds);
    CHECK_EQ(count_fds(), before);
}

int main(void) {
    t_begin(170);
    signal(SIGPIPE, SIG_DFL); /* co_write must not raise it on sockets */
    CHECK_EQ(co_init(NULL), 0); /* its epoll fd must not take a number a test frees */
    T_RUN(test_errors);
    T_RUN(test_regular_file);
    T_RUN(test_connect_timeout);
    T_RUN(test_pingpong_socketpair);
    T_RUN(test_pingpong_tcp);
    T_RUN(test_deadlines);
    T_RUN(test_close_while_waiting);
    T_RUN(test_close_many_waiters);
    T_RUN(test_write_all_and_half_close);
    T_RUN(test_reset);
    T_RUN(test_short_read_not_drained);
    T_RUN(test_accepted_then_plain_close);
    T_RUN(test_accepted_then_dgram);
    T_RUN(test_proto6_not_tcp);
    T_RUN(test_shutdown_while_thread_waits);
    T_RUN(test_whole_writes);
    T_RUN(test_write_lock_wait);
    T_RUN(test_close_cuts_write);
    T_RUN(test_close_write_storm);
    T_RUN(test_thread_server);
    T_RUN(test_thread_coroutine_mix);
    T_RUN(test_1000_connections);
    T_RUN(test_close_after_unlock); /* last: it restarts the runtime on one P */
    return t_end();
}
