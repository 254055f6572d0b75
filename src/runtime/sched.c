/*
 * The scheduler: Go's G-P-M design (runtime/proc.go) in C.
 *
 * Glossary. G: a coroutine (stack + saved context). M: an OS thread that
 * runs Gs. P: the right to run Gs, with a local run queue; there are
 * `nprocs` of them, so at most nprocs Ms run coroutine code at a time (plus
 * Ms inside co_blocking, which have given their P up).
 *
 * Switching. Unlike Go, a G that parks or yields switches straight to the
 * next runnable G of its P (one jump, no trip through the scheduler stack)
 * when there is one, and to its M's scheduler context g0 otherwise. The
 * switching G cannot publish itself (put itself on a run queue, release the
 * lock its waiter is queued under) before the switch, or another M could
 * start running it on the stack it is still using. So it leaves a
 * post-switch action in its M (m->post_fn), which whoever resumes on that M
 * runs first thing: the classic "switch, then release" of fiber
 * schedulers, and the equivalent of Go running gopark's unlockf on g0.
 *
 * Run queues (runqput/runqget/runqsteal): Go's lock-free 256-slot ring per
 * P, the runnext slot, and the global queue under sched.lock (globq.c),
 * checked first every 61 schedticks for fairness.
 *
 * Worker parking/unparking (proc.go's essay, applied here). We must not
 * leave a runnable G stranded while Ps sit idle, and we must not wake more
 * Ms than there is work for. An M looking for work is "spinning"
 * (sched.nmspinning). wakep() starts an M only if a P is idle and no M is
 * spinning: the spinning M will find the new work or hand the job on. A
 * spinning M that finds work calls resetspinning(), which wakes another
 * spinner. An M that gives up its P and stops spinning first decrements
 * nmspinning (seq_cst) and then re-checks every P's run queue; a submitter
 * first publishes its G (runqput's store-release / the global queue) and
 * then reads nmspinning (seq_cst) in wakep(). Either the submitter sees the
 * spinner or the spinner sees the G (StoreLoad on both sides).
 *
 * Sleeping. Idle Ms sleep on a futex in m->park (never busy-poll). One idle
 * M at a time is the poller: it blocks in co__netpoll until the earliest
 * timer of all Ps (sched.poll_until); adding an earlier timer breaks it.
 */
#include "runtime/proc.h"
#include "base/san.h"
#include "runtime/yslot.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

co_sched_t co__sched;

/* initial-exec: a fixed offset from the thread pointer, no __tls_get_addr.
 * A dlopen()ed libcolony.so still loads: glibc keeps static TLS room for
 * a few words like these. */
static __thread co_m_t *tls_m __attribute__((tls_model("initial-exec")));
static __thread void *tls_panic_top; /* co__panic_slot for plain threads */

/* co__test_reset_after_fork (lifecycle.c): this thread is no M. */
void co__tls_m_forget(void) { tls_m = NULL; }

/* Reached through a non-inlined function so a coroutine that migrated to
 * another thread never uses a TLS address computed on the old one. */
__attribute__((noinline)) co_m_t *co__getm(void) {
    __asm__ volatile("" ::: "memory");
    return tls_m;
}

/* sched.c's own reads of tls_m, inline. On x86-64 an asm volatile load of
 * the thread-pointer-relative slot: the compiler can neither cache it nor
 * the thread's TLS address across a switch (the reason co__getm is a
 * call), and the switch paths save two calls. */
#if defined(__x86_64__) && defined(__ELF__)
static inline __attribute__((always_inline)) co_m_t *getm(void) {
    co_m_t *m;
    __asm__ volatile("movq tls_m@gottpoff(%%rip), %0\n\tmovq %%fs:(%0), %0"
                     : "=r"(m)
                     :
                     : "memory");
    return m;
}
#else
#define getm() co__getm()
#endif

/* Reads the TLS itself (one call, not two); noinline for the same reason
 * as co__getm. */
__attribute__((noinline)) co_g_t *co__cur_g(void) {
    __asm__ volatile("" ::: "memory");
    co_m_t *m = tls_m;
    return m ? m->curg : NULL;
}
uint64_t co__g_id(const co_g_t *g) { return g ? g->id : 0; }
const char *co__g_name(const co_g_t *g) { return g ? g->name : ""; }
void **co__panic_slot(void) {
    co_g_t *g = co__cur_g();
    return g ? &g->panic_top : &tls_panic_top;
}

uint32_t co__fastrand(void) {
    co_m_t *m = co__getm();
    uint64_t x = m ? m->fastrand : (uint64_t)(uintptr_t)&x ^ (uint64_t)co_now();
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (m) m->fastrand = x;
    return (uint32_t)(x >> 16);
}

/* ---- switching ---------------------------------------------------------- */

/* Where the switch itself runs the post-switch work (co__jump_post,
 * co__jump_yslot): not with the portable fallback, nor under the
 * sanitizers, whose fiber calls must bracket the switch in C. */
#if !defined(COLONY_UCONTEXT) && !defined(CO_ASAN) && !defined(CO_TSAN)
#define SWITCH_POSTS 1
#endif

/* Runs on the context that was switched to, first thing: the previous
 * G's post-switch action, then any due timers of the P (only now: a timer
 * callback may need a lock the previous G released in its action). */
static void post_yield(co_g_t *g, void *arg);
#ifndef SWITCH_POSTS
static void post_yslot(co_g_t *g, void *arg);
#endif
static inline __attribute__((always_inline)) void yield_requeue(co_m_t *m, co_g_t *g);

static inline __attribute__((always_inline)) void run_post(co_m_t *m) {
    void (*f)(co_g_t *, void *) = m->post_fn;
    if (f) {
        m->post_fn = NULL;
#ifndef SWITCH_POSTS /* (co__post_yslot does it) */
        if (f == post_yslot) /* co_yield's fast path: g is saved now */
            co__yslot_close(m->p); /* release: publishes the slot to sysmon */
        else
#endif
        if (f == post_yield) /* the yield path, inline: no call, m at hand */
            yield_requeue(m, m->post_g);
        else
            f(m->post_g, m->post_arg);
    }
    co_p_t *p = m->p;
    if (p && CO_UNLIKELY(__atomic_load_n(&p->timer0_when, __ATOMIC_RELAXED) != 0)) {
        /* A pending timer would cost every switch a clock read (24 ns
         * here); read it at most every CO__CYCLES_SHORT ticks of the cheap
         * counter instead (10 ns). A due timer waits at most that long (a
         * microsecond or two) more; a counter that went backwards (another
         * CPU's) or reads 0 (no counter) means: check now. */
        uint64_t c = co__cycles();
        if (c - m->tcheck >= CO__CYCLES_SHORT || c == 0) {
            m->tcheck = c;
            int64_t w = __atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE);
            int64_t now;
            if (w && w <= (now = co_now())) co__timers_run(p, now);
        }
    }
}

static inline __attribute__((always_inline)) void switch_to(co_g_t *from, co_g_t *to,
                                                            bool from_exiting);

/* Switch from `from` (running on m) to `to`. Returns when `from` is
 * resumed, possibly on another M; runs that M's post-switch action. */
static inline __attribute__((always_inline)) void gogo(co_m_t *m, co_g_t *from, co_g_t *to,
                                                       bool from_exiting) {
    if (CO_UNLIKELY(!to->stack.map) && !to->is_g0 && !co__stack_attach(m, to)) {
        /* No stack for its first run: `to` waits on stackwait (gcache.c).
         * g0 looks for other work; a G switches to g0, which does. */
        if (from->is_g0) return;
        to = &m->g0;
    }
    m->curg = to->is_g0 ? NULL : to;
    if (!to->is_g0) __atomic_store_n(&to->status, CO_G_RUNNING, __ATOMIC_RELAXED);
    switch_to(from, to, from_exiting);
}

/* The other side of co__jump_post: it runs first, on the stack and with
 * the registers of the context switched to, then returns to where that
 * context was. (Defined in every build, as the assembly names it; only
 * SWITCH_POSTS builds switch through co__jump_post.) */
void co__switch_post(void) { run_post(getm()); }

/* gogo's last half: m->curg and to's status are set; tell the sanitizers,
 * switch, and run the post-switch action of whoever switched back to us
 * (with SWITCH_POSTS, the switch does: nothing follows it here). */
static inline __attribute__((always_inline)) void switch_to(co_g_t *from, co_g_t *to,
                                                            bool from_exiting) {
#ifdef SWITCH_POSTS
    (void)from_exiting;
    co__jump_post(&from->ctx.sp, to->ctx.sp);
#else
#ifdef CO_ASAN
    __sanitizer_start_switch_fiber(from_exiting ? NULL : &from->asan_fake, to->stack.lo,
                                   to->stack.size);
#else
    (void)from_exiting;
#endif
#ifdef CO_TSAN
    __tsan_switch_to_fiber(to->tsan_fiber, 0);
#endif
    co__ctx_switch(&from->ctx, &to->ctx);
#ifdef CO_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake, NULL, NULL);
#endif
    run_post(getm());
#endif
}

/* ---- run queues --------------------------------------------------------- */

static bool runqputslow(co_p_t *p, co_g_t *e, uint32_t h, uint32_t t);

static inline co_g_t *rq_tag(co_g_t *e) {
    if (rq_is_token(e) || !e->stack.map) return (co_g_t *)((uintptr_t)e | RQ_FRESH);
    return e;
}
static co_g_t *token_g_slow(co_p_t *p, co_g_t *e);
/* A run-queue entry taken to be run: a G as it is, or the G made for a
 * token (token_g_slow). */
static inline __attribute__((always_inline)) co_g_t *token_g(co_p_t *p, co_g_t *e) {
    if (CO_LIKELY(!rq_is_token(e))) return rq_strip(e);
    return token_g_slow(p, e);
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
        if (runqputslow(p, e, h, t)) return;
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

/* Owner only: queue full, move half of it plus entry e to the global
 * queue. */
static bool runqputslow(co_p_t *p, co_g_t *e, uint32_t h, uint32_t t) {
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

/* Owner, having taken an entry: while the G just taken runs, start the
 * lines of the next one's stack coming that it returns through when it
 * resumes (a G that parked long ago: all cold, and each return would wait
 * for its line in turn). sp, its saved stack pointer, comes from runq_sp
 * (or ob_sp), written when the owner queued it: reading the G
 * itself would be a read of a record this M does not own (a thief may
 * take it, run it to its end, and the record be freed). 100,000 sleepers
 * released at once (bench_runtime sleep): 896 ns each, as with that read,
 * against 984 with a prefetch of the taken G's own stack only (medians of
 * 9 alternating runs). */
static inline __attribute__((always_inline)) void prefetch_stack(char *sp) {
    if (sp)
        for (int k = 0; k < 10; k++) __builtin_prefetch(sp + 64 * k);
}

/* Start the record of run-queue entry e coming, before it runs: a G's for
 * writing (its status and more are written when it runs), a token's (a
 * pool task's record) for reading, as its submitter may write the same
 * lines again meanwhile. With a token's line taken exclusive, tiny pool
 * tasks from a coroutine took 1.16 of the time (median of 11 paired
 * runs). */
static inline __attribute__((always_inline)) void prefetch_entry(co_g_t *e) {
    if (rq_is_token(e))
        __builtin_prefetch(rq_strip(e));
    else
        co__prefetchw(rq_strip(e));
}

/* The owner's batch (p->ob, runtime.h). The ring's head is shared with
 * thieves, so the owner takes it with a locked CAS; with the ring long
 * enough, runqget takes CO_OBATCH entries in that one CAS and runs the
 * rest of them from the batch, with plain loads and stores. Spawning,
 * running and joining 1,000,000 empty coroutines (bench_runtime spawn):
 * 1 P 47.9 -> 45.2 ns, 2 P 64.2 -> 58.1 (medians of 11 alternating runs
 * on a busy host; 34 -> 27 and 39 -> 31 in its quiet rounds).
 *
 * What it costs: thieves cannot take the batch. The ring keeps at least
 * as many entries as the batch holds (a batch is claimed only from a ring
 * of 2 * CO_OBATCH or more), no batch is claimed while a P is idle (its M
 * would be woken to steal them), and one that goes idle later gets the
 * rest at the owner's next pop (obatch_give_back). But a
 * coroutine that runs long without entering the scheduler holds up the
 * batch behind it, as it holds up the yield slot: sysmon takes both from
 * it when it lends its P away (10 ms, co__yslot_steal), by the same
 * handshake, so the owner's pops stay plain: each is made inside a
 * yield-slot window. Without membarrier (no yield slot), no batch. */
static inline __attribute__((always_inline)) bool obatch_fits(co_p_t *p, uint32_t h, uint32_t t) {
    return t - h >= 2 * CO_OBATCH && __atomic_load_n(&co__yslot_on, __ATOMIC_RELAXED) &&
           !__atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED);
}

/* Owner, in a window, the batch's first n entries still to run: a P has
 * gone idle since the batch was claimed. They go back to the ring's tail,
 * in order, where that P's M can steal them; without this, a burst of
 * computations claimed by one P would run one after another there while
 * the other P sat idle (until sysmon lends the P away, 10 ms into one of
 * them). Out of line: rare. */
static __attribute__((noinline)) void obatch_give_back(co_p_t *p, uint32_t n) {
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

/* Owner only. */
static co_g_t *token_g_or_next(co_p_t *p, co_g_t *e);
static inline __attribute__((always_inline)) co_g_t *runqget(co_p_t *p) {
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
            obatch_give_back(p, n - 1); /* closes the window */
            goto got;
        }
        __atomic_store_n(&p->obn, n - 1, __ATOMIC_RELAXED); /* published by the close */
        co__yslot_close(p);
        goto got;
    }
    for (;;) {
        uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_ACQUIRE);
        uint32_t t = p->runqtail;
        if (t == h) return NULL;
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
    return token_g_or_next(p, e);
}

/* runqget's token taken from the ring: its G, or, with no memory for one
 * (the token then waits on tokwait), the ring's next entry: NULL would
 * tell the caller the ring is empty. Out of line: the loop would cost
 * every runqget a register. */
static __attribute__((noinline)) co_g_t *token_g_or_next(co_p_t *p, co_g_t *e) {
    co_g_t *g = token_g_slow(p, e);
    return g ? g : runqget(p);
}

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
    uint32_t n = runqgrab(pp, tmp, 0, steal_next);
    if (n == 0) return NULL;
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

/* Nothing a thief could take: the ring and runnext. */
static bool runq_nothing_to_steal(co_p_t *p) {
    uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_ACQUIRE);
    uint32_t t = __atomic_load_n(&p->runqtail, __ATOMIC_ACQUIRE);
    return h == t && __atomic_load_n(&p->runnext, __ATOMIC_ACQUIRE) == NULL;
}

/* Nothing queued at all: the ring, runnext, the yield slot and the owner's
 * batch. */
bool co__runq_empty(co_p_t *p) {
    return runq_nothing_to_steal(p) && !co__yslot_peek(p) &&
           !__atomic_load_n(&p->obn, __ATOMIC_RELAXED);
}

/* Sysmon's safety net against a lost wake-up: a P is idle, no M is
 * spinning, and yet there is work a woken M would take (the global queue,
 * or a ring with entries: a thief takes half). Relaxed loads: a hint, and
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
            __atomic_load_n(&p->runqtail, __ATOMIC_RELAXED))
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

/* What is queued on p: the ring, runnext, the yield slot and the owner's
 * batch. A snapshot (relaxed loads): exact only for the owner, a hint for
 * anyone else. */
static inline int runq_len(co_p_t *p) {
    uint32_t h = __atomic_load_n(&p->runqhead, __ATOMIC_RELAXED);
    uint32_t t = __atomic_load_n(&p->runqtail, __ATOMIC_RELAXED);
    return (int)(t - h) + (__atomic_load_n(&p->runnext, __ATOMIC_RELAXED) ? 1 : 0) +
           (co__yslot_peek(p) ? 1 : 0) + (int)__atomic_load_n(&p->obn, __ATOMIC_RELAXED);
}

int co__runq_len(co_p_t *p) { return runq_len(p); }

/* sched.lock held. Take up to max Gs (0: a fair share) into p. */
static co_g_t *globrunqget_locked(co_p_t *p, int max) {
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

static co_g_t *globrunqget(co_p_t *p, int max) {
    co_sched_t *s = &co__sched;
    if (!co__globrunq_pending(__ATOMIC_ACQUIRE)) return NULL;
    bool moved = co__globq_lock();
    co_g_t *g = globrunqget_locked(p, max);
    bool more = moved && s->runqsize > 0; /* beyond our share: see co__globq_lock */
    co__unlock(&s->lock);
    if (more) co__wakep();
    return token_g(p, g);
}

/* The next G for p without blocking or stealing: due timers, 1-in-61 global,
 * runnext, local ring, global. p's owner only; p may be NULL. */
static inline __attribute__((always_inline)) co_g_t *runq_next_fast(co_p_t *p) {
    if (!p) return NULL;
    /* A lent-away P: go to g0, which retires it. */
    if (CO_UNLIKELY(__atomic_load_n(&p->retire, __ATOMIC_RELAXED))) return NULL;
    /* relaxed store: sysmon reads it to spot a P that stopped scheduling */
    uint32_t tick = p->schedtick + 1;
    __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED);
    co_g_t *g;
    if (tick % 61 == 0 && (g = globrunqget(p, 1))) return g;
    /* The yield slot is older than the ring, runnext comes first (yslot.h) */
    if (co__yslot_peek(p) && !__atomic_load_n(&p->runnext, __ATOMIC_RELAXED) &&
        co__yslot_open(p)) {
        g = __atomic_load_n(&p->yieldg, __ATOMIC_RELAXED); /* window open: exact */
        __atomic_store_n(&p->yieldg, NULL, __ATOMIC_RELAXED);
        co__yslot_close(p);
        if (g) return g;
    }
    if ((g = runqget(p))) return g;
    return globrunqget(p, 0);
}

/* ---- Ps and Ms ---------------------------------------------------------- */

static void acquirep(co_m_t *m, co_p_t *p) {
    m->p = p;
    p->m = m;
    /* A new owner schedules: sysmon must not take a P that sat idle (its
     * schedtick unchanged for long) for one stuck in a coroutine. Relaxed:
     * only the owner writes it, sysmon compares it between rounds. */
    __atomic_store_n(&p->schedtick, p->schedtick + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&p->status, CO_P_RUNNING, __ATOMIC_RELEASE);
}

/* sched.lock held. */
static void pidleput_locked(co_p_t *p) {
    co_sched_t *s = &co__sched;
    p->m = NULL;
    __atomic_store_n(&p->status, CO_P_IDLE, __ATOMIC_RELEASE);
    p->link = s->pidle;
    s->pidle = p;
    __atomic_store_n(&s->npidle, s->npidle + 1, __ATOMIC_SEQ_CST);
}

void co__pidleput_locked(co_p_t *p) { pidleput_locked(p); } /* co_init */

/* sched.lock held. */
static co_p_t *pidleget_locked(void) {
    co_sched_t *s = &co__sched;
    co_p_t *p = s->pidle;
    if (p) {
        s->pidle = p->link;
        __atomic_store_n(&s->npidle, s->npidle - 1, __ATOMIC_SEQ_CST);
    }
    return p;
}

co_p_t *co__pidleget(void) {
    co__lock(&co__sched.lock);
    co_p_t *p = pidleget_locked();
    co__unlock(&co__sched.lock);
    return p;
}

static void *mstart(void *arg);

/* Create an M that will start with p. */
static bool newm(co_p_t *p, bool spinning) {
    co_sched_t *s = &co__sched;
    co_m_t *m = calloc(1, sizeof *m);
    if (!m) return false;
    m->nextp = p;
    m->spinning = spinning;
    co__lock(&s->lock);
    /* co_shutdown sets stopping, then collects allm under this lock to join
     * every M: an M added after that would be missed (a leaked thread
     * running during teardown), so none is created once stopping is set. */
    if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        co__unlock(&s->lock);
        free(m);
        return false;
    }
    m->id = s->mcount++;
    m->alllink = s->allm;
    s->allm = m;
    co__unlock(&s->lock);
    m->fastrand = 0x9E3779B97F4A7C15ull ^ ((uint64_t)m->id * 0xBF58476D1CE4E5B9ull) ^ 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1024 * 1024);
    int rc = pthread_create(&m->thread, &attr, mstart, m);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        co__lock(&s->lock);
        /* Others may have been added in front of m meanwhile. */
        for (co_m_t **pp = &s->allm; *pp; pp = &(*pp)->alllink)
            if (*pp == m) {
                *pp = m->alllink;
                break;
            }
        s->mcount--;
        co__unlock(&s->lock);
        free(m);
        return false;
    }
    return true;
}

/* p's yield slot and its owner's batch, which only an owner runs and no
 * thief takes, to the global queue: p has no owner (it is being handed
 * off or retired), so no window is open on it, and a window opened later
 * reads retire set or finds them gone. acq_rel exchanges: sysmon may take
 * them at the same time (co__yslot_steal); each goes to one of us.
 * Returns how many moved. */
static int private_to_global(co_p_t *p) {
    co_g_t *gs[1 + CO_OBATCH];
    int k = co__yslot_take(p, gs);
    for (int i = 0; i < k; i++) gs[i] = rq_unfresh(gs[i]);
    if (k) co__globrunqput(gs, k);
    return k;
}

/* Start an M to run p (or an idle P if p is NULL). */
void co__startm(co_p_t *p, bool spinning) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    if (!p) {
        p = pidleget_locked();
        if (!p) {
            co__unlock(&s->lock);
            if (spinning) __atomic_sub_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
            return;
        }
    }
    bool no_m = co__test_failing(CO__FAIL_NO_M);
    co_m_t *m = no_m ? NULL : s->midle;
    if (m) {
        s->midle = m->link;
        s->nmidle--;
    }
    co__unlock(&s->lock);
    if (!m) {
        if (no_m || !newm(p, spinning)) {
            /* No thread for p now (pthread_create failed: a pids cgroup,
             * RLIMIT_NPROC). p goes idle; what only its owner would run
             * goes where sysmon's safety net sees it (co__work_stranded:
             * the global queue, and the rings it checks anyway), so an M
             * starts for it once threads can be made again. Its runnext
             * too: the net does not look there, and a thief takes it only
             * in its last round, if any M looks for work at all. acq_rel:
             * thieves CAS it; one of us gets it. No wakep here: it would
             * only try the same creation again. */
            co_g_t *next = __atomic_exchange_n(&p->runnext, NULL, __ATOMIC_ACQ_REL);
            if (next) co__globrunqput(&next, 1);
            private_to_global(p);
            co__lock(&s->lock);
            pidleput_locked(p);
            co__unlock(&s->lock);
            if (spinning) __atomic_sub_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
        }
        return;
    }
    m->spinning = spinning;
    m->nextp = p;
    /* store-release: publishes nextp/spinning to the woken M's acquire load */
    __atomic_store_n(&m->park, 1, __ATOMIC_RELEASE);
    co__futex_wake(&m->park, 1);
}

void co__wakep(void) {
    co_sched_t *s = &co__sched;
    if (CO_UNLIKELY(__atomic_load_n(&s->stopping, __ATOMIC_RELAXED))) return; /* co_shutdown */
    /* seq_cst loads: the StoreLoad half of the spinning protocol (see top) */
    if (__atomic_load_n(&s->npidle, __ATOMIC_SEQ_CST) == 0) return;
    uint32_t z = 0;
    if (__atomic_load_n(&s->nmspinning, __ATOMIC_SEQ_CST) != 0 ||
        !__atomic_compare_exchange_n(&s->nmspinning, &z, 1, false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_RELAXED))
        return;
    co__startm(NULL, true);
}

static void resetspinning(co_m_t *m) {
    m->spinning = false;
    __atomic_sub_fetch(&co__sched.nmspinning, 1, __ATOMIC_SEQ_CST);
    co__wakep();
}

/* P released by a retake (co_blocking) or a retiring M: find it an M. */
void co__handoffp(co_p_t *p) {
    co_sched_t *s = &co__sched;
    if (!co__runq_empty(p) || co__globrunq_pending(__ATOMIC_ACQUIRE)) {
        co__startm(p, false);
        return;
    }
    uint32_t z = 0;
    if (__atomic_load_n(&s->nmspinning, __ATOMIC_SEQ_CST) +
                __atomic_load_n(&s->npidle, __ATOMIC_SEQ_CST) ==
            0 &&
        __atomic_compare_exchange_n(&s->nmspinning, &z, 1, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED)) {
        co__startm(p, true);
        return;
    }
    co__lock(&s->lock);
    pidleput_locked(p);
    co__unlock(&s->lock);
    if (__atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE) != 0 &&
        __atomic_load_n(&s->polling, __ATOMIC_ACQUIRE) == 0)
        co__wakep();
}

/* Park the M until startm hands it a P (or shutdown). */
static void stopm(co_m_t *m) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        co__unlock(&s->lock);
        return;
    }
    __atomic_store_n(&m->park, 0, __ATOMIC_RELAXED);
    m->link = s->midle;
    s->midle = m;
    s->nmidle++;
    co__unlock(&s->lock);
    /* acquire: pairs with startm's store-release */
    while (__atomic_load_n(&m->park, __ATOMIC_ACQUIRE) == 0) co__futex_wait(&m->park, 0, CO_FOREVER);
}

/* ---- finding work (g0 only) -------------------------------------------- */

static co_g_t *stealwork(co_m_t *m) {
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
            if (g) return g;
        }
    }
    return NULL;
}

static void run_all_timers(int64_t now) {
    co_sched_t *s = &co__sched;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *pp = co__allp(i);
        int64_t w = __atomic_load_n(&pp->timer0_when, __ATOMIC_ACQUIRE);
        if (w && w <= now) co__timers_run(pp, now);
    }
}

/* Block the P-less M m: as the poller until the next timer, or parked on
 * its futex. Returns when there may be work; m->p may be set. */
static void block_idle(co_m_t *m) {
    co_sched_t *s = &co__sched;
    if (CO_UNLIKELY(m->spinning)) /* every caller stops spinning first */
        co__fatal("internal error: M %d goes idle while counted as spinning", m->id);
    uint32_t z = 0;
    if (__atomic_compare_exchange_n(&s->polling, &z, 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)) {
        int64_t next = co__timers_next();
        /* seq_cst store then load of the timers: pairs with co__timer_add's
         * store of timer0_when then seq_cst load of poll_until */
        __atomic_store_n(&s->poll_until, next ? next : INT64_MAX, __ATOMIC_SEQ_CST);
        int64_t next2 = co__timers_next();
        if (next2 && (next == 0 || next2 < next)) next = next2;
        int64_t delay = -1;
        if (next) {
            delay = next - co_now();
            if (delay < 0) delay = 0;
        }
        if (co__globrunq_pending(__ATOMIC_ACQUIRE) &&
            __atomic_load_n(&s->npidle, __ATOMIC_ACQUIRE) > 0)
            delay = 0; /* work is waiting for a P: don't sleep */
        if (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) co__netpoll(delay);
        __atomic_store_n(&s->lastpoll, co_now(), __ATOMIC_RELAXED);
        __atomic_store_n(&s->poll_until, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&s->polling, 0, __ATOMIC_RELEASE);
        co_p_t *p = co__pidleget();
        if (p) acquirep(m, p);
        run_all_timers(co_now());
        if (p) return;
        /* Every P is busy: Gs readied above went to the global queue and
         * the running Ms will take them. Sleep as an ordinary idle M. */
    }
    stopm(m);
    if (m->nextp) {
        acquirep(m, m->nextp);
        m->nextp = NULL;
    }
}

/* Find a runnable G for m (which holds a P). Blocks. NULL on shutdown. */
static co_g_t *findrunnable(co_m_t *m) {
    co_sched_t *s = &co__sched;
    for (;;) {
        if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) return NULL;
        co_p_t *p = m->p;
        if (p && CO_UNLIKELY(__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE))) {
            /* Without a P this M goes to block_idle: it must stop spinning
             * first. A spinning M asleep in stopm would keep nmspinning > 0
             * for good, and wakep() would never start an M again (coroutines
             * readied from plain threads then sat in the global queue
             * forever). Before co__retire_p, whose wakep must not be vetoed
             * by our own count. */
            if (m->spinning) {
                m->spinning = false;
                __atomic_sub_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
            }
            co__retire_p(m);
            p = NULL;
        }
        if (!p) {
            block_idle(m);
            continue;
        }
        int64_t tw = __atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE);
        if (tw && tw <= co_now()) co__timers_run(p, co_now());
        co_g_t *g = runq_next_fast(p);
        if (g) return g;
        /* Lent away just now: runq_next_fast gave up without looking at the
         * queue, which may be full. Retire at the top; never steal into it. */
        if (CO_UNLIKELY(__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE))) continue;
        if (co__netpoll_has_waiters() && __atomic_load_n(&s->polling, __ATOMIC_ACQUIRE) == 0) {
            int ready = co__netpoll(0);
            /* relaxed: a hint for co__netpoll_soon and sysmon */
            __atomic_store_n(&s->lastpoll, co_now(), __ATOMIC_RELAXED);
            if (ready > 0) continue;
        }
        /* Steal, if not too many Ms are spinning already. */
        uint32_t busy = (uint32_t)s->nprocs - __atomic_load_n(&s->npidle, __ATOMIC_SEQ_CST);
        if (m->spinning || 2 * __atomic_load_n(&s->nmspinning, __ATOMIC_SEQ_CST) < busy) {
            if (!m->spinning) {
                m->spinning = true;
                __atomic_add_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
            }
            if ((g = stealwork(m))) return g;
        }
        /* Nothing: give up the P. */
        bool moved = co__globq_lock();
        if ((g = globrunqget_locked(p, 0))) {
            bool more = moved && s->runqsize > 0; /* see co__globq_lock */
            co__unlock(&s->lock);
            if (more) co__wakep();
            if ((g = token_g(p, g))) return g;
            continue; /* a token with no memory for its G: it went back (token_g) */
        }
        if (__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE)) {
            co__unlock(&s->lock);
            continue; /* lent away meanwhile: retire it at the top */
        }
        m->p = NULL;
        pidleput_locked(p);
        co__unlock(&s->lock);
        bool was_spinning = m->spinning;
        if (was_spinning) {
            m->spinning = false;
            __atomic_sub_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
            /* Re-check every queue after the decrement (see the essay). */
            bool work = co__globrunq_pending(__ATOMIC_SEQ_CST);
            /* The yield slots do not count: a busy owner runs its own,
             * and a thief could not take it (yslot.h). */
            for (int i = 0; !work && i < s->nprocs; i++)
                work = !runq_nothing_to_steal(co__allp(i));
            if (work) {
                co_p_t *p2 = co__pidleget();
                if (p2) {
                    acquirep(m, p2);
                    m->spinning = true;
                    __atomic_add_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
                    continue;
                }
            }
        } else if (__atomic_load_n(&s->inject, __ATOMIC_SEQ_CST)) {
            /* Pushed after our look, maybe before its pusher could see our
             * P idle (see "the injection stack"): take a P back for it. */
            co_p_t *p2 = co__pidleget();
            if (p2) {
                acquirep(m, p2);
                continue;
            }
        }
        block_idle(m);
    }
}

/* ---- Gs ------------------------------------------------------------------- */

/* A coroutine starts (+1) or ends (-1) on p (NULL: no P, the global
 * count). p's count is written by its owner only: a relaxed store, read by
 * co_count. */
static inline void live_add(co_p_t *p, int d) {
    if (p)
        __atomic_store_n(&p->ngo, p->ngo + d, __ATOMIC_RELAXED);
    else
        co__live_global_add(d); /* lifecycle.c: see live_global there */
}

static void post_gfree(co_g_t *g, void *arg) {
    (void)arg;
    co_m_t *m = getm();
    co__gfput(m->p, g);
}

#ifdef CO__HAVE_FRESH_START
/* goexit of g, whose default-size stack goes straight to next, which never
 * ran (so has none): next starts at the stack's top, where g's first frame
 * was, with no switch, no saved context and no trip of the stack through
 * the cache. g's frames below are dropped, this one included: nothing here
 * is needed once next runs. Spawning, running and joining 1,000,000
 * empty coroutines (bench_runtime spawn) took 52-58 ns each on 1 P instead
 * of 69-76, 66 on 2 Ps instead of 74 (medians of 7 and 9 alternating
 * runs). */
static void goexit_handover(co_m_t *m, co_g_t *g, co_g_t *next) __attribute__((noreturn));
static void goexit_handover(co_m_t *m, co_g_t *g, co_g_t *next) {
    next->stack = g->stack;
    g->stack.map = NULL;
    m->curg = next;
    __atomic_store_n(&next->status, CO_G_RUNNING, __ATOMIC_RELAXED);
#ifdef CO_ASAN
    __sanitizer_start_switch_fiber(NULL, next->stack.lo, next->stack.size);
    /* as co__stack_attach: next starts on clean shadow (the frames g
     * never returned from may have left some poisoned) */
    __asan_unpoison_memory_region(next->stack.lo, next->stack.size);
#endif
#ifdef CO_TSAN
    __tsan_switch_to_fiber(next->tsan_fiber, 0);
#endif
    /* g's record, without its stack, back to the cache only now, in
     * next's fiber: as post_gfree does, after the switch */
    co__gfput(m->p, g);
    uintptr_t top = co__stack_top(next->stack.lo, next->stack.size, next->id);
    co__fresh_start((void *)top, next, next->fpenv);
}
#endif

static void goexit(co_g_t *g) __attribute__((noreturn));
static void goexit(co_g_t *g) {
    co__stack_check(g);
    __atomic_store_n(&g->status, CO_G_DEAD, __ATOMIC_RELAXED);
    co_m_t *m = getm();
    live_add(m->p, -1);
    co_g_t *next = runq_next_fast(m->p);
#ifdef CO__HAVE_FRESH_START
    /* (m->post_fn is empty: run_post cleared it when g last resumed) */
    if (next && !next->stack.map && g->stack.size == co__sched.stack_size)
        goexit_handover(m, g, next);
#endif
    m->post_fn = post_gfree;
    m->post_g = g;
    gogo(m, g, next ? next : &m->g0, true);
    __builtin_unreachable();
}

void co__g_entry(co_g_t *g) {
#ifdef CO_ASAN
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
    run_post(getm());
    g->fn(g->arg);
#ifdef CO_ASAN
    /* Below this frame's base the stack is dead (this frame's locals are
     * not used again), but may still carry the shadow of frames that never
     * returned (left by a switch); the no-return handler ASan runs before
     * goexit puts its own frame there. */
    char *fp = (char *)__builtin_frame_address(0);
    if (fp > g->stack.lo) __asan_unpoison_memory_region(g->stack.lo, (size_t)(fp - g->stack.lo));
#endif
    goexit(g);
}

static inline __attribute__((always_inline)) co_g_t *g_alloc(co_p_t *p);
static inline __attribute__((always_inline)) void g_init(co_p_t *p, co_g_t *g,
                                                         void (*fn)(void *), void *arg,
                                                         const char *name);
static inline __attribute__((always_inline)) void queue_new(co_p_t *p, co_g_t *e, bool next);
static void plain_push(co_g_t *g);

/* co__spawn on the calling thread's M (NULL: a plain thread), the runtime
 * up. Inline in co__spawn and in co_go's path, which needs m after it. */
static inline __attribute__((always_inline)) int spawn_on(co_m_t *m, void (*fn)(void *),
                                                         void *arg, size_t stack_size,
                                                         const char *name) {
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
    if (stack_size != s->stack_size) /* after g_init: coloured by its id */
        co__ctx_make(&g->ctx, g->stack.lo, g->stack.size, g, g->fpenv, g->id);
    /* release: pairs with co_dump's acquire load, which then reads the id
     * and name g_init wrote (a plain store on x86-64) */
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELEASE);
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
    return spawn_on(getm(), fn, arg, stack_size, name);
}

/* A new G, on the all-G list, for when the caches hold none: NULL without
 * memory. Out of line: g_alloc is inline in every spawn. */
static __attribute__((noinline)) co_g_t *g_new(void) {
    co_sched_t *s = &co__sched;
    /* calloc, not a 64-byte aligned allocation: glibc's memalign is
     * slow enough to cost more than the line it saves (measured) */
    co_g_t *g = calloc(1, sizeof *g);
    if (!g) return NULL;
#ifdef CO_TSAN
    g->tsan_fiber = __tsan_create_fiber(0);
#endif
    co__lock(&s->allg_lock);
    g->alllink_next = s->allg;
    if (s->allg) s->allg->alllink_prev = g;
    s->allg = g;
    co__unlock(&s->allg_lock);
    return g;
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

/* co__wakep's own first checks, inline: nothing to do unless a P is idle
 * and no M spins (it checks them again). */
static inline void wakep_if_idle(void) {
    if (__atomic_load_n(&co__sched.npidle, __ATOMIC_SEQ_CST) != 0 &&
        __atomic_load_n(&co__sched.nmspinning, __ATOMIC_SEQ_CST) == 0)
        co__wakep();
}

/* Spawn back-pressure's test (co__spawn_backpressure): p's queue is full,
 * or the global queue holds a full queue's worth per P. */
static inline bool spawn_queue_full(co_p_t *p) {
    return runq_len(p) >= CO_RUNQ_SIZE ||
           __atomic_load_n(&co__sched.runqsize, __ATOMIC_RELAXED) >=
               (int64_t)CO_RUNQ_SIZE * co__sched.nprocs;
}

/* A plain thread (or an M without a P) makes g runnable: the injection
 * stack, then the wake-up, holding the scheduler across both (see
 * co__plain_ready_begin): a spawned G (counted live by
 * co__plain_spawn_enter) or a woken one. */
static void plain_push(co_g_t *g) {
    co__plain_ready_begin();
    co__globrunq_inject(g);
    wakep_if_idle();
    co__plain_ready_end();
}

/* A new coroutine (a G, or a token) is queued: on p (in runnext if next
 * and runnext is empty), counted live there; or, a token from a plain
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
         * of spawns then queues in order behind its first. 1M spawns: 1 P
         * 46.9 -> 41.2 ns, 2 P 62.0 -> 56.8 ns (median of 9 alternating). */
        if (next && !__atomic_load_n(&p->runnext, __ATOMIC_RELAXED))
            __atomic_store_n(&p->runnext, e, __ATOMIC_RELEASE); /* pairs with thieves' acquire */
        else
            runqput(p, e, false);
    } else {
        co__globrunq_inject(e);
    }
    wakep_if_idle();
}

/* A coroutine to be, for the pool: the token goes on the caller's P's run
 * queue (the global one from a plain thread) in place of a G, and counts as
 * a live coroutine from now on. A worker that finishes takes it over
 * without any G (co__take_unstarted); whoever takes it to run it makes its
 * G then (token_g), starting t->fn(t). The default stack size only. Never
 * fails: a token needs no memory of its own. */
static void spawn_yield(co_m_t *m);
static void yield_slow(co_m_t *m, co_g_t *g, co_p_t *p, void (*post)(co_g_t *, void *));
void co__spawn_token(co__token_t *t) {
    co_m_t *m = getm();
    co_p_t *p = m ? m->p : NULL;
    co__fpenv_store(&t->fpenv); /* as co__spawn: it starts with the spawner's */
    co_g_t *e = (co_g_t *)((uintptr_t)t | RQ_TOKEN);
    if (CO_UNLIKELY(!p)) {
        /* Not counted live here: whoever moves the injection stack to the
         * global queue counts the tokens it moves, one RMW per batch
         * (inject_append_locked). Nor checked against a shutdown
         * (co__plain_spawn_enter): a pool holds the runtime up (co__rt_hold),
         * and the default pool's shutdown hook waits for its busy
         * records, this one among them. */
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
 * control words). Without memory for that G, the token goes back to the
 * global queue (it waits, like a coroutine waiting for a stack) and NULL
 * is returned. */
static co_g_t *token_g_slow(co_p_t *p, co_g_t *e) {
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
    /* release: pairs with co_dump's acquire load, which then reads the id
     * and name g_init wrote (a plain store on x86-64) */
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELEASE);
    return g;
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
 * Behind its own full queue, the spawner came back only on this P, after
 * it had run that queue side by side with the other P, which had stolen
 * half of it: both ran the same spawner's short coroutines at once, and
 * the spawner moved between Ms about 40 times in 1M spawns (now about
 * 5,000, one per yield). 1M spawns joined by a waitgroup on 2 P: 0.76 of
 * the time (9 paired rounds, all faster; docs/hacking.md).
 *
 * A yield forced by the global queue's length alone (spawn_queue_full's
 * other half) stays behind this P's queue: behind the global backlog the
 * spawner would wait for all of it, and each such spawner, one more entry
 * there, would keep the condition true for every other. A recursive
 * fan-out on 2 P took 3 times as long with 4 times the memory, and a co_go
 * beside a plain thread's backlog of 2,000 took 50 ms (found by review;
 * test_runtime's test_backpressure_global_backlog). Out of line: once per
 * 128 spawns or more. */
static __attribute__((noinline)) void spawn_yield(co_m_t *m) {
    co_p_t *p = m->p;
    if (co__sched.nprocs == 1 || __atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED) != 0 ||
        runq_len(p) < CO_RUNQ_SIZE) {
        co_yield();
        return;
    }
    /* (nothing queued here after all, thieves having taken it: it goes on
     * running, as co_yield would) */
    yield_slow(m, m->curg, p, post_yield_global);
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

static int spawn_user(void (*fn)(void *), void *arg, size_t stack_size, const char *name) {
    int rc = spawn_check(fn, stack_size);
    if (rc < 0) return rc;
    co_m_t *m = getm();
    rc = spawn_on(m, fn, arg, stack_size, name);
    if (rc == 0) spawn_backpressure_m(m); /* with m at hand */
    return rc;
}

int co_go(void (*fn)(void *arg), void *arg) { return spawn_user(fn, arg, 0, NULL); }

int co_go_with(const co_attr_t *attr, void (*fn)(void *arg), void *arg) {
    return spawn_user(fn, arg, attr ? attr->stack_size : 0, attr ? attr->name : NULL);
}

/* ---- pinned sections (internal.h) ---------------------------------------- */

void *co__pin_enter(void) {
    co_m_t *m = getm();
    if (!m) return NULL;
    /* relaxed: the caller's next release (its push) orders it */
    __atomic_store_n(&m->pin, m->pin + 1, __ATOMIC_RELAXED);
    return m;
}

void co__pin_exit(void *mv) {
    co_m_t *m = mv;
    /* release: the section's reads happen before a waiter's acquire load */
    if (m) __atomic_store_n(&m->pin, m->pin + 1, __ATOMIC_RELEASE);
}

void co__pin_wait(void) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock); /* allm's links; an M is freed only at shutdown (or
                         * before it ever ran: never inside a section) */
    for (co_m_t *m = s->allm; m; m = m->alllink) {
        uint32_t v = __atomic_load_n(&m->pin, __ATOMIC_ACQUIRE);
        if (!(v & 1)) continue;
        co__unlock(&s->lock);
        while (__atomic_load_n(&m->pin, __ATOMIC_ACQUIRE) == v)
            co_yield(); /* sched_yield() on a plain thread */
        co__lock(&s->lock);
    }
    co__unlock(&s->lock);
}

/* ---- park / ready / yield ------------------------------------------------ */

/* Make g runnable on this P (runnext), or on the global queue from a plain
 * thread, and wake an M if a P is idle and none spins. */
static inline void ready_put(co_g_t *g) {
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
    co_m_t *m = getm();
    if (m && m->p) {
        runqput(m->p, g, true);
        wakep_if_idle();
        return;
    }
    plain_push(g);
}

void co__ready(co_g_t *g) {
    /* Its stack's top (the saved registers and the first frames it
     * returns through) may be cold, and it runs soon: start those lines
     * coming. */
    char *sp = (char *)g->ctx.sp;
    for (int i = 0; i < 4; i++) __builtin_prefetch(sp + 64 * i);
    ready_put(g);
}

void co__ready_cold(co_g_t *g) {
    /* Parked on a timer or the network, usually for long: every line it
     * returns through is cold (a pooled task parked in a sleep sits ~650
     * bytes below its stack's top, ~10 frames), and each return waits for
     * its line in turn. Start them all coming, up to the stack's top,
     * at most 1 KiB. */
    char *sp = (char *)g->ctx.sp;
    char *top = g->stack.lo + g->stack.size;
    if (top < sp || top - sp > 1024) top = sp + 1024;
    for (char *a = sp; a < top; a += 64) __builtin_prefetch(a);
    /* and the start of what it works on: its entry's argument (a pool
     * worker's record, a server's connection), equally cold; two lines, as
     * an object of a line's size rarely starts on one */
    char *arg = g->arg;
    if (arg) {
        __builtin_prefetch(arg, 1);
        __builtin_prefetch(arg + 64, 1);
    }
    ready_put(g);
}

/* Many Gs readied at once (a waitgroup's release, a broadcast): in their
 * order at the ring's tail (runnext is left alone: with hundreds woken, the
 * last one first would only reverse them), each G's record prefetched a few
 * entries ahead, and their stacks not at all: the later ones run long
 * after this, on whichever P takes them, and lines fetched now would be
 * gone by then (runqget prefetches a G's stack a turn before it runs).
 * With the release's array (wait.c), 100,000 coroutines released by a
 * waitgroup took 30 ms instead of 55 (bench_runtime sleep); 8-13 ms once
 * their waiters moved into their G records. */
void co__ready_many(co_g_t *const *gs, size_t n) {
    enum { AHEAD = 8 };
    for (size_t i = 0; i < n && i < AHEAD; i++) __builtin_prefetch(gs[i], 1);
    co_m_t *m = getm();
    co_p_t *p = m ? m->p : NULL;
    if (!p) co__plain_ready_begin(); /* until the last wake-up: see there */
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n) __builtin_prefetch(gs[i + AHEAD], 1);
        co_g_t *g = gs[i];
        __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
        if (p)
            runqput(p, g, false);
        else
            co__globrunq_inject(g);
        wakep_if_idle();
    }
    if (!p) co__plain_ready_end();
}

/* The running G switches away; post(g, arg) runs after the switch. */
static inline __attribute__((always_inline)) void park_m(co_m_t *m, void (*post)(co_g_t *, void *),
                                                          void *arg, int reason);
void co__park_current(void (*post)(co_g_t *, void *), void *arg, int reason) {
    park_m(getm(), post, arg, reason);
}

void co__park_m(co_m_t *m, void (*post)(co_g_t *, void *), void *arg, int reason) {
    park_m(m, post, arg, reason);
}

static inline __attribute__((always_inline)) void park_m(co_m_t *m, void (*post)(co_g_t *, void *),
                                                          void *arg, int reason) {
    co_g_t *g = m->curg;
    /* relaxed atomic: co_dump reads it from any thread, a hint */
    __atomic_store_n(&g->wait_reason, (int16_t)reason, __ATOMIC_RELAXED);
    co__stack_check(g);
    m->post_fn = post;
    m->post_g = g;
    m->post_arg = arg;
    co_g_t *next = runq_next_fast(m->p);
    gogo(m, g, next ? next : &m->g0, false);
}

/* Owner: a yielder may wait in the yield slot instead of the ring: nothing
 * else is queued on p and no P is idle (an idle one's M could steal it
 * from the ring). Relaxed loads: p's own fields, and npidle a hint either
 * way. The caller checks the slot itself (empty to put, full to swap). */
static inline __attribute__((always_inline)) bool yslot_fits(co_p_t *p) {
    return !__atomic_load_n(&p->runnext, __ATOMIC_RELAXED) &&
           __atomic_load_n(&p->runqhead, __ATOMIC_RELAXED) == p->runqtail &&
           !__atomic_load_n(&p->obn, __ATOMIC_RELAXED) &&
           !__atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED);
}

/* After a yield, on the M that switched away from g: g goes behind the
 * others. run_post does it inline; post_yield is its name for m->post_fn. */
static inline __attribute__((always_inline)) void yield_requeue(co_m_t *m, co_g_t *g) {
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
    co_p_t *p = m->p;
    if (p && !__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE)) {
        if (__atomic_load_n(&co__yslot_on, __ATOMIC_RELAXED) && !co__yslot_peek(p) &&
            yslot_fits(p) && co__yslot_open(p)) {
            /* release: g's state before it, for whoever takes it (sysmon) */
            __atomic_store_n(&p->yieldg, g, __ATOMIC_RELEASE);
            co__yslot_close(p);
            return;
        }
        runqput_(p, g, false, true);
        /* With a P idle (the slot was refused for that), someone must take
         * it: an idle P's M sleeps until woken, and nothing else would wake
         * it. Two coroutines yielding to each other on one P while the
         * other slept kept a 2-P machine at half its speed for good
         * (bench_runtime spread_long: 4 of a make bench's 5 runs). */
        wakep_if_idle();
    } else {
        co__globrunqput(&g, 1);
    }
}

static void post_yield(co_g_t *g, void *arg) {
    (void)arg;
    yield_requeue(getm(), g);
}

#ifndef SWITCH_POSTS
/* Never called: run_post recognises it and does co_yield's fast path's
 * post-switch work inline (m at hand). */
static void post_yslot(co_g_t *g, void *arg) {
    (void)g;
    (void)arg;
    abort();
}
#endif

/* co_yield without the yield slot: g switches to the next coroutine of p,
 * and post (post_yield: the ring or the global queue; spawn_yield's
 * post_yield_global: the global queue) requeues it after the switch, with
 * post_arg unused. Out of line, to keep co_yield's fast path short: it
 * saves no registers. */
static __attribute__((noinline)) void yield_slow(co_m_t *m, co_g_t *g, co_p_t *p,
                                                 void (*post)(co_g_t *, void *)) {
    co_g_t *next = runq_next_fast(p);
    if (!next) {
        if (!p || !__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE))
            return; /* nothing else is runnable here: keep running */
        next = &m->g0; /* our P was lent away: requeue globally via g0 */
    }
    co__stack_check(g);
    m->post_fn = post; /* run_post handles post_yield inline */
    m->post_g = g;
    gogo(m, g, next, false);
}

/* The other side of co_yield's fast path's switch (co__jump_yslot): close
 * the window the yielder opened, now that it is saved, then run_post's
 * timer check. Its common case saves no registers. (Defined in every
 * build, as co__switch_post.) */
static __attribute__((noinline)) void post_yslot_timers(co_m_t *m) { run_post(m); }
void co__post_yslot(void) {
    co_m_t *m = getm();
    co_p_t *p = m->p; /* the yielder's P: still ours */
    co__yslot_close(p); /* release: publishes the slot to sysmon */
    if (CO_UNLIKELY(__atomic_load_n(&p->timer0_when, __ATOMIC_RELAXED) != 0)) post_yslot_timers(m);
}

/* co_yield's fast path's switch, its window open and g's stack checked. */
static inline __attribute__((always_inline)) void yield_fast_switch(co_m_t *m, co_g_t *g,
                                                                    co_p_t *p, co_g_t *next) {
    /* (nobody acts on a RUNNABLE status before its switch: any_alive only
     * tells DEAD and IDLE from the rest) */
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
    __atomic_store_n(&p->yieldg, g, __ATOMIC_RELAXED); /* published by the close */
    /* next ran before (it yielded), so it has a stack: a plain switch */
    m->curg = next;
    __atomic_store_n(&next->status, CO_G_RUNNING, __ATOMIC_RELAXED);
#ifdef SWITCH_POSTS
    /* The window closes on the other side, in co__post_yslot: a tail call,
     * so this path saves no registers (the switch saves the caller's). A
     * yield went from 106 to 85 instructions (callgrind) and from 10.9 to
     * 7.5 ns (median of 11 alternating runs, bench_runtime yield). */
    (void)m;
    co__jump_yslot(&g->ctx.sp, next->ctx.sp);
#else
    m->post_fn = post_yslot; /* (needs no post_g) */
    switch_to(g, next, false);
#endif
}

/* The same for a stack without a guard page: its canary checked first. */
static __attribute__((noinline)) void yield_fast_canary(co_m_t *m, co_g_t *g, co_p_t *p,
                                                        co_g_t *next) {
    co__stack_check_canary(g);
    yield_fast_switch(m, g, p, next);
}

void co_yield(void) {
    co_m_t *m = getm();
    if (!m || !m->curg) {
        sched_yield();
        return;
    }
    co_g_t *g = m->curg;
    co_p_t *p = m->p;
    co_g_t *next;
    /* The fast path: the yield slot holds the other party of a ping-pong
     * and nothing else is queued here (yslot.h). No CAS: a yield costs 12.6 ns
     * instead of 22.4 (bench/RESULTS.md). Every 61st schedule goes the long
     * way, for the global queue's check, and so does a yield while a P is
     * idle (the yielder should be where a thief can take it). g goes in
     * the slot before it is saved: the window stays open across the switch
     * (run_post closes it on the other side, post_yslot), and until then
     * nobody else may take from the slot (yslot.h). */
    if (p && (next = co__yslot_peek(p)) != NULL) {
        uint32_t tick = p->schedtick + 1;
        if (tick % 61 != 0 && yslot_fits(p) && co__yslot_open(p)) {
            /* Still next: only a sysmon could have emptied the slot since the
             * peek, and only with p retiring, when the window cannot open. */
            /* relaxed store: sysmon reads it to spot a P that stopped scheduling */
            __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED);
            /* co__stack_check, its call out of line: with no call but the
             * switch left here, this path keeps nothing in callee-saved
             * registers and the switch is a tail call */
            if (CO_UNLIKELY(!g->stack.guarded)) {
                yield_fast_canary(m, g, p, next);
                return;
            }
            yield_fast_switch(m, g, p, next);
            return;
        }
    }
    yield_slow(m, g, p, post_yield);
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
 * sysmon see a switch. */
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
         * harmless. Tiny pool tasks from a coroutine: 45.7 -> 40.2 ns
         * (median of 21 alternating runs; before workers drained the chute
         * themselves, the same prefetch made the submitter slower,
         * docs/hacking.md). */
        __builtin_prefetch(
            rq_strip(__atomic_load_n(&p->runq[(h + 1) % CO_RUNQ_SIZE], __ATOMIC_RELAXED)));
    }
    if (rq_is_token(e)) {
        co__token_t *t = (co__token_t *)rq_strip(e);
        if (t->fn == fn && accept(t, ctx)) { /* no G made */
            co__fpenv_load(t->fpenv);
            __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED);
            live_add(p, -1);
            m->curg->arg = t; /* what it works on now (co__ready_cold) */
            return t;
        }
        co_g_t *g = token_g_slow(p, e); /* it keeps its turn, as a G */
        if (g) __atomic_store_n(&p->runnext, g, __ATOMIC_RELEASE);
        return NULL;
    }
    co_g_t *g = rq_strip(e);
    if (g->fn != fn || g->stack.map || !accept(g->arg, ctx)) {
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
    co__gfput(p, g);
    m->curg->arg = arg; /* what it works on now (co__ready_cold) */
    return arg;
}

/* Any M: move every G queued on p (ring and runnext) to the global queue. */
void co__runq_drain_global(co_p_t *p) {
    co_g_t *batch[CO_RUNQ_SIZE];
    for (;;) {
        uint32_t n = runqgrab(p, batch, 0, true);
        if (n == 0) return;
        for (uint32_t i = 0; i < n; i++) batch[i] = rq_unfresh(batch[i]);
        co__globrunqput(batch, (int)n);
        co__wakep();
    }
}

/* g0 of the M that owns a P sysmon lent away (p->retire): give the P up.
 * Its queued Gs go to the global queue, its timers to the P that replaced
 * it, and the P itself to the spare list. */
/* m's P was lent away: hand what it holds to the P that replaced it and
 * park it on pspare. Its own wakes are the queue moves' (co__wakep does
 * nothing once a shutdown is under way); the shutdown path calls this,
 * and must not start Ms, so nothing else here wakes one. */
static void retire_p_nowake(co_m_t *m) {
    co_sched_t *s = &co__sched;
    co_p_t *p = m->p;
    m->p = NULL;
    /* The yield slot and the owner's batch first (they were to run before
     * the ring); sysmon may be taking them too. */
    if (private_to_global(p)) co__wakep();
    co__runq_drain_global(p);
    co_p_t *dst = co__allp(p->id);
    if (CO_UNLIKELY(s->chaos) && co__fastrand() % 4 == 0) { /* COLONY_DEBUG=chaos: */
        struct timespec ts = {0, 2000000}; /* dst may retire meanwhile */
        nanosleep(&ts, NULL);
    }
    co__timers_move(p, dst, true);
    co__lock(&s->lock);
    for (co_p_t **pp = &s->pretiring; *pp; pp = &(*pp)->link)
        if (*pp == p) {
            *pp = p->link;
            break;
        }
    p->m = NULL;
    /* A spare P carries no count: co_count cannot see a spare that sysmon
     * is lending (off every list for a moment). */
    co__live_global_add(p->ngo); /* lifecycle.c; seq_cst (see live_global there) */
    __atomic_store_n(&p->ngo, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->status, CO_P_DEAD, __ATOMIC_RELEASE);
    __atomic_store_n(&p->retire, 0, __ATOMIC_RELAXED);
    p->link = s->pspare;
    s->pspare = p;
    co__unlock(&s->lock);
}

void co__retire_p(co_m_t *m) {
    retire_p_nowake(m);
    co__wakep(); /* for the Gs drained to the global queue */
}

/* ---- M main loop ---------------------------------------------------------- */

static void *mstart(void *arg) {
    co_m_t *m = arg;
    tls_m = m;
    m->g0.is_g0 = true;
    m->g0.id = 0;
    strcpy(m->g0.name, "g0");
#ifdef CO_TSAN
    m->g0.tsan_fiber = __tsan_get_current_fiber();
#endif
#ifdef CO_ASAN
    {
        pthread_attr_t a;
        void *addr;
        size_t sz;
        if (pthread_getattr_np(pthread_self(), &a) == 0) {
            pthread_attr_getstack(&a, &addr, &sz);
            m->g0.stack.lo = addr;
            m->g0.stack.size = sz;
            pthread_attr_destroy(&a);
        }
    }
#endif
    co__stack_m_init(m);
    if (m->nextp) {
        acquirep(m, m->nextp);
        m->nextp = NULL;
    }
    for (;;) {
        co_g_t *g = findrunnable(m);
        if (!g) break;
        if (m->spinning) resetspinning(m);
        gogo(m, &m->g0, g, false);
    }
    if (m->p) {
        /* retire is checked under sched.lock, as findrunnable does: sysmon
         * lends only a RUNNING P, under this lock. Checked before it, a
         * lend could slip in between, and the P went on the idle list while
         * on pretiring (p->link serves both): shutdown then found P's of
         * allp on the spare list and freed them twice (TSan, test_pool in
         * chaos mode). Sysmon still runs while the first Ms exit. */
        co__lock(&co__sched.lock);
        if (__atomic_load_n(&m->p->retire, __ATOMIC_ACQUIRE)) {
            co__unlock(&co__sched.lock);
            retire_p_nowake(m); /* lent away: it belongs on pspare, not the idle list */
        } else {
            pidleput_locked(m->p);
            co__unlock(&co__sched.lock);
            m->p = NULL;
        }
    }
    co__stack_m_fini(m);
    /* release: everything this thread did happens before the join */
    __atomic_store_n(&m->exited, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* ---- odds and ends ---------------------------------------------------- */

bool co__netpoll_soon(int64_t now) {
    /* acquire: pairs with block_idle's seq_cst store before it polls */
    if (__atomic_load_n(&co__sched.poll_until, __ATOMIC_ACQUIRE) != 0) return true;
    /* Ms that run out of work poll on their way to sleep: one did lately,
     * so one will again soon (sysmon polls after 10 ms without one).
     * relaxed: a hint; pairs with nothing (a stale value costs a read(2) or
     * a wait for the next poll, never a lost wake-up: the edge stays). */
    return now - __atomic_load_n(&co__sched.lastpoll, __ATOMIC_RELAXED) < CO__POLL_RECENT_NS;
}

/* A plain thread is about to park on the netpoller (io.c): make sure an M
 * polls. With none in the poller, every M asleep on its futex or none
 * started yet, only sysmon would, every 10 ms or so: a wake-up per round
 * trip. An M woken here finds no work and, idle, becomes the poller
 * (block_idle). A coroutine's M needs none of this: it goes idle itself,
 * or busy Ms poll each time they run out of work, as in Go. */
void co__netpoll_want(void) {
    /* acquire: a hint (a poller about to leave comes back through
     * findrunnable, which polls while anyone waits) */
    if (__atomic_load_n(&co__sched.polling, __ATOMIC_ACQUIRE) == 0) co__wakep();
}

uint64_t co_id(void) {
    co_g_t *g = co__cur_g();
    return g ? g->id : 0;
}
