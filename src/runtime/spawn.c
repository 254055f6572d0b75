/*
 * Making coroutines: G records (g_new, g_alloc, g_init) and the walk of
 * them all (co__each_live_g), co__spawn, co_go
 * and co_go_with, spawn back-pressure, and the pool's tokens: a coroutine
 * to be, queued without a G (co__spawn_token), made a G by whoever takes
 * it to run it (co__token_g_slow), or taken over unstarted by a running
 * coroutine (co__take_unstarted). A coroutine's exit is sched.c's goexit.
 */
#include "runtime/sched_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- G records ---------------------------------------------------------- */

/* A new G, on the all-G list, for when the caches hold none: NULL without
 * memory. Out of line: g_alloc is inline in every spawn. */
static __attribute__((noinline)) co_g_t *g_new(void) { return co__gslab_get(); }

void co__each_live_g(co__g_visit_fn *fn, void *arg) {
    co_sched_t *s = &co__sched;
    co__lock(&s->allg_lock);
    for (co_g_t *g = s->allg; g; g = g->alllink_next) {
        uint32_t st = __atomic_load_n(&g->status, __ATOMIC_ACQUIRE); /* see proc.h */
        if (st == CO_G_DEAD || st == CO_G_IDLE) continue;
        if (!fn(g, st, arg)) break;
    }
    co__unlock(&s->allg_lock);
}

/* A G from the caches, or a new one (on the all-G list): NULL without
 * memory. Its fields are to be set by g_init. */
static inline __attribute__((always_inline)) co_g_t *g_alloc(co_p_t *p) {
    co_g_t *g = co__gfget(p);
    return g ? g : g_new();
}

/* A new G's entry, id and name (NULL: none). */
static inline __attribute__((always_inline)) void g_init(co_p_t *p, co_g_t *g,
                                                         void (*fn)(void *), void *arg,
                                                         const char *name) {
    co_sched_t *s = &co__sched;
    g->fn = fn;
    g->arg = arg;
    g->panic_top = NULL;
    __atomic_store_n(&g->wait_reason, 0, __ATOMIC_RELAXED); /* co_dump reads it */
    __atomic_store_n(&g->compact_on, 0, __ATOMIC_RELAXED);  /* a new coroutine has not opted in */
    if (p) { /* ids in batches, as Go's goidcache: no shared counter per spawn */
        if (p->goidcache == p->goidcacheend) {
            p->goidcache = __atomic_fetch_add(&s->goidgen, 64, __ATOMIC_RELAXED) + 1;
            p->goidcacheend = p->goidcache + 64;
        }
        g->id = p->goidcache++;
    } else {
        g->id = __atomic_add_fetch(&s->goidgen, 1, __ATOMIC_RELAXED);
    }
    if (name) { /* name[] is in a colder line: written only when it changes */
        strncpy(g->name, name, sizeof g->name - 1);
        g->name[sizeof g->name - 1] = 0;
        g->named = true;
    } else if (g->named) {
        g->name[0] = 0;
        g->named = false;
    }
}

/* ---- spawning ----------------------------------------------------------- */

/* A new coroutine (a G, or a token) is queued: on p (next: in runnext if
 * it is empty, else on the fresh deque if it has room), counted
 * live there; or, a token from a plain
 * thread, on the injection stack, counted when the stack is moved
 * (inject_append_locked; a plain thread's G goes through plain_push). An
 * M is woken if one may be needed. */
static inline __attribute__((always_inline)) void queue_new(co_p_t *p, co_g_t *e, bool next) {
    if (p) {
        live_add(p, 1);
        /* next: runnext if it is empty, else the tail. Go's newproc moves
         * runnext's coroutine to the tail instead, which takes a locked
         * exchange (thieves CAS runnext); storing into an empty runnext
         * needs none (only the owner ever makes it non-empty), and a burst
         * of spawns then queues in order behind its first. */
        if (next && !__atomic_load_n(&p->runnext, __ATOMIC_RELAXED))
            __atomic_store_n(&p->runnext, e, __ATOMIC_RELEASE); /* pairs with thieves' acquire */
        else if (!next || !flifo_push(p, e)) /* work-first: sched_impl.h */
            runqput(p, e, false);
    } else {
        co__globrunq_inject(e);
    }
    wakep_if_idle();
}

/* co__spawn on the calling thread's M (NULL: a plain thread), the runtime
 * up. Inline in co__spawn and in co_go's path, which needs m after it. */
static inline __attribute__((always_inline)) int spawn_on(co_m_t *m, void (*fn)(void *),
                                                         void *arg, size_t stack_size,
                                                         const char *name, void *gopc) {
    co_sched_t *s = &co__sched;
    co_p_t *p = m ? m->p : NULL;
    if (!p) { /* a plain thread (or an M inside co_blocking): counted before
               * it touches the runtime (see live_global) */
        int rc = co__plain_spawn_enter();
        if (rc < 0) return rc;
    }
    stack_size = stack_size == 0 ? s->stack_size : co__stack_round(stack_size);
    co_g_t *g = g_alloc(p);
    if (!g) goto nomem;
    /* A default-size stack comes when the G first runs (gcache.c); any
     * other size now, so that running out is this call's CO_ENOMEM. */
    co__fpenv_store(&g->fpenv);
    if (stack_size != s->stack_size) {
        if (co__stack_alloc(&g->stack, stack_size) < 0) {
            g->stack.map = NULL;
            co__gfput(p, g);
            goto nomem;
        }
    }
    g_init(p, g, fn, arg, name);
    g->gopc = gopc;
    g->parent_id = m && m->curg && !m->curg->is_g0 ? m->curg->id : 0;
    if (stack_size != s->stack_size) /* after g_init: coloured by its id */
        co__ctx_make(&g->ctx, g->stack.lo, g->stack.size, g, g->fpenv, g->id);
#ifdef CO_TSAN
    co__race_spawn(g); /* after g_init (named after it), before it is queued */
#endif
    /* release: pairs with co_dump's acquire load, which then reads the id
     * and name g_init wrote (a plain store on x86-64) */
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELEASE);
    CO_TRACE(CO__TEV_CREATE, g, 0);
    if (CO_UNLIKELY(!p)) {
        plain_push(g);
        return 0;
    }
    queue_new(p, g, true);
    return 0;
nomem:
    if (!p) live_add(NULL, -1);
    return CO_ENOMEM;
}

static inline int spawn_check(void (*fn)(void *), size_t stack_size) {
    if (!fn) return CO_EINVAL;
    if (stack_size != 0 && (stack_size < CO_STACK_MIN || stack_size > CO_STACK_MAX))
        return CO_EINVAL;
    return co__ensure_init();
}

int co__spawn(void (*fn)(void *), void *arg, size_t stack_size, const char *name) {
    int rc = spawn_check(fn, stack_size);
    if (rc < 0) return rc;
    return spawn_on(getm(), fn, arg, stack_size, name, __builtin_return_address(0));
}

/* ---- back-pressure ------------------------------------------------------ */

/* Spawn back-pressure's test (co__spawn_backpressure): p's queue is full,
 * or the global queue holds a full queue's worth per P. */
static inline bool spawn_queue_full(co_p_t *p) {
    return runq_backlog(p) >= CO_RUNQ_SIZE ||
           __atomic_load_n(&co__sched.runqsize, __ATOMIC_RELAXED) >=
               (int64_t)CO_RUNQ_SIZE * co__sched.nprocs;
}

/* After spawn_yield's switch, on the M that switched away from g. */
static void post_yield_global(co_g_t *g, void *arg) {
    (void)arg;
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
    co__globrunqput(&g, 1);
    /* Every P was busy at spawn_yield's look, but one may have gone idle
     * since (its M found nothing before this put): as every put. */
    wakep_if_idle();
}

/* The back-pressure's yield. When this P's own queue is full, there is
 * more than one P and none is idle: through the global queue, as Go's
 * Gosched. This P runs what the spawner queued, and the first P to run
 * short of work (its own queue empty: it looks at the global queue before
 * it steals), or any P at its every-61st-schedule look there, takes the
 * spawner and spawns there. Otherwise co_yield, behind this P's queue (an
 * idle P's M may steal it from there).
 *
 * Not behind its own full queue: the spawner would come back only after
 * this P ran that queue side by side with the P that stole half of it,
 * both running the same spawner's short coroutines at once (figures in
 * docs/perf-notes.md).
 *
 * A yield forced by the global queue's length alone (spawn_queue_full's
 * other half) stays behind this P's queue: behind the global backlog the
 * spawner would wait for all of it, and each such spawner, one more entry
 * there, would keep the condition true for every other (test_runtime's
 * test_backpressure_global_backlog). Out of line: once per 128 spawns or
 * more. */
static __attribute__((noinline)) void spawn_yield(co_m_t *m) {
    co_p_t *p = m->p;
    if (co__sched.nprocs == 1 || __atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED) != 0 ||
        runq_backlog(p) < CO_RUNQ_SIZE) {
        co_yield();
        return;
    }
    /* (nothing queued here after all, thieves having taken it: it goes on
     * running, as co_yield would) */
    co__yield_slow(m, m->curg, p, post_yield_global);
}

/* Spawn back-pressure. A coroutine that spawns faster than its P runs what
 * it spawns would otherwise pile up new coroutines without bound (C cannot
 * preempt it; sysmon only lends a spare P after 10 ms): every record cold,
 * allocated afresh, in the order of a LIFO. Once its P's queue holds
 * CO_RUNQ_SIZE, the spawner yields instead: it goes behind them, they run
 * (and hand their records and stacks back, hot), and then it goes on. A
 * few hundred coroutines wait per P, not millions. co__spawn itself never
 * yields (its callers may hold a lock); co_go, co_go_with, a pool's submit
 * and co_group_go call this after a successful spawn, holding none. */
static inline __attribute__((always_inline)) void spawn_backpressure_m(co_m_t *m) {
    if (!m || !m->curg || !m->p) return;
    /* Hints: a thief may shorten the queue right after; then the yield is
     * merely early. The global queue counts too: thieves that took this
     * P's coroutines faster than they run them send what does not fit in
     * their own queues there (and a P lent away sends its whole queue), so
     * a spawner whose own queue keeps being emptied could still pile them
     * up there. Its yield then finds its own queue empty and takes a share
     * of the global one (runq_next_fast). */
    if (spawn_queue_full(m->p)) spawn_yield(m);
}

void co__spawn_backpressure(void) { spawn_backpressure_m(getm()); }

static inline __attribute__((always_inline)) int spawn_user(void (*fn)(void *), void *arg,
                                                           size_t stack_size, const char *name,
                                                           void *gopc) {
    int rc = spawn_check(fn, stack_size);
    if (rc < 0) return rc;
    co_m_t *m = getm();
    rc = spawn_on(m, fn, arg, stack_size, name, gopc);
    if (rc == 0) spawn_backpressure_m(m); /* with m at hand */
    return rc;
}

/* The spawner's frame for co_dump's "created by": taken here, in the
 * public entry (spawn_user is inlined), so it is the caller's code. */
int co_go(void (*fn)(void *arg), void *arg) {
    return spawn_user(fn, arg, 0, NULL, __builtin_return_address(0));
}

int co_go_with(const co_attr_t *attr, void (*fn)(void *arg), void *arg) {
    return spawn_user(fn, arg, attr ? attr->stack_size : 0, attr ? attr->name : NULL,
                      __builtin_return_address(0));
}

/* ---- tokens ------------------------------------------------------------- */

/* A coroutine to be, for the pool: the token goes on the caller's P's run
 * queue (the global one from a plain thread) in place of a G, and counts as
 * a live coroutine from now on. A worker that finishes takes it over
 * without any G (co__take_unstarted); whoever takes it to run it makes its
 * G then (token_g), starting t->fn(t). The default stack size only. Never
 * fails: a token needs no memory of its own. */
void co__spawn_token(co__token_t *t) {
    co_m_t *m = getm();
    co_p_t *p = m ? m->p : NULL;
    co__fpenv_store(&t->fpenv); /* as co__spawn: it starts with the spawner's */
#ifdef CO_TSAN
    /* the submitter's past, for whoever starts it (co__race_start, or a
     * takeover below); the token is its job's record, reused only once
     * the job is done */
    __tsan_release(t);
#endif
    co_g_t *e = (co_g_t *)((uintptr_t)t | RQ_TOKEN);
    if (CO_UNLIKELY(!p)) {
        /* Not counted live here: whoever moves the injection stack to the
         * global queue counts the tokens it moves, one RMW per batch
         * (inject_append_locked). Nor checked against a shutdown
         * (co__plain_spawn_enter): a pool holds the runtime up (co__rt_hold),
         * and the default pool's shutdown hook waits for its busy
         * records, this one among them. (In a forked child, queue_new's
         * wake-up is the fatal error: lifecycle.c.) */
        queue_new(NULL, e, false);
        return;
    }
    live_add(p, 1);
    runqput(p, e, false);
    wakep_if_idle();
    /* co__spawn_backpressure, with p at hand (a coroutine spawner only) */
    if (m->curg && spawn_queue_full(p)) spawn_yield(m);
}

/* The G made for a token taken to be run (on p, with the spawner's FP
 * control words). Without memory for that G, the token waits (on tokwait,
 * like a coroutine waiting for a stack) and NULL is returned. */
co_g_t *co__token_g_slow(co_p_t *p, co_g_t *e) {
    co__token_t *t = (co__token_t *)rq_strip(e);
    co_g_t *g = co__test_failing(CO__FAIL_TOKEN_G)
                    ? NULL
                    : g_alloc(p);
    if (CO_UNLIKELY(!g)) {
        static uint32_t warned; /* atomic: say it once per process */
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "colony: no memory for a coroutine record: a pool task waits to "
                            "start (so may others)\n");
        /* It waits for sysmon's next retry (co__stackwait_retry), as a
         * coroutine with no stack does: taken again at once, it would keep
         * an M busy failing while memory is short. */
        co__tokwait_put(t);
        return NULL;
    }
    g->fpenv = t->fpenv;
    g_init(p, g, t->fn, t, NULL);
    g->gopc = NULL; /* a pool task: its entry names the pool's worker */
    g->parent_id = 0;
#ifdef CO_TSAN
    co__race_token_g(g, t);
#endif
    /* release: pairs with co_dump's acquire load, which then reads the id
     * and name g_init wrote (a plain store on x86-64) */
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELEASE);
    return g;
}

/* accept(arg, ctx), the caller's test of a job it may take over. Under
 * TSan its reads are not recorded: it looks, in the scheduler's stead, at
 * jobs that are not the caller's yet and may never be (another pool's
 * record, freed by that pool's owner later). */
static inline bool take_accepts(bool (*accept)(void *arg, void *ctx), void *arg, void *ctx) {
#ifdef CO_TSAN
    __tsan_ignore_thread_begin();
    bool ok = accept(arg, ctx);
    __tsan_ignore_thread_end();
    return ok;
#else
    return accept(arg, ctx);
#endif
}

/* Owner of the P: the coroutine running now takes over the job of the
 * next one its P would run, if that one never ran: it is the head of the
 * owner's batch, or of the ring if the batch is empty (runnext empty: it
 * would run first otherwise), and tagged RQ_FRESH, its entry is fn and
 * accept(arg, ctx) agrees. The caller then takes the FP control words that
 * job was to start with (its spawner's: loading them is cheaper than
 * reading the caller's to compare). The head is a token (its arg is the
 * token itself; no G was ever made) or a G with no stack yet (freed
 * unrun). Its arg is returned: the caller does what fn(arg) would have
 * done, on its own stack, without a switch, a first run and an exit. An
 * untagged head is not touched; a tagged one that fails the rest goes to
 * runnext (as a G), which is empty, so it still runs next. NULL when
 * nothing was taken. Each take counts as a schedule (schedtick), and every
 * 61st is refused so that the scheduler's global-queue check, timers and
 * sysmon see a switch. Entries on the fresh deque, which would run before
 * the ring's head, are passed over: they are spawns too, and taking the
 * ring's first only delays them, as a fairness tick does. */
void *co__take_unstarted(void (*fn)(void *), bool (*accept)(void *arg, void *ctx), void *ctx) {
    co_m_t *m = getm();
    co_p_t *p = m ? m->p : NULL;
    /* A coroutine in the yield slot is older than the ring's head: it goes
     * first (the owner's slot: a relaxed look is exact, or racing a sysmon
     * that empties it, when refusing is harmless). */
    if (!p || !m->curg || __atomic_load_n(&p->runnext, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&p->retire, __ATOMIC_ACQUIRE) || co__yslot_peek(p))
        return NULL;
    uint32_t tick = p->schedtick + 1;
    if (tick % 61 == 0) return NULL;
    /* The next one: the head of the owner's batch if it holds any, else
     * the ring's head, taken as runqget does, but only if its tag says it
     * never ran: a coroutine woken from a park is left alone, untouched. */
    co_g_t *e;
    uint32_t n = __atomic_load_n(&p->obn, __ATOMIC_RELAXED); /* the owner's: exact */
    if (n) {
        /* A P went idle since the claim: let the scheduler's runqget give
         * the batch back (obatch_give_back), where that P can take it;
         * taking it here, a pool's burst ran one task after another on
         * this P while the other sat idle. */
        if (n >= 2 && __atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED)) return NULL;
        if (!co__yslot_open(p)) return NULL; /* retiring meanwhile */
        e = __atomic_load_n(&p->ob[n - 1], __ATOMIC_RELAXED);
        bool fresh = (uintptr_t)e & RQ_FRESH;
        if (fresh) __atomic_store_n(&p->obn, n - 1, __ATOMIC_RELAXED); /* published by the close */
        co__yslot_close(p);
        if (!fresh) return NULL;
        /* as below */
        if (n >= 2) __builtin_prefetch(rq_strip(__atomic_load_n(&p->ob[n - 2], __ATOMIC_RELAXED)));
    } else {
        uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_ACQUIRE);
        if (h == p->runqtail) return NULL;
        e = __atomic_load_n(&p->runq[h % CO_RUNQ_SIZE], __ATOMIC_RELAXED);
        if (!((uintptr_t)e & RQ_FRESH)) return NULL;
        /* cas-release: commits the take; a thief that moved the head wins */
        if (!__atomic_compare_exchange_n(&p->runqhead, &h, h + 1, false, __ATOMIC_RELEASE,
                                         __ATOMIC_RELAXED))
            return NULL;
        /* The next take reads the entry after it (a token's record, written
         * by its submitter, often on another CPU): start that line coming
         * now; the slot may be stale, and a prefetch of any address is
         * harmless. (It pays since workers drain the chute themselves;
         * before, it made the submitter slower: docs/perf-notes.md.) */
        __builtin_prefetch(
            rq_strip(__atomic_load_n(&p->runq[(h + 1) % CO_RUNQ_SIZE], __ATOMIC_RELAXED)));
    }
    if (rq_is_token(e)) {
        co__token_t *t = (co__token_t *)rq_strip(e);
        if (t->fn == fn && take_accepts(accept, t, ctx)) { /* no G made */
#ifdef CO_TSAN
            __tsan_acquire(t); /* its submitter's past (co__spawn_token) */
#endif
            co__fpenv_load(t->fpenv);
            __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED);
            live_add(p, -1);
            m->curg->arg = t; /* what it works on now (co__ready_cold) */
            return t;
        }
        co_g_t *g = co__token_g_slow(p, e); /* it keeps its turn, as a G */
        if (g) __atomic_store_n(&p->runnext, g, __ATOMIC_RELEASE);
        return NULL;
    }
    co_g_t *g = rq_strip(e);
    if (g->fn != fn || g->stack.map || !take_accepts(accept, g->arg, ctx)) {
        /* Only this P's owner ever stores a G into runnext (thieves only
         * take it), so it is still empty: g keeps its turn. */
        __atomic_store_n(&p->runnext, g, __ATOMIC_RELEASE);
        return NULL;
    }
    co__fpenv_load(g->fpenv);
    __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED);
    void *arg = g->arg;
    __atomic_store_n(&g->status, CO_G_DEAD, __ATOMIC_RELAXED);
    live_add(p, -1);
#ifdef CO_TSAN
    co__race_take(g); /* its spawner's past is ours now */
#endif
    co__gfput(p, g);
    m->curg->arg = arg; /* what it works on now (co__ready_cold) */
    return arg;
}
