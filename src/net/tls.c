/*
 * TLS on coroutines (Go's crypto/tls) with OpenSSL 3.
 *
 * An SSL object talks to its socket through a BIO of ours that makes one
 * non-blocking send/recv per call and never waits. When OpenSSL wants
 * more (SSL_ERROR_WANT_READ/WRITE), the operation lets go of the
 * connection's lock and waits on the netpoller (co__io_op) until the
 * fd is ready or its deadline passes, then tries again. So a coroutine
 * parks and a plain thread blocks, as with co_read; and a reader and a
 * writer may wait at once on one connection (a full-duplex protocol),
 * since neither holds the lock while it waits.
 *
 * Without OpenSSL (COLONY_HAVE_OPENSSL undefined) every call answers
 * -ENOTSUP.
 */
#include <colony.h>

#include <errno.h>

#ifndef COLONY_HAVE_OPENSSL

bool co_tls_available(void) { return false; }
int co_tls_config_new(co_tls_config_t **out, int role) {
    if (out)
        *out = NULL;
    return -ENOTSUP;
}
int co_tls_config_cert(co_tls_config_t *cfg, const char *c, const char *k) { return -ENOTSUP; }
int co_tls_config_ca(co_tls_config_t *cfg, const char *ca) { return -ENOTSUP; }
int co_tls_config_verify(co_tls_config_t *cfg, bool v) { return -ENOTSUP; }
int co_tls_config_alpn(co_tls_config_t *cfg, const char *const *p, int n) { return -ENOTSUP; }
void co_tls_config_free(co_tls_config_t *cfg) {}
int co_tls_client(co_tls_t **out, int fd, co_tls_config_t *cfg, const char *name,
                  int64_t deadline) {
    if (out)
        *out = NULL;
    if (fd >= 0)
        co_close(fd);
    return -ENOTSUP;
}
int co_tls_server(co_tls_t **out, int fd, co_tls_config_t *cfg, int64_t deadline) {
    return co_tls_client(out, fd, NULL, NULL, deadline);
}
ssize_t co_tls_read(co_tls_t *c, void *b, size_t n, int64_t d) { return -ENOTSUP; }
ssize_t co_tls_write(co_tls_t *c, const void *b, size_t n, int64_t d) { return -ENOTSUP; }
int co_tls_shutdown(co_tls_t *c, int64_t d) { return -ENOTSUP; }
int co_tls_close(co_tls_t *c) { return c ? -ENOTSUP : 0; }
int co_tls_fd(const co_tls_t *c) { return -1; }
const char *co_tls_alpn(const co_tls_t *c) { return NULL; }
const char *co_tls_servername(const co_tls_t *c) { return NULL; }
bool co_tls_resumed(const co_tls_t *c) { return false; }
const char *co_tls_version(const co_tls_t *c) { return NULL; }

#else

#include "base/san.h"
#include "io/io.h"

#include <arpa/inet.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The client session cache: the newest session per server name, so that
 * a second connection to a name resumes (Go's ClientSessionCache). */
#define TLS_CACHE_SLOTS 64

typedef struct cache_slot {
    char *name;         /* NULL: empty */
    SSL_SESSION *sess;  /* one reference, ours */
    uint64_t used;      /* for replacing the least recently used */
} cache_slot_t;

struct co_tls_config {
    SSL_CTX *ctx;
    int role;
    bool verify;
    /* connections hold a reference each, the owner one: the last drop
     * frees (acq_rel: the frees see every use before) */
    int refs;
    /* the ALPN list in wire form (length-prefixed strings); NULL: none.
     * Set before the first connection (documented), read after. */
    unsigned char *alpn;
    unsigned alpn_len;
    pthread_mutex_t cache_lock; /* protects cache[] and tick */
    cache_slot_t cache[TLS_CACHE_SLOTS];
    uint64_t tick;
};

struct co_tls {
    SSL *ssl;
    int fd;
    co_tls_config_t *cfg;
    /* mu protects ssl (OpenSSL's object is for one thread at a time) and
     * ioerr. It is held only around SSL_* calls, which never wait (the
     * BIO does not): never while parked in co_wait_fd. */
    co_mutex_t mu;
    int ioerr;          /* the last send/recv error of the BIO, -errno; 0: none */
    bool shut;          /* under mu: our close_notify is out (co_tls_shutdown done) */
    /* atomic relaxed: set by a call that returned CO_ECLOSED (someone
     * co_close'd the fd under it): the number is no longer this
     * connection's, and may already name another file, so nothing may
     * write to it or close it again. Read by co_tls_close, which runs
     * after every other call on c has returned. */
    bool fd_gone;
    char *name;         /* client: the name given (session cache key); may be NULL */
    char alpn[256];     /* the protocol agreed, "" if none; set by the handshake */
};

/* OpenSSL keeps state per OS thread (its error queue, its random
 * generators): the coroutines that call it one after another on one M
 * hand that state on, and no OpenSSL call here parks, so two never
 * interleave in it. Under TSan every coroutine is a fiber of its own, so
 * the hand-off is annotated on an address of the thread's: OSSL_IN before
 * a run of OpenSSL calls, OSSL_OUT after it. */
#ifdef CO_TSAN
static __thread char ossl_thread_token;
#define OSSL_IN() __tsan_acquire(&ossl_thread_token)
#define OSSL_OUT() __tsan_release(&ossl_thread_token)
#else
#define OSSL_IN() ((void)0)
#define OSSL_OUT() ((void)0)
#endif

static int ex_conn = -1; /* SSL ex_data index of the co_tls_t */
static BIO_METHOD *bio_meth;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* ---- the BIO: one non-blocking syscall per call ---------------------- */

static int bio_write(BIO *b, const char *buf, int len) {
    co_tls_t *c = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    for (;;) {
        ssize_t n = send(c->fd, buf, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0)
            return (int)n;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            BIO_set_retry_write(b);
            return -1;
        }
        c->ioerr = -errno;
        return -1;
    }
}

static int bio_read(BIO *b, char *buf, int len) {
    co_tls_t *c = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    for (;;) {
        ssize_t n = recv(c->fd, buf, (size_t)len, MSG_DONTWAIT);
        if (n >= 0)
            return (int)n; /* 0: the peer's FIN */
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            BIO_set_retry_read(b);
            return -1;
        }
        c->ioerr = -errno;
        return -1;
    }
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0; /* nothing is buffered here */
}

static int bio_create(BIO *b) {
    BIO_set_init(b, 1);
    return 1;
}

static void tls_init(void) {
    OPENSSL_init_ssl(0, NULL);
    ex_conn = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
    bio_meth = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "colony");
    if (bio_meth) {
        BIO_meth_set_write(bio_meth, bio_write);
        BIO_meth_set_read(bio_meth, bio_read);
        BIO_meth_set_ctrl(bio_meth, bio_ctrl);
        BIO_meth_set_create(bio_meth, bio_create);
    }
}

static bool tls_ready(void) {
    OSSL_IN();
    pthread_once(&init_once, tls_init);
    OSSL_OUT();
    return bio_meth && ex_conn >= 0;
}

bool co_tls_available(void) { return true; }

/* ---- config -------------------------------------------------------- */

/* A client session arrived (TLS 1.2: in the handshake; TLS 1.3: a ticket
 * read after it): keep it as the newest for the connection's name. */
static int new_session_cb(SSL *ssl, SSL_SESSION *sess) {
    co_tls_t *c = SSL_get_ex_data(ssl, ex_conn);
    if (!c || !c->name)
        return 0; /* not kept: OpenSSL frees it */
    co_tls_config_t *cfg = c->cfg;
    pthread_mutex_lock(&cfg->cache_lock);
    cache_slot_t *slot = NULL, *lru = &cfg->cache[0];
    for (int i = 0; i < TLS_CACHE_SLOTS; i++) {
        cache_slot_t *s = &cfg->cache[i];
        if (s->name && !strcmp(s->name, c->name)) {
            slot = s;
            break;
        }
        if (!s->name || (lru->name && s->used < lru->used))
            lru = s;
    }
    if (!slot) {
        slot = lru;
        free(slot->name);
        slot->name = strdup(c->name);
        if (slot->sess)
            SSL_SESSION_free(slot->sess);
        slot->sess = NULL;
        if (!slot->name) {
            pthread_mutex_unlock(&cfg->cache_lock);
            return 0;
        }
    }
    if (slot->sess)
        SSL_SESSION_free(slot->sess);
    slot->sess = sess;
    slot->used = ++cfg->tick;
    pthread_mutex_unlock(&cfg->cache_lock);
    return 1; /* the reference is ours */
}

/* The newest session for name, with a reference for the caller; NULL if
 * none. */
static SSL_SESSION *cache_get(co_tls_config_t *cfg, const char *name) {
    SSL_SESSION *s = NULL;
    pthread_mutex_lock(&cfg->cache_lock);
    for (int i = 0; i < TLS_CACHE_SLOTS; i++) {
        cache_slot_t *sl = &cfg->cache[i];
        if (sl->name && !strcmp(sl->name, name)) {
            if (SSL_SESSION_is_resumable(sl->sess) && SSL_SESSION_up_ref(sl->sess)) {
                s = sl->sess;
                sl->used = ++cfg->tick;
            }
            break;
        }
    }
    pthread_mutex_unlock(&cfg->cache_lock);
    return s;
}

/* Server: the first of our protocols that the client offers (Go's order:
 * the server's preference); none in common is a fatal alert, as Go. */
static int alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned inlen, void *arg) {
    co_tls_config_t *cfg = arg;
    if (!cfg->alpn)
        return SSL_TLSEXT_ERR_NOACK;
    unsigned char *o = NULL;
    if (SSL_select_next_proto(&o, outlen, cfg->alpn, cfg->alpn_len, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    *out = o;
    return SSL_TLSEXT_ERR_OK;
}

/* The system's CA store, as OpenSSL's default paths name it (honouring
 * SSL_CERT_FILE and SSL_CERT_DIR): the bundle file read into memory, and
 * the hashed directory looked up by name. Not SSL_CTX_set_default_verify_
 * paths: in OpenSSL 3 it adds a "store" lookup that reads the whole
 * directory on every chain built, a full handshake's largest cost. */
/* Fills in each trusted certificate's cached extensions (key ids, flags)
 * now, while the store is the caller's alone: OpenSSL 3.0 otherwise fills
 * them lazily during the first verifications, and concurrent handshakes
 * then write and read one certificate's cache at once. */
static void warm_store(X509_STORE *st) {
    STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(st);
    for (int i = 0; objs && i < sk_X509_OBJECT_num(objs); i++) {
        X509 *x = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objs, i));
        if (x)
            (void)X509_check_purpose(x, -1, 0);
    }
}

static int load_system_store(SSL_CTX *ctx) {
    X509_STORE *st = SSL_CTX_get_cert_store(ctx);
    const char *file = getenv(X509_get_default_cert_file_env());
    const char *dir = getenv(X509_get_default_cert_dir_env());
    if (!file)
        file = X509_get_default_cert_file();
    if (!dir)
        dir = X509_get_default_cert_dir();
    /* either may be missing on a given system: what is there is used */
    (void)X509_STORE_load_file(st, file);
    warm_store(st);
    X509_LOOKUP *lk = X509_STORE_add_lookup(st, X509_LOOKUP_hash_dir());
    if (!lk)
        return CO_ENOMEM;
    /* a colon-separated list, as OpenSSL's own */
    (void)X509_LOOKUP_add_dir(lk, dir, X509_FILETYPE_PEM);
    ERR_clear_error();
    return 0;
}

static int config_new_impl(co_tls_config_t **out, int role) {
    if (!out)
        return CO_EINVAL;
    *out = NULL;
    if (role != CO_TLS_CLIENT && role != CO_TLS_SERVER)
        return CO_EINVAL;
    if (!tls_ready())
        return CO_ENOMEM;
    co_tls_config_t *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        return CO_ENOMEM;
    cfg->role = role;
    cfg->refs = 1;
    pthread_mutex_init(&cfg->cache_lock, NULL);
    cfg->ctx = SSL_CTX_new(role == CO_TLS_CLIENT ? TLS_client_method() : TLS_server_method());
    if (!cfg->ctx) {
        free(cfg);
        return CO_ENOMEM;
    }
    SSL_CTX_set_min_proto_version(cfg->ctx, TLS1_2_VERSION); /* Go's default floor */
    /* SSL_write returns only when all is written; its buffer may move
     * between retries (ours is the caller's, re-passed at an offset) */
    SSL_CTX_set_mode(cfg->ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* our certificate goes out with the chain its file gives, as Go sends
     * it: not a chain OpenSSL would build from the trust store again on
     * every handshake */
    SSL_CTX_set_mode(cfg->ctx, SSL_MODE_NO_AUTO_CHAIN);
    /* one recv(2) for as many records as have come, not two per record
     * (header, then body); WANT_READ still means the socket must bring
     * more, so waiting on it stays right */
    SSL_CTX_set_read_ahead(cfg->ctx, 1);
    /* TLS 1.3 suites in Go's order for CPUs with AES instructions:
     * AES-128-GCM first (OpenSSL's default puts AES-256 first, ~1.4x the
     * cost per byte for no practical gain) */
    SSL_CTX_set_ciphersuites(cfg->ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:"
                                       "TLS_AES_256_GCM_SHA384");
    if (role == CO_TLS_CLIENT) {
        cfg->verify = true;
        if (load_system_store(cfg->ctx) < 0) {
            SSL_CTX_free(cfg->ctx);
            free(cfg);
            return CO_ENOMEM;
        }
        SSL_CTX_set_verify(cfg->ctx, SSL_VERIFY_PEER, NULL);
        SSL_CTX_set_session_cache_mode(cfg->ctx,
                                       SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
        SSL_CTX_sess_set_new_cb(cfg->ctx, new_session_cb);
    } else {
        SSL_CTX_set_verify(cfg->ctx, SSL_VERIFY_NONE, NULL);
        SSL_CTX_set_alpn_select_cb(cfg->ctx, alpn_select_cb, cfg);
        /* the session id context a server needs for resumption (and to
         * accept client certificates with it) */
        /* one TLS 1.3 ticket per handshake, as Go sends (OpenSSL: 2) */
        SSL_CTX_set_num_tickets(cfg->ctx, 1);
        static const unsigned char sid[] = "colony";
        SSL_CTX_set_session_id_context(cfg->ctx, sid, sizeof sid - 1);
    }
    ERR_clear_error();
    *out = cfg;
    return 0;
}

static int config_cert_impl(co_tls_config_t *cfg, const char *cert_pem, const char *key_pem) {
    if (!cfg || !cert_pem || !key_pem)
        return CO_EINVAL;
    int rc = 0;
    if (SSL_CTX_use_certificate_chain_file(cfg->ctx, cert_pem) != 1 ||
        SSL_CTX_use_PrivateKey_file(cfg->ctx, key_pem, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(cfg->ctx) != 1)
        rc = CO_EINVAL;
    ERR_clear_error();
    return rc;
}

static int config_ca_impl(co_tls_config_t *cfg, const char *ca_pem) {
    if (!cfg || !ca_pem)
        return CO_EINVAL;
    X509_STORE *st = X509_STORE_new();
    if (!st)
        return CO_ENOMEM;
    int rc = 0;
    if (X509_STORE_load_file(st, ca_pem) != 1) {
        X509_STORE_free(st);
        rc = CO_EINVAL;
    } else {
        warm_store(st);
        SSL_CTX_set_cert_store(cfg->ctx, st); /* the CTX owns it, frees the old */
        if (cfg->role == CO_TLS_SERVER) {
            /* the CAs a server names when it asks for a client cert */
            STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca_pem);
            if (names)
                SSL_CTX_set_client_CA_list(cfg->ctx, names);
        }
    }
    ERR_clear_error();
    return rc;
}

/* Verification off: the peer's chain is accepted as it is, not built.
 * OpenSSL otherwise builds and checks it on every handshake even under
 * SSL_VERIFY_NONE (only ignoring the result), looking each issuer up in
 * the trust store: Go's InsecureSkipVerify does no such work either. */
static int accept_unverified(X509_STORE_CTX *x, void *arg) {
    (void)x, (void)arg;
    return 1;
}

static int config_verify_impl(co_tls_config_t *cfg, bool verify) {
    if (!cfg)
        return CO_EINVAL;
    cfg->verify = verify;
    int mode = !verify ? SSL_VERIFY_NONE
               : cfg->role == CO_TLS_CLIENT ? SSL_VERIFY_PEER
                                            : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
    SSL_CTX_set_verify(cfg->ctx, mode, NULL);
    SSL_CTX_set_cert_verify_callback(cfg->ctx, verify ? NULL : accept_unverified, NULL);
    return 0;
}

static int config_alpn_impl(co_tls_config_t *cfg, const char *const *protos, int n) {
    if (!cfg || n < 0 || (n > 0 && !protos))
        return CO_EINVAL;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t l = protos[i] ? strlen(protos[i]) : 0;
        if (l == 0 || l > 255)
            return CO_EINVAL;
        len += 1 + l;
    }
    if (len > 65535)
        return CO_EINVAL;
    unsigned char *w = NULL;
    if (n > 0) {
        w = malloc(len);
        if (!w)
            return CO_ENOMEM;
        unsigned char *p = w;
        for (int i = 0; i < n; i++) {
            size_t l = strlen(protos[i]);
            *p++ = (unsigned char)l;
            memcpy(p, protos[i], l);
            p += l;
        }
    }
    if (cfg->role == CO_TLS_CLIENT &&
        SSL_CTX_set_alpn_protos(cfg->ctx, w, n > 0 ? (unsigned)len : 0) != 0) {
        free(w);
        return CO_ENOMEM;
    }
    free(cfg->alpn);
    cfg->alpn = w;
    cfg->alpn_len = (unsigned)len;
    return 0;
}

static void config_unref(co_tls_config_t *cfg) {
    if (__atomic_sub_fetch(&cfg->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    OSSL_IN();
    for (int i = 0; i < TLS_CACHE_SLOTS; i++) {
        free(cfg->cache[i].name);
        if (cfg->cache[i].sess)
            SSL_SESSION_free(cfg->cache[i].sess);
    }
    pthread_mutex_destroy(&cfg->cache_lock);
    SSL_CTX_free(cfg->ctx);
    OSSL_OUT();
    free(cfg->alpn);
    free(cfg);
}

int co_tls_config_new(co_tls_config_t **out, int role) {
    OSSL_IN();
    int rc = config_new_impl(out, role);
    OSSL_OUT();
    return rc;
}

int co_tls_config_cert(co_tls_config_t *cfg, const char *cert_pem, const char *key_pem) {
    OSSL_IN();
    int rc = config_cert_impl(cfg, cert_pem, key_pem);
    OSSL_OUT();
    return rc;
}

int co_tls_config_ca(co_tls_config_t *cfg, const char *ca_pem) {
    OSSL_IN();
    int rc = config_ca_impl(cfg, ca_pem);
    OSSL_OUT();
    return rc;
}

int co_tls_config_verify(co_tls_config_t *cfg, bool verify) {
    OSSL_IN();
    int rc = config_verify_impl(cfg, verify);
    OSSL_OUT();
    return rc;
}

int co_tls_config_alpn(co_tls_config_t *cfg, const char *const *protos, int n) {
    OSSL_IN();
    int rc = config_alpn_impl(cfg, protos, n);
    OSSL_OUT();
    return rc;
}

void co_tls_config_free(co_tls_config_t *cfg) {
    if (cfg)
        config_unref(cfg);
}

/* ---- connections ------------------------------------------------------ */

/* What an SSL call's failure means, under c->mu, right after the call. */
static int tls_error(co_tls_t *c, int r, int *want) {
    *want = 0;
    int e = SSL_get_error(c->ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ:
        *want = CO_READABLE;
        return 0;
    case SSL_ERROR_WANT_WRITE:
        *want = CO_WRITABLE;
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        return -EPIPE; /* the peer's close_notify: for a read, the caller says 0 */
    case SSL_ERROR_SYSCALL:
        if (c->ioerr)
            return c->ioerr;
        return -ECONNRESET; /* EOF where a record was due */
    case SSL_ERROR_SSL: {
        unsigned long err = ERR_peek_last_error();
        int rc = CO_ETLS;
        if (ERR_GET_LIB(err) == ERR_LIB_SSL &&
            ERR_GET_REASON(err) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
            rc = -ECONNRESET;
        else if (ERR_GET_LIB(err) == ERR_LIB_SSL &&
                 ERR_GET_REASON(err) == SSL_R_CERTIFICATE_VERIFY_FAILED)
            rc = CO_ETLSVERIFY;
        else if (SSL_get_verify_result(c->ssl) != X509_V_OK && c->cfg->verify &&
                 c->cfg->role == CO_TLS_CLIENT)
            rc = CO_ETLSVERIFY;
        else if (c->ioerr)
            rc = c->ioerr;
        return rc;
    }
    default:
        return CO_ETLS;
    }
}

typedef enum { OP_HANDSHAKE, OP_READ, OP_WRITE, OP_SHUTDOWN } op_t;

/* ERR_clear_error when the thread's error queue holds anything: SSL_get_error
 * needs an empty queue before the call, and ERR_clear_error walks all its
 * slots even when it is empty (twice per record otherwise). */
static inline void err_clear(void) {
    if (ERR_peek_error())
        ERR_clear_error();
}

/* One SSL call's arguments and outcome, for tls_attempt. */
typedef struct {
    co_tls_t *c;
    op_t op;
    void *buf;
    size_t len;
    int how;     /* the readiness co__io_op waits for: CO__IO_READ or CO__IO_WRITE */
    int other;   /* set by an attempt that wants the other readiness */
    ssize_t res; /* the outcome once an attempt ends the operation */
} attempt_t;

/* One non-blocking SSL call under c->mu (co__io_fn). -EAGAIN when OpenSSL
 * wants the readiness co__io_op waits for; 0 with a->other set when it
 * wants the other one; otherwise 0 with a->res the operation's result. */
static ssize_t tls_attempt(int fd, void *arg) {
    (void)fd;
    attempt_t *a = arg;
    co_tls_t *c = a->c;
    co_mutex_lock(&c->mu);
    OSSL_IN();
    err_clear();
    c->ioerr = 0;
    int r;
    size_t done = 0;
    switch (a->op) {
    case OP_HANDSHAKE:
        r = SSL_do_handshake(c->ssl);
        break;
    case OP_READ:
        r = SSL_read_ex(c->ssl, a->buf, a->len, &done);
        break;
    case OP_WRITE:
        if (c->shut) { /* after our close_notify: as a write to a shut socket */
            OSSL_OUT();
            co_mutex_unlock(&c->mu);
            a->res = -EPIPE;
            return 0;
        }
        r = SSL_write_ex(c->ssl, a->buf, a->len, &done);
        break;
    default:
        /* Once our close_notify is out, another SSL_shutdown would wait
         * for the peer's (and read, and lose, the data before it): a
         * second co_tls_shutdown is done already, as Go's CloseWrite. */
        r = c->shut ? 1 : SSL_shutdown(c->ssl);
        /* 0: our close_notify is out, the peer's not yet in: enough */
        if (r == 0)
            r = 1;
        if (r > 0)
            c->shut = true;
        break;
    }
    ssize_t ret = 0;
    if (r > 0) {
        a->res = a->op == OP_READ || a->op == OP_WRITE ? (ssize_t)done : 1;
    } else {
        int want;
        int rc = tls_error(c, r, &want);
        if (a->op == OP_READ && SSL_get_error(c->ssl, r) == SSL_ERROR_ZERO_RETURN)
            rc = 0;
        err_clear();
        if (!want)
            a->res = rc;
        else if ((want == CO_READABLE) == (a->how == CO__IO_READ))
            ret = -EAGAIN;
        else
            a->other = want;
    }
    OSSL_OUT();
    co_mutex_unlock(&c->mu);
    return ret;
}

/* Runs one SSL call until it succeeds, fails, or the deadline passes while
 * it waits for the fd. Returns the call's positive result (bytes for
 * read/write, 1 otherwise), 0 for a read at the peer's close_notify, or a
 * negative error. The wait is co__io_op's: the netpoller's edge, with the
 * readiness sequence read before the attempt, so no poll(2) or epoll_ctl(2)
 * around each park. */
static ssize_t tls_op(co_tls_t *c, op_t op, void *buf, size_t len, int64_t deadline) {
    attempt_t a = {.c = c, .op = op, .buf = buf, .len = len,
                   .how = op == OP_WRITE ? CO__IO_WRITE : CO__IO_READ};
    for (;;) {
        a.other = 0;
        ssize_t r = co__io_op(c->fd, a.how, tls_attempt, &a, deadline);
        if (r == -EAGAIN) {
            /* an fd the netpoller cannot watch: wait by asking the kernel */
            int w = co_wait_fd(c->fd, a.how == CO__IO_READ ? CO_READABLE : CO_WRITABLE, deadline);
            if (w == CO_ECLOSED)
                __atomic_store_n(&c->fd_gone, true, __ATOMIC_RELAXED);
            if (w < 0)
                return w;
            continue;
        }
        if (r == CO_ECLOSED)
            __atomic_store_n(&c->fd_gone, true, __ATOMIC_RELAXED);
        if (r < 0)
            return r; /* CO_ETIMEDOUT, CO_ECLOSED, ... */
        if (!a.other)
            return a.res;
        a.how = a.other == CO_READABLE ? CO__IO_READ : CO__IO_WRITE;
    }
}

static bool is_ip(const char *s) {
    unsigned char b[16];
    return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

static void conn_free(co_tls_t *c) {
    OSSL_IN();
    if (c->ssl)
        SSL_free(c->ssl);
    OSSL_OUT();
    co_tls_config_t *cfg = c->cfg;
    free(c->name);
    free(c);
    config_unref(cfg);
}

static int conn_new(co_tls_t **out, int fd, co_tls_config_t *cfg, int role,
                    const char *servername, int64_t deadline) {
    int rc;
    co_tls_t *c = NULL;
    if (!out || !cfg || cfg->role != role) {
        rc = CO_EINVAL;
        goto fail;
    }
    if (role == CO_TLS_CLIENT && cfg->verify && (!servername || !*servername)) {
        rc = CO_EINVAL; /* nothing to verify the certificate against */
        goto fail;
    }
    if (!tls_ready()) {
        rc = CO_ENOMEM;
        goto fail;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        rc = CO_ENOMEM;
        goto fail;
    }
    c->fd = fd;
    c->cfg = cfg;
    __atomic_add_fetch(&cfg->refs, 1, __ATOMIC_RELAXED); /* the owner's keeps it alive */
    if (servername && *servername && !(c->name = strdup(servername))) {
        rc = CO_ENOMEM;
        goto fail_conn;
    }
    if (c->name) { /* as Go: "[::1]" is the address ::1, "host." the name host */
        size_t l = strlen(c->name);
        if (l >= 2 && c->name[0] == '[' && c->name[l - 1] == ']') {
            memmove(c->name, c->name + 1, l - 2);
            c->name[l -= 2] = 0;
        }
        if (l > 1 && c->name[l - 1] == '.')
            c->name[l - 1] = 0;
    }
    OSSL_IN();
    c->ssl = SSL_new(cfg->ctx);
    BIO *bio = c->ssl ? BIO_new(bio_meth) : NULL;
    if (!bio) {
        rc = CO_ENOMEM;
        goto fail_conn;
    }
    BIO_set_data(bio, c);
    SSL_set_bio(c->ssl, bio, bio); /* the SSL owns it */
    SSL_set_ex_data(c->ssl, ex_conn, c);
    if (role == CO_TLS_CLIENT) {
        SSL_set_connect_state(c->ssl);
        if (c->name) {
            bool ip = is_ip(c->name);
            /* SNI carries host names only (RFC 6066) */
            if (!ip && SSL_set_tlsext_host_name(c->ssl, c->name) != 1) {
                rc = CO_EINVAL;
                goto fail_conn;
            }
            if (cfg->verify) {
                int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), c->name)
                            : SSL_set1_host(c->ssl, c->name);
                if (ok != 1) {
                    rc = CO_EINVAL;
                    goto fail_conn;
                }
            }
            SSL_SESSION *s = cache_get(cfg, c->name);
            if (s) {
                SSL_set_session(c->ssl, s);
                SSL_SESSION_free(s);
            }
        }
    } else {
        SSL_set_accept_state(c->ssl);
    }
    OSSL_OUT();
    ssize_t r = tls_op(c, OP_HANDSHAKE, NULL, 0, deadline);
    if (r < 0) {
        rc = (int)r;
        goto fail_conn;
    }
    const unsigned char *p;
    unsigned plen;
    OSSL_IN();
    SSL_get0_alpn_selected(c->ssl, &p, &plen);
    OSSL_OUT();
    if (p && plen < sizeof c->alpn) {
        memcpy(c->alpn, p, plen);
        c->alpn[plen] = 0;
    }
    *out = c;
    return 0;
fail_conn:
    OSSL_IN();
    ERR_clear_error();
    OSSL_OUT();
    conn_free(c);
fail:
    if (out)
        *out = NULL;
    /* CO_ECLOSED: closed under the handshake, the number no longer ours */
    if (fd >= 0 && rc != CO_ECLOSED)
        co_close(fd);
    return rc;
}

int co_tls_client(co_tls_t **out, int fd, co_tls_config_t *cfg, const char *servername,
                  int64_t deadline) {
    if (fd < 0) {
        if (out)
            *out = NULL;
        return -EBADF;
    }
    return conn_new(out, fd, cfg, CO_TLS_CLIENT, servername, deadline);
}

int co_tls_server(co_tls_t **out, int fd, co_tls_config_t *cfg, int64_t deadline) {
    if (fd < 0) {
        if (out)
            *out = NULL;
        return -EBADF;
    }
    return conn_new(out, fd, cfg, CO_TLS_SERVER, NULL, deadline);
}

ssize_t co_tls_read(co_tls_t *c, void *buf, size_t len, int64_t deadline) {
    if (!c || (!buf && len) || len > SSIZE_MAX)
        return CO_EINVAL;
    if (len == 0)
        return 0;
    return tls_op(c, OP_READ, buf, len, deadline);
}

ssize_t co_tls_write(co_tls_t *c, const void *buf, size_t len, int64_t deadline) {
    if (!c || (!buf && len) || len > SSIZE_MAX)
        return CO_EINVAL;
    if (len == 0)
        return 0;
    ssize_t r = tls_op(c, OP_WRITE, (void *)buf, len, deadline);
    return r < 0 ? r : (ssize_t)len;
}

int co_tls_shutdown(co_tls_t *c, int64_t deadline) {
    if (!c)
        return CO_EINVAL;
    ssize_t r = tls_op(c, OP_SHUTDOWN, NULL, 0, deadline);
    return r < 0 ? (int)r : 0;
}

int co_tls_close(co_tls_t *c) {
    if (!c)
        return 0;
    /* a close_notify if it goes out at once (Go's Close sends one too);
     * a peer that is gone or slow does not hold the close up */
    bool gone = __atomic_load_n(&c->fd_gone, __ATOMIC_RELAXED);
    co_mutex_lock(&c->mu);
    OSSL_IN();
    if (!gone && SSL_is_init_finished(c->ssl) && !(SSL_get_shutdown(c->ssl) & SSL_SENT_SHUTDOWN))
        (void)SSL_shutdown(c->ssl);
    ERR_clear_error();
    OSSL_OUT();
    co_mutex_unlock(&c->mu);
    int fd = c->fd;
    conn_free(c);
    return gone ? 0 : co_close(fd);
}

int co_tls_fd(const co_tls_t *c) { return c ? c->fd : -1; }

const char *co_tls_alpn(const co_tls_t *c) {
    return c && c->alpn[0] ? c->alpn : NULL;
}

const char *co_tls_servername(const co_tls_t *c) {
    if (!c)
        return NULL;
    /* immutable once the handshake is done */
    return SSL_get_servername(c->ssl, TLSEXT_NAMETYPE_host_name);
}

bool co_tls_resumed(const co_tls_t *c) { return c && SSL_session_reused(c->ssl); }

const char *co_tls_version(const co_tls_t *c) { return c ? SSL_get_version(c->ssl) : NULL; }

#endif
