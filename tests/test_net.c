/* net: co_dial and co_listen over tcp/udp/unix on 127.0.0.1 and ::1,
 * datagrams and messages (fd passing), vectored I/O and sendfile, bad
 * input. Real peers: colony's own coroutines and plain threads, and
 * python3's socket module where it is installed. Behaviour, not timing. */
// ctest-timeout: 120
#define _GNU_SOURCE 1
#include "t.h"
#include "test_net_util.h"

#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int sockopt(int fd, int level, int name) {
    int v = -1;
    socklen_t l = sizeof v;
    getsockopt(fd, level, name, &v, &l);
    return v;
}

/* ---- an echo server on a listener, one coroutine per connection ---- */

static void echo_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[4096];
    ssize_t n;
    while ((n = co_read(fd, buf, sizeof buf, co_deadline_after(10 * SEC))) > 0)
        if (co_write(fd, buf, (size_t)n, co_deadline_after(10 * SEC)) != n)
            break;
    co_close(fd);
}

typedef struct srv {
    int lfd;
    int accepted_nodelay;
    int accepted_keepalive;
    co_waitgroup_t wg;
} srv_t;

/* Accepts until the listener is closed. */
static void accept_loop(void *arg) {
    srv_t *s = arg;
    for (;;) {
        int c = co_accept(s->lfd, NULL, NULL, CO_FOREVER);
        if (c < 0)
            break;
        if (s->accepted_nodelay < 0) {
            s->accepted_nodelay = sockopt(c, IPPROTO_TCP, TCP_NODELAY);
            s->accepted_keepalive = sockopt(c, SOL_SOCKET, SO_KEEPALIVE);
        }
        co_go(echo_conn, (void *)(intptr_t)c);
    }
    co_waitgroup_done(&s->wg);
}

static void srv_start(srv_t *s, int lfd) {
    memset(s, 0, sizeof *s);
    s->lfd = lfd;
    s->accepted_nodelay = s->accepted_keepalive = -1;
    co_waitgroup_add(&s->wg, 1);
    CHECK_EQ(co_go(accept_loop, s), 0);
}

static void srv_stop(srv_t *s) {
    co_close(s->lfd);
    co_waitgroup_wait(&s->wg);
}

/* One round trip of msg over fd. */
static bool roundtrip(int fd, const char *msg) {
    size_t n = strlen(msg);
    char buf[256] = {0};
    if (co_write(fd, msg, n, co_deadline_after(10 * SEC)) != (ssize_t)n)
        return false;
    size_t got = 0;
    while (got < n) {
        ssize_t r = co_read(fd, buf + got, n - got, co_deadline_after(10 * SEC));
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return memcmp(buf, msg, n) == 0;
}

/* A listener on host (an address's host part: "127.0.0.1", "[::1]", ""),
 * any port, with its "host:port" in addr; its descriptor, or a failed
 * CHECK and the error code. */
static int listen_any_port(const char *net, const char *host, const struct co_listen_opts *o,
                           char *addr, size_t cap) {
    char at[64];
    snprintf(at, sizeof at, "%s:0", host);
    int l = co_listen(net, at, o);
    if (l < 0)
        fprintf(stderr, "listen %s %s: %s\n", net, at, co_strerror(l));
    CHECK(l >= 0);
    if (l >= 0)
        snprintf(addr, cap, "%s:%d", host, local_port(l));
    return l;
}

/* Dials addr over net, makes one round trip of msg and closes: a CHECK
 * fails where the dial or the round trip does. */
static void dial_echo(const char *net, const char *addr, const char *msg) {
    int fd = co_dial(net, addr, co_deadline_after(10 * SEC));
    if (fd < 0)
        fprintf(stderr, "dial %s %s: %s\n", net, addr, co_strerror(fd));
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(roundtrip(fd, msg));
    co_close(fd);
}

static void test_tcp4(void) {
    char addr[64];
    int l = listen_any_port("tcp4", "127.0.0.1", NULL, addr, sizeof addr);
    if (l < 0)
        return;
    int port = local_port(l);
    CHECK(port > 0);
    srv_t s;
    srv_start(&s, l);
    int fd = co_dial("tcp", addr, co_deadline_after(10 * SEC));
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK_EQ(sockopt(fd, IPPROTO_TCP, TCP_NODELAY), 1); /* Go's default */
        CHECK_EQ(sockopt(fd, SOL_SOCKET, SO_KEEPALIVE), 1);
        CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
        CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        CHECK(roundtrip(fd, "hello, tcp4"));
        CHECK_EQ(co_close(fd), 0);
    }
    /* a name from /etc/hosts, and Go's empty host: the local system */
    snprintf(addr, sizeof addr, "localhost:%d", port);
    dial_echo("tcp4", addr, "hello, localhost");
    snprintf(addr, sizeof addr, ":%d", port);
    dial_echo("tcp4", addr, "hello, empty host");
    srv_stop(&s);
    CHECK_EQ(s.accepted_nodelay, 1); /* accepted sockets inherit the listener's */
    CHECK_EQ(s.accepted_keepalive, 1);
    /* nothing listens there now */
    fd = co_dial("tcp", addr, co_deadline_after(10 * SEC));
    CHECK_EQ(fd, -ECONNREFUSED);
}

static bool have_ipv6_loopback(void) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static void test_tcp6(void) {
    if (!have_ipv6_loopback()) {
        fprintf(stderr, "skip: this host has no ::1\n");
        return;
    }
    char addr[64];
    int l = listen_any_port("tcp6", "[::1]", NULL, addr, sizeof addr);
    if (l < 0)
        return;
    srv_t s;
    srv_start(&s, l);
    dial_echo("tcp6", addr, "hello, tcp6");
    /* tcp4 cannot reach an IPv6 literal */
    CHECK_EQ(co_dial("tcp4", addr, co_deadline_after(SEC)), CO_EADDR);
    srv_stop(&s);

    /* a dual-stack wildcard listener takes both families */
    struct co_listen_opts o = {.backlog = 16};
    l = listen_any_port("tcp", "", &o, addr, sizeof addr);
    if (l < 0)
        return;
    srv_start(&s, l);
    int port = local_port(l);
    const char *fmts[] = {"127.0.0.1:%d", "[::1]:%d", "localhost:%d"};
    for (int i = 0; i < 3; i++) {
        snprintf(addr, sizeof addr, fmts[i], port);
        dial_echo("tcp", addr, addr);
    }
    srv_stop(&s);
    /* v6only: IPv4 is refused */
    o.v6only = true;
    l = listen_any_port("tcp", "[::]", &o, addr, sizeof addr);
    if (l >= 0) {
        snprintf(addr, sizeof addr, "127.0.0.1:%d", local_port(l));
        CHECK_EQ(co_dial("tcp", addr, co_deadline_after(10 * SEC)), -ECONNREFUSED);
        co_close(l);
    }
}

static void test_listen_opts(void) {
    struct co_listen_opts o = {.reuseport = true, .delay = true, .keepalive_ns = -1};
    char addr[64];
    int a = listen_any_port("tcp4", "127.0.0.1", &o, addr, sizeof addr);
    if (a < 0)
        return;
    CHECK_EQ(sockopt(a, SOL_SOCKET, SO_REUSEPORT), 1);
    CHECK_EQ(sockopt(a, IPPROTO_TCP, TCP_NODELAY), 0);
    CHECK_EQ(sockopt(a, SOL_SOCKET, SO_KEEPALIVE), 0);
    int b = co_listen("tcp4", addr, &o); /* the same port, shared */
    CHECK(b >= 0);
    int c = co_listen("tcp4", addr, NULL); /* without SO_REUSEPORT: taken */
    CHECK_EQ(c, -EADDRINUSE);
    co_close(a);
    if (b >= 0)
        co_close(b);
    struct co_listen_opts bad = {.backlog = -1};
    CHECK_EQ(co_listen("tcp", ":0", &bad), CO_EINVAL);
}

/* ---- bad input ---- */

static void test_bad_input(void) {
    static const struct {
        const char *net, *addr;
        int want;
    } cases[] = {
        {"tcp", "host", CO_EADDR},          {"tcp", "127.0.0.1", CO_EADDR},
        {"tcp", "host:", CO_EADDR},         {"tcp", "127.0.0.1:", CO_EADDR},
        {"tcp", ":99999", CO_EADDR},        {"tcp", ":65536", CO_EADDR},
        {"tcp", "[::1", CO_EADDR},          {"tcp", "[::1]", CO_EADDR},
        {"tcp", "[::1]x:80", CO_EADDR},     {"tcp", "::1:80", CO_EADDR},
        {"tcp", "127.0.0.1:-1", CO_EADDR},  {"tcp", "127.0.0.1:nosuchservice", CO_EADDR},
        {"tcp", "", CO_EADDR},              {"tcp", ":0", CO_EADDR},
        {"tcp4", "[::1]:80", CO_EADDR},     {"tcp6", "127.0.0.1:80", CO_EADDR},
        {"tcp", "bad name!:80", CO_ENOTFOUND}, {"tcp", "[fe80::1%nosuchif0]:80", CO_ENOTFOUND},
        {"tcpx", "127.0.0.1:80", CO_ENETUNKNOWN}, {"", "127.0.0.1:80", CO_ENETUNKNOWN},
        {"TCP", "127.0.0.1:80", CO_ENETUNKNOWN}, {"ip", "127.0.0.1", CO_ENETUNKNOWN},
        {"unix", "", CO_EADDR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = co_dial(cases[i].net, cases[i].addr, co_deadline_after(5 * SEC));
        if (rc != cases[i].want)
            fprintf(stderr, "co_dial(\"%s\", \"%s\") = %d (%s), want %d\n", cases[i].net,
                    cases[i].addr, rc, co_strerror(rc), cases[i].want);
        CHECK_EQ(rc, cases[i].want);
        if (rc >= 0)
            close(rc);
    }
    char path[256];
    memset(path, 'p', 200);
    path[0] = '/';
    path[200] = 0;
    CHECK_EQ(co_dial("unix", path, co_deadline_after(SEC)), CO_EADDR);
    CHECK_EQ(co_listen("unix", path, NULL), CO_EADDR);
    CHECK_EQ(co_listen("unixgram", path, NULL), CO_EADDR);
    CHECK_EQ(co_dial(NULL, "127.0.0.1:80", CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_dial("tcp", NULL, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_dial_ctx(NULL, "tcp", NULL, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_dial_ctx(NULL, "nope", "127.0.0.1:80", CO_FOREVER), CO_ENETUNKNOWN);
    CHECK_EQ(co_listen(NULL, ":0", NULL), CO_EINVAL);
    CHECK_EQ(co_listen("tcp", NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_listen("sctp", ":0", NULL), CO_ENETUNKNOWN);
    CHECK_EQ(co_listen("tcp", ":99999", NULL), CO_EADDR);
    CHECK_EQ(co_listen("tcp", "[::1", NULL), CO_EADDR);
    CHECK_EQ(co_listen("tcp", "host", NULL), CO_EADDR);
    CHECK(strcmp(co_strerror(CO_EADDR), "unknown error") != 0);
    CHECK(strcmp(co_strerror(CO_ENOTFOUND), "unknown error") != 0);
    CHECK(strcmp(co_strerror(CO_ENETUNKNOWN), "unknown error") != 0);
    CHECK(strcmp(co_strerror(CO_EDNS), "unknown error") != 0);

    /* deadlines in the past: a try, never a wait */
    char addr[64] = "";
    int l = listen_any_port("tcp4", "127.0.0.1", NULL, addr, sizeof addr);
    int fd = co_dial("tcp", addr, 0);
    CHECK(fd >= 0 || fd == CO_ETIMEDOUT);
    if (fd >= 0)
        co_close(fd);
    int a = co_accept(l, NULL, NULL, 0); /* the dial's connection, or none yet */
    CHECK(a >= 0 || a == CO_ETIMEDOUT);
    if (a >= 0)
        co_close(a);
    co_close(l);

    /* the datagram calls */
    char b[8];
    struct iovec iov = {b, sizeof b};
    CHECK_EQ(co_recvfrom(-1, b, 1, 0, NULL, NULL, 0), -EBADF);
    CHECK_EQ(co_recvfrom(0, NULL, 1, 0, NULL, NULL, 0), CO_EINVAL);
    struct sockaddr_in sa;
    CHECK_EQ(co_recvfrom(0, b, 1, 0, (struct sockaddr *)&sa, NULL, 0), CO_EINVAL);
    CHECK_EQ(co_sendto(-1, b, 1, 0, NULL, 0, 0), -EBADF);
    CHECK_EQ(co_sendto(0, NULL, 1, 0, NULL, 0, 0), CO_EINVAL);
    CHECK_EQ(co_recvmsg(0, NULL, 0, 0), CO_EINVAL);
    CHECK_EQ(co_sendmsg(0, NULL, 0, 0), CO_EINVAL);
    CHECK_EQ(co_readv(-1, &iov, 1, 0), -EBADF);
    CHECK_EQ(co_readv(0, NULL, 1, 0), CO_EINVAL);
    CHECK_EQ(co_writev(0, &iov, -1, 0), CO_EINVAL);
    CHECK_EQ(co_writev(0, &iov, 100000, 0), CO_EINVAL);
    CHECK_EQ(co_sendfile(-1, 0, NULL, 1, 0), -EBADF);
    off_t neg = -1;
    CHECK_EQ(co_sendfile(1, 0, &neg, 1, 0), CO_EINVAL);
}

/* ---- UDP ---- */

static void udp_echo(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[2048];
    for (;;) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = co_recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl, CO_FOREVER);
        if (n < 0)
            break;
        if (co_sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, fl, co_deadline_after(SEC)) != n)
            break;
    }
}

static void test_udp(void) {
    char addr[64];
    int s = listen_any_port("udp", "127.0.0.1", NULL, addr, sizeof addr);
    if (s < 0)
        return;
    CHECK_EQ(co_go(udp_echo, (void *)(intptr_t)s), 0);
    int c = co_dial("udp", addr, co_deadline_after(SEC));
    CHECK(c >= 0);
    for (int i = 0; i < 20 && c >= 0; i++) {
        char msg[64], got[64] = {0};
        int n = snprintf(msg, sizeof msg, "datagram %d", i);
        CHECK_EQ(co_write(c, msg, (size_t)n, co_deadline_after(SEC)), n);
        CHECK_EQ(co_read(c, got, sizeof got, co_deadline_after(10 * SEC)), n);
        CHECK(memcmp(msg, got, (size_t)n) == 0);
    }
    /* unconnected: co_sendto and co_recvfrom with addresses */
    int u = co_listen("udp4", "127.0.0.1:0", NULL);
    CHECK(u >= 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)local_port(s))};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(co_sendto(u, "ping", 4, 0, (struct sockaddr *)&to, sizeof to, co_deadline_after(SEC)), 4);
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    char b[16];
    CHECK_EQ(co_recvfrom(u, b, sizeof b, 0, (struct sockaddr *)&from, &fl, co_deadline_after(10 * SEC)), 4);
    CHECK_EQ(fl, sizeof from);
    CHECK_EQ(ntohs(from.sin_port), local_port(s));
    /* nothing to read: the deadline holds, past or near */
    CHECK_EQ(co_recvfrom(u, b, sizeof b, 0, NULL, NULL, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_recvfrom(u, b, sizeof b, 0, NULL, NULL, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    co_close(u);
    if (c >= 0)
        co_close(c);
    co_close(s);
}

/* python3's socket module as the far side: a UDP echo and a unix socket
 * that sends a descriptor. Without python3: false, and a line on why the
 * test skips. */
static bool have_python(void) {
    if (system("python3 -c 'import socket' >/dev/null 2>&1") == 0)
        return true;
    fprintf(stderr, "skip: no python3\n");
    return false;
}

static void test_udp_python(void) {
    if (!have_python())
        return;
    int c = co_listen("udp4", "127.0.0.1:0", NULL);
    CHECK(c >= 0);
    if (c < 0)
        return;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import socket\n"
             "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
             "s.settimeout(20)\n"
             "for i in range(3):\n"
             "  s.sendto(b\"py%%d\" %% i,(\"127.0.0.1\",%d))\n"
             "  d,a=s.recvfrom(100)\n"
             "  assert d==b\"py%%d!\" %% i, d\n"
             "' &",
             local_port(c));
    CHECK_EQ(system(cmd), 0);
    for (int i = 0; i < 3; i++) {
        char b[64];
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = co_recvfrom(c, b, sizeof b - 1, 0, (struct sockaddr *)&from, &fl,
                                co_deadline_after(20 * SEC));
        CHECK_EQ(n, 3);
        if (n != 3)
            break;
        b[n] = '!';
        CHECK_EQ(b[2], '0' + i);
        CHECK_EQ(co_sendto(c, b, 4, 0, (struct sockaddr *)&from, fl, co_deadline_after(SEC)), 4);
    }
    co_close(c);
}

/* ---- unix sockets and fd passing ---- */

static void tmp_path(char *buf, size_t cap, const char *tag) {
    snprintf(buf, cap, "/tmp/colony-net-%d-%s.sock", (int)getpid(), tag);
    unlink(buf);
}

static ssize_t send_fd(int sock, int fd, const char *data) {
    struct iovec iov = {(void *)data, strlen(data)};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return co_sendmsg(sock, &m, 0, co_deadline_after(10 * SEC));
}

/* Receives a message and the descriptor that came with it (-1 if none). */
static ssize_t recv_fd(int sock, char *data, size_t cap, int *fd) {
    struct iovec iov = {data, cap};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } u;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    *fd = -1;
    ssize_t n = co_recvmsg(sock, &m, 0, co_deadline_after(20 * SEC));
    if (n < 0)
        return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            memcpy(fd, CMSG_DATA(c), sizeof(int));
    return n;
}

typedef struct pass {
    int lfd;
    int got;
    char text[64];
    co_waitgroup_t wg;
} pass_t;

static void pass_receiver(void *arg) {
    pass_t *p = arg;
    int c = co_accept(p->lfd, NULL, NULL, co_deadline_after(20 * SEC));
    if (c >= 0) {
        char data[32] = {0};
        int fd;
        if (recv_fd(c, data, sizeof data, &fd) > 0 && fd >= 0) {
            /* the passed pipe's read end, a fresh number: co_read works on it */
            p->got = (int)co_read(fd, p->text, sizeof p->text - 1, co_deadline_after(10 * SEC));
            CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
            co_close(fd);
        }
        CHECK_EQ(strcmp(data, "fd"), 0);
        co_close(c);
    }
    co_waitgroup_done(&p->wg);
}

static void test_unix_fd_passing(void) {
    char path[108];
    tmp_path(path, sizeof path, "pass");
    pass_t p = {.got = -1};
    p.lfd = co_listen("unix", path, NULL);
    CHECK(p.lfd >= 0);
    if (p.lfd < 0)
        return;
    CHECK_EQ(co_listen("unix", path, NULL), -EADDRINUSE); /* as Go: the path is taken */
    co_waitgroup_add(&p.wg, 1);
    CHECK_EQ(co_go(pass_receiver, &p), 0);
    int c = co_dial("unix", path, co_deadline_after(10 * SEC));
    CHECK(c >= 0);
    int pp[2];
    CHECK_EQ(pipe(pp), 0);
    CHECK_EQ(write(pp[1], "through the socket", 18), 18);
    close(pp[1]);
    if (c >= 0) {
        CHECK_EQ(send_fd(c, pp[0], "fd"), 2);
        co_close(c);
    }
    close(pp[0]);
    co_waitgroup_wait(&p.wg);
    CHECK_EQ(p.got, 18);
    CHECK_EQ(strcmp(p.text, "through the socket"), 0);
    co_close(p.lfd);
    unlink(path);

    /* python3 passes us a descriptor */
    if (!have_python())
        return;
    tmp_path(path, sizeof path, "py");
    int l = co_listen("unix", path, NULL);
    CHECK(l >= 0);
    if (l < 0)
        return;
    char cmd[700];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import socket,os\n"
             "r,w=os.pipe()\n"
             "os.write(w,b\"from python\")\n"
             "os.close(w)\n"
             "s=socket.socket(socket.AF_UNIX,socket.SOCK_STREAM)\n"
             "s.connect(\"%s\")\n"
             "socket.send_fds(s,[b\"py\"],[r])\n"
             "s.recv(1)\n"
             "' &",
             path);
    CHECK_EQ(system(cmd), 0);
    int a = co_accept(l, NULL, NULL, co_deadline_after(20 * SEC));
    CHECK(a >= 0);
    if (a >= 0) {
        char data[8] = {0}, text[32] = {0};
        int fd;
        CHECK_EQ(recv_fd(a, data, sizeof data, &fd), 2);
        CHECK(fd >= 0);
        if (fd >= 0) {
            CHECK_EQ(co_read(fd, text, sizeof text, co_deadline_after(10 * SEC)), 11);
            CHECK_EQ(strcmp(text, "from python"), 0);
            co_close(fd);
        }
        co_close(a); /* python's recv(1) sees the end */
    }
    co_close(l);
    unlink(path);
}

static void test_unixgram(void) {
    char sp[108], cp[108];
    tmp_path(sp, sizeof sp, "gs");
    tmp_path(cp, sizeof cp, "gc");
    int s = co_listen("unixgram", sp, NULL);
    CHECK(s >= 0);
    int c = co_dial("unixgram", sp, co_deadline_after(SEC));
    CHECK(c >= 0);
    if (s >= 0 && c >= 0) {
        CHECK_EQ(co_write(c, "gram", 4, co_deadline_after(SEC)), 4);
        char b[8] = {0};
        CHECK_EQ(co_recvfrom(s, b, sizeof b, 0, NULL, NULL, co_deadline_after(10 * SEC)), 4);
        CHECK_EQ(memcmp(b, "gram", 4), 0);
    }
    if (c >= 0)
        co_close(c);
    if (s >= 0)
        co_close(s);
    /* the abstract namespace */
    char ab[64];
    snprintf(ab, sizeof ab, "@colony-net-%d", (int)getpid());
    int l = co_listen("unix", ab, NULL);
    CHECK(l >= 0);
    if (l >= 0) {
        srv_t srv;
        srv_start(&srv, l);
        dial_echo("unix", ab, "abstract");
        srv_stop(&srv);
    }
    /* an abstract name may fill all of sun_path (no NUL), 108 bytes with
     * its '@'; one more does not fit */
    char full[sizeof(((struct sockaddr_un *)0)->sun_path) + 2];
    memset(full, 'x', sizeof full);
    full[0] = '@';
    snprintf(full + 1, 24, "colony-full-%d-", (int)getpid());
    full[strlen(full)] = 'x';
    full[sizeof full - 2] = 0; /* 108 bytes */
    int lf = co_listen("unix", full, NULL);
    CHECK(lf >= 0);
    if (lf >= 0) {
        int cf = co_dial("unix", full, co_deadline_after(10 * SEC));
        CHECK(cf >= 0);
        if (cf >= 0)
            co_close(cf);
        co_close(lf);
    }
    full[sizeof full - 2] = 'x';
    full[sizeof full - 1] = 0; /* 109 bytes */
    CHECK_EQ(co_listen("unix", full, NULL), CO_EADDR);
    unlink(sp);
    unlink(cp);
    CHECK_EQ(co_dial("unix", sp, co_deadline_after(SEC)), -ENOENT);
}

/* ---- vectored I/O and sendfile over TCP ---- */

typedef struct sink {
    int fd;
    size_t want;
    size_t got;
    uint32_t sum;
    co_waitgroup_t wg;
} sink_t;

static void sink_fn(void *arg) {
    sink_t *s = arg;
    char buf[8192];
    while (s->got < s->want) {
        char a[3000], b[5192];
        struct iovec iov[2] = {{a, sizeof a}, {b, sizeof b}};
        ssize_t n = co_readv(s->fd, iov, 2, co_deadline_after(20 * SEC));
        if (n <= 0)
            break;
        memcpy(buf, a, (size_t)n < sizeof a ? (size_t)n : sizeof a);
        if ((size_t)n > sizeof a)
            memcpy(buf + sizeof a, b, (size_t)n - sizeof a);
        for (ssize_t i = 0; i < n; i++)
            s->sum = s->sum * 31 + (uint8_t)buf[i];
        s->got += (size_t)n;
    }
    co_waitgroup_done(&s->wg);
}

static uint32_t sum_of(const uint8_t *p, size_t n, uint32_t s) {
    for (size_t i = 0; i < n; i++)
        s = s * 31 + p[i];
    return s;
}

static void test_writev_sendfile(void) {
    char addr[64];
    int l = listen_any_port("tcp4", "127.0.0.1", NULL, addr, sizeof addr);
    if (l < 0)
        return;
    int c = co_dial("tcp", addr, co_deadline_after(10 * SEC));
    int a = co_accept(l, NULL, NULL, co_deadline_after(10 * SEC));
    CHECK(c >= 0 && a >= 0);
    if (c < 0 || a < 0)
        return;
    /* 3 MiB in 40 pieces, more than a socket buffer: co_writev parks and resumes */
    enum { PIECES = 40, PIECE = 3 * 1024 * 1024 / PIECES };
    uint8_t *data = malloc((size_t)PIECES * PIECE);
    for (size_t i = 0; i < (size_t)PIECES * PIECE; i++)
        data[i] = (uint8_t)(i * 7 + i / 251);
    struct iovec iov[PIECES];
    for (int i = 0; i < PIECES; i++)
        iov[i] = (struct iovec){data + (size_t)i * PIECE, PIECE};
    sink_t s = {.fd = a, .want = (size_t)PIECES * PIECE};
    co_waitgroup_add(&s.wg, 1);
    CHECK_EQ(co_go(sink_fn, &s), 0);
    CHECK_EQ(co_writev(c, iov, PIECES, co_deadline_after(20 * SEC)), (ssize_t)s.want);
    co_waitgroup_wait(&s.wg);
    CHECK_EQ(s.got, s.want);
    CHECK_EQ(s.sum, sum_of(data, s.want, 0));

    /* sendfile: 1 MiB of a file, from an offset */
    char tmpl[] = "/tmp/colony-net-sf-XXXXXX";
    int f = mkstemp(tmpl);
    CHECK(f >= 0);
    unlink(tmpl);
    CHECK_EQ(write(f, data, 1 << 20), 1 << 20);
    off_t off = 1000;
    size_t cnt = (1 << 20) - 1000;
    sink_t s2 = {.fd = a, .want = cnt};
    co_waitgroup_add(&s2.wg, 1);
    CHECK_EQ(co_go(sink_fn, &s2), 0);
    CHECK_EQ(co_sendfile(c, f, &off, cnt, co_deadline_after(20 * SEC)), (ssize_t)cnt);
    CHECK_EQ(off, 1 << 20);
    co_waitgroup_wait(&s2.wg);
    CHECK_EQ(s2.got, cnt);
    CHECK_EQ(s2.sum, sum_of(data + 1000, cnt, 0));
    /* past the file's end: what there was */
    off = (1 << 20) - 10;
    sink_t s3 = {.fd = a, .want = 10};
    co_waitgroup_add(&s3.wg, 1);
    CHECK_EQ(co_go(sink_fn, &s3), 0);
    CHECK_EQ(co_sendfile(c, f, &off, 100, co_deadline_after(20 * SEC)), 10);
    co_waitgroup_wait(&s3.wg);
    close(f);
    /* the writer's deadline holds when nobody reads */
    ssize_t w = 0;
    for (int i = 0; i < 100 && w >= 0; i++)
        w = co_writev(c, iov, PIECES, co_deadline_after(50 * MS));
    CHECK_EQ(w, CO_ETIMEDOUT);
    free(data);
    co_close(c);
    co_close(a);
    co_close(l);
}

/* ---- stress: many senders on one socket, coroutines and plain threads ---- */

enum { ST_SENDERS = 12, ST_THREADS = 3, ST_MSGS = 300 };

typedef struct stress {
    int fd;     /* the senders' end */
    int seen[ST_SENDERS + ST_THREADS];
    int bad;    /* atomic: sends that did not send one whole record */
    int next_id; /* atomic */
    co_waitgroup_t wg;
} stress_t;

/* A record: [id][seq][len 64][64 bytes of (id + seq)], in three vectors. */
static void send_records(stress_t *st, bool stream) {
    int id = __atomic_fetch_add(&st->next_id, 1, __ATOMIC_RELAXED);
    for (int seq = 0; seq < ST_MSGS; seq++) {
        uint32_t hdr[3] = {(uint32_t)id, (uint32_t)seq, 64};
        uint8_t body[64];
        memset(body, (uint8_t)(id + seq), sizeof body);
        struct iovec iov[3] = {{hdr, 8}, {&hdr[2], 4}, {body, sizeof body}};
        ssize_t n;
        if (stream) {
            n = co_writev(st->fd, iov, 3, co_deadline_after(20 * SEC));
        } else if (seq % 2) {
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = 3};
            n = co_sendmsg(st->fd, &m, 0, co_deadline_after(20 * SEC));
        } else {
            uint8_t flat[76];
            memcpy(flat, hdr, 12);
            memcpy(flat + 12, body, 64);
            n = co_sendto(st->fd, flat, sizeof flat, 0, NULL, 0, co_deadline_after(20 * SEC));
        }
        if (n != 76)
            __atomic_add_fetch(&st->bad, 1, __ATOMIC_RELAXED);
    }
}

typedef struct stress_arg {
    stress_t *st;
    bool stream;
} stress_arg_t;

static void *stress_thread(void *arg) {
    stress_arg_t *a = arg;
    send_records(a->st, a->stream);
    return NULL;
}

static void stress_co_stream(void *arg) {
    send_records(arg, true);
    co_waitgroup_done(&((stress_t *)arg)->wg);
}

static void stress_co_dgram(void *arg) {
    send_records(arg, false);
    co_waitgroup_done(&((stress_t *)arg)->wg);
}

static bool check_record(stress_t *st, const uint8_t *r) {
    uint32_t hdr[3];
    memcpy(hdr, r, 12);
    if (hdr[0] >= ST_SENDERS + ST_THREADS || hdr[2] != 64 || (int)hdr[1] != st->seen[hdr[0]])
        return false; /* each sender's records arrive whole and in order */
    for (int i = 0; i < 64; i++)
        if (r[12 + i] != (uint8_t)(hdr[0] + hdr[1]))
            return false;
    st->seen[hdr[0]]++;
    return true;
}

static void run_stress(bool stream) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, stream ? SOCK_STREAM : SOCK_DGRAM, 0, sv), 0);
    stress_t st = {.fd = sv[0]};
    int senders = t_sanitized() ? 4 : ST_SENDERS;
    co_waitgroup_add(&st.wg, senders);
    for (int i = 0; i < senders; i++)
        CHECK_EQ(co_go(stream ? stress_co_stream : stress_co_dgram, &st), 0);
    pthread_t th[ST_THREADS];
    stress_arg_t ta = {&st, stream};
    for (int i = 0; i < ST_THREADS; i++)
        pthread_create(&th[i], NULL, stress_thread, &ta);
    /* this plain thread receives, with co_readv or co_recvmsg/co_recvfrom */
    int total = (senders + ST_THREADS) * ST_MSGS, got = 0, rbad = 0;
    static uint8_t buf[1 << 16];
    size_t have = 0;
    while (got < total) {
        ssize_t n;
        if (stream) {
            struct iovec iov[2] = {{buf + have, 100}, {buf + have + 100, sizeof buf - have - 100}};
            n = co_readv(sv[1], iov, 2, co_deadline_after(20 * SEC));
        } else if (got % 2) {
            struct iovec iov = {buf, sizeof buf};
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
            n = co_recvmsg(sv[1], &m, 0, co_deadline_after(20 * SEC));
        } else {
            n = co_recvfrom(sv[1], buf, sizeof buf, 0, NULL, NULL, co_deadline_after(20 * SEC));
        }
        if (n <= 0)
            break;
        if (!stream) {
            if (n != 76 || !check_record(&st, buf))
                rbad++;
            got++;
            continue;
        }
        have += (size_t)n;
        size_t off = 0;
        while (have - off >= 76) {
            if (!check_record(&st, buf + off))
                rbad++;
            off += 76;
            got++;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
    for (int i = 0; i < ST_THREADS; i++)
        pthread_join(th[i], NULL);
    co_waitgroup_wait(&st.wg);
    CHECK_EQ(got, total);
    CHECK_EQ(rbad, 0);
    CHECK_EQ(__atomic_load_n(&st.bad, __ATOMIC_RELAXED), 0);
    co_close(sv[0]);
    co_close(sv[1]);
}

static void test_stress_writev(void) { run_stress(true); }
static void test_stress_datagrams(void) { run_stress(false); }

/* The resolver without a server of the test's own (so in every build,
 * c-ares or not): /etc/hosts, literals, and a name nobody knows, whose
 * answer depends on the machine's DNS but must come by the deadline. */
static void test_lookup(void) {
    struct sockaddr_storage a[8];
    CHECK(co_lookup_host(NULL, "localhost", a, 8, co_deadline_after(10 * SEC)) >= 1);
    CHECK(co_lookup_host(NULL, "LOCALHOST.", a, 8, 0) >= 1); /* any case, a root dot */
    CHECK_EQ(co_lookup_host(NULL, "10.1.2.3", a, 8, 0), 1);
    CHECK_EQ(((struct sockaddr_in *)&a[0])->sin_addr.s_addr, htonl(0x0a010203));
    char name[64] = {0};
    struct sockaddr_in lo = {.sin_family = AF_INET};
    lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&lo, sizeof lo, name, sizeof name,
                            co_deadline_after(10 * SEC)), 0);
    CHECK(name[0] != 0);
    char tiny[4];
    CHECK_EQ(co_lookup_addr(NULL, (struct sockaddr *)&lo, sizeof lo, tiny, sizeof tiny,
                            co_deadline_after(10 * SEC)), 0);
    CHECK(strlen(tiny) <= 3); /* cut to cap */
    int64_t t0 = co_now();
    int rc = co_lookup_host(NULL, "colony-test-nosuch.invalid", a, 8, co_deadline_after(2 * SEC));
    if (rc != CO_ENOTFOUND && rc != CO_EDNS && rc != CO_ETIMEDOUT)
        fprintf(stderr, "lookup of an unknown name: %d (%s)\n", rc, co_strerror(rc));
    CHECK(rc == CO_ENOTFOUND || rc == CO_EDNS || rc == CO_ETIMEDOUT);
    CHECK(co_now() - t0 < 20 * SEC); /* the deadline held, 10x loose */
    rc = co_lookup_host(NULL, "colony-test-nosuch.invalid", a, 8, 0);
    CHECK(rc == CO_ENOTFOUND || rc == CO_EDNS || rc == CO_ETIMEDOUT);
    /* a context canceled already: nothing is asked */
    co_ctx_t *ctx;
    CHECK_EQ(co_ctx_with_cancel(&ctx, co_ctx_background()), 0);
    co_ctx_cancel(ctx);
    CHECK_EQ(co_lookup_host(ctx, "colony-test-nosuch.invalid", a, 8, CO_FOREVER), CO_ECANCELED);
    CHECK_EQ(co_lookup_addr(ctx, (struct sockaddr *)&lo, sizeof lo, name, sizeof name, CO_FOREVER),
             CO_ECANCELED);
    co_ctx_free(ctx);
}

/* Many coroutines dialing at once, from plain threads too. */
typedef struct many {
    const char *addr;
    int ok;
    co_waitgroup_t wg;
} many_t;

static void dialer(void *arg) {
    many_t *m = arg;
    for (int i = 0; i < 20; i++) {
        int fd = co_dial("tcp", m->addr, co_deadline_after(20 * SEC));
        if (fd >= 0) {
            if (roundtrip(fd, "x"))
                __atomic_add_fetch(&m->ok, 1, __ATOMIC_RELAXED);
            co_close(fd);
        }
    }
    co_waitgroup_done(&m->wg);
}

static void test_many_dials(void) {
    char addr[64];
    int l = listen_any_port("tcp4", "127.0.0.1", NULL, addr, sizeof addr);
    if (l < 0)
        return;
    srv_t s;
    srv_start(&s, l);
    snprintf(addr, sizeof addr, "localhost:%d", local_port(l)); /* by name */
    many_t m = {.addr = addr};
    int n = t_sanitized() ? 10 : 50;
    co_waitgroup_add(&m.wg, n);
    for (int i = 0; i < n; i++)
        CHECK_EQ(co_go(dialer, &m), 0);
    many_t here = {.addr = addr}; /* and a plain thread, this one */
    co_waitgroup_add(&here.wg, 1);
    dialer(&here);
    CHECK_EQ(here.ok, 20);
    co_waitgroup_wait(&m.wg);
    CHECK_EQ(m.ok, n * 20);
    srv_stop(&s);
}

int main(void) {
    t_begin(110);
    signal(SIGPIPE, SIG_DFL); /* the sends must not raise it */
    CHECK_EQ(co_init(NULL), 0);
    T_RUN(test_tcp4);
    T_RUN(test_tcp6);
    T_RUN(test_listen_opts);
    T_RUN(test_bad_input);
    T_RUN(test_udp);
    T_RUN(test_udp_python);
    T_RUN(test_unix_fd_passing);
    T_RUN(test_unixgram);
    T_RUN(test_writev_sendfile);
    T_RUN(test_stress_writev);
    T_RUN(test_stress_datagrams);
    T_RUN(test_lookup);
    T_RUN(test_many_dials);
    return t_end();
}
