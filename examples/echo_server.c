/*
 * An echo server on colony: it echoes whatever it reads until the peer
 * closes. A connection waiting for data has a coroutine of its own and
 * holds no worker; data that came is echoed by a worker of a bounded
 * co_pool (pooled_server.h), which then sends the connection back to
 * waiting.
 *
 *   echo_server [-r read-cap] [port] [pool-size]
 *
 * port 0 (the default is 7007) picks a free one; the port is printed.
 * Limits: at most read-cap connections (default 10,000) hold no worker
 * (wait for data, or for a worker), each a parked coroutine and a 4 KiB
 * buffer; a new connection beyond that is refused (closed with no data:
 * the client reads end-of-file before any echo). A peer silent for 30 s,
 * or one that stops reading our echoes for 10 s, is dropped. pool-size
 * workers (default 1,000) echo at once; data that finds them all busy
 * waits up to 1 s (at most pool-size connections wait), else its
 * connection is closed.
 * SIGINT/SIGTERM shut it down cleanly (co_signal_notify to a channel): stop
 * accepting, end every connection, wait for the workers, print stats and
 * the peak RSS.
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
#include <sys/socket.h>
#include <unistd.h>

#define ECHO_MS 1000000LL
#define ECHO_BUF 4096

typedef struct echo_config {
    const char *host;         /* NULL: 127.0.0.1 */
    int port;                 /* 0: any free port */
    int pool_size;            /* workers: connections echoing at once */
    int read_cap;             /* connections holding no worker at once; 0: PSRV_READ_CAP */
    int64_t idle_timeout_ns;  /* a connection silent this long is dropped */
    int64_t write_timeout_ns; /* a peer must take our echo within this */
    int64_t queue_wait_ns;    /* how long data that came may wait for a worker */
    int queue_cap;            /* 0: pool_size */
} echo_config_t;

typedef struct echo_stats {
    int64_t accepted, served, refused, bytes, timeouts, resets;
} echo_stats_t;

typedef struct echo_server {
    psrv_t front;         /* first: the listener, pool and live connections */
    echo_config_t cfg;
    echo_stats_t st;      /* atomic counters (accepted, served, refused: in front) */
} echo_server_t;

typedef struct echo_conn {
    psrv_conn_t base;     /* first */
    size_t have;          /* bytes in buf, not echoed yet */
    char buf[ECHO_BUF];
} echo_conn_t;

#define ECHO_INC(s, f, n) __atomic_add_fetch(&(s)->st.f, (n), __ATOMIC_RELAXED)

/* The reading phase (psrv's `read`, on the connection's own coroutine, no
 * worker held): wait, up to the idle timeout, for bytes to echo. */
static int echo_read(psrv_conn_t *base) {
    echo_conn_t *c = (echo_conn_t *)base;
    echo_server_t *s = (echo_server_t *)base->srv;
    ssize_t n = co_read(base->fd, c->buf, sizeof c->buf, co_deadline_after(s->cfg.idle_timeout_ns));
    if (n > 0) {
        c->have = (size_t)n;
        return PSRV_WORK;
    }
    if (n == CO_ETIMEDOUT)
        ECHO_INC(s, timeouts, 1);
    else if (n == -ECONNRESET)
        ECHO_INC(s, resets, 1);
    return PSRV_CLOSE; /* EOF, stalled peer, reset, or shutdown */
}

/* The work (psrv's `serve`, on a pool worker): echo what was read, and
 * what is still queued behind it. A read that came back short emptied the
 * socket: back to reading then (PSRV_KEEP), with no read that would only
 * find nothing. */
static int echo_serve(psrv_conn_t *base) {
    echo_conn_t *c = (echo_conn_t *)base;
    echo_server_t *s = (echo_server_t *)base->srv;
    for (;;) {
        ssize_t w = co_write(base->fd, c->buf, c->have, co_deadline_after(s->cfg.write_timeout_ns));
        if (w != (ssize_t)c->have) {
            if (w == CO_ETIMEDOUT)
                ECHO_INC(s, timeouts, 1);
            return PSRV_CLOSE;
        }
        ECHO_INC(s, bytes, w);
        if (c->have < sizeof c->buf)
            return PSRV_KEEP;
        ssize_t n = co_read(base->fd, c->buf, sizeof c->buf, 0); /* one try */
        if (n == CO_ETIMEDOUT)
            return PSRV_KEEP;
        if (n <= 0) {
            if (n == -ECONNRESET)
                ECHO_INC(s, resets, 1);
            return PSRV_CLOSE;
        }
        c->have = (size_t)n;
    }
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
                        .read_cap = s->cfg.read_cap, .queue_wait_ns = s->cfg.queue_wait_ns,
                        .queue_cap = s->cfg.queue_cap, .conn_size = sizeof(echo_conn_t),
                        .read = echo_read, .serve = echo_serve};
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
        stats->served = s->front.admitted;
        stats->refused = s->front.refused;
    }
    free(s);
}

#ifndef ECHO_SERVER_NO_MAIN

typedef struct {
    echo_config_t cfg;
} echo_main_t;

static int echo_run(void *arg) {
    echo_main_t *m = arg;
    co_chan_t *sigs;
    int src = psrv_signals(&sigs);
    if (src < 0) {
        fprintf(stderr, "echo_server: co_signal_notify: %s\n", co_strerror(src));
        return 1;
    }
    echo_server_t *s;
    int rc = echo_server_start(&s, &m->cfg);
    if (rc < 0) {
        fprintf(stderr, "echo_server: cannot start: %s\n", co_strerror(rc));
        co_signal_stop(sigs);
        co_chan_free(sigs);
        return 1;
    }
    printf("echo_server: listening on %s:%d (pool %d, read cap %d, %d Ps)\n",
           m->cfg.host ? m->cfg.host : "127.0.0.1", echo_server_port(s), s->front.cfg.pool_size,
           s->front.cfg.read_cap, co_procs());
    fflush(stdout);
    psrv_wait_signal(sigs); /* SIGINT or SIGTERM */
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
    return 0;
}

int main(int argc, char **argv) {
    echo_main_t m = {.cfg = {.port = 7007, .pool_size = 1000}};
    bool help = argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    int a = 1;
    bool bad = false;
    if (!help && argc > 2 && !strcmp(argv[1], "-r")) {
        bad = !psrv_arg_int(argv[2], 1, 1 << 24, &m.cfg.read_cap);
        a = 3;
    }
    int npos = argc - a;
    if (help || bad || npos > 2 || (npos > 0 && !psrv_arg_int(argv[a], 0, 65535, &m.cfg.port)) ||
        (npos > 1 && !psrv_arg_int(argv[a + 1], 1, 1 << 24, &m.cfg.pool_size))) {
        fprintf(help ? stdout : stderr, "usage: %s [-r read-cap] [port (0: any)] [pool-size]\n",
                argv[0]);
        return help ? 0 : 2;
    }
    const char *h = getenv("ECHO_HOST");
    if (h)
        m.cfg.host = h;
    psrv_main_limits();
    int rc = co_main(echo_run, &m);
    int sd = co_shutdown();
    if (sd < 0)
        fprintf(stderr, "echo_server: co_shutdown: %s\n", co_strerror(sd));
    return rc ? rc : (sd < 0);
}
#endif
