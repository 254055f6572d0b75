/*
 * A concurrent map, as Go's sync.Map: byte-string keys (copied in), void *
 * values (the caller's), lock-free reads.
 *
 * Layout: a table of buckets, each a singly linked chain of nodes. A node
 * holds its key and an atomic value; a Store on a present key swaps the
 * value in place, so the common read finds a node that never changes.
 * Writers (every call that may add, remove or change) serialise on the
 * map's co_mutex (a coroutine parks on it, a thread sleeps). Readers take
 * no lock: they announce themselves in the epoch scheme below, walk the
 * chain with acquire loads and leave.
 *
 * What a reader can hold is never freed under it: an unlinked node and a
 * table replaced by a resize are retired onto the map's limbo list with
 * the epoch of their retirement and freed two epochs later (Fraser's
 * epoch-based reclamation): the global epoch advances only when every
 * thread inside a read section has announced the current one, so a node
 * retired in epoch e is freed once every reader that could have seen it
 * has left. A resize copies the nodes into the new table rather than
 * relinking them, so that a reader still walking the old table never
 * follows a moved link into another chain.
 *
 * Range calls back with no lock held and outside any read section (the
 * callback may park, and may call the map): it walks the table current at
 * its start while the map's range count keeps everything retired
 * meanwhile alive. A key is visited at most once (nodes never move within
 * a table; a key re-added lands at its chain's head, already passed), with
 * the value its node held when visited; a key stored after the start may
 * be missed, as Go's Range promises no snapshot. A resize during a Range
 * leaves it walking the old table's nodes, whose values stay those of the
 * resize: each still a mapping the key had during the call, as Go allows.
 */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- epochs --------------------------------------------------------------- */

/* One record per thread that ever read a map; reused after its thread
 * exits, never freed (their number is the peak of concurrent threads). */
typedef struct erec {
    /* 0 outside a read section; else (epoch << 1) | 1. Written by its own
     * thread only (enter: a store and a seq_cst fence, which order it
     * before the section's loads and pair with try_advance's seq_cst loads;
     * exit: release store, so the section's reads happen before an
     * advancer that sees 0). */
    uint64_t state;
    int used;          /* 1 while a thread owns it; CAS 0->1 claims, release store frees */
    struct erec *next; /* immutable once published on erecs */
} erec_t;

static erec_t *erecs;    /* list head; CAS-pushed with release, read with acquire */
static uint64_t gepoch = 2; /* the global epoch; seq_cst loads and CAS */
static pthread_key_t erec_key;
static pthread_once_t erec_once = PTHREAD_ONCE_INIT;
static __thread erec_t *my_erec __attribute__((tls_model("initial-exec")));

static void erec_release(void *p) {
    erec_t *r = p;
    __atomic_store_n(&r->state, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&r->used, 0, __ATOMIC_RELEASE); /* pairs with the claiming CAS */
}
static void erec_key_init(void) {
    if (pthread_key_create(&erec_key, erec_release) != 0) co__fatal("co_map: pthread_key_create failed");
}

/* Under TSan, the coroutines that use a thread's record one after another
 * would look like racing on it (and on the thread-local that finds it):
 * this function's accesses are the thread's own, and each read section
 * acquires and releases the record for TSan (EREC_ACQ/EREC_REL), which is
 * what running one after another on a thread means. */
#ifdef CO_TSAN
#define EREC_ACQ(r) __tsan_acquire(r)
#define EREC_REL(r) __tsan_release(r)
#else
#define EREC_ACQ(r) ((void)0)
#define EREC_REL(r) ((void)0)
#endif
CO_THREAD_STATE static erec_t *erec_get(void) {
    erec_t *r = my_erec;
    if (__builtin_expect(r != NULL, 1)) return r;
    pthread_once(&erec_once, erec_key_init);
    for (r = __atomic_load_n(&erecs, __ATOMIC_ACQUIRE); r; r = r->next) {
        int z = 0;
        if (__atomic_load_n(&r->used, __ATOMIC_RELAXED) == 0 &&
            __atomic_compare_exchange_n(&r->used, &z, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
    }
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return NULL; /* the caller reads under the lock instead */
        r->used = 1;
        r->next = __atomic_load_n(&erecs, __ATOMIC_RELAXED);
        while (!__atomic_compare_exchange_n(&erecs, &r->next, r, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
        }
    }
    pthread_setspecific(erec_key, r);
    my_erec = r;
    return r;
}

/* Nothing between enter and exit may switch coroutines: the record is the
 * thread's, and a coroutine that moved would leave another's section. */
static inline void epoch_enter(erec_t *r) {
    EREC_ACQ(r);
    uint64_t e = __atomic_load_n(&gepoch, __ATOMIC_SEQ_CST);
    /* relaxed store + seq_cst fence (one barrier, where a seq_cst store
     * and a fence would be two): the announcement is ordered before the
     * section's loads; pairs with the fence in retire_node and with the
     * seq_cst loads in try_advance. */
    __atomic_store_n(&r->state, (e << 1) | 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void epoch_exit(erec_t *r) {
    __atomic_store_n(&r->state, 0, __ATOMIC_RELEASE);
    EREC_REL(r);
}

/* Advance the global epoch if every reader inside a section has announced
 * the current one; returns the epoch after the attempt. */
static uint64_t try_advance(void) {
    uint64_t e = __atomic_load_n(&gepoch, __ATOMIC_SEQ_CST);
    for (erec_t *r = __atomic_load_n(&erecs, __ATOMIC_ACQUIRE); r; r = r->next) {
        uint64_t s = __atomic_load_n(&r->state, __ATOMIC_SEQ_CST);
        if ((s & 1) && (s >> 1) != e) return e;
    }
    __atomic_compare_exchange_n(&gepoch, &e, e + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&gepoch, __ATOMIC_SEQ_CST);
}

/* ---- the map -------------------------------------------------------------- */

typedef struct node {
    struct node *next;  /* chain link: written under the map lock (release), read by readers (acquire) */
    void *val;          /* swapped under the map lock (release), read by anyone (acquire) */
    uint64_t hash;      /* immutable */
    size_t len;         /* immutable */
    struct node *limbo; /* the map's limbo list; under the map lock */
    uint64_t retired;   /* epoch of retirement; under the map lock */
    int dead;           /* 1 once unlinked (read by Range: relaxed, a hint only) */
    unsigned char key[];
} node_t;

typedef struct table {
    size_t mask;
    struct table *limbo; /* the map's retired tables; under the map lock */
    uint64_t retired;
    node_t *b[]; /* chain heads: written under the map lock (release), read acquire */
} table_t;

struct co_map {
    table_t *tab;         /* current table: replaced under lock (release), read acquire */
    co_mutex_t mu;        /* protects every write below and the chains' links */
    size_t count;         /* live keys; under mu (read relaxed by co_map_len) */
    node_t *limbo_nodes;  /* retired nodes, newest first; under mu */
    table_t *limbo_tabs;  /* retired tables; under mu */
    size_t nlimbo;        /* entries on both lists; under mu */
    int ranges;           /* Range calls walking a table; under mu */
};

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ (w * 0xc4ceb9fe1a85ec53ull)) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8, n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, s, n);
    h = (h ^ (w * 0xc4ceb9fe1a85ec53ull)) * 0x9fb21c651e98df25ull;
    h ^= h >> 32;
    return h;
}

static table_t *table_new(size_t nb) {
    table_t *t = calloc(1, sizeof *t + nb * sizeof(node_t *));
    if (t) t->mask = nb - 1;
    return t;
}

int co_map_new(co_map_t **out) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    co_map_t *m = calloc(1, sizeof *m);
    if (!m) return CO_ENOMEM;
    m->tab = table_new(16);
    if (!m->tab) {
        free(m);
        return CO_ENOMEM;
    }
    *out = m;
    return 0;
}

void co_map_free(co_map_t *m) {
    if (!m) return;
    table_t *t = m->tab;
    for (size_t i = 0; i <= t->mask; i++)
        for (node_t *n = t->b[i], *nx; n; n = nx) nx = n->next, free(n);
    free(t);
    for (node_t *n = m->limbo_nodes, *nx; n; n = nx) nx = n->limbo, free(n);
    for (table_t *x = m->limbo_tabs, *nx; x; x = nx) nx = x->limbo, free(x);
    free(m);
}

static inline node_t *chain_find(node_t *n, uint64_t h, const void *key, size_t len) {
    for (; n; n = __atomic_load_n(&n->next, __ATOMIC_ACQUIRE))
        if (n->hash == h && n->len == len && (len == 0 || memcmp(n->key, key, len) == 0)) return n;
    return NULL;
}

/* Free what no reader can still hold. Under mu. */
static void reclaim(co_map_t *m) {
    if (m->ranges) return;
    uint64_t e = try_advance();
    e = try_advance(); /* a second step frees last epoch's retirees when readers are quiet */
    node_t **pn = &m->limbo_nodes;
    while (*pn) {
        node_t *n = *pn;
        if (n->retired + 2 <= e) {
            *pn = n->limbo;
            free(n);
            m->nlimbo--;
        } else {
            pn = &n->limbo;
        }
    }
    table_t **pt = &m->limbo_tabs;
    while (*pt) {
        table_t *t = *pt;
        if (t->retired + 2 <= e) {
            *pt = t->limbo;
            free(t);
            m->nlimbo--;
        } else {
            pt = &t->limbo;
        }
    }
}

/* Under mu: a node or table unlinked from everything readers start from. */
static void retire_node(co_map_t *m, node_t *n, bool deleted) {
    if (deleted) __atomic_store_n(&n->dead, 1, __ATOMIC_RELAXED);
    /* seq_cst fence: the unlink above is ordered before the epoch read,
     * pairing with the fence in epoch_enter (a reader that announces a
     * later epoch cannot see the node). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    n->retired = __atomic_load_n(&gepoch, __ATOMIC_SEQ_CST);
    n->limbo = m->limbo_nodes;
    m->limbo_nodes = n;
    if (++m->nlimbo >= 64) reclaim(m);
}
static void retire_table(co_map_t *m, table_t *t) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* as in retire_node */
    t->retired = __atomic_load_n(&gepoch, __ATOMIC_SEQ_CST);
    t->limbo = m->limbo_tabs;
    m->limbo_tabs = t;
    m->nlimbo++;
}

/* Under mu: double the table once it holds more keys than buckets. The new
 * table gets copies; the old nodes and table retire. Out of memory: keep
 * the old table (longer chains, still correct). */
static void maybe_grow(co_map_t *m) {
    table_t *t = m->tab;
    if (2 * m->count <= t->mask + 1) return; /* load factor <= 1/2: chains of ~1 */
    size_t nb = (t->mask + 1) * 2;
    table_t *nt = table_new(nb);
    if (!nt) return;
    for (size_t i = 0; i <= t->mask; i++) {
        for (node_t *n = t->b[i]; n; n = n->next) {
            node_t *c = malloc(sizeof *c + n->len);
            if (!c) goto fail;
            memcpy(c, n, sizeof *c + n->len);
            c->val = __atomic_load_n(&n->val, __ATOMIC_RELAXED);
            size_t j = c->hash & nt->mask;
            c->next = nt->b[j];
            nt->b[j] = c;
        }
    }
    __atomic_store_n(&m->tab, nt, __ATOMIC_RELEASE); /* pairs with the readers' acquire load */
    for (size_t i = 0; i <= t->mask; i++)
        for (node_t *n = t->b[i], *nx; n; n = nx) nx = n->next, retire_node(m, n, false);
    retire_table(m, t);
    return;
fail:
    for (size_t i = 0; i < nb; i++)
        for (node_t *n = nt->b[i], *nx; n; n = nx) nx = n->next, free(n);
    free(nt);
}

bool co_map_load(co_map_t *m, const void *key, size_t len, void **value) {
    if (!m || (!key && len)) co__fatal("co_map_load(%p, %p, %zu): NULL map or key", (void *)m, key, len);
    uint64_t h = hash_bytes(key, len);
    erec_t *r = erec_get();
    void *v = NULL;
    node_t *n;
    if (__builtin_expect(r != NULL, 1)) {
        epoch_enter(r);
        table_t *t = __atomic_load_n(&m->tab, __ATOMIC_ACQUIRE);
        n = chain_find(__atomic_load_n(&t->b[h & t->mask], __ATOMIC_ACQUIRE), h, key, len);
        if (n) v = __atomic_load_n(&n->val, __ATOMIC_ACQUIRE);
        epoch_exit(r);
    } else { /* no record for this thread (out of memory): read under the lock */
        co_mutex_lock(&m->mu);
        n = chain_find(m->tab->b[h & m->tab->mask], h, key, len);
        if (n) v = n->val;
        co_mutex_unlock(&m->mu);
    }
    if (value) *value = n ? v : NULL;
    return n != NULL;
}

/* Under mu: the node for key in the current table, and where it hangs. */
static node_t *locked_find(co_map_t *m, uint64_t h, const void *key, size_t len, node_t ***where) {
    table_t *t = m->tab;
    node_t **p = &t->b[h & t->mask];
    for (; *p; p = &(*p)->next)
        if ((*p)->hash == h && (*p)->len == len && (len == 0 || memcmp((*p)->key, key, len) == 0)) break;
    if (where) *where = p;
    return *p;
}

/* Under mu: add a new key at its chain's head. */
static int locked_add(co_map_t *m, uint64_t h, const void *key, size_t len, void *value) {
    node_t *n = malloc(sizeof *n + len);
    if (!n) return CO_ENOMEM;
    n->hash = h;
    n->len = len;
    n->val = value;
    n->dead = 0;
    n->limbo = NULL;
    n->retired = 0;
    if (len) memcpy(n->key, key, len);
    table_t *t = m->tab;
    size_t i = h & t->mask;
    n->next = t->b[i];
    __atomic_store_n(&t->b[i], n, __ATOMIC_RELEASE); /* publishes the node's fields */
    m->count++;
    maybe_grow(m);
    return 0;
}

/* Under mu: unlink *where (its node) and retire it. */
static void locked_del(co_map_t *m, node_t **where) {
    node_t *n = *where;
    __atomic_store_n(where, n->next, __ATOMIC_RELEASE);
    m->count--;
    retire_node(m, n, true);
}

#define MAP_CHECK(call, m, key, len)                                                                \
    do {                                                                                            \
        if (!(m) || (!(key) && (len)))                                                              \
            co__fatal(call "(%p, %p, %zu): NULL map or key", (void *)(m), (const void *)(key), len); \
    } while (0)

int co_map_store(co_map_t *m, const void *key, size_t len, void *value) {
    if (!m || (!key && len)) return CO_EINVAL;
    uint64_t h = hash_bytes(key, len);
    int rc = 0;
    co_mutex_lock(&m->mu);
    node_t *n = locked_find(m, h, key, len, NULL);
    if (n)
        __atomic_store_n(&n->val, value, __ATOMIC_RELEASE); /* pairs with the readers' acquire */
    else
        rc = locked_add(m, h, key, len, value);
    co_mutex_unlock(&m->mu);
    return rc;
}

int co_map_load_or_store(co_map_t *m, const void *key, size_t len, void *value, void **actual) {
    if (!m || (!key && len)) return CO_EINVAL;
    void *v;
    if (co_map_load(m, key, len, &v)) { /* the common case of a present key takes no lock */
        if (actual) *actual = v;
        return 1;
    }
    uint64_t h = hash_bytes(key, len);
    int rc;
    co_mutex_lock(&m->mu);
    node_t *n = locked_find(m, h, key, len, NULL);
    if (n) {
        if (actual) *actual = n->val;
        rc = 1;
    } else {
        rc = locked_add(m, h, key, len, value);
        if (rc == 0 && actual) *actual = value;
    }
    co_mutex_unlock(&m->mu);
    return rc;
}

int co_map_swap(co_map_t *m, const void *key, size_t len, void *value, void **previous) {
    if (!m || (!key && len)) return CO_EINVAL;
    uint64_t h = hash_bytes(key, len);
    int rc;
    co_mutex_lock(&m->mu);
    node_t *n = locked_find(m, h, key, len, NULL);
    if (n) {
        void *old = __atomic_exchange_n(&n->val, value, __ATOMIC_ACQ_REL);
        if (previous) *previous = old;
        rc = 1;
    } else {
        rc = locked_add(m, h, key, len, value);
        if (rc == 0 && previous) *previous = NULL;
    }
    co_mutex_unlock(&m->mu);
    return rc;
}

bool co_map_load_and_delete(co_map_t *m, const void *key, size_t len, void **value) {
    MAP_CHECK("co_map_load_and_delete", m, key, len);
    uint64_t h = hash_bytes(key, len);
    node_t **where;
    co_mutex_lock(&m->mu);
    node_t *n = locked_find(m, h, key, len, &where);
    void *v = n ? n->val : NULL;
    if (n) locked_del(m, where);
    co_mutex_unlock(&m->mu);
    if (value) *value = v;
    return n != NULL;
}

bool co_map_delete(co_map_t *m, const void *key, size_t len) {
    MAP_CHECK("co_map_delete", m, key, len);
    return co_map_load_and_delete(m, key, len, NULL);
}

bool co_map_compare_and_swap(co_map_t *m, const void *key, size_t len, void *old, void *value) {
    MAP_CHECK("co_map_compare_and_swap", m, key, len);
    uint64_t h = hash_bytes(key, len);
    bool ok = false;
    co_mutex_lock(&m->mu);
    node_t *n = locked_find(m, h, key, len, NULL);
    if (n && n->val == old) {
        __atomic_store_n(&n->val, value, __ATOMIC_RELEASE);
        ok = true;
    }
    co_mutex_unlock(&m->mu);
    return ok;
}

bool co_map_compare_and_delete(co_map_t *m, const void *key, size_t len, void *old) {
    MAP_CHECK("co_map_compare_and_delete", m, key, len);
    uint64_t h = hash_bytes(key, len);
    bool ok = false;
    node_t **where;
    co_mutex_lock(&m->mu);
    node_t *n = locked_find(m, h, key, len, &where);
    if (n && n->val == old) {
        locked_del(m, where);
        ok = true;
    }
    co_mutex_unlock(&m->mu);
    return ok;
}

void co_map_range(co_map_t *m, bool (*fn)(const void *key, size_t len, void *value, void *arg), void *arg) {
    if (!m || !fn) co__fatal("co_map_range(%p, %p): NULL map or function", (void *)m, (void *)fn);
    co_mutex_lock(&m->mu);
    table_t *t = m->tab;
    m->ranges++; /* nothing retired from now on is freed until we are done */
    co_mutex_unlock(&m->mu);
    for (size_t i = 0; i <= t->mask; i++) {
        bool stop = false;
        for (node_t *n = __atomic_load_n(&t->b[i], __ATOMIC_ACQUIRE); n && !stop;
             n = __atomic_load_n(&n->next, __ATOMIC_ACQUIRE)) {
            if (__atomic_load_n(&n->dead, __ATOMIC_RELAXED)) continue;
            stop = !fn(n->key, n->len, __atomic_load_n(&n->val, __ATOMIC_ACQUIRE), arg);
        }
        if (stop) break;
    }
    co_mutex_lock(&m->mu);
    if (--m->ranges == 0 && m->nlimbo) reclaim(m);
    co_mutex_unlock(&m->mu);
}

size_t co_map_len(co_map_t *m) {
    if (!m) co__fatal("co_map_len(NULL): NULL map");
    co_mutex_lock(&m->mu);
    size_t n = m->count;
    co_mutex_unlock(&m->mu);
    return n;
}
