/*
 * Dead Gs and free stacks, kept for reuse (Go's gfput/gfget and its stack
 * cache).
 *
 * A G gets its stack when it first runs, not when it is spawned. A burst of
 * co_go calls queues bare Gs of about 160 bytes. They then run one after
 * another on the same few stacks, which stay hot in the caches and the TLB.
 * Before, every queued G held a stack of its own: each spawn wrote a fresh
 * stack page, and each first run missed on it again. A dead G gives its
 * stack back at once, so the next G to start takes it.
 *
 * Bare Gs and default-size stacks are cached per P (owner only, no lock),
 * then globally under sched.gcache_lock, in batches of half a P's array.
 * On 2 Ps, the Gs one P spawns often exit on the other, so records flow
 * through the global cache; 256 per P keeps that flow in large batches, at
 * up to 60 KiB of idle records per P. The global caches are
 * unbounded: a burst of exits must not become a burst of munmaps (each
 * takes the mm lock and shoots down TLBs on every CPU running us). Once a
 * period, sysmon frees what nobody took during the whole period
 * (co__gfree_trim), as Go's GC frees the stacks of dead Gs.
 *
 * Stacks of other sizes (co_go_with) are mapped at spawn, so a failure is
 * co_go's CO_ENOMEM, and unmapped when their G exits.
 *
 * A default stack can fail to map when a G first runs: out of address
 * space, or a strict overcommit limit. Then the G waits on sched.stackwait
 * and its M runs something else. sysmon puts the waiting Gs back on the
 * global queue every STACKWAIT_RETRY_NS (sysmon.c), so they start once
 * memory is available again, for instance after other coroutines exit.
 * Such a G is never dropped.
 */
#include "runtime/proc.h"
#include "base/san.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef CO_TSAN
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

/* ---- the two caches ------------------------------------------------------ */

/* Items of esz bytes: a per-P array loc[*locn] of max (owner only) over a
 * global co__freevec_t (sched.gcache_lock). The last item put is the first taken:
 * the hottest. */
typedef struct {
    char *loc;
    int *locn;
    int max;
    co__freevec_t *gv;
    size_t esz;
    void (*drop)(void *item); /* frees an item the global array has no room for */
} cache_t;

#define AT(base, i, esz) ((base) + (size_t)(i) * (esz))
/* cache_put's batch: half a local array of either kind. It is on the
 * stack of whoever frees (a coroutine's, in goexit: 16 KiB at least). */
#define HALF_G (CO_GFREE_LOCAL / 2 * sizeof(co_g_t *))
#define HALF_S (CO_SFREE_LOCAL / 2 * sizeof(co__stack_t))
#define BATCH_BYTES (HALF_G > HALF_S ? HALF_G : HALF_S)
_Static_assert(BATCH_BYTES <= 1024, "cache_put's batch stays small on a coroutine's stack");

/* gcache_lock held. Room for k more items on gv. */
static bool vec_room_locked(co__freevec_t *gv, int k, size_t esz) {
    if (gv->n + k <= gv->cap) return true;
    int cap = gv->cap ? 2 * gv->cap : 256;
    while (cap < gv->n + k) cap *= 2;
    char *a = realloc(gv->a, (size_t)cap * esz);
    if (!a) return false;
    gv->a = a;
    gv->cap = cap;
    return true;
}

/* Owner of the local array (or loc NULL: straight to the global one).
 * Inlined where c is a constant, so the item copies are plain moves. */
static inline __attribute__((always_inline)) void cache_put(const cache_t *c, const void *item) {
    co_sched_t *s = &co__sched;
    /* aligned: a dropped item is read in place */
    _Alignas(co__stack_t) char batch[BATCH_BYTES];
    int k = 1;
    if (c->loc) {
        if (*c->locn < c->max) {
            memcpy(AT(c->loc, (*c->locn)++, c->esz), item, c->esz);
            return;
        }
        /* Full: the older half goes global, the newest stay (hot). */
        k = c->max / 2;
        memcpy(batch, c->loc, (size_t)k * c->esz);
        memmove(c->loc, AT(c->loc, k, c->esz), (size_t)(c->max - k) * c->esz);
        *c->locn -= k;
        memcpy(AT(c->loc, (*c->locn)++, c->esz), item, c->esz);
    } else {
        memcpy(batch, item, c->esz);
    }
    co__lock(&s->gcache_lock);
    bool room = vec_room_locked(c->gv, k, c->esz);
    if (room) {
        memcpy(AT(c->gv->a, c->gv->n, c->esz), batch, (size_t)k * c->esz);
        __atomic_store_n(&c->gv->n, c->gv->n + k, __ATOMIC_RELAXED);
    }
    co__unlock(&s->gcache_lock);
    if (!room) /* no memory to grow the array: free the items instead */
        for (int i = 0; i < k; i++) c->drop(AT(batch, i, c->esz));
}

/* Owner of the local array (or loc NULL). An item into *item; a global
 * batch refills the local array. */
static inline __attribute__((always_inline)) bool cache_get(const cache_t *c, void *item) {
    co_sched_t *s = &co__sched;
    if (c->loc && *c->locn) {
        memcpy(item, AT(c->loc, --*c->locn, c->esz), c->esz);
        return true;
    }
    /* relaxed: a hint; the array is read under the lock */
    if (__atomic_load_n(&c->gv->n, __ATOMIC_RELAXED) == 0) return false;
    bool got = false;
    co__lock(&s->gcache_lock);
    int n = c->gv->n;
    if (n > 0) {
        memcpy(item, AT(c->gv->a, --n, c->esz), c->esz);
        got = true;
        if (c->loc) {
            int k = c->max / 2 - *c->locn;
            if (k > n) k = n;
            if (k > 0) {
                n -= k;
                memcpy(AT(c->loc, *c->locn, c->esz), AT(c->gv->a, n, c->esz),
                       (size_t)k * c->esz);
                *c->locn += k;
            }
        }
        __atomic_store_n(&c->gv->n, n, __ATOMIC_RELAXED);
        if (n < c->gv->low) c->gv->low = n;
    }
    co__unlock(&s->gcache_lock);
    return got;
}

/* sysmon: free as many items as stayed on gv through a whole period (its
 * low watermark), keeping `keep`, in small batches: the lock is never
 * held for long, and items are freed outside it. */
static int cache_trim(const cache_t *c, int keep) {
    co_sched_t *s = &co__sched;
    co__lock(&s->gcache_lock);
    int cold = c->gv->low - keep;
    c->gv->low = c->gv->n;
    co__unlock(&s->gcache_lock);
    int freed = 0;
    while (freed < cold) {
        _Alignas(co__stack_t) char batch[32 * sizeof(co__stack_t)];
        int k = 0;
        co__lock(&s->gcache_lock);
        int n = c->gv->n;
        while (k < 32 && freed + k < cold && n > keep) {
            memcpy(AT(batch, k, c->esz), AT(c->gv->a, --n, c->esz), c->esz);
            k++;
        }
        __atomic_store_n(&c->gv->n, n, __ATOMIC_RELAXED);
        if (c->gv->low > n) c->gv->low = n;
        co__unlock(&s->gcache_lock);
        if (k == 0) break;
        for (int i = 0; i < k; i++) c->drop(AT(batch, i, c->esz));
        freed += k;
    }
    return freed;
}

/* ---- Gs and stacks ------------------------------------------------------ */

void co__g_release(co_g_t *g) {
    co__stack_free(&g->stack);
    co__gslab_put(g);
}

static void drop_g(void *item) { co__g_release(*(co_g_t **)item); }
static void drop_stack(void *item) { co__stack_free(item); }

static cache_t gcache(co_p_t *p) {
    return (cache_t){p ? (char *)p->gfree : NULL, p ? &p->gfree_n : NULL, CO_GFREE_LOCAL,
                     &co__sched.gfree, sizeof(co_g_t *), drop_g};
}

static cache_t scache(co_p_t *p) {
    return (cache_t){p ? (char *)p->sfree : NULL, p ? &p->sfree_n : NULL, CO_SFREE_LOCAL,
                     &co__sched.sfree, sizeof(co__stack_t), drop_stack};
}

/* co__gfget once p's own cache is empty (runtime.h) */
co_g_t *co__gfget_slow(co_p_t *p) {
    co_g_t *g;
    cache_t c = gcache(p);
    return cache_get(&c, &g) ? g : NULL;
}

/* co__gfput of a G with a stack, or with p's cache full (runtime.h) */
void co__gfput_slow(co_p_t *p, co_g_t *g) {
    co_sched_t *s = &co__sched;
    if (g->stack.map) {
        if (g->stack.size == s->stack_size) {
            cache_t c = scache(p);
            cache_put(&c, &g->stack);
        } else {
            co__stack_free(&g->stack);
        }
        g->stack.map = NULL;
    }
    cache_t c = gcache(p);
    cache_put(&c, &g);
}

/* A batch of a larger mapping, for p's cache. */
static void stack_put_run(co__stack_t *run, int n, void *arg) {
    cache_t c = scache(arg);
    for (int i = 0; i < n; i++) cache_put(&c, &run[i]);
}

/* Tests (tests/test_stack_map_unlocked.c): called before each batch is
 * mapped; NULL otherwise. Relaxed: a test sets it before it spawns
 * anything. */
void (*co__test_stack_map_probe)(void);

/* The caches are empty: map a batch (co__stack_batch stacks: a burst of
 * first runs then costs one mmap per batch), keep one for g, cache the
 * rest. Top pages are committed ahead for as many as p has coroutines
 * queued, and g: at the end of a burst the rest of a batch may never run
 * (a fault commits each one's page if it does). */
static bool stack_map_batch(co_p_t *p, co__stack_t *st) {
    co__stack_t batch[CO_STACK_BATCH_MAX];
    void (*probe)(void) = __atomic_load_n(&co__test_stack_map_probe, __ATOMIC_RELAXED);
    if (CO_UNLIKELY(probe != NULL)) probe();
#ifdef CO_TSAN
    /* TSan's mmap marks what it maps as written by the caller (here m's
     * g0, co__stack_attach) unless it ignores the caller's
     * accesses, when it clears it instead: the new stacks are no one's. */
    __tsan_ignore_thread_begin();
#endif
    int runs = co__stack_runs();
    int need = co__runq_len(p) + 1;
    int n = runs > 1 ? co__stack_alloc_runs(batch, runs, co__sched.stack_size, need,
                                            stack_put_run, p)
                     : co__stack_alloc_need(batch, co__stack_batch(), co__sched.stack_size, need);
#ifdef CO_TSAN
    __tsan_ignore_thread_end();
#endif
    if (n < 0) return false;
    *st = batch[0];
    cache_t c = scache(p);
    for (int i = 1; i < n; i++) cache_put(&c, &batch[i]);
    return true;
}

#ifdef CO_TSAN
/* A cached stack about to host a new coroutine: what TSan recorded of the
 * accesses of the last one there must go, or the new one's would look like
 * races with them (its fiber is unrelated, race.c). Those were made on the
 * pages it touched, still resident (mincore): each run of them is mapped
 * afresh, under ignore, which makes TSan's mmap clear their shadow (rather
 * than mark it written by the caller); the pages come back zeroed, the
 * canary zone included. The rest of the stack was never touched. (A page
 * swapped out meanwhile keeps its shadow, and a synchronisation object that
 * lived on the stack keeps its history: both can only hide a race.) Far
 * cheaper than unmapping every dead coroutine's stack: each munmap also
 * walks TSan's metadata of the whole stack, and a spawn-heavy test took
 * five times as long. */
static void stack_clean(const co__stack_t *st) {
    enum { CHUNK = 256 };
    static size_t pg;
    if (!pg) pg = (size_t)sysconf(_SC_PAGESIZE); /* (a race of equal stores) */
    unsigned char vec[CHUNK];
    __tsan_ignore_thread_begin();
    for (size_t off = 0; off < st->size; off += CHUNK * pg) {
        size_t len = st->size - off < CHUNK * pg ? st->size - off : CHUNK * pg;
        char *base = st->lo + off;
        if (mincore(base, len, vec) != 0) memset(vec, 1, sizeof vec); /* all, then */
        size_t np = len / pg;
        for (size_t i = 0; i < np;) {
            if (!(vec[i] & 1)) {
                i++;
                continue;
            }
            size_t j = i;
            while (j < np && (vec[j] & 1)) j++;
            if (mmap(base + i * pg, (j - i) * pg, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
                co__fatal("TSan: cannot map a cached stack afresh (%s)", strerror(errno));
            i = j;
        }
    }
    __tsan_ignore_thread_end();
}
#endif

/* 1: attached; 0: g waits on stackwait; -1 (only !may_map): the caches
 * are empty, and nothing was done. */
static int stack_attach(co_m_t *m, co_g_t *g, bool may_map) {
    co_sched_t *s = &co__sched;
    cache_t c = scache(m->p);
    if (cache_get(&c, &g->stack)) {
        /* attached below */
    } else if (!may_map) {
        return -1;
    } else if (!stack_map_batch(m->p, &g->stack)) {
        g->stack.map = NULL;
        static uint32_t warned; /* atomic: say it once per process */
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr,
                    "colony: no memory for the stack of coroutine %llu: it waits to start "
                    "(so may others)\n",
                    (unsigned long long)g->id);
        co__lock(&s->gcache_lock);
        g->schedlink = s->stackwait;
        s->stackwait = g;
        __atomic_store_n(&s->nstackwait, s->nstackwait + 1, __ATOMIC_RELAXED);
        co__unlock(&s->gcache_lock);
        return 0;
    }
#ifdef CO_ASAN
    /* A cached stack still carries the shadow of its last coroutine's
     * frames (scopes it left poisoned, as it never returned from them):
     * the new one starts on clean memory. */
    __asan_unpoison_memory_region(g->stack.lo, g->stack.size);
#endif
#ifdef CO_TSAN
    stack_clean(&g->stack);
    __tsan_ignore_thread_begin(); /* its first frame is g's, not the caller's */
#endif
    co__ctx_make(&g->ctx, g->stack.lo, g->stack.size, g, g->fpenv, g->id);
#ifdef CO_TSAN
    __tsan_ignore_thread_end();
#endif
    return 1;
}

int co__stack_attach(co_m_t *m, co_g_t *g, bool may_map) {
#ifdef CO_TSAN
    /* On m's g0 fiber (its thread's own TSan state), not the fiber of the
     * coroutine that switches away: one parked inside a blocking call that
     * TSan intercepts (read, poll... of a program under libcolony_hook.so)
     * has TSan ignoring its interceptors until that call returns, and the
     * mmaps above would then pass TSan by, leaving the last coroutine's
     * accesses on the stack to be reported as races with the next one's. */
    void *self = __tsan_get_current_fiber(), *g0 = m->g0.tsan_fiber;
    bool away = g0 && self != g0;
    if (away) __tsan_switch_to_fiber(g0, CO_TSAN_NO_SYNC);
    int rc = stack_attach(m, g, may_map);
    if (away) __tsan_switch_to_fiber(self, CO_TSAN_NO_SYNC);
    return rc;
#else
    return stack_attach(m, g, may_map);
#endif
}

void co__tokwait_put(co__token_t *t) {
    co_sched_t *s = &co__sched;
    co__lock(&s->gcache_lock);
    co__toklist_append(&s->tokwait, &s->tokwait_tail, t);
    __atomic_store_n(&s->nstackwait, s->nstackwait + 1, __ATOMIC_RELAXED);
    co__unlock(&s->gcache_lock);
}

/* sysmon: every coroutine and token waiting for memory goes back to the
 * global queue, in the order they came; the next M to take one tries
 * again (and puts it back here if memory is still short). */
int co__stackwait_retry(void) {
    co_sched_t *s = &co__sched;
    co__lock(&s->gcache_lock);
    co_g_t *list = s->stackwait;
    co__token_t *toks = s->tokwait;
    int n = s->nstackwait;
    s->stackwait = NULL;
    s->tokwait = s->tokwait_tail = NULL;
    __atomic_store_n(&s->nstackwait, 0, __ATOMIC_RELAXED);
    co__unlock(&s->gcache_lock);
    while (list) {
        co_g_t *g = list;
        list = g->schedlink;
        co__globrunqput(&g, 1);
    }
    while (toks) {
        co__token_t *t = toks;
        toks = t->link; /* read before the put: it reuses link */
        co__token_requeue(t);
    }
    if (n) co__wakep();
    return n;
}

/* ---- trimming and shutdown ---------------------------------------------- */

/* sysmon, every trim period: free the dead Gs and the stacks that nobody
 * took from the global caches during the whole period, keeping `keep` of
 * each. Which ones does not matter: none was used for a period. */
int co__gfree_trim(int keep) {
    cache_t g = gcache(NULL), st = scache(NULL);
    return cache_trim(&g, keep) + cache_trim(&st, keep);
}

void co__gcache_free_p(co_p_t *p) {
    while (p->gfree_n) co__g_release(p->gfree[--p->gfree_n]);
    while (p->sfree_n) co__stack_free(&p->sfree[--p->sfree_n]);
}

void co__gcache_free_global(void) {
    co_sched_t *s = &co__sched;
    cache_t g = gcache(NULL), st = scache(NULL);
    co__freevec_t *v[2] = {&s->gfree, &s->sfree};
    const cache_t *c[2] = {&g, &st};
    for (int i = 0; i < 2; i++) {
        while (v[i]->n) c[i]->drop(AT(v[i]->a, --v[i]->n, c[i]->esz));
        free(v[i]->a);
        *v[i] = (co__freevec_t){0};
    }
    co__gslab_fini();
}
