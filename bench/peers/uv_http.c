/*
 * The libuv peer of examples/http_server.c for bench/run_http1k.sh: one
 * event loop on one thread answering every request head at / with the
 * same bytes as colony's server ("Hello, World!\n", text/plain;
 * charset=utf-8, Content-Length and Date). Keep-alive and pipelining: each
 * complete head in the buffer gets one answer, written in one uv_write.
 * It parses no more than a responder for a benchmark needs.
 *
 *   uv_http [port]    (0: any free port; the port is printed)
 */
#define _GNU_SOURCE 1
#include <uv.h>

#include <arpa/inet.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HEAD_MAX 8192

static const char hello[] = "Hello, World!\n";
static uv_loop_t *loop;
static char date[40];
static time_t date_sec;

typedef struct {
    uv_tcp_t tcp;
    size_t have;
    char buf[HEAD_MAX];
} conn_t;

typedef struct {
    uv_write_t req;
    size_t len;
    char data[]; /* the answers */
} wreq_t;

static const char *now_date(void) {
    time_t now = time(NULL);
    if (now != date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        date_sec = now;
    }
    return date;
}

static void on_close(uv_handle_t *h) { free(h); }

static void on_written(uv_write_t *req, int status) {
    if (status < 0 && !uv_is_closing((uv_handle_t *)req->handle))
        uv_close((uv_handle_t *)req->handle, on_close);
    free(req);
}

static void on_alloc(uv_handle_t *h, size_t want, uv_buf_t *b) {
    (void)want;
    conn_t *c = (conn_t *)h;
    b->base = c->buf + c->have;
    b->len = sizeof c->buf - c->have;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    (void)b;
    conn_t *c = (conn_t *)s;
    if (n < 0) {
        if (!uv_is_closing((uv_handle_t *)s))
            uv_close((uv_handle_t *)s, on_close);
        return;
    }
    c->have += (size_t)n;
    char one[256];
    int ol = snprintf(one, sizeof one,
                      "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nContent-Type: text/plain; "
                      "charset=utf-8\r\nDate: %s\r\n\r\n%s",
                      sizeof hello - 1, now_date(), hello);
    size_t count = 0, used = 0;
    char *e;
    while ((e = memmem(c->buf + used, c->have - used, "\r\n\r\n", 4)) != NULL) {
        used = (size_t)(e - c->buf) + 4;
        count++;
    }
    if (count == 0) {
        if (c->have == sizeof c->buf) /* a head too long: end it */
            uv_close((uv_handle_t *)s, on_close);
        return;
    }
    memmove(c->buf, c->buf + used, c->have - used);
    c->have -= used;
    wreq_t *w = malloc(sizeof *w + count * (size_t)ol);
    if (!w) {
        uv_close((uv_handle_t *)s, on_close);
        return;
    }
    for (size_t i = 0; i < count; i++)
        memcpy(w->data + i * (size_t)ol, one, (size_t)ol);
    w->len = count * (size_t)ol;
    uv_buf_t out = uv_buf_init(w->data, (unsigned)w->len);
    if (uv_write(&w->req, s, &out, 1, on_written) < 0) {
        free(w);
        uv_close((uv_handle_t *)s, on_close);
    }
}

static void on_conn(uv_stream_t *ls, int status) {
    if (status < 0)
        return;
    conn_t *c = calloc(1, sizeof *c);
    if (!c)
        return;
    uv_tcp_init(loop, &c->tcp);
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        uv_close((uv_handle_t *)&c->tcp, on_close);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void on_signal(uv_signal_t *h, int sig) {
    (void)h;
    (void)sig;
    uv_stop(loop);
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 8082;
    loop = uv_default_loop();
    uv_tcp_t srv;
    uv_tcp_init(loop, &srv);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", port, &a);
    int rc = uv_tcp_bind(&srv, (const struct sockaddr *)&a, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&srv, 4096, on_conn);
    if (rc < 0) {
        fprintf(stderr, "uv_http: %s\n", uv_strerror(rc));
        return 1;
    }
    int l = sizeof a;
    uv_tcp_getsockname(&srv, (struct sockaddr *)&a, &l);
    printf("uv_http: listening on http://127.0.0.1:%d/\n", ntohs(a.sin_port));
    fflush(stdout);
    uv_signal_t s1, s2;
    uv_signal_init(loop, &s1);
    uv_signal_init(loop, &s2);
    uv_signal_start(&s1, on_signal, SIGINT);
    uv_signal_start(&s2, on_signal, SIGTERM);
    uv_run(loop, UV_RUN_DEFAULT);
    return 0;
}
