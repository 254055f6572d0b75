// The example HTTP server over TLS (examples/http_server.c with a TLS
// config): curl with the test's self-signed certificate, keep-alive over
// one TLS connection, a plain-HTTP client and a stalled handshake that
// hold no worker, then a clean shutdown.
// ctest-timeout: 60
// ctest-no-chaos
// ctest-tsan-supp: tsan_openssl.supp (OpenSSL's reference counts: see the file)
#include "t.h"

#define HTTP_SERVER_NO_MAIN 1
#include "../examples/http_server.c"

#include <spawn.h>
#include <sys/wait.h>

extern char **environ;
static char dir[200];

static int run_cmd(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* curl's stdout for argv, or NULL; the caller frees. */
static char *curl_out(char *const argv[]) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) < 0)
        return NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    if (rc != 0) {
        close(out[0]);
        return NULL;
    }
    size_t cap = 4096, off = 0;
    char *buf = malloc(cap);
    for (;;) {
        ssize_t n = co_read(out[0], buf + off, cap - 1 - off, co_deadline_after(30LL * 1000000000));
        if (n <= 0)
            break;
        off += (size_t)n;
        if (off + 1 >= cap)
            break;
    }
    buf[off] = 0;
    co_close(out[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return buf;
}

static int connect_port(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (co_connect(fd, (struct sockaddr *)&a, sizeof a, co_deadline_after(5LL * 1000000000)) < 0) {
        co_close(fd);
        return -1;
    }
    return fd;
}

static void test_https(void) {
    char cert[300], key[300];
    snprintf(cert, sizeof cert, "%s/cert.pem", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    http_config_t cfg = {.port = 0, .pool_size = 8};
    CHECK_EQ(co_tls_config_new(&cfg.tls, CO_TLS_SERVER), 0);
    CHECK_EQ(co_tls_config_cert(cfg.tls, cert, key), 0);
    http_server_t *s = NULL;
    CHECK_EQ(http_server_start(&s, &cfg), 0);
    if (!s)
        return;
    int port = http_server_port(s);
    char url[64], res[64];
    snprintf(url, sizeof url, "https://localhost:%d/", port);
    snprintf(res, sizeof res, "localhost:%d:127.0.0.1", port);

    /* a client that sends nothing: its handshake times out on its own
     * coroutine; a client that speaks plain HTTP: dropped */
    int idle = connect_port(port);
    CHECK(idle >= 0);
    int plain = connect_port(port);
    CHECK(plain >= 0);
    CHECK_EQ(co_write(plain, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, co_deadline_after(5LL * 1000000000)), 27);

    /* two requests over one TLS connection, verified against the cert */
    char *argv[] = {"curl", "-sS", "--max-time", "20", "--resolve", res, "--cacert", cert, url, url,
                    NULL};
    char *out = curl_out(argv);
    CHECK(out && !strcmp(out, "Hello, World!\nHello, World!\n"));
    free(out);

    char b[256];
    ssize_t n = co_read(plain, b, sizeof b, co_deadline_after(10LL * 1000000000));
    CHECK(n <= 0); /* no plaintext answer: closed */
    co_close(plain);

    http_server_stop(s);
    http_stats_t st;
    http_server_wait(s, &st);
    CHECK_EQ(st.requests, 2);
    CHECK_EQ(st.status_2xx, 2);
    co_close(idle);
    co_tls_config_free(cfg.tls);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_https);
    return 0;
}

int main(void) {
    if (!co_tls_available()) {
        fprintf(stderr, "colony built without OpenSSL: TLS is compiled out\n");
        return 77;
    }
    if (run_cmd("command -v openssl >/dev/null 2>&1 && command -v curl >/dev/null 2>&1") != 0) {
        fprintf(stderr, "openssl or curl not installed\n");
        return 77;
    }
    snprintf(dir, sizeof dir, "%s/colony-https.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        return 1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
             "-keyout key.pem -out cert.pem -days 30 -subj /CN=localhost "
             "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1",
             dir);
    if (run_cmd(cmd) != 0) {
        fprintf(stderr, "openssl could not make a certificate\n");
        return 1;
    }
    t_begin(50);
    CHECK_EQ(co_main(run, NULL), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    run_cmd(cmd);
    return t_end();
}
