/*
 * A small HTTP/1.1 server on colony: a coroutine of its own for each
 * connection while it reads a request head, a bounded co_pool of workers
 * for the work (pooled_server.h).
 *
 *   http_server [-r read-cap] [port] [pool-size] [file]
 *
 * port 0 (the default 8080 otherwise) picks a free one; the port is printed.
 * Routes: GET/HEAD /      -> "Hello, World!\n" (fixed)
 *         GET/HEAD /file  -> the file given on the command line, streamed
 *                            from disk per request in 64 KiB pieces (each
 *                            read inside co_blocking)
 * Keep-alive (HTTP/1.1 default, HTTP/1.0 with "Connection: keep-alive"),
 * pipelining, Content-Length on every response, request bodies up to
 * 1 MiB (discarded). 400 for a malformed request, 431 for a request head
 * over 8 KiB, 413/501/505 where they apply; each error closes the
 * connection after a lingering close.
 *
 * A connection's phases and their limits:
 *   reading   the request head, on the connection's own coroutine: no
 *             worker is held, so slow clients (slowloris) and kept-alive
 *             connections waiting for their next request cost a parked
 *             coroutine and an 8 KiB buffer each (about 12 KiB of RSS,
 *             measured), not a worker. Deadlines, set once per head
 *             (trickling bytes does not extend them): a new connection's
 *             first byte within 3 s and its whole head within 5 s of its
 *             arrival; a kept-alive connection's next request within 10 s,
 *             its head within 5 s of its first byte.
 *   waiting   a complete head waits for a worker: at most 1 s, and at most
 *             pool-size heads wait; beyond either, 503.
 *   working   holding one of pool-size work slots (default 1,000): on
 *             the connection's own coroutine where a slot is free, else on
 *             a pool worker once one is: read the body (10 s per read),
 *             write the answer (10 s per write, /file per 64 KiB piece) and
 *             answer any request pipelined behind it that is already
 *             buffered; then the connection goes back to reading and the
 *             slot is free. Reading a body holds a slot: a client slow to
 *             send its body is bounded by the slots and the per-read
 *             deadline only.
 * At most read-cap connections (-r, default 10,000) hold no worker
 * (reading, waiting, or closing after an error: the lingering close runs
 * on a coroutine too); a new connection beyond that gets a 503 at once,
 * a kept-alive one is closed. So a flood, slow or fast, costs at most
 * read-cap + pool-size connections of memory, and slow clients deny
 * service only once they are read-cap (10,000 within a head timeout).
 *
 * SIGINT/SIGTERM (messages on a channel, co_signal_notify): stop
 * accepting, end every connection, wait for the workers, print stats.
 *
 * HTTPS: with HTTP_TLS_CERT and HTTP_TLS_KEY set (PEM files), every
 * connection is TLS (co_tls_server, ALPN http/1.1; a handshake gets 5 s).
 * A self-signed pair for a try:
 *   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
 *     -keyout key.pem -out cert.pem -days 30 -subj /CN=localhost \
 *     -addext subjectAltName=DNS:localhost,IP:127.0.0.1
 *   HTTP_TLS_CERT=cert.pem HTTP_TLS_KEY=key.pem ./http_server 8443 &
 *   curl --cacert cert.pem https://localhost:8443/
 *
 * The server is also a small library (http_server_start/stop/wait) that
 * tests/test_servers.c includes with HTTP_SERVER_NO_MAIN defined.
 */
#define _GNU_SOURCE 1
#include <colony.h>

#include "pooled_server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HTTP_MAX_HEAD 8192           /* request line + headers */
#define HTTP_MAX_BODY (1 << 20)      /* request bodies we accept (and drop) */
#define HTTP_FILE_CHUNK (64 << 10)   /* /file is sent in pieces of this: memory per
                                        connection stays bounded, whatever the file */
#define HTTP_MS 1000000LL

static const char http_hello[] = "Hello, World!\n";

typedef struct http_config {
    const char *host;         /* listen address; NULL: 127.0.0.1 */
    int port;                 /* 0: any free port */
    int pool_size;            /* workers: requests worked on at once */
    int read_cap;             /* connections holding no worker (reading a head, kept
                               * alive, waiting for a worker) at once; 0: PSRV_READ_CAP */
    const char *file;         /* served at /file; NULL: 404 there */
    int64_t first_byte_timeout_ns; /* a new connection's first byte must come in this */
    int64_t head_timeout_ns;  /* a request head must be complete this long after the
                               * connection arrived (kept alive: after its first byte) */
    int64_t idle_timeout_ns;  /* a kept-alive connection waits this long for a request */
    int64_t read_timeout_ns;  /* each read of a request body must return in this */
    int64_t write_timeout_ns; /* each write (a response, a piece of /file) must be taken
                               * by the peer in this */
    int64_t queue_wait_ns;    /* a request waits this long for a worker, then 503 */
    int queue_cap;            /* requests that may wait for a worker; 0: pool_size */
    co_tls_config_t *tls;     /* a TLS server config: HTTPS; NULL: plain HTTP */
} http_config_t;

typedef struct http_stats {
    int64_t accepted, served, refused, requests;
    int64_t status_2xx, status_4xx, status_5xx, timeouts, resets;
} http_stats_t;

typedef struct http_server {
    psrv_t front;          /* first: the listener, pool, queue and live connections */
    http_config_t cfg;
    http_stats_t st;       /* atomic counters (accepted, refused: in front) */
} http_server_t;

typedef struct http_conn {
    psrv_conn_t base;         /* first */
    long head;                /* the buffered head: its length, or -status to refuse it */
    time_t date_sec;
    char date[40];
    /* the "/" answer, whole, as last formatted: it changes only with the
     * second (Date) and the kind (hello_key), and formatting it was a third
     * of a request's instructions */
    time_t hello_sec;         /* 0: none yet */
    int hello_key;            /* conn_hdr * 2 + head_only */
    int hello_len;
    char hello[192];
    size_t have;              /* bytes in buf */
    char buf[HTTP_MAX_HEAD];  /* not zeroed (conn_zero): only its first `have` bytes are read */
} http_conn_t;

#define HTTP_INC(s, f) __atomic_add_fetch(&(s)->st.f, 1, __ATOMIC_RELAXED)

static inline http_server_t *http_srv(const http_conn_t *c) {
    return (http_server_t *)c->base.srv; /* front is its first member */
}

/* ---- responses ------------------------------------------------------------ */

static const char *http_reason(int code) {
    switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

static const char *http_date(http_conn_t *c) {
    time_t now = time(NULL);
    if (now != c->date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(c->date, sizeof c->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        c->date_sec = now;
    }
    return c->date;
}

/* Status line and headers into out (cap bytes); their length. */
static int http_head(http_conn_t *c, int code, const char *ctype, size_t len,
                     int conn_hdr /* 0 none, 1 close, 2 keep-alive */, const char *extra,
                     char *out, size_t cap) {
    return snprintf(out, cap,
                    "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\nContent-Type: %s\r\nDate: %s\r\n%s%s\r\n",
                    code, http_reason(code), len, ctype, http_date(c),
                    conn_hdr == 1 ? "Connection: close\r\n"
                    : conn_hdr == 2 ? "Connection: keep-alive\r\n"
                                    : "",
                    extra ? extra : "");
}

/* Write status line, headers and body (head_only: HEAD, no body). */
static int http_respond(http_conn_t *c, int code, const char *ctype, const void *body, size_t len,
                        bool head_only, int conn_hdr /* 0 none, 1 close, 2 keep-alive */,
                        const char *extra) {
    http_server_t *s = http_srv(c);
    char small[1024];
    int h = http_head(c, code, ctype, len, conn_hdr, extra, small, sizeof small);
    if (code < 300)
        HTTP_INC(s, status_2xx);
    else if (code < 500)
        HTTP_INC(s, status_4xx);
    else
        HTTP_INC(s, status_5xx);
    int64_t dl = co_deadline_after(s->cfg.write_timeout_ns);
    if (head_only)
        len = 0;
    if ((size_t)h + len <= sizeof small) { /* one write: header and body together */
        if (len)
            memcpy(small + h, body, len);
        return psrv_conn_write(&c->base, small, (size_t)h + len, dl) < 0 ? -1 : 0;
    }
    if (psrv_conn_write(&c->base, small, (size_t)h, dl) < 0)
        return -1;
    return len && psrv_conn_write(&c->base, body, len, dl) < 0 ? -1 : 0;
}

/* "/": the same bytes as http_respond would write, formatted once a
 * second per connection and kind. */
static int http_hello_reply(http_conn_t *c, bool head_only, int conn_hdr) {
    http_server_t *s = http_srv(c);
    time_t now = time(NULL);
    int key = conn_hdr * 2 + head_only;
    if (now != c->hello_sec || key != c->hello_key) {
        int h = http_head(c, 200, "text/plain; charset=utf-8", sizeof http_hello - 1, conn_hdr,
                          NULL, c->hello, sizeof c->hello);
        if (h < 0 || (size_t)h + sizeof http_hello > sizeof c->hello) /* cannot: a fixed head */
            return http_respond(c, 200, "text/plain; charset=utf-8", http_hello,
                                sizeof http_hello - 1, head_only, conn_hdr, NULL);
        if (!head_only) {
            memcpy(c->hello + h, http_hello, sizeof http_hello - 1);
            h += (int)sizeof http_hello - 1;
        }
        c->hello_len = h;
        c->hello_sec = now;
        c->hello_key = key;
    }
    HTTP_INC(s, status_2xx);
    return psrv_conn_write(&c->base, c->hello, (size_t)c->hello_len,
                           co_deadline_after(s->cfg.write_timeout_ns)) < 0 ? -1 : 0;
}

/* ---- the file route --------------------------------------------------------- */

/* open/fstat and each piece's read run inside co_blocking: they may block
 * on the disk. The file is streamed: one HTTP_FILE_CHUNK buffer per
 * connection, never the whole file (a client that stops reading holds a
 * piece, not a copy of the file). */
typedef struct {
    const char *path;
    int fd;
    size_t len;
    int err;
} http_file_open_t;

static void http_open_file(void *arg) {
    http_file_open_t *j = arg;
    j->fd = open(j->path, O_RDONLY | O_CLOEXEC);
    if (j->fd < 0) {
        j->err = errno;
        return;
    }
    struct stat st;
    if (fstat(j->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        j->err = EINVAL;
        close(j->fd);
        j->fd = -1;
        return;
    }
    j->len = (size_t)st.st_size;
    j->err = 0;
}

typedef struct {
    int fd;
    char *buf;
    size_t want;
    off_t off;
    ssize_t got;
} http_file_piece_t;

static void http_read_piece(void *arg) {
    http_file_piece_t *r = arg;
    do
        r->got = pread(r->fd, r->buf, r->want, r->off);
    while (r->got < 0 && errno == EINTR);
}

static void http_close_file(void *arg) { close(*(int *)arg); }

/* GET/HEAD /file: the head with the file's size, then (GET) the file in
 * pieces. The write deadline counts per piece: a client that keeps
 * reading, however slowly, gets the whole file; one that stops for the
 * write timeout is dropped. A file that shrank under us cannot make up its
 * Content-Length: the connection is closed (-1). */
static int http_send_file(http_conn_t *c, bool head_only, int conn_hdr) {
    http_server_t *s = http_srv(c);
    http_file_open_t j = {.path = s->cfg.file, .fd = -1};
    co_blocking(http_open_file, &j);
    if (j.err)
        return http_respond(c, 500, "text/plain; charset=utf-8", "file unavailable\n", 17,
                            head_only, conn_hdr, NULL);
    int rc = http_respond(c, 200, "application/octet-stream", NULL, j.len, true, conn_hdr, NULL);
    char *buf = rc == 0 && !head_only && j.len ? malloc(HTTP_FILE_CHUNK) : NULL;
    if (rc == 0 && !head_only && j.len && !buf)
        rc = -1; /* the head promised a body we cannot send */
    for (size_t off = 0; buf && off < j.len;) {
        size_t want = j.len - off < HTTP_FILE_CHUNK ? j.len - off : HTTP_FILE_CHUNK;
        http_file_piece_t r = {.fd = j.fd, .buf = buf, .want = want, .off = (off_t)off};
        co_blocking(http_read_piece, &r);
        if (r.got <= 0 ||
            psrv_conn_write(&c->base, buf, (size_t)r.got, co_deadline_after(s->cfg.write_timeout_ns)) < 0) {
            rc = -1;
            break;
        }
        off += (size_t)r.got;
    }
    free(buf);
    co_blocking(http_close_file, &j.fd);
    return rc;
}

/* ---- parsing ---------------------------------------------------------------- */

static bool http_tchar(int ch) {
    return isalnum(ch) || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

typedef struct {
    const char *method;
    size_t method_len;
    const char *target;
    size_t target_len;
    int minor;           /* HTTP/1.<minor> */
    size_t head_len;     /* through the blank line */
    long long body_len;
    bool has_host, conn_close, conn_keep, chunked;
} http_req_t;

/* Check the start of a request before its head is complete, so that
 * garbage is refused at once instead of after the read timeout.
 * 0: fine so far, 400 or 505: refuse. */
static int http_precheck(const char *b, size_t n) {
    size_t i = 0;
    while (i < n && http_tchar((unsigned char)b[i]))
        i++;
    if (i == n)
        return i > 32 ? 400 : 0;
    if (i == 0 || b[i] != ' ' || i > 32)
        return 400;
    return 0; /* the rest is for http_parse */
}

/* A line ended by LF alone (RFC 9112 lets a server refuse it). */
static bool http_bare_lf(const char *b, size_t n) {
    for (const char *p = memchr(b, '\n', n); p; p = memchr(p + 1, '\n', (size_t)(b + n - p - 1)))
        if (p == b || p[-1] != '\r')
            return true;
    return false;
}

/* Parse a complete head in b[0..head_len). Returns 0 or an HTTP status. */
static int http_parse(char *b, size_t head_len, http_req_t *r) {
    memset(r, 0, sizeof *r);
    r->head_len = head_len;
    char *end = b + head_len - 2; /* the final CRLF: lines end before it */
    char *line = b;
    char *eol = memchr(line, '\r', (size_t)(end - line));
    if (!eol || eol[1] != '\n')
        return 400;
    /* request line: method SP target SP HTTP/1.x */
    char *sp1 = memchr(line, ' ', (size_t)(eol - line));
    if (!sp1 || sp1 == line)
        return 400;
    for (char *p = line; p < sp1; p++)
        if (!http_tchar((unsigned char)*p))
            return 400;
    char *tgt = sp1 + 1;
    char *sp2 = memchr(tgt, ' ', (size_t)(eol - tgt));
    if (!sp2 || sp2 == tgt)
        return 400;
    for (char *p = tgt; p < sp2; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            return 400;
    size_t vlen = (size_t)(eol - sp2 - 1);
    const char *ver = sp2 + 1;
    if (vlen != 8 || memcmp(ver, "HTTP/", 5) != 0 || !isdigit((unsigned char)ver[5]) ||
        ver[6] != '.' || !isdigit((unsigned char)ver[7]))
        return 400;
    if (ver[5] != '1')
        return 505;
    r->method = line;
    r->method_len = (size_t)(sp1 - line);
    r->target = tgt;
    r->target_len = (size_t)(sp2 - tgt);
    r->minor = ver[7] - '0';
    r->body_len = 0;
    bool seen_len = false;
    /* header fields */
    line = eol + 2;
    while (line < end) {
        eol = memchr(line, '\r', (size_t)(end - line) + 1);
        if (!eol || eol[1] != '\n')
            return 400;
        if (*line == ' ' || *line == '\t')
            return 400; /* obsolete line folding */
        char *colon = memchr(line, ':', (size_t)(eol - line));
        if (!colon || colon == line)
            return 400;
        for (char *p = line; p < colon; p++)
            if (!http_tchar((unsigned char)*p))
                return 400; /* includes whitespace before the colon */
        size_t nlen = (size_t)(colon - line);
        char *v = colon + 1;
        while (v < eol && (*v == ' ' || *v == '\t'))
            v++;
        char *ve = eol;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t vl = (size_t)(ve - v);
        for (char *p = v; p < ve; p++)
            if ((unsigned char)*p < 0x20 && *p != '\t')
                return 400;
        if (nlen == 4 && strncasecmp(line, "host", 4) == 0) {
            if (r->has_host)
                return 400;
            r->has_host = true;
        } else if (nlen == 14 && strncasecmp(line, "content-length", 14) == 0) {
            if (vl == 0 || vl > 18)
                return vl > 18 ? 413 : 400;
            long long n = 0;
            for (size_t i = 0; i < vl; i++) {
                if (!isdigit((unsigned char)v[i]))
                    return 400;
                n = n * 10 + (v[i] - '0');
            }
            if (seen_len && n != r->body_len)
                return 400;
            seen_len = true;
            r->body_len = n;
        } else if (nlen == 17 && strncasecmp(line, "transfer-encoding", 17) == 0) {
            r->chunked = true;
        } else if (nlen == 10 && strncasecmp(line, "connection", 10) == 0) {
            /* a comma-separated token list */
            const char *p = v;
            while (p < ve) {
                while (p < ve && (*p == ' ' || *p == ','))
                    p++;
                const char *q = p;
                while (q < ve && *q != ',' && *q != ' ')
                    q++;
                if (q - p == 5 && strncasecmp(p, "close", 5) == 0)
                    r->conn_close = true;
                if (q - p == 10 && strncasecmp(p, "keep-alive", 10) == 0)
                    r->conn_keep = true;
                p = q;
            }
        }
        line = eol + 2;
    }
    if (r->chunked)
        return 501; /* no chunked request bodies here */
    if (r->minor >= 1 && !r->has_host)
        return 400;
    if (r->body_len > HTTP_MAX_BODY)
        return 413;
    return 0;
}

/* ---- one connection ------------------------------------------------------- */

/* What the buffer holds: the length of a complete head, 0 if the head is
 * not complete yet (read more), or -status to refuse it (garbage, a bare
 * LF, too long: waiting would only time out). Empty lines before a
 * request line are dropped (RFC 9112, 2.2). */
static long http_head_status(http_conn_t *c) {
    size_t skip = 0;
    while (c->have - skip >= 2 && c->buf[skip] == '\r' && c->buf[skip + 1] == '\n')
        skip += 2;
    if (skip) {
        memmove(c->buf, c->buf + skip, c->have - skip);
        c->have -= skip;
    }
    char *e = c->have >= 4 ? memmem(c->buf, c->have, "\r\n\r\n", 4) : NULL;
    if (e)
        return (long)(e - c->buf) + 4;
    int pre = c->have == 1 && c->buf[0] == '\r' ? 0 : http_precheck(c->buf, c->have);
    if (pre)
        return -pre;
    if (http_bare_lf(c->buf, c->have))
        return -400; /* lines end in CRLF here */
    if (c->have == sizeof c->buf)
        return -431;
    return 0;
}

/* The reading phase (psrv's `read`, on the connection's own coroutine, no
 * worker held): read until the buffer holds a head, complete or to be
 * refused (PSRV_WORK: the worker answers it), or end the connection
 * (PSRV_CLOSE: EOF, a deadline, a reset, shutdown). The deadlines are set
 * once, not per read, so a peer that trickles a byte now and then gains
 * nothing: a new connection has first_byte_timeout for its first byte and
 * head_timeout for its whole head; a kept-alive one idle_timeout for its
 * next request's first byte, then head_timeout from that byte. */
static int http_read(psrv_conn_t *base) {
    http_conn_t *c = (http_conn_t *)base;
    http_server_t *s = http_srv(c);
    int64_t now = co_now();
    bool kept = base->rounds > 0;
    int64_t head_dl = kept && c->have == 0 ? CO_FOREVER : now + s->cfg.head_timeout_ns;
    int64_t first_dl = now + (kept ? s->cfg.idle_timeout_ns : s->cfg.first_byte_timeout_ns);
    if (head_dl != CO_FOREVER && first_dl > head_dl)
        first_dl = head_dl;
    for (;;) {
        long hl = http_head_status(c);
        if (hl != 0) {
            c->head = hl;
            return PSRV_WORK;
        }
        ssize_t n = psrv_conn_read(base, c->buf + c->have, sizeof c->buf - c->have,
                            c->have ? head_dl : first_dl);
        if (n > 0) {
            if (head_dl == CO_FOREVER) /* a kept-alive connection's next request begins */
                head_dl = co_now() + s->cfg.head_timeout_ns;
            c->have += (size_t)n;
            continue;
        }
        if (n == CO_ETIMEDOUT)
            HTTP_INC(s, timeouts);
        else if (n == -ECONNRESET)
            HTTP_INC(s, resets);
        return PSRV_CLOSE; /* EOF (between requests or not), deadline, reset, shutdown */
    }
}

/* Drop a request body of len bytes, part of which may be buffered. */
static int http_skip_body(http_conn_t *c, size_t head_len, long long len) {
    size_t inbuf = c->have - head_len;
    if ((long long)inbuf >= len) {
        size_t used = head_len + (size_t)len;
        memmove(c->buf, c->buf + used, c->have - used);
        c->have -= used;
        return 0;
    }
    len -= (long long)inbuf;
    c->have = 0;
    while (len > 0) {
        size_t want = len < (long long)sizeof c->buf ? (size_t)len : sizeof c->buf;
        /* the read timeout counts per read, as the write timeout per piece:
         * a slow upload that keeps coming is not cut */
        int64_t dl = co_deadline_after(http_srv(c)->cfg.read_timeout_ns);
        ssize_t n = psrv_conn_read(&c->base, c->buf, want, dl);
        if (n <= 0)
            return -1;
        len -= n;
    }
    return 0;
}

/* The work (psrv's `serve`, on a pool worker): answer the buffered head,
 * and the requests pipelined behind it that are already buffered too.
 * PSRV_KEEP once the buffer holds no complete request (the connection goes
 * back to reading, the worker is free), PSRV_CLOSE to end the connection. */
static int http_serve(psrv_conn_t *base) {
    http_conn_t *c = (http_conn_t *)base;
    http_server_t *s = http_srv(c);
    for (;;) {
        long hl = c->head;
        if (hl < 0) { /* refuse a bad request */
            http_respond(c, (int)-hl, "text/plain; charset=utf-8", http_reason((int)-hl),
                         strlen(http_reason((int)-hl)), false, 1, NULL);
            base->linger = true;
            return PSRV_CLOSE;
        }
        http_req_t r;
        int bad = http_parse(c->buf, (size_t)hl, &r);
        if (bad) {
            http_respond(c, bad, "text/plain; charset=utf-8", http_reason(bad),
                         strlen(http_reason(bad)), false, 1, NULL);
            base->linger = true;
            return PSRV_CLOSE;
        }
        HTTP_INC(s, requests);
        bool keep = r.minor >= 1 ? !r.conn_close : r.conn_keep && !r.conn_close;
        if (psrv_stopping(&s->front))
            keep = false;
        int conn_hdr = keep ? (r.minor == 0 ? 2 : 0) : 1;
        bool is_get = r.method_len == 3 && memcmp(r.method, "GET", 3) == 0;
        bool is_head = r.method_len == 4 && memcmp(r.method, "HEAD", 4) == 0;
        /* copy what we need: skipping the body reuses the buffer. Routes
         * go by the path: a query string ("/?a=1") is not part of it. */
        char target[64];
        const char *qm = memchr(r.target, '?', r.target_len);
        size_t path_len = qm ? (size_t)(qm - r.target) : r.target_len;
        size_t tl = path_len < sizeof target - 1 ? path_len : sizeof target - 1;
        memcpy(target, r.target, tl);
        target[tl] = 0;
        bool target_fits = path_len < sizeof target - 1;
        if (http_skip_body(c, r.head_len, r.body_len) < 0)
            return PSRV_CLOSE;
        int rc;
        if (!is_get && !is_head) {
            rc = http_respond(c, 405, "text/plain; charset=utf-8", "Method Not Allowed\n", 19,
                              false, conn_hdr, "Allow: GET, HEAD\r\n");
        } else if (target_fits && strcmp(target, "/") == 0) {
            rc = http_hello_reply(c, is_head, conn_hdr);
        } else if (target_fits && strcmp(target, "/file") == 0 && s->cfg.file) {
            rc = http_send_file(c, is_head, conn_hdr);
        } else {
            rc = http_respond(c, 404, "text/plain; charset=utf-8", "not found\n", 10, is_head,
                              conn_hdr, NULL);
        }
        if (rc < 0 || !keep)
            return PSRV_CLOSE;
        /* pipelined: the next head may be buffered already */
        if ((c->head = http_head_status(c)) == 0)
            return PSRV_KEEP;
    }
}

/* ---- the library face ---------------------------------------------------------- */

/* A refused connection (pool and waiting room full, or shutting down). */
static const char http_busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                "Retry-After: 1\r\nConnection: close\r\n\r\n";

/* Start serving (from a coroutine or a thread). 0 or a negative code. */
static int http_server_start(http_server_t **out, const http_config_t *cfg) {
    http_server_t *s = calloc(1, sizeof *s);
    if (!s)
        return CO_ENOMEM;
    s->cfg = *cfg;
    if (s->cfg.first_byte_timeout_ns <= 0)
        s->cfg.first_byte_timeout_ns = 3000 * HTTP_MS;
    if (s->cfg.head_timeout_ns <= 0)
        s->cfg.head_timeout_ns = 5000 * HTTP_MS;
    if (s->cfg.idle_timeout_ns <= 0)
        s->cfg.idle_timeout_ns = 10000 * HTTP_MS;
    if (s->cfg.read_timeout_ns <= 0)
        s->cfg.read_timeout_ns = 10000 * HTTP_MS;
    if (s->cfg.write_timeout_ns <= 0)
        s->cfg.write_timeout_ns = 10000 * HTTP_MS;
    psrv_config_t pc = {.host = s->cfg.host, .port = s->cfg.port, .pool_size = s->cfg.pool_size,
                        .read_cap = s->cfg.read_cap, .queue_wait_ns = s->cfg.queue_wait_ns,
                        .queue_cap = s->cfg.queue_cap, .conn_size = sizeof(http_conn_t),
                        .conn_zero = offsetof(http_conn_t, buf),
                        .read = http_read, .serve = http_serve, .refuse_msg = http_busy,
                        .tls = s->cfg.tls};
    int rc = psrv_start(&s->front, &pc);
    if (rc < 0) {
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

static int http_server_port(const http_server_t *s) {
    return s->front.port;
}

/* Begin shutdown; callable once, from any coroutine or thread. */
static void http_server_stop(http_server_t *s) {
    psrv_stop(&s->front);
}

/* Wait for the shutdown begun by http_server_stop to finish: every
 * connection ended, every worker returned. Frees s. */
static void http_server_wait(http_server_t *s, http_stats_t *stats) {
    psrv_wait(&s->front);
    if (stats) {
        *stats = s->st;
        stats->accepted = s->front.accepted;
        stats->served = s->front.admitted;
        stats->refused = s->front.refused;
    }
    free(s);
}

#ifndef HTTP_SERVER_NO_MAIN

static void http_print_stats(FILE *f, const http_stats_t *st) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(f,
            "http_server: accepted %lld, served %lld, refused %lld; requests %lld "
            "(2xx %lld, 4xx %lld, 5xx %lld); timeouts %lld, resets %lld; peak RSS %ld KiB\n",
            (long long)st->accepted, (long long)st->served, (long long)st->refused,
            (long long)st->requests, (long long)st->status_2xx, (long long)st->status_4xx,
            (long long)st->status_5xx, (long long)st->timeouts, (long long)st->resets,
            ru.ru_maxrss);
}


typedef struct {
    http_config_t cfg;
} http_main_t;

static int http_run(void *arg) {
    http_main_t *m = arg;
    co_chan_t *sigs;
    int src = psrv_signals(&sigs);
    if (src < 0) {
        fprintf(stderr, "http_server: co_signal_notify: %s\n", co_strerror(src));
        return 1;
    }
    http_server_t *s;
    int rc = http_server_start(&s, &m->cfg);
    if (rc < 0) {
        fprintf(stderr, "http_server: cannot start: %s\n", co_strerror(rc));
        co_signal_stop(sigs);
        co_chan_free(sigs);
        return 1;
    }
    printf("http_server: listening on %s://%s:%d/ (pool %d, read cap %d, %d Ps)\n",
           m->cfg.tls ? "https" : "http", m->cfg.host ? m->cfg.host : "127.0.0.1", http_server_port(s), s->front.cfg.pool_size,
           s->front.cfg.read_cap, co_procs());
    fflush(stdout);
    psrv_wait_signal(sigs); /* SIGINT or SIGTERM */
    printf("http_server: shutting down\n");
    http_server_stop(s);
    http_stats_t st;
    http_server_wait(s, &st);
    http_print_stats(stdout, &st);
    return 0;
}

int main(int argc, char **argv) {
    http_main_t m = {.cfg = {.port = 8080, .pool_size = 1000}};
    bool help = argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    int a = 1;
    bool bad = false;
    if (!help && argc > 2 && !strcmp(argv[1], "-r")) {
        bad = !psrv_arg_int(argv[2], 1, 1 << 24, &m.cfg.read_cap);
        a = 3;
    }
    int npos = argc - a;
    if (help || bad || npos > 3 || (npos > 0 && !psrv_arg_int(argv[a], 0, 65535, &m.cfg.port)) ||
        (npos > 1 && !psrv_arg_int(argv[a + 1], 1, 1 << 24, &m.cfg.pool_size))) {
        fprintf(help ? stdout : stderr,
                "usage: %s [-r read-cap] [port (0: any)] [pool-size] [file served at /file]\n"
                "  (HTTPS: HTTP_TLS_CERT=cert.pem HTTP_TLS_KEY=key.pem)\n",
                argv[0]);
        return help ? 0 : 2;
    }
    if (npos > 2)
        m.cfg.file = argv[a + 2];
    const char *h = getenv("HTTP_HOST");
    if (h)
        m.cfg.host = h;
    /* HTTPS: HTTP_TLS_CERT and HTTP_TLS_KEY name PEM files */
    const char *cert = getenv("HTTP_TLS_CERT"), *key = getenv("HTTP_TLS_KEY");
    if (cert || key) {
        static const char *const alpn[] = {"http/1.1"};
        int trc = co_tls_config_new(&m.cfg.tls, CO_TLS_SERVER);
        if (trc == 0)
            trc = co_tls_config_cert(m.cfg.tls, cert ? cert : "", key ? key : "");
        if (trc == 0)
            trc = co_tls_config_alpn(m.cfg.tls, alpn, 1);
        if (trc < 0) {
            fprintf(stderr, "http_server: TLS with %s and %s: %s\n", cert ? cert : "(no cert)",
                    key ? key : "(no key)", co_strerror(trc));
            return 1;
        }
    }
    psrv_main_limits();
    int rc = co_main(http_run, &m);
    co_tls_config_free(m.cfg.tls);
    int sd = co_shutdown();
    if (sd < 0)
        fprintf(stderr, "http_server: co_shutdown: %s\n", co_strerror(sd));
    return rc ? rc : (sd < 0);
}
#endif
