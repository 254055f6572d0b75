/*
 * The front end shared by the example servers (echo_server.c,
 * http_server.c): a TCP listener; for each connection a plain coroutine
 * of its own while it reads its request, and a bounded colony pool for
 * the work. A connection goes round three phases:
 *
 *   reading  its coroutine (co_go) runs the server's `read` until a request
 *            is complete, under the server's own deadlines. It holds no
 *            worker: a client slow to send its request (slowloris), or a
 *            kept-alive connection waiting for its next one, costs a
 *            parked coroutine and the connection's buffer, not a worker.
 *   working  the server's `serve` (the work and the answer) runs holding
 *            one of pool_size work slots (a semaphore). Where a slot is
 *            free and nobody waits for one, the connection's own coroutine
 *            takes it and serves in place, then goes back to reading: a
 *            request then costs no hand-off, no pool queue and no new
 *            coroutine.
 *   waiting  else the request is handed to the pool (co_pool_submit_until,
 *            pool_size workers): a free worker takes it at once, else it
 *            waits, behind at most queue_cap others (the pool's
 *            max_blocking); the worker then waits its turn for a slot
 *            (FIFO). In all it waits at most queue_wait_ns, else it is
 *            refused. After the work, PSRV_KEEP sends the connection back
 *            to reading on a new coroutine (the worker is free as soon as
 *            it has answered); PSRV_CLOSE ends it (a lingering close, too,
 *            goes to a coroutine of its own).
 *
 * Limits: at most read_cap connections hold no slot (reading, waiting
 * for one, being refused or closing), at most pool_size hold one. A new
 * connection beyond read_cap is refused at once; a kept-alive one that
 * finds no room is closed (lingering: a request it had already sent is
 * drained, not reset). So read_cap + pool_size bounds the connections open
 * at once, and with them the memory; slow clients deny service only once
 * they are read_cap.
 *
 * Refusing: a connection refused when it arrives is refused by the accept
 * loop, which never waits: what the peer sent is drained (so that the
 * close is a FIN, not a reset), the server's refusal message written if it
 * has one (one non-blocking try) and the connection closed. A request that
 * got no worker in time is refused by its connection's coroutine, which
 * may wait a little: the message gets 1 s, and the close lingers. Every
 * accepted connection is served or refused; none is dropped.
 *
 * A server embeds psrv_t as the first member of its own struct and
 * psrv_conn_t as the first member of its connection struct (zeroed when
 * the connection arrives, up to conn_zero, then the server's own until it ends: the front
 * end keeps it across phases and frees it). Shutdown (psrv_stop,
 * psrv_wait) ends every connection in whatever phase it is.
 *
 * Header-only (static functions), so that tests can #include both servers
 * in one program.
 */
#ifndef COLONY_EXAMPLES_POOLED_SERVER_H
#define COLONY_EXAMPLES_POOLED_SERVER_H

#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define PSRV_MS 1000000LL
#define PSRV_READ_CAP 10000 /* default read_cap */

/* what `read` and `serve` return */
enum { PSRV_CLOSE = 0, PSRV_WORK = 1, PSRV_KEEP = 1 };

typedef struct psrv psrv_t;

typedef struct psrv_conn {
    psrv_t *srv;
    int fd;
    bool linger;           /* close lingering (shutdown, drain, close): set by the server */
    bool off_pool;         /* it counts in srv->off_pool (it holds no worker) */
    int64_t rounds;        /* how many times it has been served (0: a new connection) */
    int64_t wait_dl;       /* handed to the pool: when its wait for a slot ends */
    co_tls_t *tls;         /* with cfg.tls: the session, on a dup of fd, once the handshake
                            * is done (fd stays the server's: shutdown, close) */
    struct psrv_conn *prev, *next; /* in srv->active, under srv->mu */
} psrv_conn_t;

typedef struct psrv_config {
    const char *host;      /* listen address; NULL: 127.0.0.1 */
    int port;              /* 0: any free port */
    int pool_size;         /* workers: requests worked on at once */
    int read_cap;          /* connections holding no worker (reading, waiting...) at once */
    int64_t queue_wait_ns; /* how long a request may wait for a worker */
    int queue_cap;         /* requests that may wait for a worker */
    size_t conn_size;      /* bytes of the server's connection struct */
    size_t conn_zero;      /* its first bytes zeroed on arrival (0: all): a buffer
                            * after them is left untouched, so its pages cost
                            * memory only once bytes are read into them */
    /* The reading phase, on the connection's own coroutine: read until a
     * request is ready (PSRV_WORK) or the connection is to end (PSRV_CLOSE:
     * EOF, a deadline, an error). */
    int (*read)(psrv_conn_t *c);
    /* The work, on a pool worker: answer what was read; PSRV_KEEP (read
     * the next request) or PSRV_CLOSE. */
    int (*serve)(psrv_conn_t *c);
    const char *refuse_msg; /* written to a refused connection; NULL: none */
    co_tls_config_t *tls;   /* a server config: TLS on every connection; NULL: plain */
    int64_t handshake_timeout_ns; /* with tls: the handshake's time; 0: 5 s */
} psrv_config_t;

struct psrv {
    psrv_config_t cfg;
    int lfd, port;
    co_pool_t *pool;       /* the waiting room: requests that found no free slot */
    co_sem_t slots;        /* pool_size work slots: `serve` runs holding one */
    co_waitgroup_t loop;   /* the accept loop */
    co_waitgroup_t conns;  /* the connections admitted and not ended yet */
    int stopping;          /* atomic: set once by psrv_stop */
    int off_pool;          /* atomic: connections holding no worker (<= read_cap) */
    co_mutex_t mu;         /* protects active, closing */
    psrv_conn_t *active;   /* admitted connections (for shutdown) */
    bool closing;          /* under mu: no new connection may register */
    int64_t accepted, admitted, refused; /* atomic counters */
};

/* A connection's reads and writes, through TLS where it has it. */
static inline ssize_t psrv_conn_read(psrv_conn_t *c, void *buf, size_t len, int64_t dl) {
    return c->tls ? co_tls_read(c->tls, buf, len, dl) : co_read(c->fd, buf, len, dl);
}
static inline ssize_t psrv_conn_write(psrv_conn_t *c, const void *buf, size_t len, int64_t dl) {
    return c->tls ? co_tls_write(c->tls, buf, len, dl) : co_write(c->fd, buf, len, dl);
}

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

/* A place among the connections that hold no worker, if there is one. */
static bool psrv_take_place(psrv_t *s) {
    int n = __atomic_load_n(&s->off_pool, __ATOMIC_RELAXED);
    do {
        if (n >= s->cfg.read_cap)
            return false;
    } while (!__atomic_compare_exchange_n(&s->off_pool, &n, n + 1, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return true;
}

static void psrv_leave_place(psrv_t *s) {
    __atomic_sub_fetch(&s->off_pool, 1, __ATOMIC_RELAXED);
}

/* Refuse a connection as it arrives (the accept loop: never wait). */
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

/* Close after an error or a refusal: stop sending, let the peer's pending
 * bytes drain (so that what we sent last is not destroyed by a reset),
 * then close. At most 500 ms and 256 KiB. */
static void psrv_linger_close(int fd) {
    shutdown(fd, SHUT_WR);
    char sink[4096];
    int64_t dl = co_deadline_after(500 * PSRV_MS);
    for (int i = 0; i < 64; i++)
        if (co_read(fd, sink, sizeof sink, dl) <= 0)
            break;
    co_close(fd);
}

/* The connection's end, in whatever phase: after this, neither c nor its
 * server may be touched (psrv_wait may be about to free the server). */
static void psrv_end(psrv_conn_t *c) {
    psrv_t *s = c->srv;
    psrv_unregister(c);
    if (c->tls)
        co_tls_close(c->tls); /* a close_notify if it goes at once; the dup */
    if (c->linger)
        psrv_linger_close(c->fd);
    else
        co_close(c->fd);
    if (c->off_pool)
        psrv_leave_place(s);
    free(c);
    co_waitgroup_done(&s->conns);
}

static void psrv_reader(void *arg);

static void psrv_closer(void *arg) {
    psrv_end(arg);
}

/* A request that got no slot in time, too many waiting, or shutting down:
 * 503 (if the server has a message; it gets 1 s) and a lingering close. */
static void psrv_refuse_req(psrv_conn_t *c) {
    psrv_t *s = c->srv;
    __atomic_add_fetch(&s->refused, 1, __ATOMIC_RELAXED);
    if (s->cfg.refuse_msg)
        (void)psrv_conn_write(c, s->cfg.refuse_msg, strlen(s->cfg.refuse_msg),
                              co_deadline_after(1000 * PSRV_MS));
    c->linger = true;
    psrv_end(c);
}

static void psrv_refuser(void *arg) {
    psrv_refuse_req(arg);
}

/* The work, with a slot held, which it gives back. true: the connection
 * goes back to reading, its place among those holding no slot taken
 * again; false: it is to end (c->linger says how). */
static bool psrv_work(psrv_conn_t *c) {
    psrv_t *s = c->srv;
    c->off_pool = false; /* it holds a slot now */
    psrv_leave_place(s);
    int r = s->cfg.serve(c);
    c->rounds++;
    co_sem_release(&s->slots, 1);
    bool keep = r == PSRV_KEEP && !psrv_stopping(s);
    if (keep && psrv_take_place(s)) {
        c->off_pool = true;
        return true;
    }
    if (keep) { /* no room: end it, as an idle keep-alive connection may be */
        __atomic_add_fetch(&s->refused, 1, __ATOMIC_RELAXED);
        c->linger = true;
    }
    if (c->linger && psrv_take_place(s))
        c->off_pool = true; /* a lingering close counts among those holding no slot */
    return false;
}

/* A request that found no free slot: a pool task, waiting for one. */
static void psrv_worker(void *arg) {
    psrv_conn_t *c = arg;
    psrv_t *s = c->srv;
    bool got = co_sem_acquire(&s->slots, 1, c->wait_dl) == 0;
    if (!got || psrv_stopping(s)) { /* no slot in time, or shutting down */
        if (got)
            co_sem_release(&s->slots, 1);
        if (co_go(psrv_refuser, c) < 0) /* off the worker: the 503 may take 1 s */
            psrv_refuse_req(c);
        return;
    }
    if (psrv_work(c)) {
        if (co_go(psrv_reader, c) == 0)
            return; /* the connection's new coroutine has it */
        __atomic_add_fetch(&s->refused, 1, __ATOMIC_RELAXED);
        c->linger = true; /* (lingering on the worker: no coroutine to be had) */
    } else if (c->off_pool && co_go(psrv_closer, c) == 0) {
        return;
    }
    psrv_end(c);
}

/* The reading phase, and the work where a slot is free: the connection's
 * own coroutine, for as long as it keeps finding one. */
static void psrv_reader(void *arg) {
    psrv_conn_t *c = arg;
    psrv_t *s = c->srv;
    if (s->cfg.tls && !c->tls) {
        /* on a dup: co_tls_server closes what it is given if it fails,
         * and fd must stay valid while the connection is registered
         * (psrv_wait shuts it down) */
        int d = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
        int64_t hs = s->cfg.handshake_timeout_ns > 0 ? s->cfg.handshake_timeout_ns : 5000 * PSRV_MS;
        if (d < 0 || co_tls_server(&c->tls, d, s->cfg.tls, co_deadline_after(hs)) < 0) {
            c->tls = NULL;
            psrv_end(c);
            return;
        }
    }
    while (s->cfg.read(c) == PSRV_WORK) {
        if (psrv_stopping(s)) {
            psrv_refuse_req(c);
            return;
        }
        /* a free slot, and nobody before us waiting for one: work here */
        if (co_sem_try_acquire(&s->slots, 1)) {
            if (psrv_work(c))
                continue;
            break;
        }
        /* else a pool worker waits for a slot in our place (a free worker
         * first, no clock read; else wait for one) */
        c->wait_dl = co_deadline_after(s->cfg.queue_wait_ns);
        int rc = co_pool_submit_until(s->pool, psrv_worker, c, 0);
        if (rc == CO_ETIMEDOUT)
            rc = co_pool_submit_until(s->pool, psrv_worker, c, c->wait_dl);
        if (rc == 0)
            return; /* a worker has it */
        psrv_refuse_req(c);
        return;
    }
    psrv_end(c);
}

/* A new connection: into the reading phase, or refused. */
static void psrv_admit(psrv_t *s, int fd) {
    psrv_conn_t *c = NULL;
    if (psrv_take_place(s)) {
        size_t z = s->cfg.conn_zero && s->cfg.conn_zero < s->cfg.conn_size ? s->cfg.conn_zero
                                                                            : s->cfg.conn_size;
        c = malloc(s->cfg.conn_size);
        if (c)
            memset(c, 0, z);
        else
            psrv_leave_place(s);
    }
    if (!c) {
        psrv_refuse(s, fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->off_pool = true;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    co_waitgroup_add(&s->conns, 1);
    bool registered = psrv_register(c); /* (false only once psrv_wait has begun) */
    if (!registered || co_go(psrv_reader, c) < 0) {
        if (registered)
            psrv_unregister(c);
        psrv_leave_place(s);
        free(c);
        co_waitgroup_done(&s->conns);
        psrv_refuse(s, fd);
        return;
    }
    __atomic_add_fetch(&s->admitted, 1, __ATOMIC_RELAXED);
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
        psrv_admit(s, fd);
    }
    co_waitgroup_done(&s->loop);
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
 * read_cap <= 0 PSRV_READ_CAP, queue_wait_ns <= 0 one second, queue_cap
 * <= 0 pool_size. 0 or a negative code (then nothing is left running). */
static int psrv_start(psrv_t *s, const psrv_config_t *cfg) {
    s->cfg = *cfg;
    if (s->cfg.pool_size <= 0)
        s->cfg.pool_size = 1000;
    if (s->cfg.read_cap <= 0)
        s->cfg.read_cap = PSRV_READ_CAP;
    if (s->cfg.queue_wait_ns <= 0)
        s->cfg.queue_wait_ns = 1000 * PSRV_MS;
    if (s->cfg.queue_cap <= 0)
        s->cfg.queue_cap = s->cfg.pool_size;
    int rc = psrv_listen(s->cfg.host, s->cfg.port, &s->port);
    if (rc < 0)
        return rc;
    s->lfd = rc;
    /* default-size stacks: the runtime caches those, and a worker per
     * request starts on a warm one */
    co_sem_init(&s->slots, s->cfg.pool_size);
    co_pool_opts_t po = {.max_blocking = s->cfg.queue_cap};
    if ((rc = co_pool_new(&s->pool, s->cfg.pool_size, &po)) < 0)
        goto fail_lfd;
    co_waitgroup_add(&s->loop, 1);
    if ((rc = co_go(psrv_accept_loop, s)) < 0) {
        co_waitgroup_done(&s->loop);
        goto fail_pool;
    }
    return 0;
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

/* Wait for the shutdown begun by psrv_stop to finish: every connection is
 * ended, in whatever phase (reads see EOF, a request waiting for a worker
 * is refused), every worker returned. */
static void psrv_wait(psrv_t *s) {
    co_waitgroup_wait(&s->loop);
    co_mutex_lock(&s->mu);
    s->closing = true;
    for (psrv_conn_t *c = s->active; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    co_mutex_unlock(&s->mu);
    co_pool_release(s->pool); /* requests waiting for a worker: CO_ECLOSED */
    co_waitgroup_wait(&s->conns);
    co_pool_destroy(s->pool); /* waits for the workers' last steps */
}

/* ---- for a server's main() ---------------------------------------------- */

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

/* Before co_main: lets the process use its whole fd allowance, and blocks
 * SIGINT and SIGTERM in this thread, so in every thread made from now on
 * (the runtime's): they then come only to colony's signal relay thread
 * (psrv_signals), and interrupt no system call of the server's. (SIGPIPE
 * needs nothing: colony's socket writes answer -EPIPE, never a signal.) */
static inline void psrv_main_limits(void) {
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
}

/* SIGINT and SIGTERM as messages on a channel (co_signal_notify), from
 * now on: call it before saying that the server listens, so that a signal
 * sent after that is never the default action's. 0 or a colony error. */
static inline int psrv_signals(co_chan_t **out) {
    int rc = co_chan_new(out, sizeof(int), 1);
    if (rc < 0)
        return rc;
    static const int sigs[] = {SIGINT, SIGTERM};
    rc = co_signal_notify(*out, sigs, 2);
    if (rc < 0) {
        co_chan_free(*out);
        *out = NULL;
    }
    return rc;
}

/* In a coroutine: wait until SIGINT or SIGTERM arrives on ch, then stop
 * relaying them and free ch. Returns the signal's number. */
static inline int psrv_wait_signal(co_chan_t *ch) {
    int sig = 0;
    (void)co_chan_recv(ch, &sig, CO_FOREVER);
    co_signal_stop(ch);
    co_chan_free(ch);
    return sig;
}

#endif
