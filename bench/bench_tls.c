/*
 * TLS benchmark, colony's side (bench/run_tls.sh runs it next to
 * bench/go/tls, which does the same with crypto/tls):
 *
 *   bench_tls server CERT KEY          a TLS echo server on 127.0.0.1, a
 *                                      coroutine per connection; prints
 *                                      "listening on 127.0.0.1:PORT";
 *                                      SIGTERM ends it
 *   bench_tls handshakes PORT C SECS   C coroutines, each connecting and
 *                                      handshaking (full handshakes: no
 *                                      resumption, no verification) then
 *                                      closing, for SECS seconds
 *   bench_tls echo PORT C SECS SIZE    C connections, each writing SIZE
 *                                      bytes and reading them back, for
 *                                      SECS seconds
 *
 * TLS 1.3 with OpenSSL's defaults (X25519, AES-128-GCM or ChaCha20 as the
 * CPU prefers), an ECDSA P-256 certificate made by the script.
 */
#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define SEC (1000LL * 1000 * 1000)

static co_tls_config_t *cfg;
static int port;
static int64_t end_at;
static size_t size;
static int64_t count, bytes, errors; /* atomic */

static void conn_co(void *arg) {
    int fd = (int)(intptr_t)arg;
    co_tls_t *c;
    if (co_tls_server(&c, fd, cfg, co_deadline_after(10 * SEC)) < 0)
        return;
    char *buf = malloc(16384);
    for (;;) {
        ssize_t n = co_tls_read(c, buf, 16384, CO_FOREVER);
        if (n <= 0 || co_tls_write(c, buf, (size_t)n, co_deadline_after(10 * SEC)) != n)
            break;
    }
    free(buf);
    co_tls_close(c);
}

static void accept_co(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = co_accept(lfd, NULL, NULL, CO_FOREVER);
        if (fd < 0) {
            if (fd == CO_ECLOSED || fd == -EBADF)
                return;
            co_sleep(5 * 1000000);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (co_go(conn_co, (void *)(intptr_t)fd) < 0)
            co_close(fd);
    }
}

static int server_main(void *arg) {
    char **argv = arg;
    if (co_tls_config_new(&cfg, CO_TLS_SERVER) < 0 || co_tls_config_cert(cfg, argv[2], argv[3]) < 0) {
        fprintf(stderr, "bench_tls: cannot load %s / %s\n", argv[2], argv[3]);
        return 1;
    }
    co_chan_t *sigs;
    co_chan_new(&sigs, sizeof(int), 1);
    static const int sl[] = {SIGINT, SIGTERM};
    co_signal_notify(sigs, sl, 2);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 4096) < 0) {
        perror("bench_tls: listen");
        return 1;
    }
    socklen_t l = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &l);
    printf("bench_tls: listening on 127.0.0.1:%d\n", ntohs(a.sin_port));
    fflush(stdout);
    co_go(accept_co, (void *)(intptr_t)lfd);
    int sig;
    co_chan_recv(sigs, &sig, CO_FOREVER);
    _exit(0); /* connections may be mid-flight: a benchmark needs no clean end */
}

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (co_connect(fd, (struct sockaddr *)&a, sizeof a, co_deadline_after(10 * SEC)) < 0) {
        co_close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void hs_co(void *arg) {
    co_waitgroup_t *wg = arg;
    while (co_now() < end_at) {
        int fd = dial();
        co_tls_t *c;
        if (fd < 0 || co_tls_client(&c, fd, cfg, NULL, co_deadline_after(10 * SEC)) < 0) {
            __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
            continue;
        }
        __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED);
        co_tls_close(c);
    }
    co_waitgroup_done(wg);
}

static void echo_co(void *arg) {
    co_waitgroup_t *wg = arg;
    int fd = dial();
    co_tls_t *c;
    if (fd < 0 || co_tls_client(&c, fd, cfg, NULL, co_deadline_after(10 * SEC)) < 0) {
        __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
        co_waitgroup_done(wg);
        return;
    }
    char *out = malloc(size), *in = malloc(size);
    memset(out, 'x', size);
    while (co_now() < end_at) {
        if (co_tls_write(c, out, size, co_deadline_after(10 * SEC)) != (ssize_t)size) {
            __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
            break;
        }
        size_t got = 0;
        while (got < size) {
            ssize_t n = co_tls_read(c, in + got, size - got, co_deadline_after(10 * SEC));
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        if (got < size) {
            __atomic_add_fetch(&errors, 1, __ATOMIC_RELAXED);
            break;
        }
        __atomic_add_fetch(&bytes, (int64_t)size, __ATOMIC_RELAXED);
        __atomic_add_fetch(&count, 1, __ATOMIC_RELAXED);
    }
    free(out);
    free(in);
    co_tls_close(c);
    co_waitgroup_done(wg);
}

static int client_main(void *arg) {
    char **argv = arg;
    bool hs = !strcmp(argv[1], "handshakes");
    port = atoi(argv[2]);
    int conns = atoi(argv[3]);
    int secs = atoi(argv[4]);
    if (!hs)
        size = (size_t)atol(argv[5]);
    if (port <= 0 || conns <= 0 || secs <= 0 || (!hs && (size == 0 || size > (64u << 20)))) {
        fprintf(stderr, "bench_tls: bad arguments\n");
        return 2;
    }
    co_tls_config_new(&cfg, CO_TLS_CLIENT);
    co_tls_config_verify(cfg, false);
    int64_t t0 = co_now();
    end_at = t0 + secs * SEC;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, conns);
    for (int i = 0; i < conns; i++)
        co_go(hs ? hs_co : echo_co, &wg);
    co_waitgroup_wait(&wg);
    double el = (double)(co_now() - t0) / 1e9;
    if (hs)
        printf("handshakes: %lld in %.2f s, %.1f/s, %lld errors\n", (long long)count, el,
               (double)count / el, (long long)errors);
    else
        printf("echo: %lld round trips of %zu B in %.2f s, %.1f MiB/s, %lld errors\n",
               (long long)count, size, el, (double)bytes / el / (1 << 20), (long long)errors);
    /* the client's CPU time (user + system, all threads), for the cost
     * per operation */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("cpu: client_ms=%lld\n",
           (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
               (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000);
    co_tls_config_free(cfg);
    return 0;
}

int main(int argc, char **argv) {
    if (!co_tls_available()) {
        fprintf(stderr, "bench_tls: colony was built without OpenSSL\n");
        return 77;
    }
    if (argc == 4 && !strcmp(argv[1], "server"))
        return co_main(server_main, argv);
    if ((argc == 5 && !strcmp(argv[1], "handshakes")) || (argc == 6 && !strcmp(argv[1], "echo")))
        return co_main(client_main, argv);
    fprintf(stderr, "usage: %s server CERT KEY | handshakes PORT CONNS SECS | "
                    "echo PORT CONNS SECS SIZE\n", argv[0]);
    return 2;
}
