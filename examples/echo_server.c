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

#include "pooled_server.h"

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

typedef struct echo_server {
    psrv_t front;         /* first: the listener, pool, queue and live connections */
    echo_config_t cfg;
    echo_stats_t st;      /* atomic counters (accepted, refused: in front) */
} echo_server_t;

typedef struct echo_conn {
    psrv_conn_t base;     /* first */
} echo_conn_t;

#define ECHO_INC(s, f, n) __atomic_add_fetch(&(s)->st.f, (n), __ATOMIC_RELAXED)

static void echo_conn_main(void *arg) {
    echo_conn_t *c = arg;
    echo_server_t *s = (echo_server_t *)c->base.srv;
    int fd = c->base.fd;
    ECHO_INC(s, served, 1);
    if (psrv_register(&c->base)) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char buf[ECHO_BUF];
        for (;;) {
            ssize_t n = co_read(fd, buf, sizeof buf, co_deadline_after(s->cfg.idle_timeout_ns));
            if (n <= 0) {
                if (n == CO_ETIMEDOUT)
                    ECHO_INC(s, timeouts, 1);
                else if (n == -ECONNRESET)
                    ECHO_INC(s, resets, 1);
                break; /* EOF, stalled peer, reset, or shutdown */
            }
            ssize_t w = co_write(fd, buf, (size_t)n, co_deadline_after(s->cfg.write_timeout_ns));
            if (w != n) {
                if (w == CO_ETIMEDOUT)
                    ECHO_INC(s, timeouts, 1);
                break;
            }
            ECHO_INC(s, bytes, n);
        }
        psrv_unregister(&c->base);
    }
    co_close(fd);
    free(c);
}

static int echo_server_start(echo_server_t **out, const echo_config_t *cfg) {
    echo_server_t *s = calloc(1, sizeof *s);
    if (!s)
        return CO_ENOMEM;
    s->cfg = *cfg;
    if (s->cfg.idle_timeout_ns <= 0)
        s->cfg.idle_timeout_ns = 30000 * ECHO_MS;
    if (s->cfg.write_timeout_ns <= 0)
        s->cfg.write_timeout_ns = 10000 * ECHO_MS;
    /* a refused connection gets no data: the client reads EOF */
    psrv_config_t pc = {.host = s->cfg.host, .port = s->cfg.port, .pool_size = s->cfg.pool_size,
                        .queue_wait_ns = s->cfg.queue_wait_ns, .queue_cap = s->cfg.queue_cap,
                        .conn_size = sizeof(echo_conn_t), .serve = echo_conn_main};
    int rc = psrv_start(&s->front, &pc);
    if (rc < 0) {
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

static int echo_server_port(const echo_server_t *s) { return s->front.port; }

static void echo_server_stop(echo_server_t *s) { psrv_stop(&s->front); }

/* Wait for the shutdown begun by echo_server_stop; frees s. */
static void echo_server_wait(echo_server_t *s, echo_stats_t *stats) {
    psrv_wait(&s->front);
    if (stats) {
        *stats = s->st;
        stats->accepted = s->front.accepted;
        stats->refused = s->front.refused;
    }
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
           m->cfg.host ? m->cfg.host : "127.0.0.1", echo_server_port(s), s->front.cfg.pool_size,
           co_procs());
    fflush(stdout);
    psrv_wait_signal(m->sigfd);
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
    bool help = argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    if (help || argc > 3 || (argc > 1 && !psrv_arg_int(argv[1], 0, 65535, &m.cfg.port)) ||
        (argc > 2 && !psrv_arg_int(argv[2], 1, 1 << 24, &m.cfg.pool_size))) {
        fprintf(help ? stdout : stderr, "usage: %s [port (0: any)] [pool-size]\n", argv[0]);
        return help ? 0 : 2;
    }
    const char *h = getenv("ECHO_HOST");
    if (h)
        m.cfg.host = h;
    m.sigfd = psrv_main_signals(); /* before co_main starts threads */
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
