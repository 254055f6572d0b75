/*
 * Dead Gs and free stacks, kept for reuse (Go's gfput/gfget and its stack
 * cache).
 *
 * A G gets its stack when it first runs, not when it is spawned. A burst of
 * co_go calls queues bare Gs of about 200 bytes. They then run one after
 * another on the same few stacks, which stay hot in the caches and the TLB.
 * Before, every queued G held a stack of its own: each spawn wrote a fresh
 * stack page, and each first run missed on it again. A dead G gives its
 * stack back at once, so the next G to start takes it.
 *
 * Bare Gs and default-size stacks are cached per P (owner only, no lock),
 * then globally under sched.lock, in batches. The global caches are
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
#include "runtime.h"
#include "san.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- Gs ----------------------------------------------------------------- */

void co__g_release(co_g_t *g) {
    co_sched_t *s = &co__sched;
    co__stack_free(&g->stack);
#ifdef CO_TSAN
    if (g->tsan_fiber) __tsan_destroy_fiber(g->tsan_fiber);
#endif
    co__lock(&s->allg_lock);
    if (g->alllink_prev)
        g->alllink_prev->alllink_next = g->alllink_next;
    else
        s->allg = g->alllink_next;
    if (g->alllink_next) g->alllink_next->alllink_prev = g->alllink_prev;
    co__unlock(&s->allg_lock);
    free(g);
}

/* Owner of p (or p NULL). A bare G onto the caches. */
static void gput(co_p_t *p, co_g_t *g) {
    co_sched_t *s = &co__sched;
    co_g_t *first = g, *last = g;
    int n = 1;
    if (p) {
        g->schedlink = p->gfree;
        p->gfree = g;
        if (++p->gfree_n < CO_GFREE_LOCAL) return;
        /* Spill half to the global list. */
        first = last = p->gfree;
        while (p->gfree_n - n > CO_GFREE_LOCAL / 2) {
            last = last->schedlink;
            n++;
        }
        p->gfree = last->schedlink;
        p->gfree_n -= n;
    }
    co__lock(&s->lock);
    last->schedlink = s->gfree_global;
    s->gfree_global = first;
    __atomic_store_n(&s->ngfree_global, s->ngfree_global + n, __ATOMIC_RELAXED);
    co__unlock(&s->lock);
}

co_g_t *co__gfget(co_p_t *p) {
    co_sched_t *s = &co__sched;
    if (p && p->gfree) {
        co_g_t *g = p->gfree;
        p->gfree = g->schedlink;
        p->gfree_n--;
        return g;
    }
    /* relaxed: a hint; the list is read under the lock */
    if (__atomic_load_n(&s->ngfree_global, __ATOMIC_RELAXED) == 0) return NULL;
    co__lock(&s->lock);
    co_g_t *g = s->gfree_global;
    if (g) {
        s->gfree_global = g->schedlink;
        int n = s->ngfree_global - 1;
        /* refill the local cache with a batch */
        while (p && p->gfree_n < CO_GFREE_LOCAL / 2 && s->gfree_global) {
            co_g_t *x = s->gfree_global;
            s->gfree_global = x->schedlink;
            n--;
            x->schedlink = p->gfree;
            p->gfree = x;
            p->gfree_n++;
        }
        __atomic_store_n(&s->ngfree_global, n, __ATOMIC_RELAXED);
        if (n < s->gfree_low) s->gfree_low = n;
    }
    co__unlock(&s->lock);
    return g;
}

/* ---- stacks ------------------------------------------------------------- */

/* sched.lock held. Room for n more stacks on the global array. */
static bool sfree_room_locked(int n) {
    co_sched_t *s = &co__sched;
    if (s->nsfree_global + n <= s->sfree_cap) return true;
    int cap = s->sfree_cap ? 2 * s->sfree_cap : 256;
    while (cap < s->nsfree_global + n) cap *= 2;
    co__stack_t *a = realloc(s->sfree_global, (size_t)cap * sizeof *a);
    if (!a) return false;
    s->sfree_global = a;
    s->sfree_cap = cap;
    return true;
}

/* Owner of p (or p NULL). Keeps the default-size stack *st. */
static void stackput(co_p_t *p, const co__stack_t *st) {
    co_sched_t *s = &co__sched;
    co__stack_t batch[CO_SFREE_LOCAL / 2 + 1];
    int n = 0;
    if (p) {
        if (p->sfree_n < CO_SFREE_LOCAL) {
            p->sfree[p->sfree_n++] = *st;
            return;
        }
        /* Full: the older half goes global, the newest stay (hot). */
        n = CO_SFREE_LOCAL / 2;
        for (int i = 0; i < n; i++) batch[i] = p->sfree[i];
        for (int i = n; i < CO_SFREE_LOCAL; i++) p->sfree[i - n] = p->sfree[i];
        p->sfree_n -= n;
        p->sfree[p->sfree_n++] = *st;
    } else {
        batch[n++] = *st;
    }
    co__lock(&s->lock);
    bool room = sfree_room_locked(n);
    if (room) {
        for (int i = 0; i < n; i++) s->sfree_global[s->nsfree_global + i] = batch[i];
        __atomic_store_n(&s->nsfree_global, s->nsfree_global + n, __ATOMIC_RELAXED);
    }
    co__unlock(&s->lock);
    if (!room) /* no memory for the array: give the stacks back instead */
        for (int i = 0; i < n; i++) co__stack_free(&batch[i]);
}

/* Owner of p (or p NULL). A cached default-size stack into *st. */
static bool stackget(co_p_t *p, co__stack_t *st) {
    co_sched_t *s = &co__sched;
    if (p && p->sfree_n) {
        *st = p->sfree[--p->sfree_n];
        return true;
    }
    /* relaxed: a hint; the array is read under the lock */
    if (__atomic_load_n(&s->nsfree_global, __ATOMIC_RELAXED) == 0) return false;
    bool got = false;
    co__lock(&s->lock);
    int n = s->nsfree_global;
    if (n > 0) {
        *st = s->sfree_global[--n];
        got = true;
        while (p && n > 0 && p->sfree_n < CO_SFREE_LOCAL / 2)
            p->sfree[p->sfree_n++] = s->sfree_global[--n];
        __atomic_store_n(&s->nsfree_global, n, __ATOMIC_RELAXED);
        if (n < s->sfree_low) s->sfree_low = n;
    }
    co__unlock(&s->lock);
    return got;
}

void co__gfput(co_p_t *p, co_g_t *g) {
    co_sched_t *s = &co__sched;
    if (g->stack.map) {
        if (g->stack.size == s->stack_size)
            stackput(p, &g->stack);
        else
            co__stack_free(&g->stack);
        g->stack.map = NULL;
    }
    gput(p, g);
}

bool co__stack_attach(co_m_t *m, co_g_t *g) {
    co_sched_t *s = &co__sched;
    if (!stackget(m->p, &g->stack) && co__stack_alloc(&g->stack, s->stack_size) < 0) {
        g->stack.map = NULL;
        static uint32_t warned; /* atomic: say it once per process */
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr,
                    "colony: no memory for the stack of coroutine %llu: it waits to start "
                    "(so may others)\n",
                    (unsigned long long)g->id);
        co__lock(&s->lock);
        g->schedlink = s->stackwait;
        s->stackwait = g;
        __atomic_store_n(&s->nstackwait, s->nstackwait + 1, __ATOMIC_RELAXED);
        co__unlock(&s->lock);
        return false;
    }
    co__ctx_make(&g->ctx, g->stack.lo, g->stack.size, g, g->fpenv);
    return true;
}

int co__stackwait_retry(void) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    co_g_t *list = s->stackwait;
    int n = s->nstackwait;
    s->stackwait = NULL;
    __atomic_store_n(&s->nstackwait, 0, __ATOMIC_RELAXED);
    co__unlock(&s->lock);
    while (list) {
        co_g_t *g = list;
        list = g->schedlink;
        co__globrunqput(&g, 1);
    }
    if (n) co__wakep();
    return n;
}

/* ---- trimming and shutdown ---------------------------------------------- */

/* sysmon, every trim period: free as many dead Gs and stacks as stayed on
 * the global caches through the whole period (their low watermarks),
 * keeping `keep` of each. Which ones does not matter (none was used for a
 * period); they are taken in small batches, so sched.lock is never held
 * for long, and freed outside it. */
int co__gfree_trim(int keep) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    int gcold = s->gfree_low - keep;
    int scold = s->sfree_low - keep;
    s->gfree_low = s->ngfree_global;
    s->sfree_low = s->nsfree_global;
    co__unlock(&s->lock);
    int freed = 0;
    for (int done = 0; done < gcold;) {
        co_g_t *batch = NULL;
        int n = 0;
        co__lock(&s->lock);
        while (n < 256 && done + n < gcold && s->ngfree_global - n > keep && s->gfree_global) {
            co_g_t *x = s->gfree_global;
            s->gfree_global = x->schedlink;
            x->schedlink = batch;
            batch = x;
            n++;
        }
        __atomic_store_n(&s->ngfree_global, s->ngfree_global - n, __ATOMIC_RELAXED);
        if (s->gfree_low > s->ngfree_global) s->gfree_low = s->ngfree_global;
        co__unlock(&s->lock);
        if (n == 0) break;
        while (batch) {
            co_g_t *x = batch;
            batch = x->schedlink;
            co__g_release(x);
        }
        done += n;
        freed += n;
    }
    for (int done = 0; done < scold;) {
        co__stack_t batch[64];
        int n = 0;
        co__lock(&s->lock);
        int left = s->nsfree_global;
        while (n < 64 && done + n < scold && left > keep) batch[n++] = s->sfree_global[--left];
        __atomic_store_n(&s->nsfree_global, left, __ATOMIC_RELAXED);
        if (s->sfree_low > left) s->sfree_low = left;
        co__unlock(&s->lock);
        if (n == 0) break;
        for (int i = 0; i < n; i++) co__stack_free(&batch[i]);
        done += n;
        freed += n;
    }
    return freed;
}

void co__gcache_free_p(co_p_t *p) {
    while (p->gfree) {
        co_g_t *g = p->gfree;
        p->gfree = g->schedlink;
        co__g_release(g);
    }
    p->gfree_n = 0;
    while (p->sfree_n) co__stack_free(&p->sfree[--p->sfree_n]);
}

void co__gcache_free_global(void) {
    co_sched_t *s = &co__sched;
    while (s->gfree_global) {
        co_g_t *g = s->gfree_global;
        s->gfree_global = g->schedlink;
        co__g_release(g);
    }
    s->ngfree_global = 0;
    while (s->nsfree_global) co__stack_free(&s->sfree_global[--s->nsfree_global]);
    free(s->sfree_global);
    s->sfree_global = NULL;
    s->sfree_cap = 0;
}
