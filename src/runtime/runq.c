/*
 * The per-P run queues: Go's lock-free 256-slot ring per P and its runnext
 * slot, beside the global queue under sched.lock (globq.c), which a P
 * checks first every 61 schedticks for fairness. The owner's fast
 * operations (runqput, runqget, runq_next_fast) are inline in
 * sched_impl.h; here are the ring's slow paths, the looks other files take
 * at the queues, the pulls from the global queue into a P, and stealing.
 */
#include "runtime/sched_impl.h"

#include <time.h>

/* ---- the ring's slow paths ---------------------------------------------- */

/* Owner only: queue full, move half of it plus entry e to the global
 * queue. */
bool co__runqputslow(co_p_t *p, co_g_t *e, uint32_t h, uint32_t t) {
    enum { N = CO_RUNQ_SIZE / 2 };
    co_g_t *batch[N + 1];
    uint32_t n = (t - h) / 2;
    if (n != N) return false;
    for (uint32_t i = 0; i < n; i++)
        batch[i] = rq_unfresh(__atomic_load_n(&p->runq[(h + i) % CO_RUNQ_SIZE], __ATOMIC_RELAXED));
    /* cas-release: commits consume */
    if (!__atomic_compare_exchange_n(&p->runqhead, &h, h + n, false, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED))
        return false;
    batch[n] = rq_unfresh(e);
    co__globrunqput(batch, (int)n + 1);
    return true;
}

/* Owner, in a window, the batch's first n entries still to run: a P has
 * gone idle since the batch was claimed. They go back to the ring's tail,
 * in order, where that P's M can steal them; without this, a burst of
 * computations claimed by one P would run one after another there while
 * the other P sat idle (until sysmon lends the P away, 10 ms into one of
 * them). Out of line: rare. */
__attribute__((noinline)) void co__obatch_give_back(co_p_t *p, uint32_t n) {
    co_g_t *gs[CO_OBATCH];
    void *sps[CO_OBATCH];
    for (uint32_t i = 0; i < n; i++) {
        gs[i] = __atomic_load_n(&p->ob[n - 1 - i], __ATOMIC_RELAXED);
        sps[i] = p->ob_sp[n - 1 - i];
    }
    __atomic_store_n(&p->obn, 0, __ATOMIC_RELAXED); /* published by the close */
    co__yslot_close(p);
    for (uint32_t i = 0; i < n; i++) runq_push(p, gs[i], sps[i]);
    co__wakep();
}

co_g_t *co__flifo_steal(co_p_t *p) {
    for (;;) {
        /* fltop, a seq_cst fence (pairs with flifo_pop's), then flbot
         * (acquire: pairs with flifo_push's release, for the slot) */
        uint32_t t = __atomic_load_n(&p->fltop, __ATOMIC_ACQUIRE);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        uint32_t b = __atomic_load_n(&p->flbot, __ATOMIC_ACQUIRE);
        if ((int32_t)(b - t) <= 0) return NULL;
        /* may be overwritten meanwhile once the owner wraps past t: then
         * fltop has moved and the CAS fails */
        co_g_t *g = __atomic_load_n(&p->fl[t % CO_FLIFO], __ATOMIC_RELAXED);
        if (__atomic_compare_exchange_n(&p->fltop, &t, t + 1, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED))
            return g;
    }
}

void co__flifo_move(co_p_t *p, co_p_t *np) {
    for (co_g_t *g; (g = co__flifo_steal(p));)
        if (!flifo_push(np, g)) {
            g = rq_unfresh(g);
            co__globrunqput(&g, 1);
        }
}

/* Every 61st schedule with entries on the fresh deque: an oldest entry
 * seen there at fl_limit such looks in a row goes to the ring's tail,
 * which these looks take before the deque. Each such move doubles fl_limit (the one
 * after it is the next oldest, seen once more), so that a long fork-join,
 * whose first spawn is rightly the oldest for half of its run, has a
 * subtree opened early only a few times in all (each parks one more chain
 * of parents); an oldest entry that leaves on its own (run, or taken by a
 * thief) sets it back. The doubling stops at CO_FLIFO_AGE_MAX: unbounded,
 * the k-th of k spawns below a loop that forks and joins for ever waited
 * 2^k times the first one's wait, so a few dozen never ran. The pointer
 * compare may mistake a recycled G for the same one: it then moves a
 * little early. */
static void flifo_fair(co_p_t *p) {
    co_g_t *old = __atomic_load_n(&p->fl[__atomic_load_n(&p->fltop, __ATOMIC_RELAXED) % CO_FLIFO],
                                  __ATOMIC_RELAXED); /* a hint: a thief may take it */
    if (!p->fl_limit) p->fl_limit = CO_FLIFO_AGE;
    if (old != p->fl_seen) {
        p->fl_seen = old;
        p->fl_age = 0;
        p->fl_limit = CO_FLIFO_AGE;
        return;
    }
    if (++p->fl_age < p->fl_limit) return;
    co_g_t *g = co__flifo_steal(p);
    if (g) runq_push(p, rq_tag(g), NULL);
    p->fl_age = 0;
    if (p->fl_limit < CO_FLIFO_AGE_MAX) p->fl_limit *= 2;
    p->fl_seen = __atomic_load_n(&p->fl[__atomic_load_n(&p->fltop, __ATOMIC_RELAXED) % CO_FLIFO],
                                 __ATOMIC_RELAXED);
}

/* The yield slot is not looked at: while it holds a coroutine, nothing
 * goes on the deque (sched_impl.h). */
co_g_t *co__fair_next(co_p_t *p) {
    flifo_fair(p);
    co_g_t *g = co__globrunqget(p, 1);
    if (g) return g;
    if ((g = runqget_(p, false))) return g;
    return co__globrunqget(p, 0);
}

/* runqget's token taken from the ring: its G, or, with no memory for one
 * (the token then waits on tokwait), the ring's next entry: NULL would
 * tell the caller the ring is empty. Out of line: the loop would cost
 * every runqget a register. */
__attribute__((noinline)) co_g_t *co__token_g_or_next(co_p_t *p, co_g_t *e) {
    co_g_t *g = co__token_g_slow(p, e);
    return g ? g : runqget(p);
}

/* ---- looks at the queues ------------------------------------------------ */

/* Nothing queued at all: the ring, the fresh deque, runnext, the yield
 * slot and the owner's batch. */
bool co__runq_empty(co_p_t *p) {
    return runq_nothing_to_steal(p) && !co__yslot_peek(p) &&
           !__atomic_load_n(&p->obn, __ATOMIC_RELAXED);
}

int co__runq_len(co_p_t *p) { return runq_len(p); }

/* Sysmon's safety net against a lost wake-up: a P is idle, no M is
 * spinning, and yet there is work a woken M would take (the global queue,
 * or a ring or fresh deque with entries). Relaxed loads: a hint, and
 * co__wakep re-checks. */
bool co__work_stranded(void) {
    co_sched_t *s = &co__sched;
    if (__atomic_load_n(&s->npidle, __ATOMIC_RELAXED) == 0 ||
        __atomic_load_n(&s->nmspinning, __ATOMIC_RELAXED) != 0)
        return false;
    if (co__globrunq_pending(__ATOMIC_RELAXED)) return true;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *p = co__allp(i);
        if (__atomic_load_n(&p->runqhead, __ATOMIC_RELAXED) !=
                __atomic_load_n(&p->runqtail, __ATOMIC_RELAXED) ||
            __atomic_load_n(&p->fltop, __ATOMIC_RELAXED) !=
                __atomic_load_n(&p->flbot, __ATOMIC_RELAXED))
            return true;
        /* An idle P's runnext: nobody runs it but a thief (a busy P's is
         * its owner's to run, and waking a thief for it would only move
         * it). None should be left there (co__startm moves it when it
         * finds no M), but a woken M's last round of stealing takes it. */
        if (__atomic_load_n(&p->status, __ATOMIC_RELAXED) == CO_P_IDLE &&
            __atomic_load_n(&p->runnext, __ATOMIC_RELAXED))
            return true;
    }
    return false;
}

/* ---- the global queue, into a P ----------------------------------------- */

/* sched.lock held. Take up to max Gs (0: a fair share) into p. */
co_g_t *co__globrunqget_locked(co_p_t *p, int max) {
    int n = co__globrunq_share_locked(max);
    if (n == 0) return NULL;
    /* in batches of a few: this may run on a coroutine's stack */
    co_g_t *batch[16], *g = NULL;
    while (n > 0) {
        int k = n < 16 ? n : 16, i = 0;
        co__globrunq_pop_n_locked(batch, k);
        if (!g) g = batch[i++];
        for (; i < k; i++) runqput(p, batch[i], false);
        n -= k;
    }
    return g;
}

co_g_t *co__globrunqget(co_p_t *p, int max) {
    co_sched_t *s = &co__sched;
    if (!co__globrunq_pending(__ATOMIC_ACQUIRE)) return NULL;
    bool moved = co__globq_lock();
    co_g_t *g = co__globrunqget_locked(p, max);
    bool more = moved && s->runqsize > 0; /* beyond our share: see co__globq_lock */
    co__unlock(&s->lock);
    if (more) co__wakep();
    return token_g(p, g);
}

/* ---- stealing ----------------------------------------------------------- */

/* Any M: grab half of pp's queue into batch[bh..] (ring of size 256),
 * ring entries with their tags (see RQ_FRESH). */
static uint32_t runqgrab(co_p_t *pp, co_g_t **batch, uint32_t bh, bool steal_next) {
    for (;;) {
        uint32_t h = __atomic_load_n(&pp->runqhead, __ATOMIC_ACQUIRE);
        uint32_t t = __atomic_load_n(&pp->runqtail, __ATOMIC_ACQUIRE);
        uint32_t n = t - h;
        n = n - n / 2;
        if (n == 0) {
            if (steal_next) {
                co_g_t *next = __atomic_load_n(&pp->runnext, __ATOMIC_ACQUIRE);
                if (next) {
                    /* Let a running P that just readied a G switch to it
                     * first (proc.go's usleep(3) before stealing runnext). */
                    if (__atomic_load_n(&pp->status, __ATOMIC_RELAXED) == CO_P_RUNNING) {
                        struct timespec ts = {0, 3000};
                        nanosleep(&ts, NULL);
                    }
                    if (!__atomic_compare_exchange_n(&pp->runnext, &next, NULL, false,
                                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                        continue;
                    batch[bh % CO_RUNQ_SIZE] = next;
                    return 1;
                }
            }
            return 0;
        }
        if (n > CO_RUNQ_SIZE / 2) continue; /* read an inconsistent h and t */
        for (uint32_t i = 0; i < n; i++)
            batch[(bh + i) % CO_RUNQ_SIZE] =
                __atomic_load_n(&pp->runq[(h + i) % CO_RUNQ_SIZE], __ATOMIC_RELAXED);
        if (__atomic_compare_exchange_n(&pp->runqhead, &h, h + n, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return n;
    }
}

/* Owner of p: steal half of pp's queue into p's, return one G to run. */
static co_g_t *runqsteal(co_p_t *p, co_p_t *pp, bool steal_next) {
    uint32_t t = p->runqtail;
    co_g_t *tmp[CO_RUNQ_SIZE];
    uint32_t n = runqgrab(pp, tmp, 0, false);
    if (n == 0) { /* the fresh deque's oldest, then runnext (runqgrab's last round) */
        co_g_t *g = co__flifo_steal(pp);
        if (g) return g;
        if (steal_next) n = runqgrab(pp, tmp, 0, true);
        if (n == 0) return NULL;
    }
    n--;
    co_g_t *g = token_g(p, tmp[n]);
    /* Thieves steal with an empty queue, but never trust it: a ring written
     * past its free slots overwrites queued Gs. What does not fit goes to
     * the global queue. */
    uint32_t room = CO_RUNQ_SIZE - (t - __atomic_load_n(&p->runqhead, __ATOMIC_ACQUIRE));
    uint32_t keep = n < room ? n : room;
    for (uint32_t i = 0; i < keep; i++)
        __atomic_store_n(&p->runq[(t + i) % CO_RUNQ_SIZE], tmp[i], __ATOMIC_RELAXED);
    if (keep) __atomic_store_n(&p->runqtail, t + keep, __ATOMIC_RELEASE);
    if (keep < n) {
        for (uint32_t i = keep; i < n; i++) tmp[i] = rq_unfresh(tmp[i]);
        co__globrunqput(tmp + keep, (int)(n - keep));
    }
    return g;
}

/* g0 of m, which holds a P: steal from the other Ps (their due timers
 * run first, in the last round). */
co_g_t *co__stealwork(co_m_t *m) {
    co_sched_t *s = &co__sched;
    int n = s->nprocs;
    if (CO_UNLIKELY(s->chaos) && co__fastrand() % 64 == 0) { /* COLONY_DEBUG=chaos */
        struct timespec ts = {0, (long)(1 + co__fastrand() % 15) * 1000000};
        nanosleep(&ts, NULL);
    }
    for (int round = 0; round < 4; round++) {
        bool last = round == 3;
        uint32_t start = co__fastrand() % (uint32_t)n;
        for (int i = 0; i < n; i++) {
            co_p_t *pp = co__allp((int)((start + (uint32_t)i) % (uint32_t)n));
            if (pp == m->p) continue;
            if (last && __atomic_load_n(&pp->timer0_when, __ATOMIC_ACQUIRE) != 0) {
                int64_t now = co_now();
                int64_t w = __atomic_load_n(&pp->timer0_when, __ATOMIC_ACQUIRE);
                if (w && w <= now && co__timers_run(pp, now) > 0) {
                    co_g_t *g = runqget(m->p);
                    if (g) return g;
                }
            }
            co_g_t *g = runqsteal(m->p, pp, last);
            if (g) CO_TRACE(CO__TEV_STEAL, g, pp->id);
            if (g) return g;
        }
    }
    return NULL;
}

/* Any M: move every G queued on p (ring, fresh deque and runnext) to the
 * global queue. */
void co__runq_drain_global(co_p_t *p) {
    co_g_t *batch[CO_RUNQ_SIZE];
    for (co_g_t *g; (g = co__flifo_steal(p));) {
        co__globrunqput(&g, 1);
        co__wakep();
    }
    for (;;) {
        uint32_t n = runqgrab(p, batch, 0, true);
        if (n == 0) return;
        for (uint32_t i = 0; i < n; i++) batch[i] = rq_unfresh(batch[i]);
        co__globrunqput(batch, (int)n);
        co__wakep();
    }
}

/* For tests (tests/t_internal.h): the fresh deque's owner operations, out
 * of line, on a P no M owns. */
bool co__test_flifo_push(co_p_t *p, co_g_t *g) { return flifo_push(p, g); }
co_g_t *co__test_flifo_pop(co_p_t *p) { return flifo_pop(p); }
