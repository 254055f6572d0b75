/*
 * The global run queue and the injection stack (Go's sched.runq, and what
 * plain threads push through), apart from the Ps' own rings (runq.c, sched_impl.h).
 *
 * The global queue is FIFO under sched.lock: chunks of 126 entries, with
 * two linked lists (Gs through schedlink, tokens through their link) as
 * the fallback when no chunk can be allocated. runqsize counts it (written
 * under the lock, read lock-free as a hint). A P takes a fair share into
 * its ring (co__globrunq_share_locked), as Go's globrunqget does.
 */
#include "runtime/proc.h"

#include <stdlib.h>
#include <string.h>

/* ---- the global run queue (sched.lock) ---------------------------------- */

#define CO_GCHUNK 126 /* a chunk is 1 KiB */
typedef struct co__gchunk {
    struct co__gchunk *next;
    uint32_t head, tail;  /* g[head..tail) are queued */
    co_g_t *g[CO_GCHUNK];
} co__gchunk_t;

/* sched.lock held. A chunk with room at the tail of the queue, or NULL. */
static co__gchunk_t *rq_tail_chunk_locked(void) {
    co_sched_t *s = &co__sched;
    co__gchunk_t *c = s->rq_last;
    if (co__test_failing(CO__FAIL_GLOBQ_CHUNK)) return NULL;
    if (c && c->tail < CO_GCHUNK) return c;
    if ((c = s->rq_spare) != NULL) {
        s->rq_spare = c->next;
        s->rq_nspare--;
    } else if ((c = malloc(sizeof *c)) == NULL) {
        return NULL;
    }
    c->next = NULL;
    c->head = c->tail = 0;
    if (s->rq_last)
        s->rq_last->next = c;
    else
        s->rq_first = c;
    s->rq_last = c;
    return c;
}

/* sched.lock held. The chunk to append to, or NULL: out of memory for
 * chunks, or already queuing on the lists (which must then keep order). */
static inline co__gchunk_t *rq_append_chunk_locked(void) {
    co_sched_t *s = &co__sched;
    return s->runqhead || s->tokhead ? NULL : rq_tail_chunk_locked();
}

/* sched.lock held. Append e to the lists, rq_append_chunk_locked having
 * found no chunk. */
static void rq_append_list_locked(co_g_t *e) {
    co_sched_t *s = &co__sched;
    if (rq_is_token(e)) { /* tokens on a list of their own */
        co__toklist_append(&s->tokhead, &s->toktail, (co__token_t *)rq_strip(e));
        return;
    }
    e->schedlink = NULL;
    if (s->runqtail)
        s->runqtail->schedlink = e;
    else
        s->runqhead = e;
    s->runqtail = e;
}

/* sched.lock held. */
static void globrunqput_locked(co_g_t **gs, int n) {
    co_sched_t *s = &co__sched;
    for (int i = 0; i < n;) {
        co__gchunk_t *c = rq_append_chunk_locked();
        if (CO_UNLIKELY(!c)) {
            rq_append_list_locked(gs[i++]);
            continue;
        }
        uint32_t t = c->tail;
        while (i < n && t < CO_GCHUNK) c->g[t++] = gs[i++];
        c->tail = t;
    }
    __atomic_store_n(&s->runqsize, s->runqsize + n, __ATOMIC_RELEASE);
}

void co__globrunqput(co_g_t **gs, int n) {
    co__lock(&co__sched.lock);
    globrunqput_locked(gs, n);
    co__unlock(&co__sched.lock);
}

void co__globrunqput_front(co_g_t *g) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    g->schedlink = NULL;
    if (s->fronttail)
        s->fronttail->schedlink = g;
    else
        s->fronthead = g;
    s->fronttail = g;
    __atomic_store_n(&s->front_pending, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&s->runqsize, s->runqsize + 1, __ATOMIC_RELEASE);
    co__unlock(&s->lock);
}

/* A token taken off a queue that must wait its turn again (runtime.h). */
void co__token_requeue(co__token_t *t) {
    co_g_t *e = (co_g_t *)((uintptr_t)t | RQ_TOKEN);
    co__globrunqput(&e, 1);
}

/* sched.lock held. The next queued G, or NULL. */
static inline co_g_t *rq_pop_locked(void) {
    co_sched_t *s = &co__sched;
    co_g_t *fg = s->fronthead;
    if (CO_UNLIKELY(fg != NULL)) {
        s->fronthead = fg->schedlink;
        if (!s->fronthead) {
            s->fronttail = NULL;
            __atomic_store_n(&s->front_pending, 0, __ATOMIC_RELAXED);
        }
        return fg;
    }
    co__gchunk_t *c = s->rq_first;
    while (c && c->head == c->tail) { /* drop empty chunks */
        s->rq_first = c->next;
        if (!s->rq_first) s->rq_last = NULL;
        if (s->rq_nspare < 16) {
            c->next = s->rq_spare;
            s->rq_spare = c;
            s->rq_nspare++;
        } else {
            free(c);
        }
        c = s->rq_first;
    }
    if (c) return c->g[c->head++];
    co_g_t *g = s->runqhead;
    if (g) {
        s->runqhead = g->schedlink;
        if (!s->runqhead) s->runqtail = NULL;
        return g;
    }
    co__token_t *t = s->tokhead;
    if (t) {
        s->tokhead = t->link;
        if (!s->tokhead) s->toktail = NULL;
        return (co_g_t *)((uintptr_t)t | RQ_TOKEN);
    }
    return NULL;
}

/* sched.lock held (runtime.h). */
void co__globrunq_pop_n_locked(co_g_t **out, int n) {
    co_sched_t *s = &co__sched;
    for (int i = 0; i < n;) {
        co__gchunk_t *c = s->rq_first;
        if (CO_LIKELY(c != NULL && !s->fronthead)) { /* straight from the first chunk */
            uint32_t h = c->head, k = c->tail - h;
            if (k > (uint32_t)(n - i)) k = (uint32_t)(n - i);
            memcpy(out + i, c->g + h, k * sizeof *out);
            i += (int)k;
            c->head = h + k;
            if (k) continue;
        }
        out[i++] = rq_pop_locked(); /* an empty chunk to drop, or the lists */
    }
}

void co__globrunq_free(void) {
    co_sched_t *s = &co__sched;
    while (s->rq_first) {
        co__gchunk_t *c = s->rq_first;
        s->rq_first = c->next;
        free(c);
    }
    while (s->rq_spare) {
        co__gchunk_t *c = s->rq_spare;
        s->rq_spare = c->next;
        free(c);
    }
    s->rq_last = NULL;
    s->rq_nspare = 0;
}

/* ---- the injection stack: lock-free pushes from plain threads --------
 * A plain thread that spawns or readies a coroutine (a pool submit from a
 * thread, a channel send that wakes a coroutine) pushes its run-queue
 * entry here with one CAS instead of taking sched.lock, which the Ms
 * taking from the global queue hold at the same time. Entries, tagged
 * as in the rings (RQ_TOKEN), are linked newest first through
 * g->schedlink or token->link. An M takes the whole stack with an exchange
 * (inject_take, no lock held: the links are a miss each), puts it in order,
 * and appends it to the global queue under sched.lock (co__globq_lock). Every
 * 16th push, the pushing thread does that itself if the lock is free
 * (inject_flush_try), while the links are still in its cache.
 *
 * No entry is stranded. The push is a seq_cst CAS followed by wakep's
 * seq_cst loads of npidle and nmspinning; an M giving up its P stores
 * npidle (seq_cst, sched_impl.h's pidleput_locked) and then loads `inject` (seq_cst)
 * before it sleeps: either the pusher sees the idle P (and wakes an M) or
 * the M sees the entry (and takes its P back). Entries an M has taken but
 * not yet appended are its own: it runs some and wakes another M for the
 * rest (co__globq_lock's callers).
 *
 * Tokens (co__spawn_token from a plain thread) are the only entries not yet
 * counted live when pushed: inject_append_locked counts them as it moves
 * them. Anything else pushed here must be counted already. */
static inline co_g_t *ent_next(co_g_t *e) {
    if (rq_is_token(e)) return (co_g_t *)(void *)((co__token_t *)rq_strip(e))->link;
    return e->schedlink;
}
static inline void ent_set_next(co_g_t *e, co_g_t *next) {
    if (rq_is_token(e))
        ((co__token_t *)rq_strip(e))->link = (co__token_t *)(void *)next;
    else
        e->schedlink = next;
}

static void inject_flush_try(void);
/* Pushes by this thread; every INJECT_FLUSH_EVERY-th moves the stack. */
#define INJECT_FLUSH_EVERY 16
static __thread uint32_t inject_pushes;

void co__globrunq_inject(co_g_t *e) {
    co_sched_t *s = &co__sched;
    co_g_t *old = __atomic_load_n(&s->inject, __ATOMIC_RELAXED);
    do {
        ent_set_next(e, old);
        /* seq_cst: publishes e (release) and is the store half of the
         * StoreLoad pairing with the M that goes idle (see above) */
    } while (!__atomic_compare_exchange_n(&s->inject, &old, e, true, __ATOMIC_SEQ_CST,
                                          __ATOMIC_RELAXED));
    if (CO_UNLIKELY(++inject_pushes % INJECT_FLUSH_EVERY == 0)) inject_flush_try();
}

/* Take everything pushed so far, oldest first (linked as on the stack), or
 * NULL. */
static co_g_t *inject_take(void) {
    co_sched_t *s = &co__sched;
    if (!__atomic_load_n(&s->inject, __ATOMIC_RELAXED)) return NULL;
    /* seq_cst: acquires the pushes (their entries' contents and links) */
    co_g_t *e = __atomic_exchange_n(&s->inject, NULL, __ATOMIC_SEQ_CST);
    co_g_t *rev = NULL;
    while (e) {
        co_g_t *n = ent_next(e);
        ent_set_next(e, rev);
        rev = e;
        e = n;
    }
    return rev;
}

/* sched.lock held. Append a list from inject_take to the global queue,
 * straight into its chunks (through an array and globrunqput_locked, the
 * move cost a plain thread's pool submit 48 instructions per task). */
static void inject_append_locked(co_g_t *e) {
    co_sched_t *s = &co__sched;
    int64_t n = 0, ntok = 0;
    while (e) {
        co__gchunk_t *c = rq_append_chunk_locked();
        if (CO_UNLIKELY(!c)) {
            co_g_t *next = ent_next(e);
            ntok += rq_is_token(e);
            rq_append_list_locked(e);
            e = next;
            n++;
            continue;
        }
        uint32_t t = c->tail, t0 = t;
        while (e && t < CO_GCHUNK) {
            ntok += rq_is_token(e);
            c->g[t++] = e;
            e = ent_next(e);
        }
        c->tail = t;
        n += t - t0;
    }
    /* The tokens on the stack are plain threads' pool tasks
     * (co__spawn_token), not yet counted live: count them now, before any
     * can run and be counted out. */
    if (ntok) co__live_global_add((int)ntok);
    __atomic_store_n(&s->runqsize, s->runqsize + n, __ATOMIC_RELEASE);
}

/* Take sched.lock for the global queue, the injection stack moved into it
 * first. True if this moved anything: entries held privately for a moment,
 * which another M may have missed and gone to sleep over, so the caller
 * wakes one (co__wakep) after the unlock if some are still queued. */
bool co__globq_lock(void) {
    co_g_t *inj = inject_take();
    co__lock(&co__sched.lock);
    inject_append_locked(inj);
    return inj != NULL;
}

/* A pushing thread moves the injection stack to the global queue itself
 * now and then, if sched.lock is free: the entries it pushed last are in
 * its cache, while an M would fetch each link from here in turn. The
 * caller's own co__wakep calls came before the move; an M that looked
 * while the entries were held here may have gone to sleep, so wake one if
 * the queue holds some. */
static __attribute__((noinline)) void inject_flush_try(void) {
    co_sched_t *s = &co__sched;
    if (!__atomic_load_n(&s->inject, __ATOMIC_RELAXED) || !co__trylock(&s->lock)) return;
    co_g_t *inj = inject_take();
    inject_append_locked(inj);
    bool more = inj && s->runqsize > 0;
    co__unlock(&s->lock);
    if (more) co__wakep();
}

int64_t co__globrunq_len(void) {
    co_sched_t *s = &co__sched;
    bool moved = co__globq_lock();
    int64_t n = s->runqsize;
    co__unlock(&s->lock);
    if (moved && n > 0) co__wakep();
    return n;
}
