/*
 * The resolver (Go's net.Resolver): co_lookup_host, co_lookup_addr.
 *
 * /etc/hosts first, parsed here and cached (as Go does). Then, with c-ares
 * (COLONY_HAVE_CARES), DNS as /etc/resolv.conf says (servers, search,
 * ndots, timeout, attempts), with the protocol, retries, TCP after a
 * truncated answer and the ordering of answers (RFC 6724) left to c-ares. A lookup takes a c-ares channel of
 * its own from a free list (a channel is not safe for two threads at
 * once) and drives it from the caller: c-ares's sockets go into an epoll
 * set of the channel's (its socket-state callback), and the caller parks
 * on that one descriptor with co_wait_fd until it is readable, until
 * c-ares's next timeout, or until its deadline; no M ever blocks. A
 * context's cancellation reaches the parked caller through an eventfd in
 * the same set, written by a watcher coroutine that selects on the
 * context's done channel.
 *
 * getaddrinfo/getnameinfo run in co_blocking, in a coroutine of their own
 * that the caller waits for with its deadline (and gives up on at the
 * deadline; the call finishes and cleans up alone): for the whole lookup
 * without c-ares, and for a name that c-ares cannot find when
 * /etc/nsswitch.conf names sources other than files and dns (mdns,
 * myhostname, ...), which only the C library's NSS reaches -- unless the
 * program named its servers (co_resolver_configure): NSS's dns would ask
 * the system's.
 */
#include "base/base.h"
#include "net/net.h"

#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef COLONY_HAVE_CARES
#include <ares.h>
#endif

/* ---- literals ----------------------------------------------------------- */

socklen_t co__net_salen(const struct sockaddr_storage *ss) {
    return ss->ss_family == AF_INET    ? (socklen_t)sizeof(struct sockaddr_in)
           : ss->ss_family == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6)
                                       : 0;
}

bool co__net_literal(const char *host, struct sockaddr_storage *ss, socklen_t *len) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        *len = sizeof *v4;
        return true;
    }
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    char buf[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    const char *pct = strchr(host, '%');
    size_t hl = pct ? (size_t)(pct - host) : strlen(host);
    if (hl >= INET6_ADDRSTRLEN)
        return false;
    memcpy(buf, host, hl);
    buf[hl] = 0;
    if (inet_pton(AF_INET6, buf, &v6->sin6_addr) != 1)
        return false;
    if (pct) { /* a zone: an interface name or number */
        const char *z = pct + 1;
        char *end;
        unsigned long n = strtoul(z, &end, 10);
        if (*z && !*end && n <= UINT32_MAX)
            v6->sin6_scope_id = (uint32_t)n;
        else if (!*z || !(v6->sin6_scope_id = if_nametoindex(z)))
            return false;
    }
    v6->sin6_family = AF_INET6;
    *len = sizeof *v6;
    return true;
}

/* A name a resolver may be asked for: 1..253 characters of letters,
 * digits, '-', '_', '.', labels of 1..63 (a trailing dot allowed). */
static bool name_ok(const char *h) {
    size_t n = strlen(h), label = 0;
    if (n == 0 || n > 254 || (n == 254 && h[253] != '.'))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (c == '.') {
            if (label == 0)
                return false;
            label = 0;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_') {
            if (++label > 63)
                return false;
        } else {
            return false;
        }
    }
    return true;
}

/* ---- /etc/hosts, cached ---------------------------------------------------- */

/* As Go's net: the file is parsed once and read again when its mtime or
 * size changed, looked at no more often than every 5 s. */
#define HOSTS_PATH "/etc/hosts"
#define HOSTS_RECHECK_NS (5 * 1000000000LL)

typedef struct hent {
    char name[256]; /* lowercased, no trailing dot */
    struct sockaddr_storage ss;
} hent_t;

/* hosts_mu protects hosts_tab, hosts_n, hosts_mtime and hosts_size. */
static co_rwmutex_t hosts_mu = CO_RWMUTEX_INIT;
static hent_t *hosts_tab;
static int hosts_n;
static struct timespec hosts_mtime;
static off_t hosts_size = -1;
/* atomic (relaxed): when to stat the file next; a stale value costs one
 * more look under the write lock, which decides. */
static int64_t hosts_next;

static void lower_copy(char *dst, const char *src, size_t cap) {
    size_t i = 0;
    for (; src[i] && i + 1 < cap; i++)
        dst[i] = (char)(src[i] >= 'A' && src[i] <= 'Z' ? src[i] + 32 : src[i]);
    if (i > 0 && dst[i - 1] == '.')
        i--;
    dst[i] = 0;
}

/* hosts_mu held for writing. */
static void hosts_parse(FILE *f) {
    free(hosts_tab);
    hosts_tab = NULL;
    hosts_n = 0;
    int cap = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char *sv, *tok = strtok_r(line, " \t\r\n", &sv);
        struct sockaddr_storage ss;
        socklen_t len;
        if (!tok || !co__net_literal(tok, &ss, &len))
            continue;
        for (tok = strtok_r(NULL, " \t\r\n", &sv); tok; tok = strtok_r(NULL, " \t\r\n", &sv)) {
            if (hosts_n == cap) {
                int ncap = cap ? cap * 2 : 16;
                hent_t *t = realloc(hosts_tab, sizeof *t * (size_t)ncap);
                if (!t)
                    return;
                hosts_tab = t;
                cap = ncap;
            }
            lower_copy(hosts_tab[hosts_n].name, tok, sizeof hosts_tab[0].name);
            hosts_tab[hosts_n++].ss = ss;
        }
    }
}

static void hosts_refresh(void) {
    int64_t now = co_now();
    if (now < __atomic_load_n(&hosts_next, __ATOMIC_RELAXED))
        return;
    co_rwmutex_lock(&hosts_mu);
    if (now >= __atomic_load_n(&hosts_next, __ATOMIC_RELAXED)) {
        __atomic_store_n(&hosts_next, now + HOSTS_RECHECK_NS, __ATOMIC_RELAXED);
        struct stat st;
        if (stat(HOSTS_PATH, &st) != 0) {
            hosts_parse(NULL);
            hosts_size = -1;
        } else if (st.st_size != hosts_size || st.st_mtim.tv_sec != hosts_mtime.tv_sec ||
                   st.st_mtim.tv_nsec != hosts_mtime.tv_nsec) {
            FILE *f = fopen(HOSTS_PATH, "re");
            hosts_parse(f);
            if (f)
                fclose(f);
            hosts_size = st.st_size;
            hosts_mtime = st.st_mtim;
        }
    }
    co_rwmutex_unlock(&hosts_mu);
}

/* host's addresses in /etc/hosts, in the file's order: how many (0: none). */
static int hosts_lookup(const char *host, struct sockaddr_storage *out, int max) {
    hosts_refresh();
    char key[256];
    lower_copy(key, host, sizeof key);
    int n = 0;
    co_rwmutex_rlock(&hosts_mu);
    for (int i = 0; i < hosts_n && n < max; i++) {
        if (strcmp(hosts_tab[i].name, key) != 0)
            continue;
        bool dup = false;
        for (int k = 0; k < n && !dup; k++)
            dup = memcmp(&out[k], &hosts_tab[i].ss, sizeof out[k]) == 0;
        if (!dup)
            out[n++] = hosts_tab[i].ss;
    }
    co_rwmutex_runlock(&hosts_mu);
    return n;
}

/* The first name /etc/hosts gives the address sa: true if it has one. */
static bool hosts_reverse(const struct sockaddr *sa, char *name, size_t cap) {
    hosts_refresh();
    bool found = false;
    co_rwmutex_rlock(&hosts_mu);
    for (int i = 0; i < hosts_n && !found; i++) {
        const struct sockaddr_storage *e = &hosts_tab[i].ss;
        if (e->ss_family != sa->sa_family)
            continue;
        if (sa->sa_family == AF_INET)
            found = ((const struct sockaddr_in *)e)->sin_addr.s_addr ==
                    ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
        else
            found = memcmp(&((const struct sockaddr_in6 *)e)->sin6_addr,
                           &((const struct sockaddr_in6 *)sa)->sin6_addr, 16) == 0;
        if (found)
            snprintf(name, cap, "%s", hosts_tab[i].name);
    }
    co_rwmutex_runlock(&hosts_mu);
    return found;
}

/* ---- the blocking fallback: getaddrinfo in co_blocking ------------------- */

/* One lookup, shared by the caller and the coroutine that runs it; the
 * last of the two to let go frees it (refs, acq_rel: the other's writes
 * come before the free). The caller reads the result only after receiving
 * on done, which the runner sends on after writing it. */
typedef struct gai_job {
    int refs;
    bool reverse;
    char host[256];
    struct sockaddr_storage sa; /* reverse: the address */
    socklen_t salen;
    struct sockaddr_storage out[16];
    int n;  /* addresses found, or a negative code */
    char name[NI_MAXHOST];
    co_chan_t *done; /* capacity 1: the runner's send never waits */
} gai_job_t;

/* At most this many getaddrinfo calls at once: each holds an M. */
static co_sem_t gai_sem;
static co_once_t gai_once = CO_ONCE_INIT;
static void gai_sem_init(void *arg) {
    (void)arg;
    co_sem_init(&gai_sem, 32);
}

static void gai_unref(gai_job_t *j) {
    if (__atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        co_chan_free(j->done);
        free(j);
    }
}

static int gai_code(int e) {
    switch (e) {
    case EAI_NONAME:
#ifdef EAI_NODATA
    case EAI_NODATA:
#endif
#ifdef EAI_ADDRFAMILY
    case EAI_ADDRFAMILY:
#endif
        return CO_ENOTFOUND;
    case EAI_MEMORY: return CO_ENOMEM;
    case EAI_AGAIN:
    case EAI_FAIL: return CO_EDNS;
    case EAI_SYSTEM: return errno ? -errno : CO_EDNS;
    default: return CO_EDNS;
    }
}

static void gai_call(void *arg) {
    gai_job_t *j = arg;
    if (j->reverse) {
        int e = getnameinfo((struct sockaddr *)&j->sa, j->salen, j->name, sizeof j->name, NULL, 0,
                            NI_NAMEREQD);
        j->n = e ? gai_code(e) : 1;
        return;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int e = getaddrinfo(j->host, NULL, &hints, &res);
    if (e) {
        j->n = gai_code(e);
        return;
    }
    j->n = 0;
    for (struct addrinfo *a = res; a && j->n < 16; a = a->ai_next) {
        if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) ||
            a->ai_addrlen > sizeof j->out[0])
            continue;
        memcpy(&j->out[j->n++], a->ai_addr, a->ai_addrlen);
    }
    freeaddrinfo(res);
    if (j->n == 0)
        j->n = CO_ENOTFOUND;
}

static void gai_runner(void *arg) {
    gai_job_t *j = arg;
    co_sem_acquire(&gai_sem, 1, CO_FOREVER);
    co_blocking(gai_call, j);
    co_sem_release(&gai_sem, 1);
    int one = 1;
    co_chan_send(j->done, &one, CO_FOREVER);
    gai_unref(j);
}

/* Run j (refs 1, the caller's) and wait for it with the deadline and ctx.
 * 0: j->n and j->out/name are the answer. Gives j up in every case. */
static int gai_run(gai_job_t *j, co_ctx_t *ctx, int64_t deadline) {
    co_once(&gai_once, gai_sem_init, NULL);
    int rc = co_chan_new(&j->done, sizeof(int), 1);
    if (rc < 0) {
        free(j);
        return rc;
    }
    j->refs = 2;
    if ((rc = co_go(gai_runner, j)) < 0) {
        co_chan_free(j->done);
        free(j);
        return rc;
    }
    co_case_t cs[2] = {{.ch = j->done, .op = CO_RECV}, {.ch = co_ctx_done(ctx), .op = CO_RECV}};
    int i = co_select(cs, 2, deadline);
    if (i == 0)
        return 0;
    gai_unref(j);
    return i == 1 ? co_ctx_err(ctx) : i;
}

static int gai_lookup(co_ctx_t *ctx, const char *host, struct sockaddr_storage *out, int max,
                      int64_t deadline) {
    gai_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return CO_ENOMEM;
    strcpy(j->host, host); /* name_ok: at most 254 characters */
    int rc = gai_run(j, ctx, deadline);
    if (rc < 0)
        return rc;
    int n = j->n;
    for (int i = 0; i < n && i < max; i++)
        out[i] = j->out[i];
    gai_unref(j);
    return n < 0 ? n : (n < max ? n : max);
}

static int gai_reverse(co_ctx_t *ctx, const struct sockaddr *sa, socklen_t len, char *name,
                       size_t cap, int64_t deadline) {
    gai_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return CO_ENOMEM;
    j->reverse = true;
    memcpy(&j->sa, sa, len);
    j->salen = len;
    int rc = gai_run(j, ctx, deadline);
    if (rc < 0)
        return rc;
    rc = j->n < 0 ? j->n : 0;
    if (rc == 0)
        snprintf(name, cap, "%s", j->name);
    gai_unref(j);
    return rc;
}

/* ---- c-ares on the netpoller --------------------------------------------- */

#ifdef COLONY_HAVE_CARES

/* A channel and the epoll set its sockets are in. Used by one lookup at a
 * time (taken off the free list). */
typedef struct rchan {
    ares_channel ch;
    int epfd;
    int evfd; /* in epfd: a context's cancellation */
    uint64_t gen;
    bool own_servers; /* made with co_resolver_configure's servers: no NSS fallback */
    struct rchan *next;
} rchan_t;

/* rs_mu protects rs_free, rs_nfree, rs_gen and rs_conf's strings. */
static co_mutex_t rs_mu = CO_MUTEX_INIT;
static rchan_t *rs_free;
static int rs_nfree;
static uint64_t rs_gen;
static struct {
    bool set;
    char *servers, *search;
    int ndots, attempts;
    int64_t timeout_ns;
} rs_conf;
static co_once_t rs_once = CO_ONCE_INIT;
static int rs_init_rc;
/* Whether NSS has hosts sources beyond files and dns (set once in
 * rs_init, read after co_once). */
static bool rs_nss_other;

static void rs_init(void *arg) {
    (void)arg;
    rs_init_rc = ares_library_init(ARES_LIB_INIT_ALL) == ARES_SUCCESS ? 0 : CO_ENOMEM;
    FILE *f = fopen("/etc/nsswitch.conf", "re");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "hosts:", 6) != 0)
            continue;
        for (char *sv, *t = strtok_r(line + 6, " \t\n", &sv); t; t = strtok_r(NULL, " \t\n", &sv))
            if (t[0] != '[' && strcmp(t, "files") != 0 && strcmp(t, "dns") != 0)
                rs_nss_other = true;
    }
    fclose(f);
}

static void sock_state(void *data, ares_socket_t fd, int readable, int writable) {
    rchan_t *rc = data;
    struct epoll_event ev = {.events = (readable ? EPOLLIN : 0) | (writable ? EPOLLOUT : 0),
                             .data.fd = fd};
    if (!readable && !writable) {
        epoll_ctl(rc->epfd, EPOLL_CTL_DEL, fd, NULL);
        return;
    }
    if (epoll_ctl(rc->epfd, EPOLL_CTL_MOD, fd, &ev) < 0 && errno == ENOENT)
        epoll_ctl(rc->epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void rchan_free(rchan_t *rc) {
    if (!rc)
        return;
    if (rc->ch)
        ares_destroy(rc->ch);
    if (rc->epfd >= 0)
        co_close(rc->epfd);
    if (rc->evfd >= 0)
        close(rc->evfd);
    free(rc);
}

static int ares_code(int st) {
    switch (st) {
    case ARES_SUCCESS: return 0;
    case ARES_ENODATA:
    case ARES_ENOTFOUND:
    case ARES_EBADNAME: return CO_ENOTFOUND;
    case ARES_ETIMEOUT: return CO_ETIMEDOUT;
    case ARES_ENOMEM: return CO_ENOMEM;
    case ARES_ECANCELLED:
    case ARES_EDESTRUCTION: return CO_ECANCELED;
    default: return CO_EDNS;
    }
}

/* A channel per the configuration of generation gen (rs_mu held: the
 * strings of rs_conf). */
static int rchan_new(rchan_t **out, uint64_t gen) {
    rchan_t *rc = calloc(1, sizeof *rc);
    if (!rc)
        return CO_ENOMEM;
    rc->epfd = rc->evfd = -1;
    rc->gen = gen;
    rc->own_servers = rs_conf.set && rs_conf.servers;
    rc->epfd = epoll_create1(EPOLL_CLOEXEC);
    rc->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int err = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = -1};
    if (rc->epfd < 0 || rc->evfd < 0 || epoll_ctl(rc->epfd, EPOLL_CTL_ADD, rc->evfd, &ev) < 0) {
        err = -errno;
        goto fail;
    }
    struct ares_options o = {0};
    /* STAYOPEN: the channel is reused, and so are its sockets */
    int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_LOOKUPS | ARES_OPT_FLAGS;
    o.flags = ARES_FLAG_STAYOPEN;
    o.sock_state_cb = sock_state;
    o.sock_state_cb_data = rc;
    o.lookups = (char *)"b"; /* DNS: /etc/hosts is ours (hosts_lookup) */
    char *doms[8], *sbuf = NULL;
    if (rs_conf.set && rs_conf.search) {
        sbuf = strdup(rs_conf.search);
        if (!sbuf) {
            err = CO_ENOMEM;
            goto fail;
        }
        int n = 0;
        for (char *sv, *t = strtok_r(sbuf, " \t,", &sv); t && n < 8; t = strtok_r(NULL, " \t,", &sv))
            doms[n++] = t;
        o.domains = doms;
        o.ndomains = n;
        mask |= ARES_OPT_DOMAINS;
    }
    if (rs_conf.set && rs_conf.ndots > 0) {
        o.ndots = rs_conf.ndots;
        mask |= ARES_OPT_NDOTS;
    }
    if (rs_conf.set && rs_conf.timeout_ns > 0) {
        int64_t ms = (rs_conf.timeout_ns + 999999) / 1000000;
        o.timeout = ms > INT32_MAX ? INT32_MAX : (int)ms;
        mask |= ARES_OPT_TIMEOUTMS;
    }
    if (rs_conf.set && rs_conf.attempts > 0) {
        o.tries = rs_conf.attempts;
        mask |= ARES_OPT_TRIES;
    }
    int st = ares_init_options(&rc->ch, &o, mask);
    free(sbuf);
    if (st != ARES_SUCCESS) {
        rc->ch = NULL;
        err = st == ARES_ENOMEM ? CO_ENOMEM : CO_EDNS;
        goto fail;
    }
    if (rs_conf.set && rs_conf.servers &&
        ares_set_servers_ports_csv(rc->ch, rs_conf.servers) != ARES_SUCCESS) {
        err = CO_EINVAL;
        goto fail;
    }
    *out = rc;
    return 0;
fail:
    rchan_free(rc);
    return err;
}

static int rchan_take(rchan_t **out) {
    co_once(&rs_once, rs_init, NULL);
    if (rs_init_rc < 0)
        return rs_init_rc;
    rchan_t *stale = NULL;
    co_mutex_lock(&rs_mu);
    rchan_t *rc = rs_free;
    if (rc) {
        rs_free = rc->next;
        rs_nfree--;
        if (rc->gen != rs_gen) {
            stale = rc;
            rc = NULL;
        }
    }
    int err = 0;
    if (!rc)
        err = rchan_new(&rc, rs_gen);
    co_mutex_unlock(&rs_mu);
    rchan_free(stale);
    *out = rc;
    return err;
}

static void rchan_give(rchan_t *rc) {
    co_mutex_lock(&rs_mu);
    bool keep = rc->gen == rs_gen && rs_nfree < 64;
    if (keep) {
        rc->next = rs_free;
        rs_free = rc;
        rs_nfree++;
    }
    co_mutex_unlock(&rs_mu);
    if (!keep)
        rchan_free(rc);
}

int co_resolver_configure(const co_resolver_conf_t *conf) {
    co_once(&rs_once, rs_init, NULL);
    char *sv = NULL, *se = NULL;
    if (conf) {
        if (conf->ndots < 0 || conf->attempts < 0 || conf->timeout_ns < 0)
            return CO_EINVAL;
        if ((conf->servers && !(sv = strdup(conf->servers))) ||
            (conf->search && !(se = strdup(conf->search)))) {
            free(sv);
            return CO_ENOMEM;
        }
    }
    co_mutex_lock(&rs_mu);
    __typeof__(rs_conf) old = rs_conf;
    rs_conf.set = conf != NULL;
    rs_conf.servers = sv;
    rs_conf.search = se;
    rs_conf.ndots = conf ? conf->ndots : 0;
    rs_conf.attempts = conf ? conf->attempts : 0;
    rs_conf.timeout_ns = conf ? conf->timeout_ns : 0;
    rs_gen++;
    /* check the servers now, so that a bad string is an error here and
     * the configuration in force stays (nobody saw the new one: both
     * under rs_mu) */
    rchan_t *probe = NULL;
    int rc = rchan_new(&probe, rs_gen);
    if (rc != 0) {
        rs_conf = old;
        rs_gen--;
        old.servers = sv;
        old.search = se;
    }
    co_mutex_unlock(&rs_mu);
    free(old.servers);
    free(old.search);
    if (rc == 0)
        rchan_give(probe);
    return rc;
}

/* A watcher of ctx: writes evfd when ctx is canceled, or returns when
 * stop closes. */
typedef struct watch {
    co_ctx_t *ctx;
    int evfd;
    co_chan_t *stop;
    co_waitgroup_t wg;
} watch_t;

static void watch_fn(void *arg) {
    watch_t *w = arg;
    co_case_t cs[2] = {{.ch = co_ctx_done(w->ctx), .op = CO_RECV}, {.ch = w->stop, .op = CO_RECV}};
    if (co_select(cs, 2, CO_FOREVER) == 0) {
        uint64_t one = 1;
        (void)!write(w->evfd, &one, sizeof one);
    }
    co_waitgroup_done(&w->wg);
}

/* The result of one c-ares query, written by its callback. */
typedef struct qres {
    bool done;
    int status;
    struct sockaddr_storage *out;
    int max, n;
    char *name;
    size_t cap;
} qres_t;

static void addr_cb(void *arg, int status, int timeouts, struct ares_addrinfo *ai) {
    (void)timeouts;
    qres_t *q = arg;
    q->done = true;
    q->status = status;
    if (status == ARES_SUCCESS && ai) {
        for (struct ares_addrinfo_node *nd = ai->nodes; nd && q->n < q->max; nd = nd->ai_next) {
            if ((nd->ai_family != AF_INET && nd->ai_family != AF_INET6) ||
                nd->ai_addrlen > sizeof q->out[0])
                continue;
            bool dup = false;
            for (int i = 0; i < q->n && !dup; i++)
                dup = memcmp(&q->out[i], nd->ai_addr, nd->ai_addrlen) == 0;
            if (!dup) {
                memset(&q->out[q->n], 0, sizeof q->out[0]);
                memcpy(&q->out[q->n++], nd->ai_addr, nd->ai_addrlen);
            }
        }
        if (q->n == 0)
            q->status = ARES_ENODATA;
    }
    if (ai)
        ares_freeaddrinfo(ai);
}

static void name_cb(void *arg, int status, int timeouts, char *node, char *service) {
    (void)timeouts;
    (void)service;
    qres_t *q = arg;
    q->done = true;
    q->status = status;
    if (status == ARES_SUCCESS && node)
        snprintf(q->name, q->cap, "%s", node);
    else if (status == ARES_SUCCESS)
        q->status = ARES_ENOTFOUND;
}

/* Drive rc until q is done, the deadline passes or ctx is canceled (the
 * query is then canceled: c-ares calls back with ARES_ECANCELLED). 0 or
 * the code that ended the wait. */
static int drive(rchan_t *rc, qres_t *q, co_ctx_t *ctx, int64_t deadline) {
    watch_t w = {.ctx = ctx, .evfd = rc->evfd};
    bool watching = false;
    int err = 0;
    if (!q->done && ctx && co_ctx_done(ctx)) {
        if ((err = co_chan_new(&w.stop, 1, 0)) < 0)
            goto out;
        co_waitgroup_add(&w.wg, 1);
        if ((err = co_go(watch_fn, &w)) < 0) {
            co_waitgroup_done(&w.wg);
            co_chan_free(w.stop);
            goto out;
        }
        watching = true;
    }
    while (!q->done) {
        if (ctx && (err = co_ctx_err(ctx)) < 0)
            break;
        struct timeval tv, *tvp = ares_timeout(rc->ch, NULL, &tv);
        int64_t wake = deadline;
        if (tvp) {
            int64_t t = co_now() + (int64_t)tvp->tv_sec * 1000000000 + (int64_t)tvp->tv_usec * 1000;
            if (deadline == CO_FOREVER || t < deadline)
                wake = t;
        }
        int r = co_wait_fd(rc->epfd, CO_READABLE, wake);
        if (r == CO_ETIMEDOUT) {
            if (deadline != CO_FOREVER && co_now() >= deadline) {
                err = CO_ETIMEDOUT;
                break;
            }
            ares_process_fd(rc->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD); /* its timeouts */
            continue;
        }
        if (r < 0) {
            err = r;
            break;
        }
        struct epoll_event evs[8];
        int n = epoll_wait(rc->epfd, evs, 8, 0);
        for (int i = 0; i < n && !q->done; i++) {
            if (evs[i].data.fd < 0)
                continue; /* the eventfd: co_ctx_err says, at the loop's top */
            int fd = evs[i].data.fd;
            ares_process_fd(rc->ch, (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) ? fd : ARES_SOCKET_BAD,
                            (evs[i].events & EPOLLOUT) ? fd : ARES_SOCKET_BAD);
        }
        if (n == 0)
            ares_process_fd(rc->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    }
out:
    if (!q->done)
        ares_cancel(rc->ch);
    if (watching) {
        co_chan_close(w.stop);
        co_waitgroup_wait(&w.wg);
        co_chan_free(w.stop);
        uint64_t v;
        (void)!read(rc->evfd, &v, sizeof v); /* a cancellation's count */
    }
    return err;
}

static int cares_lookup(co_ctx_t *ctx, const char *host, struct sockaddr_storage *out, int max,
                        int64_t deadline) {
    rchan_t *rc;
    int err = rchan_take(&rc);
    if (err < 0)
        return err;
    qres_t q = {.out = out, .max = max};
    struct ares_addrinfo_hints hints = {.ai_family = AF_UNSPEC};
    ares_getaddrinfo(rc->ch, host, NULL, &hints, addr_cb, &q);
    err = drive(rc, &q, ctx, deadline);
    /* the C library's NSS only for the system's own configuration: its
     * dns source would ask /etc/resolv.conf's servers, not the ones the
     * program configured */
    bool nss = rs_nss_other && !rc->own_servers;
    rchan_give(rc);
    if (err < 0)
        return err;
    err = ares_code(q.status);
    if (err == CO_ENOTFOUND && nss)
        return gai_lookup(ctx, host, out, max, deadline);
    return err < 0 ? err : q.n;
}

static int cares_reverse(co_ctx_t *ctx, const struct sockaddr *sa, socklen_t len, char *name,
                         size_t cap, int64_t deadline) {
    rchan_t *rc;
    int err = rchan_take(&rc);
    if (err < 0)
        return err;
    qres_t q = {.name = name, .cap = cap};
    ares_getnameinfo(rc->ch, sa, len, ARES_NI_LOOKUPHOST | ARES_NI_NAMEREQD, name_cb, &q);
    err = drive(rc, &q, ctx, deadline);
    bool nss = rs_nss_other && !rc->own_servers; /* as cares_lookup */
    rchan_give(rc);
    if (err < 0)
        return err;
    err = ares_code(q.status);
    if (err == CO_ENOTFOUND && nss)
        return gai_reverse(ctx, sa, len, name, cap, deadline);
    return err;
}

#else /* !COLONY_HAVE_CARES */

int co_resolver_configure(const co_resolver_conf_t *conf) {
    (void)conf;
    return -ENOTSUP;
}

#endif

/* ---- the calls ----------------------------------------------------------- */

int co_lookup_host(co_ctx_t *ctx, const char *host, struct sockaddr_storage *out, int max,
                   int64_t deadline) {
    if (!host || !out || max <= 0)
        return CO_EINVAL;
    int err;
    if (ctx && (err = co_ctx_err(ctx)) < 0)
        return err;
    socklen_t len;
    if (co__net_literal(host, &out[0], &len))
        return 1;
    if (!name_ok(host))
        return CO_ENOTFOUND;
    int n = hosts_lookup(host, out, max);
    if (n > 0)
        return n;
#ifdef COLONY_HAVE_CARES
    return cares_lookup(ctx, host, out, max, deadline);
#else
    return gai_lookup(ctx, host, out, max, deadline);
#endif
}

int co_lookup_addr(co_ctx_t *ctx, const struct sockaddr *addr, socklen_t addrlen, char *name,
                   size_t cap, int64_t deadline) {
    if (!addr || !name || cap == 0)
        return CO_EINVAL;
    if (!((addr->sa_family == AF_INET && addrlen >= sizeof(struct sockaddr_in)) ||
          (addr->sa_family == AF_INET6 && addrlen >= sizeof(struct sockaddr_in6))))
        return CO_EADDR;
    /* the address's own size: a longer addrlen (sizeof(struct
     * sockaddr_storage), a common idiom) is c-ares's ENOTIMP, and the
     * fallback copies only that much */
    addrlen = addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    int err;
    if (ctx && (err = co_ctx_err(ctx)) < 0)
        return err;
    name[0] = 0;
    if (hosts_reverse(addr, name, cap))
        return 0;
#ifdef COLONY_HAVE_CARES
    return cares_reverse(ctx, addr, addrlen, name, cap, deadline);
#else
    return gai_reverse(ctx, addr, addrlen, name, cap, deadline);
#endif
}
