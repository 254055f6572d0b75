/* net: the resolver against a DNS responder this test runs on 127.0.0.1
 * (UDP and TCP, one plain thread each): answers, a slow answer, one that
 * never comes (the deadline and a context's cancellation end the wait),
 * NXDOMAIN, a truncated answer retried over TCP, search domains, a name
 * with both families dialed (RFC 6555), reverse lookups, /etc/hosts.
 * Behaviour, not timing: the bounds on waits are 10x loose. */
// ctest-timeout: 120
#define _GNU_SOURCE 1
#include "t.h"
#include "test_net_util.h"

#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { T_A = 1, T_PTR = 12, T_AAAA = 28 };

static int udp_fd = -1, tcp_fd = -1, dns_port;
static int stop; /* atomic (relaxed): the responder threads' end */
static int queries_tcp; /* atomic: questions that came over TCP */
static int dual_port;   /* the port "dual.test" is dialed on (for the log) */

/* Decodes the question's name into out ("a.test"), lowercased; returns the
 * offset after the question's type and class, or -1. */
static int parse_q(const uint8_t *p, int n, char *out, int *qtype) {
    int i = 12, o = 0;
    if (n < 17)
        return -1;
    while (i < n && p[i]) {
        int l = p[i++];
        if (l > 63 || i + l > n || o + l + 2 > 255)
            return -1;
        if (o)
            out[o++] = '.';
        for (int k = 0; k < l; k++) {
            char c = (char)p[i + k];
            out[o++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        }
        i += l;
    }
    out[o] = 0;
    if (i + 5 > n)
        return -1;
    *qtype = p[i + 1] << 8 | p[i + 2];
    return i + 5;
}

static int put_rr(uint8_t *r, int at, int type, const void *data, int len) {
    r[at++] = 0xc0; /* the name: a pointer to the question's */
    r[at++] = 12;
    r[at++] = 0;
    r[at++] = (uint8_t)type;
    r[at++] = 0;
    r[at++] = 1;
    r[at++] = 0, r[at++] = 0, r[at++] = 0, r[at++] = 60; /* TTL */
    r[at++] = (uint8_t)(len >> 8);
    r[at++] = (uint8_t)len;
    memcpy(r + at, data, (size_t)len);
    return at + len;
}

/* The zone. Builds the answer to q into r; returns its length, 0 for no
 * answer at all, -1 to ignore the question for good. */
static int answer(const uint8_t *q, int n, uint8_t *r, bool tcp, int *delay_ms) {
    char name[256];
    int qtype, end = parse_q(q, n, name, &qtype);
    if (end < 0)
        return -1;
    *delay_ms = 0;
    memcpy(r, q, (size_t)end);
    r[2] = 0x84 | (q[2] & 1); /* QR, AA, RD as asked */
    r[3] = 0x80;              /* RA, NOERROR */
    r[6] = r[7] = r[8] = r[9] = r[10] = r[11] = 0;
    int at = end, an = 0;
    uint8_t a4[4], a6[16];
    if (!strcmp(name, "never.test"))
        return -1;
    if (!strcmp(name, "a.test") || !strcmp(name, "slow.test") || !strcmp(name, "host.corp.test")) {
        if (!strcmp(name, "slow.test"))
            *delay_ms = 300;
        inet_pton(AF_INET, !strcmp(name, "host.corp.test") ? "10.0.0.3" : "10.0.0.1", a4);
        if (qtype == T_A)
            at = put_rr(r, at, T_A, a4, 4), an++;
    } else if (!strcmp(name, "six.test")) {
        inet_pton(AF_INET6, "2001:db8::6", a6);
        if (qtype == T_AAAA)
            at = put_rr(r, at, T_AAAA, a6, 16), an++;
    } else if (!strcmp(name, "dual.test")) {
        inet_pton(AF_INET6, "::1", a6);
        inet_pton(AF_INET, "127.0.0.1", a4);
        if (qtype == T_AAAA)
            at = put_rr(r, at, T_AAAA, a6, 16), an++;
        if (qtype == T_A)
            at = put_rr(r, at, T_A, a4, 4), an++;
    } else if (!strcmp(name, "big.test")) {
        if (!tcp) { /* truncated: the client must ask again over TCP */
            r[2] |= 0x02;
        } else {
            __atomic_add_fetch(&queries_tcp, 1, __ATOMIC_RELAXED);
            inet_pton(AF_INET, "10.0.0.2", a4);
            if (qtype == T_A)
                at = put_rr(r, at, T_A, a4, 4), an++;
        }
    } else if (!strcmp(name, "fail.test")) {
        r[3] = 0x82; /* SERVFAIL */
    } else if (!strcmp(name, "1.0.0.10.in-addr.arpa") && qtype == T_PTR) {
        static const uint8_t ptr[] = {1, 'a', 4, 't', 'e', 's', 't', 0};
        at = put_rr(r, at, T_PTR, ptr, sizeof ptr), an++;
    } else {
        r[3] = 0x83; /* NXDOMAIN */
    }
    r[7] = (uint8_t)an;
    return at;
}

static void *udp_server(void *arg) {
    (void)arg;
    uint8_t q[512], r[1024];
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        struct pollfd p = {.fd = udp_fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(udp_fd, q, sizeof q, 0, (struct sockaddr *)&from, &fl);
        int delay;
        int len = n > 0 ? answer(q, (int)n, r, false, &delay) : -1;
        if (len <= 0)
            continue;
        if (delay)
            usleep((useconds_t)delay * 1000);
        sendto(udp_fd, r, (size_t)len, 0, (struct sockaddr *)&from, fl);
    }
    return NULL;
}

static bool read_full(int fd, void *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)b + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static void *tcp_server(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        struct pollfd p = {.fd = tcp_fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(tcp_fd, NULL, NULL);
        if (c < 0)
            continue;
        uint8_t lb[2], q[512], r[1026];
        while (read_full(c, lb, 2)) {
            int n = lb[0] << 8 | lb[1];
            if (n > (int)sizeof q || !read_full(c, q, (size_t)n))
                break;
            int delay, len = answer(q, n, r + 2, true, &delay);
            if (len <= 0)
                continue;
            r[0] = (uint8_t)(len >> 8);
            r[1] = (uint8_t)len;
            if (write(c, r, (size_t)len + 2) != len + 2)
                break;
        }
        close(c);
    }
    return NULL;
}

static pthread_t th_udp, th_tcp;

/* A UDP and a TCP socket on one port number of 127.0.0.1. */
static void start_responder(void) {
    for (int tries = 0; tries < 100 && tcp_fd < 0; tries++) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t l = sizeof a;
        udp_fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (bind(udp_fd, (struct sockaddr *)&a, sizeof a) < 0) {
            close(udp_fd);
            continue;
        }
        getsockname(udp_fd, (struct sockaddr *)&a, &l);
        dns_port = ntohs(a.sin_port);
        tcp_fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(tcp_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(tcp_fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(tcp_fd, 16) < 0) {
            close(tcp_fd);
            close(udp_fd);
            tcp_fd = -1; /* that number is taken for TCP: another one */
        }
    }
    CHECK(tcp_fd >= 0);
    pthread_create(&th_udp, NULL, udp_server, NULL);
    pthread_create(&th_tcp, NULL, tcp_server, NULL);
}

static void stop_responder(void) {
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    pthread_join(th_udp, NULL);
    pthread_join(th_tcp, NULL);
    close(udp_fd);
    close(tcp_fd);
}

static int configure(int64_t timeout_ns, int attempts, const char *search) {
    char servers[64];
    snprintf(servers, sizeof servers, "127.0.0.1:%d", dns_port);
    co_resolver_conf_t c = {.servers = servers, .search = search, .ndots = 1,
                            .timeout_ns = timeout_ns, .attempts = attempts};
    return co_resolver_configure(&c);
}

static const char *ntop(const struct sockaddr_storage *ss, char *buf) {
    if (ss->ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)ss)->sin_addr, buf, 64);
    else
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ss)->sin6_addr, buf, 64);
    return buf;
}

static void test_answers(void) {
    CHECK_EQ(configure(5 * SEC, 2, "corp.test"), 0);
    struct sockaddr_storage a[8];
    char b[64];
    CHECK_EQ(co_lookup_host(NULL, "a.test", a, 8, co_deadline_after(10 * SEC)), 1);
    CHECK_EQ(strcmp(ntop(&a[0], b), "10.0.0.1"), 0);
    CHECK_EQ(co_lookup_host(NULL, "six.test", a, 8, co_deadline_after(10 * SEC)), 1);
    CHECK_EQ(strcmp(ntop(&a[0], b), "2001:db8::6"), 0);
    int n = co_lookup_host(NULL, "dual.test", a, 8, co_deadline_after(10 * SEC));
    CHECK_EQ(n, 2);
    CHECK_EQ(co_lookup_host(NULL, "dual.test", a, 1, co_deadline_after(10 * SEC)), 1); /* max */
    /* a slow answer within the deadline */
    CHECK_EQ(co_lookup_host(NULL, "slow.test", a, 8, co_deadline_after(10 * SEC)), 1);
    CHECK_EQ(strcmp(ntop(&a[0], b), "10.0.0.1"), 0);
    /* NXDOMAIN, SERVFAIL */
    CHECK_EQ(co_lookup_host(NULL, "nx.test", a, 8, co_deadline_after(10 * SEC)), CO_ENOTFOUND);
    CHECK_EQ(co_lookup_host(NULL, "fail.test", a, 8, co_deadline_after(20 * SEC)), CO_EDNS);
    /* truncated over UDP, answered over TCP */
    int tcp0 = __atomic_load_n(&queries_tcp, __ATOMIC_RELAXED);
    CHECK_EQ(co_lookup_host(NULL, "big.test", a, 8, co_deadline_after(10 * SEC)), 1);
    CHECK_EQ(strcmp(ntop(&a[0], b), "10.0.0.2"), 0);
    CHECK(__atomic_load_n(&queries_tcp, __ATOMIC_RELAXED) > tcp0);
    /* search domains: "host" has fewer dots than ndots */
    CHECK_EQ(co_lookup_host(NULL, "host", a, 8, co_deadline_after(10 * SEC)), 1);
    CHECK_EQ(strcmp(ntop(&a[0], b), "10.0.0.3"), 0);
    CHECK_EQ(co_lookup_host(NULL, "host.", a, 8, co_deadline_after(10 * SEC)), CO_ENOTFOUND);
    /* /etc/hosts comes first, and literals need nobody */
    CHECK(co_lookup_host(NULL, "localhost", a, 8, co_deadline_after(10 * SEC)) >= 1);
    CHECK_EQ(co_lookup_host(NULL, "192.0.2.7", a, 8, 0), 1);
    CHECK_EQ(strcmp(ntop(&a[0], b), "192.0.2.7"), 0);
    CHECK_EQ(co_lookup_host(NULL, "::1", a, 8, 0), 1);
    CHECK_EQ(a[0].ss_family, AF_INET6);
    /* reverse */
    char name[64];
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "10.0.0.1", &sa.sin_addr);
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&sa, sizeof sa, name, sizeof name,
                            co_deadline_after(10 * SEC)), 0);
    CHECK_EQ(strcmp(name, "a.test"), 0);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&sa, sizeof sa, name, sizeof name,
                            co_deadline_after(10 * SEC)), 0);
    CHECK(name[0] != 0); /* /etc/hosts' name for it */
    inet_pton(AF_INET, "10.9.9.9", &sa.sin_addr);
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&sa, sizeof sa, name, sizeof name,
                            co_deadline_after(10 * SEC)), CO_ENOTFOUND);
    /* addrlen of a sockaddr_storage, a common idiom: the same answer */
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    memcpy(&ss, &sa, sizeof sa);
    inet_pton(AF_INET, "10.0.0.1", &((struct sockaddr_in *)&ss)->sin_addr);
    name[0] = 0;
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&ss, sizeof ss, name, sizeof name,
                            co_deadline_after(10 * SEC)), 0);
    CHECK_EQ(strcmp(name, "a.test"), 0);
}

static void test_deadline_holds(void) {
    /* c-ares's own timeout far beyond the deadline: only ours can end it */
    CHECK_EQ(configure(30 * SEC, 1, NULL), 0);
    struct sockaddr_storage a[4];
    int64_t t0 = co_now();
    CHECK_EQ(co_lookup_host(NULL, "never.test", a, 4, co_deadline_after(200 * MS)), CO_ETIMEDOUT);
    CHECK(co_now() - t0 < 20 * SEC); /* a tenth of c-ares's timeout */
    /* a deadline already past: one try, which an answer already in may
     * complete, and never a wait */
    CHECK_EQ(co_lookup_host(NULL, "never.test", a, 4, 0), CO_ETIMEDOUT);
    int rc = co_lookup_host(NULL, "a.test", a, 4, 0);
    CHECK(rc == 1 || rc == CO_ETIMEDOUT);
    CHECK_EQ(co_dial("tcp", "never.test:80", co_deadline_after(100 * MS)), CO_ETIMEDOUT);
    /* the channel is fine afterwards */
    CHECK_EQ(co_lookup_host(NULL, "a.test", a, 4, co_deadline_after(10 * SEC)), 1);
    /* c-ares's own timeouts run out first: CO_ETIMEDOUT too */
    CHECK_EQ(configure(100 * MS, 1, NULL), 0);
    CHECK_EQ(co_lookup_host(NULL, "never.test", a, 4, co_deadline_after(20 * SEC)), CO_ETIMEDOUT);
}

typedef struct canceller {
    co_ctx_t *ctx;
    co_waitgroup_t wg;
} canceller_t;

static void cancel_later(void *arg) {
    canceller_t *c = arg;
    co_sleep(100 * MS);
    co_ctx_cancel(c->ctx);
    co_waitgroup_done(&c->wg);
}

/* A context that a coroutine cancels 100 ms from now. */
static void cancel_soon(canceller_t *c) {
    CHECK_EQ(co_ctx_with_cancel(&c->ctx, co_ctx_background()), 0);
    co_waitgroup_add(&c->wg, 1);
    CHECK_EQ(co_go(cancel_later, c), 0);
}

static void cancel_done(canceller_t *c) {
    co_waitgroup_wait(&c->wg);
    co_ctx_free(c->ctx);
}

typedef struct in_co {
    co_ctx_t *ctx;
    int rc;
    co_waitgroup_t wg;
} in_co_t;

static void lookup_in_co(void *arg) {
    in_co_t *x = arg;
    struct sockaddr_storage a[4];
    x->rc = co_lookup_host(x->ctx, "never.test", a, 4, co_deadline_after(30 * SEC));
    co_waitgroup_done(&x->wg);
}

static void test_cancel(void) {
    CHECK_EQ(configure(30 * SEC, 1, NULL), 0);
    canceller_t c = {0};
    cancel_soon(&c);
    co_ctx_t *ctx = c.ctx;
    struct sockaddr_storage a[4];
    int64_t t0 = co_now();
    /* from a plain thread */
    CHECK_EQ(co_lookup_host(ctx, "never.test", a, 4, co_deadline_after(30 * SEC)), CO_ECANCELED);
    CHECK(co_now() - t0 < 20 * SEC);
    /* canceled already */
    CHECK_EQ(co_lookup_host(ctx, "a.test", a, 4, co_deadline_after(30 * SEC)), CO_ECANCELED);
    /* and a dial, in its lookup */
    CHECK_EQ(co_dial_ctx(ctx, "tcp", "a.test:80", co_deadline_after(30 * SEC)), CO_ECANCELED);
    cancel_done(&c);
    canceller_t c2 = {0};
    cancel_soon(&c2);
    CHECK_EQ(co_dial_ctx(c2.ctx, "tcp", "never.test:80", co_deadline_after(30 * SEC)), CO_ECANCELED);
    cancel_done(&c2);
    /* from coroutines, a context with a deadline */
    in_co_t x[8];
    co_ctx_t *dctx;
    CHECK_EQ(co_ctx_with_timeout(&dctx, co_ctx_background(), 150 * MS), 0);
    for (int i = 0; i < 8; i++) {
        x[i] = (in_co_t){.ctx = dctx};
        co_waitgroup_add(&x[i].wg, 1);
        CHECK_EQ(co_go(lookup_in_co, &x[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        co_waitgroup_wait(&x[i].wg);
        CHECK_EQ(x[i].rc, CO_ETIMEDOUT);
    }
    co_ctx_free(dctx);
}

/* Many lookups at once from coroutines: channels are not shared. */
typedef struct storm {
    int ok;
    co_waitgroup_t wg;
} storm_t;

static void storm_fn(void *arg) {
    storm_t *s = arg;
    struct sockaddr_storage a[4];
    for (int i = 0; i < 10; i++) {
        const char *n = i % 3 == 0 ? "a.test" : i % 3 == 1 ? "dual.test" : "localhost";
        if (co_lookup_host(NULL, n, a, 4, co_deadline_after(20 * SEC)) >= 1)
            __atomic_add_fetch(&s->ok, 1, __ATOMIC_RELAXED);
    }
    co_waitgroup_done(&s->wg);
}

static void test_storm(void) {
    CHECK_EQ(configure(5 * SEC, 3, NULL), 0);
    storm_t s = {0};
    int n = t_sanitized() ? 8 : 40;
    co_waitgroup_add(&s.wg, n);
    for (int i = 0; i < n; i++)
        CHECK_EQ(co_go(storm_fn, &s), 0);
    co_waitgroup_wait(&s.wg);
    CHECK_EQ(s.ok, n * 10);
}

/* Dials addr over tcp and closes: the family of the address reached, or
 * the dial's error code. */
static int dial_family(const char *addr, int64_t deadline) {
    int fd = co_dial("tcp", addr, deadline);
    if (fd < 0)
        return fd;
    int family = peer_family(fd);
    co_close(fd);
    return family;
}

/* A listener on ::1, any port; without IPv6 here, a line on why the test
 * skips and the error code. */
static int listen_ipv6_loopback(const struct co_listen_opts *o) {
    int l = co_listen("tcp6", "[::1]:0", o);
    if (l < 0)
        fprintf(stderr, "skip: this host has no ::1 (%s)\n", co_strerror(l));
    return l;
}

/* dual.test is ::1 and 127.0.0.1: a dial reaches a listener on either. */
static void test_dial_dual(void) {
    CHECK_EQ(configure(5 * SEC, 2, NULL), 0);
    int l4 = co_listen("tcp4", "127.0.0.1:0", NULL);
    CHECK(l4 >= 0);
    if (l4 < 0)
        return;
    char addr[64];
    dual_port = local_port(l4);
    snprintf(addr, sizeof addr, "dual.test:%d", dual_port);
    /* ::1 first (refused, or no IPv6 here), then IPv4 */
    CHECK_EQ(dial_family(addr, co_deadline_after(10 * SEC)), AF_INET);
    int a = co_accept(l4, NULL, NULL, co_deadline_after(10 * SEC));
    CHECK(a >= 0);
    if (a >= 0)
        co_close(a);
    co_close(l4);
    int l6 = listen_ipv6_loopback(NULL);
    if (l6 < 0)
        return;
    snprintf(addr, sizeof addr, "dual.test:%d", local_port(l6));
    CHECK_EQ(dial_family(addr, co_deadline_after(10 * SEC)), AF_INET6);
    CHECK_EQ(co_dial("tcp4", "six.test:80", co_deadline_after(10 * SEC)), CO_EADDR);
    CHECK_EQ(co_dial("tcp", "nx.test:80", co_deadline_after(10 * SEC)), CO_ENOTFOUND);
    co_close(l6);
}

typedef struct race {
    const char *addr;
    int v4; /* atomic: dials that ended on IPv4 */
    co_waitgroup_t wg;
} race_t;

static void race_one(void *arg) {
    race_t *r = arg;
    if (dial_family(r->addr, co_deadline_after(30 * SEC)) == AF_INET)
        __atomic_add_fetch(&r->v4, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&r->wg);
}

/* RFC 6555's fallback: dual.test's first address (::1) does not answer
 * (a listener whose accept queue is full drops SYNs), 127.0.0.1 does, on
 * the same port: the fallback starts after its delay and wins, and the
 * IPv6 attempt still in progress is cut short. */
static void test_dial_fallback(void) {
    CHECK_EQ(configure(5 * SEC, 2, NULL), 0);
    struct sockaddr_storage a[4];
    CHECK_EQ(co_lookup_host(NULL, "dual.test", a, 4, co_deadline_after(10 * SEC)), 2);
    if (a[0].ss_family != AF_INET6) {
        fprintf(stderr, "skip: the resolver puts IPv4 first here (no ::1?)\n");
        return;
    }
    /* the resolver's channels (an epoll fd, an eventfd, a socket each)
     * that the dials below will use exist already, in its free list */
    storm_t warm = {0};
    co_waitgroup_add(&warm.wg, 16);
    for (int i = 0; i < 16; i++)
        CHECK_EQ(co_go(storm_fn, &warm), 0);
    co_waitgroup_wait(&warm.wg);
    int fds0 = t_count_fds();
    struct co_listen_opts one = {.backlog = 1};
    int l6 = listen_ipv6_loopback(&one);
    if (l6 < 0)
        return;
    int port = local_port(l6);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    int l4 = co_listen("tcp4", addr, NULL);
    if (l4 < 0) {
        fprintf(stderr, "skip: port %d is taken for IPv4 (%s)\n", port, co_strerror(l4));
        co_close(l6);
        return;
    }
    /* fill the IPv6 listener's queue; nobody accepts there */
    int fill[4], nfill = 0;
    snprintf(addr, sizeof addr, "[::1]:%d", port);
    for (int i = 0; i < 4; i++) {
        fill[nfill] = co_dial("tcp6", addr, co_deadline_after(300 * MS));
        if (fill[nfill] >= 0)
            nfill++;
        else
            break; /* the queue is full: SYNs are dropped now */
    }
    CHECK(nfill < 4);
    snprintf(addr, sizeof addr, "dual.test:%d", port);
    CHECK_EQ(dial_family(addr, co_deadline_after(30 * SEC)), AF_INET);
    /* again, many at once: each race has its winner */
    race_t r = {.addr = addr};
    co_waitgroup_add(&r.wg, 8);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(co_go(race_one, &r), 0);
    co_waitgroup_wait(&r.wg);
    CHECK_EQ(r.v4, 8);
    /* the deadline ends a race that nobody wins */
    co_close(l4);
    CHECK_EQ(co_dial("tcp6", addr, co_deadline_after(200 * MS)), CO_ETIMEDOUT);
    /* a context ends a connect that does not answer, one family or two */
    canceller_t c = {0};
    cancel_soon(&c);
    CHECK_EQ(co_dial_ctx(c.ctx, "tcp6", addr, co_deadline_after(30 * SEC)), CO_ECANCELED);
    cancel_done(&c);
    cancel_soon(&c);
    CHECK_EQ(co_dial_ctx(c.ctx, "tcp", addr, CO_FOREVER), CO_ECANCELED);
    cancel_done(&c);
    co_ctx_t *dctx;
    CHECK_EQ(co_ctx_with_timeout(&dctx, co_ctx_background(), 100 * MS), 0);
    CHECK_EQ(co_dial_ctx(dctx, "tcp6", addr, CO_FOREVER), CO_ETIMEDOUT);
    co_ctx_free(dctx);
    for (int i = 0; i < nfill; i++)
        co_close(fill[i]);
    co_close(l6);
    /* the losers' sockets are closed by their own coroutines, soon */
    int64_t until = co_deadline_after(10 * SEC);
    while (t_count_fds() > fds0 && co_now() < until)
        co_sleep(10 * MS);
    CHECK_EQ(t_count_fds(), fds0);
}

/* The resolver's channels outlive a runtime: after co_shutdown their
 * descriptors are registered again with the next one. */
static void test_after_shutdown(void) {
    int rc = CO_EBUSY;
    int64_t until = co_deadline_after(10 * SEC);
    while ((rc = co_shutdown()) == CO_EBUSY && co_now() < until)
        usleep(10000); /* a canceller of test_cancel on its way out */
    CHECK_EQ(rc, 0);
    struct sockaddr_storage a[4];
    CHECK_EQ(co_lookup_host(NULL, "a.test", a, 4, co_deadline_after(10 * SEC)), 1);
    CHECK_EQ(co_lookup_host(NULL, "never.test", a, 4, co_deadline_after(100 * MS)), CO_ETIMEDOUT);
}

static void test_bad_input(void) {
    struct sockaddr_storage a[2];
    char name[8];
    CHECK_EQ(co_lookup_host(NULL, NULL, a, 2, 0), CO_EINVAL);
    CHECK_EQ(co_lookup_host(NULL, "a.test", NULL, 2, 0), CO_EINVAL);
    CHECK_EQ(co_lookup_host(NULL, "a.test", a, 0, 0), CO_EINVAL);
    CHECK_EQ(co_lookup_host(NULL, "", a, 2, 0), CO_ENOTFOUND);
    CHECK_EQ(co_lookup_host(NULL, "a..test", a, 2, 0), CO_ENOTFOUND);
    CHECK_EQ(co_lookup_host(NULL, "white space", a, 2, 0), CO_ENOTFOUND);
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[299] = 0;
    CHECK_EQ(co_lookup_host(NULL, longname, a, 2, 0), CO_ENOTFOUND);
    CHECK_EQ(co_lookup_addr(NULL, NULL, 0, name, sizeof name, 0), CO_EINVAL);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&sa, sizeof sa, NULL, 8, 0), CO_EINVAL);
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&sa, 2, name, sizeof name, 0), CO_EADDR);
    co_resolver_conf_t bad = {.servers = "not a server list"};
    CHECK(co_resolver_configure(&bad) < 0);
    co_resolver_conf_t neg = {.attempts = -1};
    CHECK_EQ(co_resolver_configure(&neg), CO_EINVAL);
    /* a refused configuration leaves the one in force: the test's
     * responder still answers */
    struct sockaddr_storage a1[2];
    CHECK_EQ(co_lookup_host(NULL, "a.test", a1, 2, co_deadline_after(10 * SEC)) >= 1, 1);
}

int main(void) {
    t_begin(110);
    co_resolver_conf_t probe = {0};
    if (co_resolver_configure(&probe) == -ENOTSUP) {
        fprintf(stderr, "skip: built without c-ares, so the resolver cannot be pointed at a test server\n");
        return 77;
    }
    start_responder();
    T_RUN(test_answers);
    T_RUN(test_deadline_holds);
    T_RUN(test_cancel);
    T_RUN(test_storm);
    /* before the races: a race's loser ends on its own, unjoined, and
     * co_shutdown's wait for it is no happens-before edge to TSan */
    T_RUN(test_after_shutdown);
    T_RUN(test_dial_dual);
    T_RUN(test_dial_fallback);
    T_RUN(test_bad_input);
    co_resolver_configure(NULL);
    stop_responder();
    return t_end();
}
