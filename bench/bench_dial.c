/*
 * bench_dial — net: dial, lookup and UDP echo, against bench/go/dial.
 *
 *   bench_dial dial   N C        N dial+close to a listener of this process, from C coroutines
 *   bench_dial hosts  N C        N lookups of "localhost" (/etc/hosts), C coroutines
 *   bench_dial dns    N C PORT   N lookups of "a.test" from the responder on 127.0.0.1:PORT
 *   bench_dial udp    N C        N 64-byte UDP round trips to an echo of this process, C clients
 *   bench_dial udpmm  N C        the same, the echo batching with co_recvmmsg/co_sendmmsg
 *   bench_dial serve-dns         a DNS responder on 127.0.0.1: prints "port=P", serves until killed
 *
 * One measurement, one line (bench_util.h's format), ops = N.
 */
#define _GNU_SOURCE 1 /* struct mmsghdr */
#include "bench_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int64_t n_ops;
static int n_co;
static char addr[64];
static int dns_port;
static int failures; /* atomic */
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static int local_port(int fd) {
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    return ntohs(a.sin_port);
}

static void closer(void *arg) {
    int l = (int)(intptr_t)arg;
    for (;;) {
        int c = co_accept(l, NULL, NULL, CO_FOREVER);
        if (c < 0)
            break;
        co_close(c);
    }
}

static void dial_worker(void *arg) {
    int64_t n = (int64_t)(intptr_t)arg;
    for (int64_t i = 0; i < n; i++) {
        int fd = co_dial("tcp", addr, co_deadline_after(10000000000LL));
        if (fd < 0) {
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
            continue;
        }
        co_close(fd);
    }
    co_waitgroup_done(&wg);
}

static void lookup_worker(void *arg) {
    int64_t n = (int64_t)(intptr_t)arg;
    const char *name = dns_port ? "a.test" : "localhost";
    struct sockaddr_storage out[4];
    for (int64_t i = 0; i < n; i++)
        if (co_lookup_host(NULL, name, out, 4, co_deadline_after(10000000000LL)) < 1)
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

static void udp_server(void *arg) {
    int s = (int)(intptr_t)arg;
    char buf[2048];
    for (;;) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = co_recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl, CO_FOREVER);
        if (n < 0)
            break;
        co_sendto(s, buf, (size_t)n, 0, (struct sockaddr *)&from, fl, CO_FOREVER);
    }
}

/* The batching server: up to 32 datagrams a system call each way
 * (recvmmsg/sendmmsg), answers sent back to each datagram's source. */
static void udp_server_mm(void *arg) {
    int s = (int)(intptr_t)arg;
    enum { B = 32 };
    char (*buf)[2048] = malloc(B * sizeof *buf); /* 64 KiB: not on a coroutine's stack */
    struct iovec iov[B];
    struct sockaddr_storage from[B];
    struct mmsghdr m[B];
    for (;;) {
        for (int i = 0; i < B; i++) {
            iov[i] = (struct iovec){buf[i], sizeof buf[i]};
            m[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                           .msg_iov = &iov[i], .msg_iovlen = 1};
        }
        int k = co_recvmmsg(s, m, B, 0, CO_FOREVER);
        if (k < 0)
            break;
        for (int i = 0; i < k; i++)
            iov[i].iov_len = m[i].msg_len;
        for (int sent = 0; sent < k;) {
            int w = co_sendmmsg(s, m + sent, (unsigned)(k - sent), 0, CO_FOREVER);
            if (w < 1)
                break;
            sent += w;
        }
    }
    free(buf);
}

static void udp_worker(void *arg) {
    int64_t n = (int64_t)(intptr_t)arg;
    int fd = co_dial("udp", addr, CO_FOREVER);
    char msg[64] = {1}, got[64];
    for (int64_t i = 0; fd >= 0 && i < n; i++) {
        if (co_write(fd, msg, sizeof msg, CO_FOREVER) != sizeof msg ||
            co_read(fd, got, sizeof got, co_deadline_after(1000000000LL)) != sizeof got)
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED); /* a lost datagram: the next one */
    }
    if (fd >= 0)
        co_close(fd);
    co_waitgroup_done(&wg);
}

/* The responder: A 10.0.0.1 for every name, no AAAA (NOERROR, empty). */
static int serve_dns(void) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int big = 8 << 20; /* a lost query costs its client the resolver's timeout */
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0)
        return 1;
    printf("port=%d\n", local_port(s));
    fflush(stdout);
    uint8_t q[512], r[600];
    for (;;) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(s, q, sizeof q, 0, (struct sockaddr *)&from, &fl);
        if (n < 17)
            continue;
        int i = 12;
        while (i < n && q[i])
            i += q[i] + 1;
        if (i + 5 > n)
            continue;
        int qtype = q[i + 1] << 8 | q[i + 2], end = i + 5;
        memcpy(r, q, (size_t)end);
        r[2] = 0x84 | (q[2] & 1);
        r[3] = 0x80;
        memset(r + 6, 0, 6);
        int at = end;
        if (qtype == 1) {
            static const uint8_t rr[] = {0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 0, 0, 1};
            memcpy(r + at, rr, sizeof rr);
            at += sizeof rr;
            r[7] = 1;
        }
        sendto(s, r, (size_t)at, 0, (struct sockaddr *)&from, fl);
    }
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "serve-dns"))
        return serve_dns();
    if (argc < 4) {
        fprintf(stderr, "usage: bench_dial dial|hosts|dns|udp|udpmm N C [PORT]\n");
        return 2;
    }
    const char *mode = argv[1];
    n_ops = atoll(argv[2]);
    n_co = atoi(argv[3]);
    if (n_ops <= 0 || n_co <= 0)
        return 2;
    int srv = -1;
    if (!strcmp(mode, "dial")) {
        struct co_listen_opts o = {.backlog = 4096};
        srv = co_listen("tcp4", "127.0.0.1:0", &o);
        snprintf(addr, sizeof addr, "127.0.0.1:%d", local_port(srv));
        for (int i = 0; i < 2; i++)
            co_go(closer, (void *)(intptr_t)srv);
    } else if (!strcmp(mode, "udp") || !strcmp(mode, "udpmm")) {
        srv = co_listen("udp4", "127.0.0.1:0", NULL);
        snprintf(addr, sizeof addr, "127.0.0.1:%d", local_port(srv));
        bool mm = !strcmp(mode, "udpmm");
        for (int i = 0; i < 4; i++)
            co_go(mm ? udp_server_mm : udp_server, (void *)(intptr_t)srv);
    } else if (!strcmp(mode, "dns")) {
        if (argc < 5)
            return 2;
        dns_port = atoi(argv[4]);
        char servers[64];
        snprintf(servers, sizeof servers, "127.0.0.1:%d", dns_port);
        co_resolver_conf_t c = {.servers = servers};
        if (co_resolver_configure(&c) < 0) {
            fprintf(stderr, "bench_dial: co_resolver_configure failed (no c-ares?)\n");
            return 1;
        }
    } else if (strcmp(mode, "hosts") != 0) {
        return 2;
    }
    void (*fn)(void *) = !strcmp(mode, "dial")  ? dial_worker
                         : !strcmp(mode, "udp") || !strcmp(mode, "udpmm") ? udp_worker
                                                : lookup_worker;
    int64_t per = n_ops / n_co;
    co_waitgroup_add(&wg, n_co);
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    int64_t t0 = bench_now();
    for (int i = 0; i < n_co; i++)
        co_go(fn, (void *)(intptr_t)per);
    co_waitgroup_wait(&wg);
    int64_t dt = bench_now() - t0;
    int64_t ops = per * n_co;
    getrusage(RUSAGE_SELF, &ru1);
    /* CPU time (user + system, all threads) of the measurement: what a
     * loaded machine's wall clock hides */
#define TV_NS(tv) ((int64_t)(tv).tv_sec * 1000000000 + (int64_t)(tv).tv_usec * 1000)
    int64_t cpu = TV_NS(ru1.ru_utime) + TV_NS(ru1.ru_stime) - TV_NS(ru0.ru_utime) - TV_NS(ru0.ru_stime);
    printf("bench=%s impl=colony procs=%d ns_per_op=%.1f ops=%lld peak_rss_kb=%ld ops_per_s=%.0f "
           "failures=%d cpu_ns_per_op=%.0f\n",
           mode, co_procs(), (double)dt / (double)ops, (long long)ops, bench_peak_rss_kb(),
           (double)ops * 1e9 / (double)dt, failures, (double)cpu / (double)ops);
    return 0;
}
