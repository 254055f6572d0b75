/*
 * co_dial and co_listen (Go's net.Dial, net.Listen, net.ListenPacket).
 *
 * A dial to a name tries its addresses as Go's dialer does: for "tcp"
 * with addresses of both families, the family of the first address goes
 * first (the primaries) and the other one (the fallbacks) starts after a
 * fallback delay of 300 ms or as soon as the primaries fail (RFC 6555);
 * each side tries its addresses one after another, each with a share of
 * the time left (at least 2 s of it, never past the deadline); the first
 * connection wins and the attempts still under way are cut short
 * (shutdown(2) aborts a connect in progress) and closed.
 */
#include "base/base.h"
#include "io/io.h"
#include "net/net.h"

#include <colony.h>

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#define FALLBACK_DELAY_NS (300 * 1000000LL)
#define MIN_ATTEMPT_NS (2000 * 1000000LL)
#define KEEPALIVE_NS (15 * 1000000000LL)
#define MAX_ADDRS 16

typedef struct netw {
    int family; /* AF_UNSPEC (either IP family), AF_INET, AF_INET6, AF_UNIX */
    int type;   /* SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET */
} netw_t;

static int parse_network(const char *n, netw_t *nw) {
    static const struct {
        const char *name;
        netw_t nw;
    } tab[] = {
        {"tcp", {AF_UNSPEC, SOCK_STREAM}},   {"tcp4", {AF_INET, SOCK_STREAM}},
        {"tcp6", {AF_INET6, SOCK_STREAM}},   {"udp", {AF_UNSPEC, SOCK_DGRAM}},
        {"udp4", {AF_INET, SOCK_DGRAM}},     {"udp6", {AF_INET6, SOCK_DGRAM}},
        {"unix", {AF_UNIX, SOCK_STREAM}},    {"unixgram", {AF_UNIX, SOCK_DGRAM}},
        {"unixpacket", {AF_UNIX, SOCK_SEQPACKET}},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(n, tab[i].name) == 0) {
            *nw = tab[i].nw;
            return 0;
        }
    return CO_ENETUNKNOWN;
}

/* "host:port", "[v6]:port", ":port" (Go's net.SplitHostPort) into host
 * (brackets gone) and a port number; a service name is looked up in
 * /etc/services. An empty port is 0. */
static int split_hostport(const char *a, const netw_t *nw, char *host, size_t cap, int *port) {
    const char *colon = strrchr(a, ':');
    if (!colon)
        return CO_EADDR; /* missing port */
    const char *h = a, *he = colon;
    if (a[0] == '[') {
        const char *rb = strchr(a, ']');
        if (!rb || rb + 1 != colon)
            return CO_EADDR; /* "[::1", "[::1]x:80", "[::1]" */
        h = a + 1;
        he = rb;
        if (memchr(h, '[', (size_t)(he - h)))
            return CO_EADDR;
    } else if (memchr(a, ':', (size_t)(colon - a)) || memchr(a, '[', (size_t)(colon - a)) ||
               memchr(a, ']', (size_t)(colon - a))) {
        return CO_EADDR; /* "::1:80": too many colons */
    }
    if ((size_t)(he - h) >= cap)
        return CO_EADDR;
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = 0;
    const char *p = colon + 1;
    if (!*p) {
        *port = 0;
        return 0;
    }
    if (strchr(p, ']') || strchr(p, '['))
        return CO_EADDR;
    bool digits = true;
    for (const char *q = p; *q; q++)
        digits = digits && *q >= '0' && *q <= '9';
    if (digits) {
        long v = 0;
        for (const char *q = p; *q && v <= 65535; q++)
            v = v * 10 + (*q - '0');
        if (v > 65535)
            return CO_EADDR;
        *port = (int)v;
        return 0;
    }
    struct servent se, *r = NULL;
    char buf[1024];
    if (getservbyname_r(p, nw->type == SOCK_DGRAM ? "udp" : "tcp", &se, buf, sizeof buf, &r) != 0 ||
        !r)
        return CO_EADDR; /* unknown port */
    *port = ntohs((uint16_t)r->s_port);
    return 0;
}

static void set_port(struct sockaddr_storage *ss, int port) {
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
}

static bool fam_ok(const netw_t *nw, int fam) {
    return nw->family == AF_UNSPEC || nw->family == fam;
}

/* The addresses of an IP network's address, port set, of nw's family. */
static int ip_addrs(const netw_t *nw, const char *address, bool listen, co_ctx_t *ctx,
                    int64_t deadline, struct sockaddr_storage *out, int *n) {
    char host[300];
    int port, rc = split_hostport(address, nw, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    if (!listen && port == 0)
        return CO_EADDR; /* nowhere to dial */
    struct sockaddr_storage tmp[MAX_ADDRS];
    int m;
    if (!host[0]) {
        /* Go: the local system to dial, every address to listen on */
        memset(tmp, 0, sizeof tmp[0] * 2);
        m = 0;
        if (nw->family != AF_INET) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&tmp[m++];
            s6->sin6_family = AF_INET6;
            s6->sin6_addr = listen ? in6addr_any : in6addr_loopback;
        }
        if (nw->family != AF_INET6) {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&tmp[m++];
            s4->sin_family = AF_INET;
            s4->sin_addr.s_addr = htonl(listen ? INADDR_ANY : INADDR_LOOPBACK);
        }
        if (!listen && nw->family == AF_UNSPEC) { /* IPv4 first, as Go dials "" */
            struct sockaddr_storage t = tmp[0];
            tmp[0] = tmp[1];
            tmp[1] = t;
        }
    } else {
        m = co_lookup_host(ctx, host, tmp, MAX_ADDRS, deadline);
        if (m < 0)
            return m;
    }
    *n = 0;
    for (int i = 0; i < m; i++)
        if (fam_ok(nw, tmp[i].ss_family)) {
            out[*n] = tmp[i];
            set_port(&out[(*n)++], port);
        }
    return *n ? 0 : CO_EADDR; /* no address of the network's family */
}

static int unix_addr(const char *path, struct sockaddr_un *su, socklen_t *len) {
    size_t n = strlen(path);
    memset(su, 0, sizeof *su);
    su->sun_family = AF_UNIX;
    /* a path needs its NUL in sun_path; an abstract name ("@name") does
     * not, so it may fill all of it */
    if (n == 0 || n > sizeof su->sun_path || (path[0] != '@' && n == sizeof su->sun_path))
        return CO_EADDR; /* empty, or longer than sun_path holds */
    memcpy(su->sun_path, path, n);
    if (path[0] == '@') /* Linux's abstract namespace, as Go names it */
        su->sun_path[0] = 0;
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '@' ? 0 : 1));
    return 0;
}

static int new_socket(int fam, int type) {
    int fd = socket(fam, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    co__io_adopt(fd, type == SOCK_STREAM && (fam == AF_INET || fam == AF_INET6));
    return fd;
}

/* Go's defaults for a TCP connection: no Nagle, keep-alive every period. */
static void tcp_opts(int fd, bool nodelay, int64_t keepalive_ns) {
    int one = 1;
    if (nodelay)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (keepalive_ns > 0) {
        /* whole seconds, 1 to the kernel's most (32767): a longer
         * period would be refused and leave the kernel's default */
        int64_t s64 = keepalive_ns / 1000000000 + (keepalive_ns % 1000000000 != 0);
        int secs = s64 > 32767 ? 32767 : (int)s64;
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &secs, sizeof secs);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &secs, sizeof secs);
    }
}

/* ---- dialing -------------------------------------------------------------- */

/* The two sides of a race (RFC 6555). mu protects fd[] and stop: an
 * attempt publishes its fd while it connects, so that the side that wins
 * (or the caller, at the deadline) can cut it short with shutdown(2), and
 * takes it back before closing it (a number is never shut down once it
 * may have been reused). The first connection to find stop clear sets it
 * and wins; one that finds it set closes its fd. The rest is written
 * before the sides start and only read after. */
typedef struct race {
    co_mutex_t mu;
    int fd[2];
    bool stop; /* set once, by the winner or the caller giving up */
    int refs;  /* atomic: the caller and each side; the last frees (acq_rel: the
                * others' writes come before the free); a new side's reference is
                * taken (relaxed) by a holder before co_go publishes the side */
    co_chan_t *res; /* capacity 2: each side sends its result once */
    netw_t nw;
    int64_t deadline;
    struct sockaddr_storage addrs[2][MAX_ADDRS];
    int n[2];
} race_t;

typedef struct result {
    int side;
    int rc; /* the fd of the winner, or the side's first error */
} result_t;

static void race_unref(race_t *r) {
    if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        co_chan_free(r->res);
        free(r);
    }
}

static int dial_one(const netw_t *nw, const struct sockaddr *sa, socklen_t len, int64_t deadline,
                    race_t *r, int side) {
    int fd = new_socket(sa->sa_family, nw->type);
    if (fd < 0)
        return fd;
    if (nw->type == SOCK_STREAM && sa->sa_family != AF_UNIX)
        tcp_opts(fd, true, KEEPALIVE_NS);
    if (r) {
        co_mutex_lock(&r->mu);
        bool stop = r->stop;
        if (!stop)
            r->fd[side] = fd;
        co_mutex_unlock(&r->mu);
        if (stop) {
            co_close(fd);
            return CO_ECANCELED;
        }
    }
    int rc = co_connect(fd, sa, len, deadline);
    if (r) {
        co_mutex_lock(&r->mu);
        r->fd[side] = -1;
        if (rc == 0 && r->stop)
            rc = CO_ECANCELED; /* the other side won */
        else if (rc == 0) {
            r->stop = true; /* this one wins: cut the other short */
            if (r->fd[!side] >= 0)
                shutdown(r->fd[!side], SHUT_RDWR);
        }
        co_mutex_unlock(&r->mu);
    }
    if (rc < 0) {
        co_close(fd);
        return rc;
    }
    return fd;
}

/* Go's dialSerial: each address in turn, each with a share of the time
 * left; the first error is the one reported. */
static int dial_serial(const netw_t *nw, const struct sockaddr_storage *a, int n,
                       int64_t deadline, race_t *r, int side) {
    int first = CO_EADDR;
    for (int i = 0; i < n; i++) {
        int64_t dl = deadline;
        if (deadline != CO_FOREVER) {
            int64_t now = co_now();
            if (now >= deadline && i > 0)
                return first;
            int64_t share = (deadline - now) / (n - i);
            if (share < MIN_ATTEMPT_NS)
                share = MIN_ATTEMPT_NS;
            if (now + share < deadline)
                dl = now + share;
        }
        int fd = dial_one(nw, (const struct sockaddr *)&a[i], co__net_salen(&a[i]), dl, r, side);
        if (fd >= 0)
            return fd;
        if (i == 0)
            first = fd;
        if (fd == CO_ECANCELED || (deadline != CO_FOREVER && co_now() >= deadline))
            return i == 0 ? fd : first;
    }
    return first;
}

typedef struct side_arg {
    race_t *r;
    int side;
} side_arg_t;

static void race_side(void *arg) {
    race_t *r = ((side_arg_t *)arg)->r;
    int side = ((side_arg_t *)arg)->side;
    free(arg);
    result_t res = {side, dial_serial(&r->nw, r->addrs[side], r->n[side], r->deadline, r, side)};
    co_chan_send(r->res, &res, CO_FOREVER); /* room for both: never waits */
    race_unref(r);
}

static int start_side(race_t *r, int side) {
    side_arg_t *a = malloc(sizeof *a);
    if (!a)
        return CO_ENOMEM;
    *a = (side_arg_t){r, side};
    __atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED);
    int rc = co_go(race_side, a);
    if (rc < 0) {
        free(a);
        __atomic_sub_fetch(&r->refs, 1, __ATOMIC_RELAXED);
    }
    return rc;
}

/* Go's dialParallel (with no fallbacks: a dial that a context may cut
 * short). Waits for the sides' results, the fallback delay, the deadline
 * and ctx's cancellation. */
static int dial_parallel(race_t *r, co_ctx_t *ctx) {
    int rc = start_side(r, 0);
    if (rc < 0)
        return rc;
    int running = 1, first = 0;
    bool fb_due = r->n[1] > 0; /* the fallbacks are still to start */
    int64_t fb = co_deadline_after(FALLBACK_DELAY_NS);
    if (r->deadline != CO_FOREVER && r->deadline < fb)
        fb = r->deadline;
    while (running > 0 || fb_due) {
        result_t res;
        co_case_t cs[2] = {{.ch = r->res, .op = CO_RECV, .elem = &res},
                           {.ch = co_ctx_done(ctx), .op = CO_RECV}};
        int w = co_select(cs, 2, fb_due ? fb : r->deadline);
        if (w == CO_ETIMEDOUT && fb_due &&
            (r->deadline == CO_FOREVER || co_now() < r->deadline)) {
            if (start_side(r, 1) == 0)
                running++;
            fb_due = false;
            continue;
        }
        if (w != 0) {
            /* The deadline or ctx: stop both; a winner of the last
             * instant is taken below, from the channel. */
            co_mutex_lock(&r->mu);
            bool won = r->stop;
            r->stop = true;
            for (int i = 0; i < 2; i++)
                if (r->fd[i] >= 0)
                    shutdown(r->fd[i], SHUT_RDWR);
            co_mutex_unlock(&r->mu);
            while (won && running-- > 0 && co_chan_recv(r->res, &res, CO_FOREVER) == 0)
                if (res.rc >= 0)
                    return res.rc;
            return w == 1 ? co_ctx_err(ctx) : CO_ETIMEDOUT;
        }
        running--;
        if (res.rc >= 0)
            return res.rc;
        if (res.side == 0 || !first)
            first = res.rc; /* the primaries' error, if they have one */
        if (fb_due) { /* the primaries failed: the fallbacks now */
            if (start_side(r, 1) == 0)
                running++;
            fb_due = false;
        }
    }
    return first ? first : CO_EADDR;
}

int co_dial(const char *network, const char *address, int64_t deadline) {
    return co_dial_ctx(NULL, network, address, deadline);
}

int co_dial_ctx(co_ctx_t *ctx, const char *network, const char *address, int64_t deadline) {
    if (!network || !address)
        return CO_EINVAL;
    netw_t nw;
    int rc = parse_network(network, &nw);
    if (rc < 0)
        return rc;
    if (ctx && (rc = co_ctx_err(ctx)) < 0)
        return rc;
    if (nw.family == AF_UNIX) { /* connect(2) does not wait here */
        struct sockaddr_un su;
        socklen_t len;
        if ((rc = unix_addr(address, &su, &len)) < 0)
            return rc;
        return dial_one(&nw, (struct sockaddr *)&su, len, deadline, NULL, 0);
    }
    struct sockaddr_storage all[MAX_ADDRS];
    int n;
    if ((rc = ip_addrs(&nw, address, false, ctx, deadline, all, &n)) < 0)
        return rc;
    /* Go's partition: the first address's family are the primaries. */
    int fam = all[0].ss_family, nf = 0;
    for (int i = 0; i < n; i++)
        nf += all[i].ss_family != fam;
    bool cancellable = co_ctx_done(ctx) != NULL && nw.type == SOCK_STREAM;
    if (nw.type != SOCK_STREAM || (nf == 0 && !cancellable))
        return dial_serial(&nw, all, n, deadline, NULL, 0);
    race_t *r = malloc(sizeof *r);
    if (!r)
        return CO_ENOMEM;
    int np = 0;
    nf = 0;
    for (int i = 0; i < n; i++) {
        if (all[i].ss_family == fam)
            r->addrs[0][np++] = all[i];
        else
            r->addrs[1][nf++] = all[i];
    }
    r->n[0] = np;
    r->n[1] = nf;
    r->nw = nw;
    r->deadline = deadline;
    r->fd[0] = r->fd[1] = -1;
    r->stop = false;
    r->refs = 1;
    memset(&r->mu, 0, sizeof r->mu);
    if ((rc = co_chan_new(&r->res, sizeof(result_t), 2)) < 0) {
        free(r);
        return rc;
    }
    rc = dial_parallel(r, ctx);
    race_unref(r);
    return rc;
}

/* ---- listening ------------------------------------------------------------ */

int co_listen(const char *network, const char *address, const struct co_listen_opts *opts) {
    if (!network || !address)
        return CO_EINVAL;
    static const struct co_listen_opts defaults;
    if (!opts)
        opts = &defaults;
    if (opts->backlog < 0)
        return CO_EINVAL;
    netw_t nw;
    int rc = parse_network(network, &nw);
    if (rc < 0)
        return rc;
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (nw.family == AF_UNIX) {
        struct sockaddr_un su;
        if ((rc = unix_addr(address, &su, &len)) < 0)
            return rc;
        memcpy(&ss, &su, len);
    } else {
        struct sockaddr_storage a[MAX_ADDRS];
        int n;
        if ((rc = ip_addrs(&nw, address, true, NULL, CO_FOREVER, a, &n)) < 0)
            return rc;
        /* Go listens on the first IPv4 address of a name, if it has one. A
         * wildcard of "tcp"/"udp" is [::] (dual stack) where IPv6 works. */
        int pick = 0;
        char host[300];
        int port;
        bool wild = split_hostport(address, &nw, host, sizeof host, &port) == 0 && !host[0];
        for (int i = 0; i < n && !wild; i++)
            if (a[i].ss_family == AF_INET) {
                pick = i;
                break;
            }
        ss = a[pick];
        len = co__net_salen(&ss);
    }
    int fd = new_socket(ss.ss_family, nw.type);
    if (fd == -EAFNOSUPPORT && ss.ss_family == AF_INET6 && nw.family == AF_UNSPEC) {
        /* no IPv6 here: the IPv4 wildcard */
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        int port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        memset(&ss, 0, sizeof ss);
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        len = sizeof *s4;
        fd = new_socket(AF_INET, nw.type);
    }
    if (fd < 0)
        return fd;
    int one = 1;
    if (ss.ss_family == AF_INET6) {
        int v6only = opts->v6only || nw.family == AF_INET6;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
    }
    if (nw.family != AF_UNIX && nw.type == SOCK_STREAM)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (opts->reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) {
        rc = -errno;
        goto fail;
    }
    if (nw.family != AF_UNIX && nw.type == SOCK_STREAM) /* accepted sockets inherit these */
        tcp_opts(fd, !opts->delay, opts->keepalive_ns ? opts->keepalive_ns : KEEPALIVE_NS);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0) {
        rc = -errno;
        goto fail;
    }
    if (nw.type != SOCK_DGRAM && listen(fd, opts->backlog ? opts->backlog : SOMAXCONN) < 0) {
        rc = -errno;
        goto fail;
    }
    return fd;
fail:
    co_close(fd);
    return rc;
}
