/*
 * Load generator for echo servers (ours or anyone's), written on colony.
 *
 *   echo_client [-h host] [-p port] [-c conns] [-s bytes] [-d seconds]
 *       load: conns coroutines, each with its own connection, send a
 *       message of `bytes` and wait for all of it to come back, in a loop,
 *       for `seconds`. Prints round trips/s and latency percentiles.
 *   echo_client -f N [-H hold-ms] [-t timeout-ms] ...
 *       flood: N connections at once; each sends one message, waits for
 *       its echo, holds the connection hold-ms, closes. Every connection
 *       ends up in exactly one class: served (echo received), refused
 *       (the server closed it before echoing: end-of-file), reset,
 *       connect error, or timeout.
 *
 * Defaults: 127.0.0.1:7007, 100 connections, 64 bytes, 10 s.
 */
#define _GNU_SOURCE 1
#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define MS 1000000LL
#define HBUCKETS 20000 /* 10 us each: 0..200 ms, then overflow */

typedef struct {
    const char *host;
    int port, conns, size, seconds, flood, hold_ms, timeout_ms;
    struct sockaddr_in addr;
} opts_t;

typedef struct {
    const opts_t *o;
    int id;
    int64_t end;
    int64_t trips;
    int err;
    uint32_t *hist;
    co_waitgroup_t *wg;
} worker_t;

enum { F_SERVED, F_REFUSED, F_RESET, F_CONNECT, F_TIMEOUT, F_OTHER, F_N };
static const char *fname[F_N] = {"served", "refused", "reset", "connect error", "timeout", "other"};
static int64_t fcount[F_N]; /* atomic */

static int dial(const opts_t *o, int64_t deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = co_connect(fd, (const struct sockaddr *)&o->addr, sizeof o->addr, deadline);
    if (rc < 0) {
        co_close(fd);
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Read the n-byte echo into b (room for n + 1 bytes): n, 0 on EOF first,
 * or a negative code (-EPROTO if the server sent more than it was sent).
 * Each read asks for one byte more than is still due, so the last one comes
 * back short and colony's co_read knows the socket is drained: the next
 * read, after the next write, parks at once instead of first making a
 * read(2) that fails with EAGAIN. */
static ssize_t read_echo(int fd, char *b, size_t n, int64_t deadline) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = co_read(fd, b + got, n + 1 - got, deadline);
        if (k <= 0)
            return k == 0 && got == 0 ? 0 : (k == 0 ? -EPIPE : k);
        got += (size_t)k;
    }
    return got == n ? (ssize_t)n : -EPROTO;
}

/* One round trip: write msg, read its echo into back (room for n + 1).
 * A message larger than the socket buffers cannot be written whole before
 * any of its echo is read (both ends would wait on full buffers until the
 * deadline): a helper coroutine writes it while this one reads. */
#define BIG_MSG (32 << 10)
typedef struct {
    int fd;
    const char *msg;
    size_t n;
    int64_t dl;
    ssize_t rc;
    co_waitgroup_t wg;
} big_write_t;
static void big_writer(void *arg) {
    big_write_t *b = arg;
    b->rc = co_write(b->fd, b->msg, b->n, b->dl);
    co_waitgroup_done(&b->wg);
}
static bool round_trip(int fd, const char *msg, char *back, size_t n, int64_t dl) {
    if (n <= BIG_MSG)
        return co_write(fd, msg, n, dl) == (ssize_t)n && read_echo(fd, back, n, dl) == (ssize_t)n;
    big_write_t b = {.fd = fd, .msg = msg, .n = n, .dl = dl, .rc = -1, .wg = CO_WAITGROUP_INIT};
    co_waitgroup_add(&b.wg, 1);
    if (co_go(big_writer, &b) != 0)
        return false;
    ssize_t r = read_echo(fd, back, n, dl);
    if (r != (ssize_t)n)
        shutdown(fd, SHUT_RDWR); /* the writer may wait on a full buffer: end it now */
    co_waitgroup_wait(&b.wg);
    return r == (ssize_t)n && b.rc == (ssize_t)n;
}

static void load_worker(void *arg) {
    worker_t *w = arg;
    const opts_t *o = w->o;
    char *msg = malloc((size_t)o->size), *back = malloc((size_t)o->size + 1);
    for (int i = 0; i < o->size; i++)
        msg[i] = (char)('a' + (w->id + i) % 26);
    int fd = dial(o, co_deadline_after(10000 * MS));
    if (fd < 0) {
        w->err = fd;
        static int reported; /* atomic: print the first failure only */
        if (!__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "echo_client: connect: %s\n", co_strerror(fd));
        goto out;
    }
    for (;;) {
        int64_t t0 = co_now(); /* one clock read: loop test, deadline, latency start */
        if (t0 >= w->end) break;
        int64_t dl = t0 + 10000 * MS;
        if (!round_trip(fd, msg, back, (size_t)o->size, dl) ||
            memcmp(back, msg, (size_t)o->size) != 0) {
            w->err = -EIO;
            static int reported_io; /* atomic */
            if (!__atomic_exchange_n(&reported_io, 1, __ATOMIC_RELAXED))
                fprintf(stderr, "echo_client: connection %d failed mid-run (error, timeout or a wrong echo)\n", w->id);
            break;
        }
        int64_t us10 = (co_now() - t0) / 10000;
        w->hist[us10 < HBUCKETS ? us10 : HBUCKETS]++;
        w->trips++;
    }
    co_close(fd);
out:
    free(msg);
    free(back);
    co_waitgroup_done(w->wg);
}

static void flood_worker(void *arg) {
    worker_t *w = arg;
    const opts_t *o = w->o;
    char msg[64], back[65]; /* read_echo wants room for one more byte */
    int n = o->size < 64 ? o->size : 64;
    memset(msg, 'f', sizeof msg);
    int64_t dl = co_deadline_after(o->timeout_ms * MS);
    int cls = F_OTHER;
    int fd = dial(o, dl);
    if (fd < 0) {
        cls = fd == CO_ETIMEDOUT ? F_TIMEOUT : F_CONNECT;
        goto out;
    }
    ssize_t r = co_write(fd, msg, (size_t)n, dl);
    if (r == n)
        r = read_echo(fd, back, (size_t)n, dl);
    if (r == n)
        cls = F_SERVED;
    else if (r == 0 || r == -EPIPE)
        cls = F_REFUSED;
    else if (r == -ECONNRESET)
        cls = F_RESET;
    else if (r == CO_ETIMEDOUT)
        cls = F_TIMEOUT;
    if (cls == F_SERVED && o->hold_ms > 0)
        co_sleep(o->hold_ms * MS);
    co_close(fd);
out:
    __atomic_add_fetch(&fcount[cls], 1, __ATOMIC_RELAXED);
    co_waitgroup_done(w->wg);
}

static int run(void *arg) {
    opts_t *o = arg;
    int n = o->flood ? o->flood : o->conns;
    worker_t *ws = calloc((size_t)n, sizeof *ws);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    int64_t t0 = co_now();
    int64_t end = t0 + (int64_t)o->seconds * 1000 * MS;
    co_attr_t attr = {.stack_size = 64 * 1024};
    for (int i = 0; i < n; i++) {
        ws[i] = (worker_t){.o = o, .id = i, .end = end, .wg = &wg};
        if (!o->flood)
            ws[i].hist = calloc(HBUCKETS + 1, sizeof(uint32_t));
        co_waitgroup_add(&wg, 1);
        int rc = co_go_with(&attr, o->flood ? flood_worker : load_worker, &ws[i]);
        if (rc < 0) {
            fprintf(stderr, "echo_client: co_go: %s\n", co_strerror(rc));
            co_waitgroup_done(&wg);
        }
    }
    co_waitgroup_wait(&wg);
    double secs = (double)(co_now() - t0) / 1e9;
    int status = 0;
    if (o->flood) {
        printf("flood: %d connections in %.2f s:", n, secs);
        int64_t total = 0;
        for (int i = 0; i < F_N; i++) {
            printf(" %s %lld%s", fname[i], (long long)fcount[i], i + 1 < F_N ? "," : "\n");
            total += fcount[i];
        }
        status = total != n;
    } else {
        int64_t trips = 0;
        int errs = 0;
        uint64_t *h = calloc(HBUCKETS + 1, sizeof *h);
        for (int i = 0; i < n; i++) {
            trips += ws[i].trips;
            errs += ws[i].err != 0;
            for (int b = 0; b <= HBUCKETS; b++)
                h[b] += ws[i].hist[b];
            free(ws[i].hist);
        }
        double pct[3] = {0.50, 0.99, 0.999};
        double val[3] = {0};
        for (int k = 0; k < 3; k++) {
            uint64_t want = (uint64_t)((double)trips * pct[k]), acc = 0;
            for (int b = 0; b <= HBUCKETS; b++) {
                acc += h[b];
                if (acc > want) {
                    val[k] = (b + 0.5) * 10.0;
                    break;
                }
            }
        }
        free(h);
        printf("echo: %d connections, %d-byte messages, %.2f s: %lld round trips, %.0f/s; "
               "latency p50 %.0f us, p99 %.0f us, p99.9 %.0f us; %d connection errors\n",
               n, o->size, secs, (long long)trips, (double)trips / secs, val[0], val[1], val[2],
               errs);
        status = errs != 0;
    }
    free(ws);
    return status;
}

int main(int argc, char **argv) {
    opts_t o = {.host = "127.0.0.1", .port = 7007, .conns = 100, .size = 64, .seconds = 10,
                .timeout_ms = 15000};
    int c;
    while ((c = getopt(argc, argv, "h:p:c:s:d:f:H:t:")) != -1) {
        switch (c) {
        case 'h': o.host = optarg; break;
        case 'p': o.port = atoi(optarg); break;
        case 'c': o.conns = atoi(optarg); break;
        case 's': o.size = atoi(optarg); break;
        case 'd': o.seconds = atoi(optarg); break;
        case 'f': o.flood = atoi(optarg); break;
        case 'H': o.hold_ms = atoi(optarg); break;
        case 't': o.timeout_ms = atoi(optarg); break;
        default:
            fprintf(stderr,
                    "usage: %s [-h host] [-p port] [-c conns] [-s bytes] [-d seconds]\n"
                    "       %s -f connections [-H hold-ms] [-t timeout-ms] [-h host] [-p port]\n",
                    argv[0], argv[0]);
            return 2;
        }
    }
    if (o.conns <= 0 || o.size <= 0 || o.seconds < 0 || o.flood < 0 || o.port <= 0 ||
        o.port > 65535) {
        fprintf(stderr, "echo_client: bad arguments\n");
        return 2;
    }
    o.addr.sin_family = AF_INET;
    o.addr.sin_port = htons((uint16_t)o.port);
    if (inet_pton(AF_INET, o.host, &o.addr.sin_addr) != 1) {
        fprintf(stderr, "echo_client: bad host %s\n", o.host);
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    int rc = co_main(run, &o);
    co_shutdown();
    return rc;
}
