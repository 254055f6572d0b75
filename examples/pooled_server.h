/*
 * The front end shared by the example servers (echo_server.c,
 * http_server.c): a TCP listener whose connections are served by a colony
 * pool, one pool task per connection.
 *
 *   accept loop  -> a free worker?  hand the connection to the pool
 *                -> else the waiting room (a channel of queue_cap
 *                   connections) -> the dispatcher waits for a worker until
 *                   the connection's queue_wait_ns is up, then refuses it
 *                -> the waiting room is full too: refuse at once
 *
 * Refusing drains what the peer sent (so the close is a FIN, not a reset),
 * writes the server's refusal message if it has one (one non-blocking try:
 * the acceptor never stalls), and closes. Every accepted connection is
 * served or refused; none is dropped.
 *
 * A server embeds psrv_t as the first member of its own struct and
 * psrv_conn_t as the first member of its connection struct. Its `serve`
 * task calls psrv_register() first (false: shutting down, close at once)
 * and psrv_unregister() before it closes the connection, so that
 * psrv_wait() can end the connections still being served.
 *
 * Header-only (static functions), so that tests can #include both servers
 * in one program.
 */
#ifndef COLONY_EXAMPLES_POOLED_SERVER_H
#define COLONY_EXAMPLES_POOLED_SERVER_H

#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define PSRV_MS 1000000LL

typedef struct psrv psrv_t;

typedef struct psrv_conn {
    psrv_t *srv;
    int fd;
    struct psrv_conn *prev, *next; /* in srv->active, under srv->mu */
} psrv_conn_t;

typedef struct psrv_config {
    const char *host;      /* listen address; NULL: 127.0.0.1 */
    int port;              /* 0: any free port */
    int pool_size;         /* workers: connections served at once */
    int64_t queue_wait_ns; /* how long a connection may wait for a worker */
    int queue_cap;         /* connections that may wait */
    size_t conn_size;      /* bytes of the server's connection struct */
    void (*serve)(void *conn);   /* the pool task, given the new connection */
    const char *refuse_msg;      /* written to a refused connection; NULL: none */
} psrv_config_t;

struct psrv {
    psrv_config_t cfg;
    int lfd, port;
    co_pool_t *pool;
    co_chan_t *queue;      /* of psrv_pending_t: connections waiting for a worker */
    co_waitgroup_t loops;  /* the accept loop and the dispatcher */
    int stopping;          /* atomic: set once by psrv_stop */
    co_mutex_t mu;         /* protects active, closing */
    psrv_conn_t *active;   /* connections being served (for shutdown) */
    bool closing;          /* under mu: no new connection may register */
    int64_t accepted, refused; /* atomic counters */
};

typedef struct psrv_pending {
    int fd;
    int64_t since;
} psrv_pending_t;

static inline bool psrv_stopping(const psrv_t *s) {
    return __atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE) != 0;
}

static bool psrv_register(psrv_conn_t *c) {
    psrv_t *s = c->srv;
    co_mutex_lock(&s->mu);
    bool ok = !s->closing;
    if (ok) {
        c->prev = NULL;
        c->next = s->active;
        if (s->active)
            s->active->prev = c;
        s->active = c;
    }
    co_mutex_unlock(&s->mu);
    return ok;
}

static void psrv_unregister(psrv_conn_t *c) {
    psrv_t *s = c->srv;
    co_mutex_lock(&s->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->active = c->next;
    if (c->next)
        c->next->prev = c->prev;
    co_mutex_unlock(&s->mu);
}

static void psrv_refuse(psrv_t *s, int fd) {
    __atomic_add_fetch(&s->refused, 1, __ATOMIC_RELAXED);
    char sink[1024];
    /* drained (at most 16 KiB: a peer that keeps sending must not hold the
     * acceptor), so that our close sends FIN, not RST */
    for (int i = 0; i < 16 && co_read(fd, sink, sizeof sink, 0) > 0; i++) {
    }
    if (s->cfg.refuse_msg) /* try once: never stall the acceptor */
        (void)co_write(fd, s->cfg.refuse_msg, strlen(s->cfg.refuse_msg), 0);
    shutdown(fd, SHUT_WR);
    co_close(fd);
}

/* A zeroed connection of cfg.conn_size bytes, handed to a worker by the
 * deadline (0: only if one is free now). */
static int psrv_hand_to_pool(psrv_t *s, int fd, int64_t deadline) {
    psrv_conn_t *c = calloc(1, s->cfg.conn_size);
    if (!c)
        return CO_ENOMEM;
    c->srv = s;
    c->fd = fd;
    int rc = co_pool_submit_until(s->pool, s->cfg.serve, c, deadline);
    if (rc < 0)
        free(c);
    return rc;
}

/* Takes waiting connections off the queue and waits (until each one's
 * own deadline) for a worker. */
static void psrv_dispatcher(void *arg) {
    psrv_t *s = arg;
    psrv_pending_t p;
    while (co_chan_recv(s->queue, &p, CO_FOREVER) == 0) {
        if (psrv_stopping(s) || psrv_hand_to_pool(s, p.fd, p.since + s->cfg.queue_wait_ns) < 0)
            psrv_refuse(s, p.fd);
    }
    co_waitgroup_done(&s->loops);
}

static void psrv_accept_loop(void *arg) {
    psrv_t *s = arg;
    int64_t backoff = 0;
    for (;;) {
        int fd = co_accept(s->lfd, NULL, NULL, CO_FOREVER);
        if (fd < 0) {
            if (fd == CO_ECLOSED || fd == -EBADF || psrv_stopping(s))
                break;
            /* EMFILE, ENOBUFS...: back off as Go's Serve does (5 ms .. 1 s) */
            backoff = backoff ? (backoff * 2 > 1000 * PSRV_MS ? 1000 * PSRV_MS : backoff * 2)
                              : 5 * PSRV_MS;
            co_sleep(backoff);
            continue;
        }
        backoff = 0;
        __atomic_add_fetch(&s->accepted, 1, __ATOMIC_RELAXED);
        if (psrv_hand_to_pool(s, fd, 0) == 0)
            continue; /* a worker took it */
        psrv_pending_t p = {.fd = fd, .since = co_now()};
        if (co_chan_send(s->queue, &p, 0) < 0)
            psrv_refuse(s, fd); /* the waiting room is full too */
    }
    co_chan_close(s->queue); /* the dispatcher refuses what is left, then ends */
    co_waitgroup_done(&s->loops);
}

static int psrv_listen(const char *host, int port, int *bound) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host ? host : "127.0.0.1", &a.sin_addr) != 1) {
        close(fd);
        return CO_EINVAL;
    }
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4096) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    *bound = ntohs(a.sin_port);
    return fd;
}

/* Start serving into s (zeroed by the caller). pool_size <= 0 means 1000,
 * queue_wait_ns <= 0 one second, queue_cap <= 0 pool_size. 0 or a negative
 * code (then nothing is left running). */
static int psrv_start(psrv_t *s, const psrv_config_t *cfg) {
    s->cfg = *cfg;
    if (s->cfg.pool_size <= 0)
        s->cfg.pool_size = 1000;
    if (s->cfg.queue_wait_ns <= 0)
        s->cfg.queue_wait_ns = 1000 * PSRV_MS;
    if (s->cfg.queue_cap <= 0)
        s->cfg.queue_cap = s->cfg.pool_size;
    int rc = psrv_listen(s->cfg.host, s->cfg.port, &s->port);
    if (rc < 0)
        return rc;
    s->lfd = rc;
    co_pool_opts_t po = {.stack_size = 64 * 1024};
    if ((rc = co_pool_new(&s->pool, s->cfg.pool_size, &po)) < 0)
        goto fail_lfd;
    if ((rc = co_chan_new(&s->queue, sizeof(psrv_pending_t), (size_t)s->cfg.queue_cap)) < 0)
        goto fail_pool;
    co_waitgroup_add(&s->loops, 2);
    if ((rc = co_go(psrv_dispatcher, s)) < 0) {
        co_waitgroup_add(&s->loops, -2);
        goto fail_chan;
    }
    if ((rc = co_go(psrv_accept_loop, s)) < 0) {
        co_waitgroup_done(&s->loops);
        co_chan_close(s->queue);
        co_waitgroup_wait(&s->loops);
        goto fail_chan;
    }
    return 0;
fail_chan:
    co_chan_free(s->queue);
fail_pool:
    co_pool_destroy(s->pool);
fail_lfd:
    co_close(s->lfd);
    return rc;
}

/* Begin shutdown; callable once, from any coroutine or thread. */
static void psrv_stop(psrv_t *s) {
    if (__atomic_exchange_n(&s->stopping, 1, __ATOMIC_ACQ_REL))
        return;
    co_close(s->lfd); /* wakes the accept loop with CO_ECLOSED */
}

/* Wait for the shutdown begun by psrv_stop to finish: the connections still
 * served are ended (their reads see EOF), every worker returned. */
static void psrv_wait(psrv_t *s) {
    co_waitgroup_wait(&s->loops);
    co_mutex_lock(&s->mu);
    s->closing = true;
    for (psrv_conn_t *c = s->active; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    co_mutex_unlock(&s->mu);
    co_pool_destroy(s->pool); /* waits for the workers */
    co_chan_free(s->queue);
}

/* ---- for a server's main() ---------------------------------------------- */

/* Before co_main: lets the process use its whole fd allowance, blocks
 * SIGINT and SIGTERM (before the runtime's threads exist: they inherit the
 * mask) and returns a signalfd that receives them (or -1, errno set).
 * SIGPIPE is ignored: a write to a closed peer returns EPIPE. */
/* A command-line integer in [lo, hi], all of the string ("80x" is not
 * 80, "--help" not 0); false otherwise. */
static inline bool psrv_arg_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static inline int psrv_main_signals(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

/* In a coroutine: wait until SIGINT or SIGTERM arrives on sigfd. */
static inline void psrv_wait_signal(int sigfd) {
    for (;;) {
        int rc = co_wait_fd(sigfd, CO_READABLE, CO_FOREVER);
        struct signalfd_siginfo si;
        if (rc < 0 || co_read(sigfd, &si, sizeof si, 0) == (ssize_t)sizeof si)
            return;
    }
}

#endif
