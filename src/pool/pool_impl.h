/*
 * The pool's private types: worker records, the idle-worker queues (a LIFO
 * stack, or a fixed ring when prealloc), the pool lock and the pool
 * itself. Only src/pool and the pool tests include this.
 *
 * An idle worker holds no coroutine and no stack: it is one co__pw_t (a few
 * words, with the time it went idle) in the idle queue. A coroutine exists
 * only while a worker has a task: the submitter that takes an idle record
 * (or creates one) queues it as a run-queue token, and a coroutine is made
 * for it when it runs (unless a finishing worker takes it over first); when
 * the task returns, the worker hands itself
 * straight to a blocked submitter's task if one waits, and otherwise puts its
 * record back in the idle queue and the coroutine exits, its stack returning
 * to the runtime's per-P cache.
 */
#ifndef COLONY_POOL_IMPL_H
#define COLONY_POOL_IMPL_H

#include "runtime/runtime.h"
#include "chan/chan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- worker records ----------------------------------------------------- */
typedef struct co__pw co__pw_t;
/* A record's run-queue token as the pool reads it: co__token_t's words,
 * with its owner link typed (asserted below). */
typedef struct co__pw_tok {
    void (*fn)(void *);   /* token.fn: the pool's worker entry, set once at creation */
    co__pw_t *pw_next;    /* token.owner_link: the record's link on the chute, the
                           * spare cache and the lists of records to retire or free */
    uint64_t fpenv;       /* token.fpenv: the runtime's */
} co__pw_tok_t;

struct co__pw {
    /* First: a record is its own run-queue token (co__spawn_token), so a
     * worker starts with no G made for it until one must run it. */
    union {
        co__token_t token; /* as the runtime takes it */
        co__pw_tok_t tok;  /* as the pool reads it */
    };
    struct co_pool *pool; /* immutable */
    /* The following are owned by whoever holds the record: the pool lock
     * while it is idle or cached, the worker coroutine while it is busy. */
    void (*fn)(void *);   /* the task (NULL in a function pool) */
    void *arg;
    int64_t last_used;    /* co_now() when it went idle; the queues keep it sorted */
    uint64_t gen;         /* the pool's release generation it was activated in */
};
_Static_assert(sizeof(co__pw_tok_t) == sizeof(co__token_t) &&
                   offsetof(co__pw_tok_t, fn) == offsetof(co__token_t, fn) &&
                   offsetof(co__pw_tok_t, pw_next) == offsetof(co__token_t, owner_link) &&
                   offsetof(co__pw_tok_t, fpenv) == offsetof(co__token_t, fpenv),
               "the pool's view of a token is the token");
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(co__pw_t) == 64,
               "a worker record is one cache line (submit.c allocates it aligned)");
#endif

/* ---- idle-worker queue --------------------------------------------------
 * stack (prealloc off): items[0..len) oldest first; insert/detach at the top
 *   (LIFO: the most recently used worker is reused first, the oldest ones
 *   sit at the bottom and are purged first), like ants' workerStack.
 * ring (prealloc on): `cap` fixed slots; insert at the tail, detach at the
 *   head (FIFO), like ants' loopQueue.
 * In both, last_used is non-decreasing from the oldest to the newest entry,
 * so the expired entries are a prefix found by binary search.
 * Not thread-safe: the pool lock protects it. */
typedef struct co__wq {
    co__pw_t **items;
    int cap;    /* slots allocated */
    int len;    /* entries */
    int head;   /* ring: slot of the oldest entry; stack: always 0 */
    bool ring;
} co__wq_t;

static inline int co__wq_init(co__wq_t *q, bool ring, int size) {
    memset(q, 0, sizeof *q);
    q->ring = ring;
    if (ring && size <= 0) return CO_EINVAL;
    if (size > 0) {
        q->items = (co__pw_t **)calloc((size_t)size, sizeof *q->items);
        if (!q->items) return CO_ENOMEM;
        q->cap = size;
    }
    return 0;
}
/* The ring's slot of the i-th entry from the oldest (0 <= i <= len <=
 * cap): in unsigned arithmetic, since head + i overflows an int once cap
 * passes INT_MAX / 2. */
static inline int co__wq_slot(const co__wq_t *q, int i) {
    return (int)(((unsigned)q->head + (unsigned)i) % (unsigned)q->cap);
}
static inline void co__wq_destroy(co__wq_t *q) {
    free(q->items);
    memset(q, 0, sizeof *q);
}
static inline int co__wq_len(const co__wq_t *q) { return q->len; }
static inline bool co__wq_empty(const co__wq_t *q) { return q->len == 0; }
/* i-th entry counting from the oldest. */
static inline co__pw_t *co__wq_at(const co__wq_t *q, int i) {
    return q->ring ? q->items[co__wq_slot(q, i)] : q->items[i];
}
static inline co__pw_t *co__wq_newest(const co__wq_t *q) {
    return q->len ? co__wq_at(q, q->len - 1) : NULL;
}
static inline co__pw_t *co__wq_oldest(const co__wq_t *q) { return q->len ? co__wq_at(q, 0) : NULL; }

/* Append w as the newest entry. 0; CO_EOVERLOAD when a ring is full;
 * CO_ENOMEM when a stack cannot grow. */
static inline int co__wq_insert(co__wq_t *q, co__pw_t *w) {
    if (q->ring) {
        if (q->len == q->cap) return CO_EOVERLOAD;
        q->items[co__wq_slot(q, q->len)] = w;
        q->len++;
        return 0;
    }
    if (q->len == q->cap) {
        /* doubling, up to INT_MAX entries (the pool's counts are ints) */
        if (q->cap == INT_MAX) return CO_ENOMEM;
        int ncap = q->cap == 0 ? 64 : q->cap > INT_MAX / 2 ? INT_MAX : q->cap * 2;
        co__pw_t **n = (co__pw_t **)realloc(q->items, (size_t)ncap * sizeof *n);
        if (!n) return CO_ENOMEM;
        q->items = n;
        q->cap = ncap;
    }
    q->items[q->len++] = w;
    return 0;
}

/* Take the entry to reuse: the newest of a stack, the oldest of a ring. */
static inline co__pw_t *co__wq_detach(co__wq_t *q) {
    if (q->len == 0) return NULL;
    if (q->ring) {
        co__pw_t *w = q->items[q->head];
        q->items[q->head] = NULL;
        q->head = co__wq_slot(q, 1);
        q->len--;
        return w;
    }
    return q->items[--q->len];
}

/* The entry co__wq_detach would take next, or NULL. */
static inline co__pw_t *co__wq_peek(const co__wq_t *q) {
    if (q->len == 0) return NULL;
    return q->ring ? q->items[q->head] : q->items[q->len - 1];
}

/* Index (from the oldest) of the newest entry with last_used <= cutoff, or -1
 * if none: a binary search over the sorted entries. */
static inline int co__wq_search(const co__wq_t *q, int64_t cutoff) {
    int lo = 0, hi = q->len - 1, found = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (co__wq_at(q, mid)->last_used <= cutoff) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

/* Remove the k oldest entries (0 <= k <= len) and return them linked
 * through tok.pw_next, oldest first. */
static inline co__pw_t *co__wq_take_oldest(co__wq_t *q, int k) {
    if (k <= 0) return NULL;
    co__pw_t *head = NULL, **tail = &head;
    for (int i = 0; i < k; i++) {
        co__pw_t *w = co__wq_at(q, i);
        *tail = w;
        tail = &w->tok.pw_next;
    }
    *tail = NULL;
    if (q->ring) {
        for (int i = 0; i < k; i++) q->items[co__wq_slot(q, i)] = NULL;
        q->head = co__wq_slot(q, k);
    } else {
        memmove(q->items, q->items + k, (size_t)(q->len - k) * sizeof *q->items);
    }
    q->len -= k;
    return head;
}

/* Remove every entry with last_used <= cutoff (the expired prefix) and
 * return them linked through tok.pw_next, oldest first; *n gets their number. */
static inline co__pw_t *co__wq_refresh(co__wq_t *q, int64_t cutoff, int *n) {
    int k = co__wq_search(q, cutoff) + 1;
    *n = k;
    return co__wq_take_oldest(q, k);
}

/* Remove every entry (release); returns them linked through tok.pw_next. */
static inline co__pw_t *co__wq_reset(co__wq_t *q, int *n) {
    return co__wq_refresh(q, INT64_MAX, n);
}

/* ---- the pool's lock ----------------------------------------------------
 * Default: the runtime's futex lock (co__lock_t) whose contended path
 * depends on the caller. A coroutine spins briefly and then co_yield()s,
 * so its P keeps running other coroutines (the holder is a coroutine or
 * thread on another M and holds it for a few dozen instructions); a plain
 * thread spins briefly and then sleeps on the futex (co__lock_slow).
 * Neither ants' spinlock (always yield:
 * a plain thread's sched_yield loses the core) nor co__lock_t (always sleep
 * the M: the whole P stalls) is best for both (bench/results/pool.md).
 * Build with -DCOLONY_POOL_SPINLOCK (ants' co_spinlock_t) or
 * -DCOLONY_POOL_FUTEXLOCK (co__lock_t) to measure the alternatives on the
 * same pool code; bench/run_pool.sh does.
 * The pool never holds another lock when it takes this one, so yielding
 * with it contended is safe. */
#if defined(COLONY_POOL_SPINLOCK)
#define CO__PLOCK_NAME "spin"
typedef co_spinlock_t co__plock_t;
static inline void co__plock(co__plock_t *l) { co_spinlock_lock(l); }
static inline void co__punlock(co__plock_t *l) { co_spinlock_unlock(l); }
static inline bool co__ptrylock(co__plock_t *l) {
    uint32_t z = 0; /* the spinlock is a 0/1 word (spinlock.c) */
    return __atomic_compare_exchange_n(&l->_opaque, &z, 1, false, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
}
#elif defined(COLONY_POOL_FUTEXLOCK)
#define CO__PLOCK_NAME "futex"
typedef co__lock_t co__plock_t;
static inline void co__plock(co__plock_t *l) { co__lock(l); }
static inline void co__punlock(co__plock_t *l) { co__unlock(l); }
static inline bool co__ptrylock(co__plock_t *l) { return co__trylock(l); }
#else
#define CO__PLOCK_NAME "yield"
/* The runtime's lock (co__lock_t: lock.c) with its own contended path: a
 * coroutine yields its P instead of sleeping. Its unlock is co__unlock's
 * plain store, not an exchange: it runs twice per task. */
typedef struct co__plock {
    co__lock_t l;
} co__plock_t;
CO_HIDDEN void co__plock_slow(co__plock_t *l);
static inline bool co__ptrylock(co__plock_t *l) { return co__trylock(&l->l); }
static inline void co__plock(co__plock_t *l) {
    if (CO_UNLIKELY(!co__ptrylock(l))) co__plock_slow(l);
}
static inline void co__punlock(co__plock_t *l) { co__unlock(&l->l); }
#endif

/* ---- the pool ----------------------------------------------------------- */
enum { CO__POOL_OPEN = 0, CO__POOL_CLOSED = 1 };

#define CO__CACHELINE 64

struct co_pool {
    /* Read on every task end (the chute's checks), written rarely: kept on
     * a line of their own, away from the per-task counters below. Each is
     * [L, atomic]: written under the lock with atomic stores, read without
     * it by those checks and by the getters (snapshots). */
    _Alignas(CO__CACHELINE) uint32_t state; /* CO__POOL_*; only release and reboot change it */
    uint32_t waiters;     /* 1 while someone waits on the pool (submitq, idleq or
                           * drainq non-empty, or about to be) */
    int32_t cap;          /* -1 unlimited */
    int32_t running;      /* workers: busy + idle (+ on the chute) */
    uint64_t gen;         /* release generation, bumped by every release */
    uint32_t purge_armed; /* the purge timer is pending or running; set by whoever
                           * adds it, cleared only by its callback */
    bool no_purge;        /* immutable: opts.disable_purge */
    uint64_t gate;        /* seq_cst, [L] to write: what the fields above say of the
                           * chute, in one word (pool_locked.h, gate_update_locked):
                           * gen << 1 while the chute is open to that generation, odd
                           * while shut. Stored after every change of them, before the
                           * drain; loaded by a finishing worker before and after its
                           * push */
    uint32_t tag;         /* CO__TAG_POOL from creation until destroy frees it
                           * (chan/chan.h); on the line every submit reads */

    /* The chute: workers whose task ended while nobody waits push their
     * record here with one CAS instead of taking the lock; the next lock
     * holder drains it ("The chute", worker.c). Pushed by CAS (seq_cst),
     * emptied by an exchange (seq_cst) under the lock. */
    _Alignas(CO__CACHELINE) co__pw_t *chute;
    uint32_t inflight;    /* atomic: workers between their chute push and their last
                           * access to the pool that cannot hold a pin there (the
                           * drain after a failed re-check; destroy waits for 0) */

    /* lock protects every field below marked [L]. Never held across a park
     * except through ppark's unlock callback, and never held while calling
     * co__spawn, a user callback or co__timer_del. Lock order: pool lock ->
     * timer heap lock. */
    _Alignas(CO__CACHELINE) co__plock_t lock;
    int32_t busy;         /* [L, atomic] workers with a task, all generations; a
                           * worker on the chute still counts until drained */
    int32_t busy_old;     /* [L] busy workers activated before the last release */
    int32_t waiting;      /* [L, atomic] submitters linked in submitq */
    int32_t sub_parked;   /* [L] submitters parked, or sent round again (RETRY), and
                           * not yet accounted for by a waker's claim or by the end
                           * of their submit (destroy waits) */

    co__wq_t idle;        /* [L] idle worker records */
    co__pw_t *spare;      /* [L] retired records kept for reuse */
    int nspare;           /* [L] */

    co__waitq_t submitq;  /* [L] blocked submitters, by arrival; waiter.data = their
                           * co__task, waiter.n = their ticket */
    int64_t sub_ticket;   /* [L] the next blocked submitter's ticket */
    co__waitq_t idleq;    /* [L] co_pool_wait_idle callers: woken when busy == 0 */
    co__waitq_t drainq;   /* [L] release_timeout/destroy callers: woken when
                           * busy_old <= waiter.n */

    /* [L] statistics, exact once the chute is drained (co_pool_stats does).
     * rejected is atomic (also bumped without the lock). */
    int64_t submitted, completed, panicked;
    int64_t rejected;     /* atomic relaxed */

    co__timer_t purge;    /* the purge (purge.c); armed iff purge_armed */

    /* Immutable after creation. */
    void (*fn)(void *);   /* function pool: every task is fn(arg) */
    co_pool_opts_t opts;
    int64_t expiry;       /* ns */
};

_Static_assert(offsetof(struct co_pool, tag) >= 32 && offsetof(struct co_pool, tag) < CO__CACHELINE,
               "the tag lies past what free() writes, on the first line");

#define POOL_CHECK(p, call) CO__HANDLE_CHECK(p, CO__TAG_POOL, call)

/* Internal entry points shared by multipool.c and default_pool.c. */
/* Start a release; CO_ECLOSED if already closed. */
CO_HIDDEN int co__pool_release_begin(co_pool_t *p);
/* Wait until every worker that was busy at the last release has exited.
 * 0 / CO_ETIMEDOUT. */
CO_HIDDEN int co__pool_drain_until(co_pool_t *p, int64_t deadline);
/* co_pool_destroy's first step (default_pool.c): if p is the default pool,
 * it stops being it; the next use makes a new one. */
CO_HIDDEN void co__default_pool_detach(co_pool_t *p);
/* Invoke on a function pool with a deadline (co_pool_invoke's engine). */
CO_HIDDEN int co__pool_invoke_until(co_pool_t *p, void *arg, int64_t deadline);

#endif
