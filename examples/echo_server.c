/*
 * An echo server on colony: every connection is served by a coroutine from
 * a bounded co_pool; it echoes whatever it reads until the peer closes.
 *
 *   echo_server [port] [pool-size]
 *
 * port 0 (the default is 7007) picks a free one; the port is printed.
 * A peer silent for 30 s, or one that stops reading our echoes for 10 s,
 * is dropped. When the pool is full a new connection waits (in a bounded
 * queue as deep as the pool) up to 1 s for a worker; after that, or if
 * the queue is full too, it is refused: closed with no data (the client
 * reads end-of-file before any echo). SIGINT/SIGTERM shut it down cleanly
 * (signalfd + co_wait_fd): stop accepting, end every connection, wait for
 * the workers, print stats and the peak RSS.
 *
 * tests/test_servers.c includes this file with ECHO_SERVER_NO_MAIN.
 */
#define _GNU_SOURCE 1
#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define ECHO_MS 1000000LL
#define ECHO_BUF 4096

typedef struct echo_config {
    const char *host;         /* NULL: 127.0.0.1 */
    int port;                 /* 0: any free port */
    int pool_size;
    int64_t idle_timeout_ns;  /* a connection silent this long is dropped */
    int64_t write_timeout_ns; /* a peer must take our echo within this */
    int64_t queue_wait_ns;    /* how long a new connection waits for a worker */
    int queue_cap;            /* 0: pool_size */
} echo_config_t;

typedef struct echo_stats {
    int64_t accepted, served, refused, bytes, timeouts, resets;
} echo_stats_t;

typedef struct echo_conn echo_conn_t;
typedef struct echo_server {
    echo_config_t cfg;
    int lfd, port;
    co_pool_t *pool;
    co_chan_t *queue;     /* of echo_pending_t */
    co_waitgroup_t loops; /* accept loop + dispatcher */
    int stopping;         /* atomic: set once by echo_server_stop */
    co_mutex_t mu;        /* protects active, closing */
    echo_conn_t *active;
    bool closing;
    echo_stats_t st;      /* atomic counters */
} echo_server_t;

struct echo_conn {
    echo_server_t *srv;
    int fd;
    echo_conn_t *prev, *next; /* in srv->active, under srv->mu */
};

typedef struct {
    int fd;
    int64_t since;
} echo_pending_t;

#define ECHO_INC(s, f, n) __atomic_add_fetch(&(s)->st.f, (n), __ATOMIC_RELAXED)

static bool echo_register(echo_conn_t *c) {
    echo_server_t *s = c->srv;
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

static void echo_unregister(echo_conn_t *c) {
    echo_server_t *s = c->srv;
    co_mutex_lock(&s->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->active = c->next;
    if (c->next)
        c->next->prev = c->prev;
    co_mutex_unlock(&s->mu);
}

static void echo_conn_main(void *arg) {
    echo_conn_t *c = arg;
    echo_server_t *s = c->srv;
    ECHO_INC(s, served, 1);
    if (echo_register(c)) {
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char buf[ECHO_BUF];
        for (;;) {
            ssize_t n = co_read(c->fd, buf, sizeof buf, co_deadline_after(s->cfg.idle_timeout_ns));
            if (n <= 0) {
                if (n == CO_ETIMEDOUT)
                    ECHO_INC(s, timeouts, 1);
                else if (n == -ECONNRESET)
                    ECHO_INC(s, resets, 1);
                break; /* EOF, stalled peer, reset, or shutdown */
            }
            ssize_t w = co_write(c->fd, buf, (size_t)n, co_deadline_after(s->cfg.write_timeout_ns));
            if (w != n) {
                if (w == CO_ETIMEDOUT)
                    ECHO_INC(s, timeouts, 1);
                break;
            }
            ECHO_INC(s, bytes, n);
        }
        echo_unregister(c);
    }
    co_close(c->fd);
    free(c);
}

/* Refuse: FIN with no data. Drain first so that the close is not a reset. */
static void echo_refuse(echo_server_t *s, int fd) {
    ECHO_INC(s, refused, 1);
    char sink[1024];
    while (co_read(fd, sink, sizeof sink, 0) > 0) {
    }
    shutdown(fd, SHUT_WR);
    co_close(fd);
}

static int echo_hand_to_pool(echo_server_t *s, int fd, int64_t deadline) {
    echo_conn_t *c = malloc(sizeof *c);
    if (!c)
        return CO_ENOMEM;
    c->srv = s;
    c->fd = fd;
    int rc = co_pool_submit_until(s->pool, echo_conn_main, c, deadline);
    if (rc < 0)
        free(c);
    return rc;
}

static void echo_dispatcher(void *arg) {
    echo_server_t *s = arg;
    echo_pending_t p;
    while (co_chan_recv(s->queue, &p, CO_FOREVER) == 0) {
        if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE) ||
            echo_hand_to_pool(s, p.fd, p.since + s->cfg.queue_wait_ns) < 0)
            echo_refuse(s, p.fd);
    }
    co_waitgroup_done(&s->loops);
}

static void echo_accept_loop(void *arg) {
    echo_server_t *s = arg;
    int64_t backoff = 0;
    for (;;) {
        int fd = co_accept(s->lfd, NULL, NULL, CO_FOREVER);
        if (fd < 0) {
            if (fd == CO_ECLOSED || fd == -EBADF || __atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE))
                break;
            backoff = backoff ? (backoff * 2 > 1000 * ECHO_MS ? 1000 * ECHO_MS : backoff * 2)
                              : 5 * ECHO_MS;
            co_sleep(backoff); /* EMFILE and friends */
            continue;
        }
        backoff = 0;
        ECHO_INC(s, accepted, 1);
        if (echo_hand_to_pool(s, fd, 0) == 0)
            continue;
        echo_pending_t p = {.fd = fd, .since = co_now()};
        if (co_chan_send(s->queue, &p, 0) < 0)
            echo_refuse(s, fd);
    }
    co_chan_close(s->queue);
    co_waitgroup_done(&s->loops);
}

static int echo_listen(const char *host, int port, int *bound) {
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

static int echo_server_start(echo_server_t **out, const echo_config_t *cfg) {
    echo_server_t *s = calloc(1, sizeof *s);
    if (!s)
        return CO_ENOMEM;
    s->cfg = *cfg;
    if (s->cfg.pool_size <= 0)
        s->cfg.pool_size = 1000;
    if (s->cfg.idle_timeout_ns <= 0)
        s->cfg.idle_timeout_ns = 30000 * ECHO_MS;
    if (s->cfg.write_timeout_ns <= 0)
        s->cfg.write_timeout_ns = 10000 * ECHO_MS;
    if (s->cfg.queue_wait_ns <= 0)
        s->cfg.queue_wait_ns = 1000 * ECHO_MS;
    if (s->cfg.queue_cap <= 0)
        s->cfg.queue_cap = s->cfg.pool_size;
    int rc = echo_listen(s->cfg.host, s->cfg.port, &s->port);
    if (rc < 0)
        goto fail;
    s->lfd = rc;
    co_pool_opts_t po = {.stack_size = 64 * 1024};
    if ((rc = co_pool_new(&s->pool, s->cfg.pool_size, &po)) < 0)
        goto fail_lfd;
    if ((rc = co_chan_new(&s->queue, sizeof(echo_pending_t), (size_t)s->cfg.queue_cap)) < 0)
        goto fail_pool;
    co_waitgroup_add(&s->loops, 2);
    if ((rc = co_go(echo_dispatcher, s)) < 0) {
        co_waitgroup_add(&s->loops, -2);
        goto fail_chan;
    }
    if ((rc = co_go(echo_accept_loop, s)) < 0) {
        co_waitgroup_done(&s->loops);
        co_chan_close(s->queue);
        co_waitgroup_wait(&s->loops);
        goto fail_chan;
    }
    *out = s;
    return 0;
fail_chan:
    co_chan_free(s->queue);
fail_pool:
    co_pool_destroy(s->pool);
fail_lfd:
    co_close(s->lfd);
fail:
    free(s);
    return rc;
}

static void echo_server_stop(echo_server_t *s) {
    if (__atomic_exchange_n(&s->stopping, 1, __ATOMIC_ACQ_REL))
        return;
    co_close(s->lfd);
}

static void echo_server_wait(echo_server_t *s, echo_stats_t *stats) {
    co_waitgroup_wait(&s->loops);
    co_mutex_lock(&s->mu);
    s->closing = true;
    for (echo_conn_t *c = s->active; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    co_mutex_unlock(&s->mu);
    co_pool_destroy(s->pool);
    co_chan_free(s->queue);
    if (stats)
        *stats = s->st;
    free(s);
}

#ifndef ECHO_SERVER_NO_MAIN

typedef struct {
    echo_config_t cfg;
    int sigfd;
} echo_main_t;

static int echo_run(void *arg) {
    echo_main_t *m = arg;
    echo_server_t *s;
    int rc = echo_server_start(&s, &m->cfg);
    if (rc < 0) {
        fprintf(stderr, "echo_server: cannot start: %s\n", co_strerror(rc));
        return 1;
    }
    printf("echo_server: listening on %s:%d (pool %d, %d Ps)\n",
           m->cfg.host ? m->cfg.host : "127.0.0.1", s->port, s->cfg.pool_size, co_procs());
    fflush(stdout);
    for (;;) {
        rc = co_wait_fd(m->sigfd, CO_READABLE, CO_FOREVER);
        struct signalfd_siginfo si;
        if (rc < 0 || co_read(m->sigfd, &si, sizeof si, 0) == (ssize_t)sizeof si)
            break;
    }
    printf("echo_server: shutting down\n");
    echo_server_stop(s);
    echo_stats_t st;
    echo_server_wait(s, &st);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("echo_server: accepted %lld, served %lld, refused %lld, %lld bytes echoed; "
           "timeouts %lld, resets %lld; peak RSS %ld KiB\n",
           (long long)st.accepted, (long long)st.served, (long long)st.refused,
           (long long)st.bytes, (long long)st.timeouts, (long long)st.resets, ru.ru_maxrss);
    co_close(m->sigfd);
    return 0;
}

int main(int argc, char **argv) {
    echo_main_t m = {.cfg = {.port = 7007, .pool_size = 1000}};
    if (argc > 1)
        m.cfg.port = atoi(argv[1]);
    if (argc > 2)
        m.cfg.pool_size = atoi(argv[2]);
    if (argc > 3 || m.cfg.port < 0 || m.cfg.port > 65535 || (argc > 2 && m.cfg.pool_size <= 0)) {
        fprintf(stderr, "usage: %s [port (0: any)] [pool-size]\n", argv[0]);
        return 2;
    }
    const char *h = getenv("ECHO_HOST");
    if (h)
        m.cfg.host = h;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before the runtime's threads exist */
    signal(SIGPIPE, SIG_IGN);
    m.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (m.sigfd < 0) {
        perror("signalfd");
        return 1;
    }
    int rc = co_main(echo_run, &m);
    int sd = co_shutdown();
    if (sd < 0)
        fprintf(stderr, "echo_server: co_shutdown: %s\n", co_strerror(sd));
    return rc ? rc : (sd < 0);
}
#endif
