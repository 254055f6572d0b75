/*
 * The scheduler's private header: the inline helpers its files share, and
 * the functions they call in one another. sched.c (switching, park, ready,
 * yield, the M loop), runq.c (run queues), proc.c (Ps and Ms) and spawn.c
 * (making coroutines) include it; nothing else does.
 *
 * The helpers are inline on purpose: co_yield, a spawn, a park, a ready and
 * a coroutine's exit run them on every switch, and a call there costs each
 * of them. What they call out of line (co__runqputslow, co__globrunqget,
 * co__token_g_slow, ...) are the slow paths.
 */
#ifndef COLONY_RUNTIME_SCHED_IMPL_H
#define COLONY_RUNTIME_SCHED_IMPL_H

#include "runtime/proc.h"
#include "runtime/yslot.h"
#include "runtime/trace.h"

/* Hidden, as defined (sched.c): its fields are read PC-relative, with no
 * load of its address from the GOT first. */
CO_HIDDEN extern co_sched_t co__sched;

/* ---- called across the scheduler's files -------------------------------- */

/* runq.c: the run queues' slow paths and stealing */
/* Owner, ring full: half of it and entry e go to the global queue; false
 * if h and t went stale (the caller looks again). */
CO_HIDDEN bool co__runqputslow(co_p_t *p, co_g_t *e, uint32_t h, uint32_t t);
CO_HIDDEN void co__obatch_give_back(co_p_t *p, uint32_t n);
/* Anyone: the fresh deque's oldest entry, NULL if it is empty. */
CO_HIDDEN co_g_t *co__flifo_steal(co_p_t *p);
/* For tests (tests/t_internal.h): flifo_push and flifo_pop, out of line. */
CO_HIDDEN bool co__test_flifo_push(co_p_t *p, co_g_t *g);
CO_HIDDEN co_g_t *co__test_flifo_pop(co_p_t *p);
/* Owner, every 61st schedule with entries on the fresh deque: the next
 * entry to run as runq_next_fast would, the ring before the deque. */
CO_HIDDEN co_g_t *co__fair_next(co_p_t *p);
CO_HIDDEN co_g_t *co__token_g_or_next(co_p_t *p, co_g_t *e);
/* Take up to max entries of the global queue into p (0: a fair share),
 * one of them returned to run. _locked: sched.lock held, and that one
 * returned as queued (a token not made a G yet). */
CO_HIDDEN co_g_t *co__globrunqget(co_p_t *p, int max);
CO_HIDDEN co_g_t *co__globrunqget_locked(co_p_t *p, int max);
CO_HIDDEN co_g_t *co__stealwork(co_m_t *m); /* g0: half of another P's queue */
/* proc.c: Ps and Ms */
CO_HIDDEN void co__block_idle(co_m_t *m);        /* a P-less M sleeps until there may be work */
CO_HIDDEN void co__retire_p_nowake(co_m_t *m);   /* co__retire_p without its wake-up */
/* sched.c */
CO_HIDDEN void *co__mstart(void *m);             /* an M's thread */
/* A yield that does not use the yield slot: post requeues g after the
 * switch. */
CO_HIDDEN void co__yield_slow(co_m_t *m, co_g_t *g, co_p_t *p, void (*post)(co_g_t *, void *));
/* spawn.c */
CO_HIDDEN co_g_t *co__token_g_slow(co_p_t *p, co_g_t *e); /* a token's G; NULL: it waits */

/* ---- the current M ------------------------------------------------------ */

/* This thread's M (NULL on a plain thread), defined in sched.c.
 * initial-exec: a fixed offset from the thread pointer, no __tls_get_addr.
 * A dlopen()ed libcolony.so still loads: glibc keeps static TLS room for
 * a few words like these. */
CO_HIDDEN extern __thread co_m_t *co__tls_m __attribute__((tls_model("initial-exec")));

/* The scheduler's own reads of co__tls_m, inline. On x86-64 an asm
 * volatile load of the thread-pointer-relative slot: the compiler can
 * neither cache it nor the thread's TLS address across a switch (the
 * reason co__getm is a call), and the switch paths save two calls. */
#if defined(__x86_64__) && defined(__ELF__)
static inline __attribute__((always_inline)) co_m_t *getm(void) {
    co_m_t *m;
    __asm__ volatile("movq co__tls_m@gottpoff(%%rip), %0\n\tmovq %%fs:(%0), %0"
                     : "=r"(m)
                     :
                     : "memory");
    return m;
}
#else
#define getm() co__getm()
#endif

/* ---- counts, wake-ups, Ps ----------------------------------------------- */

/* A coroutine starts (+1) or ends (-1) on p (NULL: no P, the global
 * count). p's count is written by its owner only: a relaxed store, read by
 * co_count. */
static inline void live_add(co_p_t *p, int d) {
    if (p)
        __atomic_store_n(&p->ngo, p->ngo + d, __ATOMIC_RELAXED);
    else
        co__live_global_add(d); /* lifecycle.c: see live_global there */
}

/* co__wakep's own first checks, inline: nothing to do unless a P is idle
 * and no M spins (it checks them again). */
static inline void wakep_if_idle(void) {
    if (__atomic_load_n(&co__sched.npidle, __ATOMIC_SEQ_CST) != 0 &&
        __atomic_load_n(&co__sched.nmspinning, __ATOMIC_SEQ_CST) == 0)
        co__wakep();
}

/* A plain thread (or an M without a P) makes g runnable: the injection
 * stack, then the wake-up, holding the scheduler across both (see
 * co__plain_ready_begin): a spawned G (counted live by
 * co__plain_spawn_enter) or a woken one. */
static inline void plain_push(co_g_t *g) {
    co__plain_ready_begin();
    if (CO_UNLIKELY(co__timer_ready_front))
        co__globrunqput_front(g); /* a timer fired late, off its P: run it next */
    else
        co__globrunq_inject(g);
    wakep_if_idle();
    co__plain_ready_end();
}

/* m takes p, to run its coroutines. */
static inline void acquirep(co_m_t *m, co_p_t *p) {
    if (CO_UNLIKELY(m->transit)) co__transit_end(m);
    CO_TRACE(CO__TEV_P_ACQUIRE, p->id, 0);
    m->p = p;
    p->m = m;
    co__p_owner_hint(p, m);
    /* A new owner schedules: sysmon must not take a P that sat idle (its
     * schedtick unchanged for long) for one stuck in a coroutine. Relaxed:
     * only the owner writes it, sysmon compares it between rounds. */
    __atomic_store_n(&p->schedtick, p->schedtick + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&p->status, CO_P_RUNNING, __ATOMIC_RELEASE);
}

/* sched.lock held. p goes on the idle list. */
static inline void pidleput_locked(co_p_t *p) {
    CO_TRACE(CO__TEV_P_RELEASE, p->id, 0);
    co_sched_t *s = &co__sched;
    /* an M holding Gs that only it may run waits for a P: this one */
    if (CO_UNLIKELY(s->naffq > 0) && co__affine_handoff_locked(p)) return;
    p->m = NULL;
    /* sysmon's request to yield was for the coroutine that ran here: none
     * does now (left set, every I/O call would look at it until sysmon
     * next saw p schedule) */
    co__preempt_clear(p);
    __atomic_store_n(&p->status, CO_P_IDLE, __ATOMIC_RELEASE);
    p->link = s->pidle;
    s->pidle = p;
    __atomic_store_n(&s->npidle, s->npidle + 1, __ATOMIC_SEQ_CST);
}

/* ---- run queues: the owner's fast operations (runq.c has the rest) ------ */

/* Entry e as a ring holds it: tagged RQ_FRESH if it never ran (a token,
 * or a G with no stack yet). */
static inline co_g_t *rq_tag(co_g_t *e) {
    if (rq_is_token(e) || !e->stack.map) return (co_g_t *)((uintptr_t)e | RQ_FRESH);
    return e;
}
/* A run-queue entry taken to be run: a G as it is, or the G made for a
 * token (co__token_g_slow). */
static inline __attribute__((always_inline)) co_g_t *token_g(co_p_t *p, co_g_t *e) {
    if (CO_LIKELY(!rq_is_token(e))) return rq_strip(e);
    return co__token_g_slow(p, e);
}

/* Owner only: entry e, tagged as it is to stay, at the ring's tail, with
 * sp for runq_sp; if the ring is full, half of it and e go to the global
 * queue. */
static inline __attribute__((always_inline)) void runq_push(co_p_t *p, co_g_t *e, void *sp) {
    for (;;) {
        /* load-acquire: synchronize with consumers advancing head */
        uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_ACQUIRE);
        uint32_t t = p->runqtail;
        if (t - h < CO_RUNQ_SIZE) {
            p->runq_sp[t % CO_RUNQ_SIZE] = sp;
            __atomic_store_n(&p->runq[t % CO_RUNQ_SIZE], e, __ATOMIC_RELAXED);
            /* store-release: makes the item available for consumption */
            __atomic_store_n(&p->runqtail, t + 1, __ATOMIC_RELEASE);
            return;
        }
        if (co__runqputslow(p, e, h, t)) return;
    }
}

/* Owner only. next=true puts g in runnext, kicking the old one to the tail.
 * ran: g is known to have run (a yield), so it needs no tag. */
static inline __attribute__((always_inline)) void runqput_(co_p_t *p, co_g_t *g, bool next,
                                                          bool ran) {
    if (next) {
        /* An empty runnext is filled with a plain store: only the owner
         * makes it non-empty (thieves only empty it), so nobody can race
         * this store; release pairs with thieves' acquire. A channel
         * ping-pong readies into an empty runnext every message: one
         * locked instruction fewer each. */
        if (!__atomic_load_n(&p->runnext, __ATOMIC_RELAXED)) {
            __atomic_store_n(&p->runnext, g, __ATOMIC_RELEASE);
            return;
        }
        /* acq_rel: pairs with thieves' CAS of runnext */
        co_g_t *old = __atomic_exchange_n(&p->runnext, g, __ATOMIC_ACQ_REL);
        if (!old) return;
        g = old;
    }
    co_g_t *e = ran ? g : rq_tag(g);
    /* e untagged: g has a stack, and is ours until the tail's store */
    runq_push(p, e, e == g ? g->ctx.sp : NULL);
}
static inline __attribute__((always_inline)) void runqput(co_p_t *p, co_g_t *g, bool next) {
    runqput_(p, g, next, false);
}

/* Owner, having taken an entry: while the G just taken runs, start the
 * lines of the next one's stack coming that it returns through when it
 * resumes (a G that parked long ago: all cold, and each return would wait
 * for its line in turn). sp, its saved stack pointer, comes from runq_sp
 * (or ob_sp), written when the owner queued it: reading the G
 * itself would be a read of a record this M does not own (a thief may
 * take it, run it to its end, and the record be freed). */
static inline __attribute__((always_inline)) void prefetch_stack(char *sp) {
    if (sp)
        for (int k = 0; k < 10; k++) __builtin_prefetch(sp + 64 * k);
}

/* Start the record of run-queue entry e coming, before it runs: a G's for
 * writing (its status and more are written when it runs), a token's (a
 * pool task's record) for reading, as its submitter may write the same
 * lines again meanwhile (taken exclusive, the line would bounce between
 * them). */
static inline __attribute__((always_inline)) void prefetch_entry(co_g_t *e) {
    if (rq_is_token(e))
        __builtin_prefetch(rq_strip(e));
    else
        co__prefetchw(rq_strip(e));
}

/* The owner's batch (p->ob, proc.h). The ring's head is shared with
 * thieves, so the owner takes it with a locked CAS; with the ring long
 * enough, runqget takes CO_OBATCH entries in that one CAS and runs the
 * rest of them from the batch, with plain loads and stores.
 *
 * What it costs: thieves cannot take the batch. The ring keeps at least
 * as many entries as the batch holds (a batch is claimed only from a ring
 * of 2 * CO_OBATCH or more), no batch is claimed while a P is idle (its M
 * would be woken to steal them), and one that goes idle later gets the
 * rest at the owner's next pop (co__obatch_give_back). But a
 * coroutine that runs long without entering the scheduler holds up the
 * batch behind it, as it holds up the yield slot: sysmon takes both from
 * it when it lends its P away (10 ms, co__yslot_steal), by the same
 * handshake, so the owner's pops stay plain: each is made inside a
 * yield-slot window. Without membarrier (no yield slot), no batch. */
static inline __attribute__((always_inline)) bool obatch_fits(co_p_t *p, uint32_t h, uint32_t t) {
    return t - h >= 2 * CO_OBATCH && __atomic_load_n(&co__yslot_on, __ATOMIC_RELAXED) &&
           !__atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED);
}

/* Work-first. A fork-join parent spawns its first child into runnext and
 * its second one behind it, then waits; the children do the same. With
 * the second children at the ring's tail, the P runs the ring's head
 * next: the oldest second child, the largest subtree left, which opens
 * the tree breadth-first and parks a chain of parents (each on a stack of
 * its own) for every subtree it opens. So a spawn that finds runnext taken
 * goes on the P's fresh deque (p->fl), which the owner runs newest first,
 * after runnext and the batch and before the ring, and thieves take
 * oldest first: the subtree just opened is finished first, a P holds
 * about one chain of parents, and a thief takes the largest subtree left
 * (Cilk's order). It is a deque of its own, not the ring's other end: the
 * ring's batch steals take half of it by one CAS of runqhead from a
 * runqtail read before, which an owner's pop at the tail would race.
 *
 * Before the ring, not after it: a fork-join's ring holds what must not
 * open early (a subtree the bounds below moved there), and a spawner
 * that yields behind its ring (back-pressure) would come back before its
 * children ran (docs/perf-notes.md). The yield slot runs before the
 * deque: so a spawn does not go on the deque while the slot holds a
 * coroutine, and a yielder goes in the slot only with the deque empty
 * (yield_requeue), which keeps the deque out of the slot's swap,
 * co_yield's fast path.
 *
 * Bounds, for fairness. The deque holds CO_FLIFO entries; a spawn beyond
 * goes to the ring's tail. Every 61st schedule (runq_next_fast) takes the
 * ring before the deque, so nothing queued in the ring waits behind a
 * stream of spawns; and an oldest entry that stays the oldest for
 * CO_FLIFO_AGE such ticks, then twice as many for the next, ... (up to
 * CO_FLIFO_AGE_MAX), goes to the ring's tail (runq.c's flifo_fair), so a
 * spawner that keeps the deque from ever emptying (a loop that forks and
 * joins for ever) cannot keep an older spawn from running for ever. Either move opens a subtree early, and a
 * chain of parents parks for it: too many such moves (a smaller deque,
 * a fixed age) opened the fork-join breadth-first again
 * (docs/perf-notes.md). */
#define CO_FLIFO_AGE 1024
/* The limit's doubling stops here: each spawn below such a loop then waits
 * at most this many ticks longer than the one before it (runq.c). */
#define CO_FLIFO_AGE_MAX (CO_FLIFO_AGE << 3)

/* Owner, a spawn found runnext taken: g onto the fresh deque; false if it
 * is full or the yield slot is taken (the caller queues g on the ring). */
static inline __attribute__((always_inline)) bool flifo_push(co_p_t *p, co_g_t *g) {
    uint32_t b = p->flbot; /* the owner's own */
    /* acquire (a plain load on x86-64): pairs with the release of a
     * thief's CAS of fltop, so that its load of the slot it took happens
     * before this push writes that slot again, CO_FLIFO pushes later (as
     * runq_push loads runqhead). A stale fltop only makes the deque look
     * fuller. The yield slot's swap does not look at the deque (above). */
    if (b - __atomic_load_n(&p->fltop, __ATOMIC_ACQUIRE) >= CO_FLIFO || co__yslot_peek(p))
        return false;
    __atomic_store_n(&p->fl[b % CO_FLIFO], g, __ATOMIC_RELAXED);
    /* release (a plain store on x86-64): publishes the slot and g's fields
     * to a thief's acquire load of flbot (after its seq_cst fence). No
     * thief can take slot b until it sees this store. */
    __atomic_store_n(&p->flbot, b + 1, __ATOMIC_RELEASE);
    return true;
}

/* Owner: the fresh deque's newest entry, NULL if it is empty. */
static inline __attribute__((always_inline)) co_g_t *flifo_pop(co_p_t *p) {
    uint32_t b = p->flbot; /* the owner's own */
    /* relaxed: only the owner adds entries, so an empty deque stays empty */
    if (b == __atomic_load_n(&p->fltop, __ATOMIC_RELAXED)) return NULL;
    b--;
    /* store, seq_cst fence, load (pairs with the fence in
     * co__flifo_steal): a thief that reads the old flbot has loaded
     * fltop before this store, and its CAS of fltop fails if this load
     * sees fltop past it. A fence, not a seq_cst store and load: those
     * are enough on x86-64 and AArch64, but qemu-user runs AArch64's
     * stlr and ldar on an x86-64 host without ordering the store before
     * the load, and an owner and a thief then took the same entry. */
    __atomic_store_n(&p->flbot, b, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint32_t t = __atomic_load_n(&p->fltop, __ATOMIC_RELAXED);
    if ((int32_t)(b - t) < 0) { /* a thief took the last one */
        __atomic_store_n(&p->flbot, b + 1, __ATOMIC_RELAXED);
        return NULL;
    }
    co_g_t *g = __atomic_load_n(&p->fl[b % CO_FLIFO], __ATOMIC_RELAXED);
    if (b != t) return g; /* more than one: the thieves' end is elsewhere */
    /* the last one: the owner and a thief race for it by fltop's CAS */
    bool won = __atomic_compare_exchange_n(&p->fltop, &t, t + 1, false, __ATOMIC_SEQ_CST,
                                           __ATOMIC_RELAXED);
    __atomic_store_n(&p->flbot, b + 1, __ATOMIC_RELAXED);
    return won ? g : NULL;
}

/* Owner only: the next entry to run, NULL if none is queued. fresh_first:
 * the fresh deque before the ring (all but co__fair_next). */
static inline __attribute__((always_inline)) co_g_t *runqget_(co_p_t *p, bool fresh_first) {
    co_g_t *next = __atomic_load_n(&p->runnext, __ATOMIC_ACQUIRE);
    if (next && __atomic_compare_exchange_n(&p->runnext, &next, NULL, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
        return next;
    co_g_t *e;
    /* relaxed: only the owner makes it non-zero (a retiring P's batch
     * being taken meanwhile is caught by the window) */
    uint32_t n = __atomic_load_n(&p->obn, __ATOMIC_RELAXED);
    if (n && co__yslot_open(p)) {
        e = __atomic_load_n(&p->ob[n - 1], __ATOMIC_RELAXED);
        if (n >= 2) prefetch_stack(p->ob_sp[n - 2]);
        if (CO_UNLIKELY(n >= 2 && __atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED))) {
            co__obatch_give_back(p, n - 1); /* closes the window */
            goto got;
        }
        __atomic_store_n(&p->obn, n - 1, __ATOMIC_RELAXED); /* published by the close */
        co__yslot_close(p);
        goto got;
    }
    if (fresh_first && (e = flifo_pop(p))) return e;
    for (;;) {
        uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_ACQUIRE);
        uint32_t t = p->runqtail;
        if (t == h) return fresh_first ? NULL : flifo_pop(p);
        e = __atomic_load_n(&p->runq[h % CO_RUNQ_SIZE], __ATOMIC_RELAXED);
        if (CO_UNLIKELY(obatch_fits(p, h, t)) && co__yslot_open(p)) {
            /* The batch is empty (we just looked, and only the owner fills
             * it): fill it before the CAS; it counts only once obn is set. */
            for (uint32_t i = 1; i < CO_OBATCH; i++) {
                uint32_t j = (h + i) % CO_RUNQ_SIZE;
                co_g_t *b = __atomic_load_n(&p->runq[j], __ATOMIC_RELAXED);
                __atomic_store_n(&p->ob[CO_OBATCH - 1 - i], b, __ATOMIC_RELAXED);
                p->ob_sp[CO_OBATCH - 1 - i] = p->runq_sp[j];
            }
            /* cas-release: commits the consume, as below */
            bool won = __atomic_compare_exchange_n(&p->runqhead, &h, h + CO_OBATCH, false,
                                                   __ATOMIC_RELEASE, __ATOMIC_RELAXED);
            if (won) __atomic_store_n(&p->obn, CO_OBATCH - 1, __ATOMIC_RELAXED);
            co__yslot_close(p);
            if (!won) continue;
            /* Their records are likely cold (queued long ago, maybe by
             * another CPU): start them all coming at once. */
            for (uint32_t i = 0; i < CO_OBATCH - 1; i++) prefetch_entry(p->ob[i]);
            prefetch_stack(p->ob_sp[CO_OBATCH - 2]);
            goto got;
        }
        if (__atomic_compare_exchange_n(&p->runqhead, &h, h + 1, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED)) {
            /* The G after it is likely cold (queued long ago): start its
             * first line coming. The slot may be stale; a prefetch of any
             * address is harmless. */
            prefetch_entry(__atomic_load_n(&p->runq[(h + 2) % CO_RUNQ_SIZE], __ATOMIC_RELAXED));
            if (t - h >= 2) prefetch_stack(p->runq_sp[(h + 1) % CO_RUNQ_SIZE]);
            goto got;
        }
    }
got:
    if (CO_LIKELY(!rq_is_token(e))) return rq_strip(e);
    return co__token_g_or_next(p, e);
}
static inline __attribute__((always_inline)) co_g_t *runqget(co_p_t *p) {
    return runqget_(p, true);
}

/* Nothing a thief could take: the ring, the fresh deque and runnext. */
static inline bool runq_nothing_to_steal(co_p_t *p) {
    uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_ACQUIRE);
    uint32_t t = __atomic_load_n(&p->runqtail, __ATOMIC_ACQUIRE);
    return h == t && __atomic_load_n(&p->runnext, __ATOMIC_ACQUIRE) == NULL &&
           __atomic_load_n(&p->fltop, __ATOMIC_ACQUIRE) ==
               __atomic_load_n(&p->flbot, __ATOMIC_ACQUIRE);
}

/* What is queued on p but the fresh deque: the ring, runnext, the yield
 * slot and the owner's batch (spawn back-pressure's measure: the deque
 * has a bound of its own, beyond which spawns go to the ring). A snapshot
 * (relaxed loads): exact only for the owner, a hint for anyone else. */
static inline int runq_backlog(co_p_t *p) {
    uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_RELAXED);
    uint32_t t = __atomic_load_n(&p->runqtail, __ATOMIC_RELAXED);
    return (int)(t - h) + (__atomic_load_n(&p->runnext, __ATOMIC_RELAXED) ? 1 : 0) +
           (co__yslot_peek(p) ? 1 : 0) + (int)__atomic_load_n(&p->obn, __ATOMIC_RELAXED);
}
/* All that is queued on p, the fresh deque too. */
static inline int runq_len(co_p_t *p) {
    return runq_backlog(p) + (int)(__atomic_load_n(&p->flbot, __ATOMIC_RELAXED) -
                                   __atomic_load_n(&p->fltop, __ATOMIC_RELAXED));
}

/* The next G for p without blocking or stealing: due timers, 1-in-61 global,
 * runnext, the owner's batch, the fresh deque, local ring, global (the
 * ring before the fresh deque 1 in 61: co__fair_next). p's owner only; p may be NULL. */
static inline __attribute__((always_inline)) co_g_t *runq_next_fast(co_p_t *p) {
    if (!p) return NULL;
    /* A lent-away P: go to g0, which retires it. */
    if (CO_UNLIKELY(__atomic_load_n(&p->retire, __ATOMIC_RELAXED))) return NULL;
    /* relaxed store: sysmon reads it to spot a P that stopped scheduling */
    uint32_t tick = p->schedtick + 1;
    __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED);
    co_g_t *g;
    if (CO_UNLIKELY(tick % 61 == 0)) {
        /* fairness: Gs sent back to this M (co_thread_return) first */
        co_m_t *m = getm();
        if (CO_UNLIKELY(__atomic_load_n(&m->affq, __ATOMIC_RELAXED) != NULL) &&
            (g = co__affq_take(m)))
            return g;
        /* another M asleep with Gs only it may run, and no idle P (a P
         * going idle would have gone to it): to g0, which hands this P
         * over (findrunnable, co__relieve_stranded) */
        if (CO_UNLIKELY(__atomic_load_n(&co__sched.nstranded, __ATOMIC_RELAXED) != 0)) return NULL;
        /* the ring before the fresh deque, this once (runq.c) */
        if (p->flbot != __atomic_load_n(&p->fltop, __ATOMIC_RELAXED)) return co__fair_next(p);
    }
    /* The global queue's front list (a late timer's coroutine, one back
     * from co_blocking) is looked at every time, the rest 1 in 61. */
    if ((tick % 61 == 0 || CO_UNLIKELY(__atomic_load_n(&co__sched.front_pending, __ATOMIC_RELAXED))) &&
        (g = co__globrunqget(p, 1)))
        return g;
    /* The yield slot is older than the ring, runnext comes first (yslot.h) */
    if (co__yslot_peek(p) && !__atomic_load_n(&p->runnext, __ATOMIC_RELAXED) &&
        co__yslot_open(p)) {
        g = __atomic_load_n(&p->yieldg, __ATOMIC_RELAXED); /* window open: exact */
        __atomic_store_n(&p->yieldg, NULL, __ATOMIC_RELAXED);
        co__yslot_close(p);
        if (g) return g;
    }
    if ((g = runqget(p))) return g;
    return co__globrunqget(p, 0);
}


#endif
