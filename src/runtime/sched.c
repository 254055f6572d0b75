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
 * Worker parking/unparking (proc.go's essay, applied here; wakep and startm
 * are in proc.c). We must not leave a runnable G stranded while Ps sit
 * idle, and we must not wake more Ms than there is work for. An M looking
 * for work is "spinning" (sched.nmspinning). wakep() starts an M only if a
 * P is idle and no M is spinning: the spinning M will find the new work or
 * hand the job on. A spinning M that finds work calls resetspinning(),
 * which wakes another spinner. An M that gives up its P and stops spinning
 * first decrements nmspinning (seq_cst) and then re-checks every P's run
 * queue; a submitter first publishes its G (runqput's store-release / the
 * global queue) and then reads nmspinning (seq_cst) in wakep(). Either the
 * submitter sees the spinner or the spinner sees the G (StoreLoad on both
 * sides).
 *
 * Sleeping (proc.c's co__block_idle). Idle Ms sleep on a futex in m->park
 * (never busy-poll). One idle M at a time is the poller: it blocks in
 * co__netpoll until the earliest timer of all Ps (sched.poll_until);
 * adding an earlier timer breaks it. An M without a P on its way to sleep
 * is in transit (sched.ntransit): startm, finding no M asleep, leaves its
 * P idle for such an M (sched.nwanted) rather than make a thread, and the
 * M takes it at stopm or at the poll; one that takes a P of its own
 * instead passes the wake-up on. So Ms beyond those inside co_blocking
 * and those holding Ps are made only when none is on its way to be spare.
 *
 * Where. This file: the current M, switching, a coroutine's exit, park,
 * ready and yield, and the M's loop (findrunnable, mstart). runq.c: the
 * run queues (their owner's fast operations inline in sched_impl.h), the
 * global queue's pulls, stealing. proc.c: Ps and Ms (the idle P list,
 * startm, wakep, stopm, handoffp, an idle M's sleep, retiring a P).
 * spawn.c: G records, spawning, back-pressure, the pool's tokens.
 * sched_impl.h: the inline helpers they share, so that the hot paths
 * (co_yield, spawn, park and ready) make no call between these files.
 */
#include "runtime/sched_impl.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

co_sched_t co__sched;

/* ---- the current M and G ------------------------------------------------ */

/* This thread's M (sched_impl.h's getm reads it inline). */
__thread co_m_t *co__tls_m __attribute__((tls_model("initial-exec")));
static __thread void *tls_panic_top; /* co__panic_slot for plain threads */

/* co__test_reset_after_fork (lifecycle.c): this thread is no M. */
void co__tls_m_forget(void) { co__tls_m = NULL; }

/* Reached through a non-inlined function so a coroutine that migrated to
 * another thread never uses a TLS address computed on the old one. */
__attribute__((noinline)) co_m_t *co__getm(void) {
    __asm__ volatile("" ::: "memory");
    return co__tls_m;
}

/* Reads the TLS itself (one call, not two); noinline for the same reason
 * as co__getm. */
__attribute__((noinline)) co_g_t *co__cur_g(void) {
    __asm__ volatile("" ::: "memory");
    co_m_t *m = co__tls_m;
    /* inside co_blocking the M holds no P: it waits as a thread would */
    return m && m->p ? m->curg : NULL;
}
__attribute__((noinline)) co_g_t *co__running_g(void) {
    __asm__ volatile("" ::: "memory");
    co_m_t *m = co__tls_m;
    return m ? m->curg : NULL;
}
uint64_t co__g_id(const co_g_t *g) { return g ? g->id : 0; }
const char *co__g_name(const co_g_t *g) { return g ? g->name : ""; }
uint64_t co_id(void) {
    co_g_t *g = co__running_g();
    return g ? g->id : 0;
}
void **co__panic_slot(void) {
    co_g_t *g = co__running_g();
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
#ifdef CO_TSAN
static void post_gfree(co_g_t *g, void *arg);
#endif

static inline __attribute__((always_inline)) void run_post(co_m_t *m) {
    void (*f)(co_g_t *, void *) = m->post_fn;
#ifdef CO_TSAN
    /* TSan's current fiber is still the switching coroutine's: its
     * post-switch action is its own doing (the unlock it deferred, say),
     * and runs as such; then the fiber of whoever runs now (race.c). An
     * exited coroutine's fiber goes once that switch is done; it is taken
     * off its G first, as the action gives the G back for reuse. The
     * action runs on this context's stack, not the switcher's: its memory
     * accesses are not recorded, or this coroutine's own, later, at the
     * same addresses would look like races with it. That holds for every
     * action, a yield's requeue too: its lock's slow path reads the clock
     * into a timespec on g0's stack, a thread stack glibc may hand to a
     * later M with that shadow still on it. */
    void *dead = NULL;
    bool hide = f != NULL;
    if (f == post_gfree) {
        dead = m->post_g->tsan_fiber;
        m->post_g->tsan_fiber = NULL;
    }
    if (hide) __tsan_ignore_thread_begin();
#endif
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
#ifdef CO_TSAN
    if (hide) __tsan_ignore_thread_end();
    co__race_enter(m);
    if (dead) __tsan_destroy_fiber(dead);
#endif
    co_p_t *p = m->p;
    if (p && CO_UNLIKELY(__atomic_load_n(&p->timer0_when, __ATOMIC_RELAXED) != 0)) {
        /* A pending timer would cost every switch a clock read: read it
         * at most every CO__CYCLES_SHORT ticks of the cheap counter
         * instead. A due timer waits at most that long (a microsecond or
         * two) more; a counter that went backwards (another CPU's) or
         * reads 0 (no counter) means: check now. */
        uint64_t c = co__cycles();
        if (c - m->tcheck >= CO__CYCLES_SHORT || c == 0) {
            m->tcheck = c;
            int64_t w = __atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE);
            int64_t now;
            if (w && w <= (now = co_now())) {
#ifdef CO_TSAN
                co__race_timers_run(m, p, now);
#else
                co__timers_run(p, now);
#endif
            }
        }
    }
}

static inline __attribute__((always_inline)) void switch_to(co_g_t *from, co_g_t *to,
                                                            bool from_exiting);

/* Whether a switch to g needs more than the plain way: compact_on, is_g0
 * or trace_sw set (proc.h). One test of the aligned word they share (the
 * fourth byte, named, masked off); trace_sw is written by other
 * threads, so under TSan three atomic loads. */
static inline __attribute__((always_inline)) bool gogo_special(co_g_t *g) {
#if defined(CO_TSAN) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return __atomic_load_n(&g->compact_on, __ATOMIC_RELAXED) || g->is_g0 ||
           __atomic_load_n(&g->trace_sw, __ATOMIC_RELAXED);
#else
    uint32_t w;
    memcpy(&w, &g->compact_on, sizeof w);
    return (w & 0x00ffffffu) != 0; /* little-endian: named is the high byte */
#endif
}

/* Switch from `from` (running on m) to `to`. Returns when `from` is
 * resumed, possibly on another M; runs that M's post-switch action. how:
 * the trace's word for why `from` stops (CO__TEV_PARK, YIELD, EXIT). */
static inline __attribute__((always_inline)) void gogo(co_m_t *m, co_g_t *from, co_g_t *to,
                                                       bool from_exiting, int how) {
    if (CO_UNLIKELY(!to->stack.map) && !to->is_g0) {
        int rc = co__stack_attach(m, to, from->is_g0);
        if (rc < 0) { /* a stack to map: on g0, after from's post-switch action */
            m->g0_next = to;
            to = &m->g0;
        } else if (rc == 0) {
            /* No stack for its first run: `to` waits on stackwait (gcache.c).
             * g0 looks for other work; a G switches to g0, which does. */
            if (from->is_g0) return;
            to = &m->g0;
        }
    }
    /* compact_on, is_g0 and trace_sw in one test: a plain G, no trace on,
     * goes straight on. While a trace is on every G's trace_sw is set, and
     * the switch is recorded; a switch to g0 is recorded whenever a trace
     * is on. One that opted in to compaction has its stack put back in
     * place (compact.c) before anything runs on it. (The G's own store of
     * compact_on was ordered before this by its park and ready.) */
    if (CO_LIKELY(!gogo_special(to))) {
        m->curg = to;
        __atomic_store_n(&to->status, CO_G_RUNNING, __ATOMIC_RELAXED);
    } else {
        CO_TRACE_SWITCH(how, from, to);
        if (to->is_g0) {
            m->curg = NULL;
        } else {
            if (__atomic_load_n(&to->compact_on, __ATOMIC_RELAXED)) co__compact_resume(to);
            m->curg = to;
            __atomic_store_n(&to->status, CO_G_RUNNING, __ATOMIC_RELAXED);
        }
    }
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
    /* (TSan's fiber changes after the switch: run_post) */
    co__ctx_switch(&from->ctx, &to->ctx);
#ifdef CO_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake, NULL, NULL);
#endif
    run_post(getm());
#endif
}

/* ---- a coroutine's exit ------------------------------------------------- */

static void post_gfree(co_g_t *g, void *arg) {
    (void)arg;
    co_m_t *m = getm();
    co__gfput(m->p, g);
}

/* (Not under TSan: there a stack's pages are mapped afresh before it hosts
 * another coroutine, gcache.c, which cannot be done from on it.) */
#if defined(CO__HAVE_FRESH_START) && !defined(CO_TSAN)
#define GOEXIT_HANDOVER 1
#endif

#ifdef GOEXIT_HANDOVER
/* goexit of g, whose default-size stack goes straight to next, which never
 * ran (so has none): next starts at the stack's top, where g's first frame
 * was, with no switch, no saved context and no trip of the stack through
 * the cache. g's frames below are dropped, this one included: nothing here
 * is needed once next runs. It records no trace event: while a trace is
 * on, goexit does not come here (co__sched.handover_size). */
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
#ifdef GOEXIT_HANDOVER
    /* (m->post_fn is empty: run_post cleared it when g last resumed) */
    /* (handover_size: 0 while a trace is on, which this way would not see) */
    if (next && !next->stack.map &&
        g->stack.size == __atomic_load_n(&co__sched.handover_size, __ATOMIC_RELAXED))
        goexit_handover(m, g, next);
#endif
    m->post_fn = post_gfree;
    m->post_g = g;
    gogo(m, g, next ? next : &m->g0, true, CO__TEV_EXIT);
    __builtin_unreachable();
}

void co__g_entry(co_g_t *g) {
#ifdef CO_ASAN
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
    run_post(getm());
#ifdef CO_TSAN
    co__race_start(g);
#endif
    g->fn(g->arg);
#ifdef CO_TSAN
    co__race_exit(g);
#endif
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

/* ---- park / ready / yield ----------------------------------------------- */

/* Make g runnable on this P (runnext), or on the global queue from a plain
 * thread, and wake an M if a P is idle and none spins. */
static inline void ready_put(co_g_t *g) {
    CO_TRACE(CO__TEV_READY, g, 0);
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
#ifdef CO_TSAN
    /* a waker's: its hand-over happens before g's return from its park
     * (co__ready_cold's are a timer's or the network's: nothing handed) */
    co__race_ready(g);
#endif
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
    co_m_t *m = getm();
    if (CO_UNLIKELY(m && m->p && m->np_batch)) {
        /* One of a batch of the network's or the timers' wake-ups: the
         * ring's tail, in order. Each into runnext would push whoever is
         * there (a timer's coroutine, due now) behind the whole batch. */
        CO_TRACE(CO__TEV_READY, g, 0);
        __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
        runqput(m->p, g, false);
        wakep_if_idle();
        return;
    }
    ready_put(g);
}

/* Many Gs readied at once (a waitgroup's release, a broadcast): in their
 * order at the ring's tail (runnext is left alone: with hundreds woken, the
 * last one first would only reverse them), each G's record prefetched a few
 * entries ahead, and their stacks not at all: the later ones run long
 * after this, on whichever P takes them, and lines fetched now would be
 * gone by then (runqget prefetches a G's stack a turn before it runs). */
void co__ready_many(co_g_t *const *gs, size_t n) {
    enum { AHEAD = 8 };
    for (size_t i = 0; i < n && i < AHEAD; i++) __builtin_prefetch(gs[i], 1);
    co_m_t *m = getm();
    co_p_t *p = m ? m->p : NULL;
    if (!p) co__plain_ready_begin(); /* until the last wake-up: see there */
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n) __builtin_prefetch(gs[i + AHEAD], 1);
        co_g_t *g = gs[i];
        CO_TRACE(CO__TEV_READY, g, 0);
#ifdef CO_TSAN
        co__race_ready(g); /* as co__ready */
#endif
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
    __atomic_store_n(&g->wait_reason, (int8_t)reason, __ATOMIC_RELAXED);
    __atomic_store_n(&g->waitsince, __atomic_load_n(&co__sched.coarse_ms, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    co__stack_check(g);
    m->post_fn = post;
    m->post_g = g;
    m->post_arg = arg;
    co_g_t *next = runq_next_fast(m->p);
    gogo(m, g, next ? next : &m->g0, false, CO__TEV_PARK);
#ifdef CO_TSAN
    co__race_woken(g); /* whoever readied it handed over what it had */
#endif
}

/* Owner: a yielder may wait in the yield slot instead of the ring: nothing
 * else is queued on p and no P is idle (an idle one's M could steal it
 * from the ring). Relaxed loads: p's own fields, and npidle a hint either
 * way. The caller checks the slot itself (empty to put, full to swap). */
static inline __attribute__((always_inline)) bool yslot_fits_local(co_p_t *p) {
    return !__atomic_load_n(&p->runnext, __ATOMIC_RELAXED) &&
           __atomic_load_n(&p->runqhead, __ATOMIC_RELAXED) == p->runqtail &&
           !__atomic_load_n(&p->obn, __ATOMIC_RELAXED);
}
static inline __attribute__((always_inline)) bool yslot_fits(co_p_t *p) {
    return yslot_fits_local(p) && !__atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED);
}

/* Whether co_yield's fast path must step aside: a P is idle, or a trace is
 * on (co__sched.traced). On x86-64 one load of both words: the trace costs
 * the untraced path no instruction of its own. */
static inline __attribute__((always_inline)) bool yield_stand_aside(void) {
#if defined(CO_TRACE_NO_SITES)
    return __atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED) != 0;
#elif defined(__x86_64__) && !defined(CO_TSAN)
    return __atomic_load_n(&co__sched.npidle_traced, __ATOMIC_RELAXED) != 0;
#else
    return __atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED) != 0 ||
           __atomic_load_n(&co__sched.traced, __ATOMIC_RELAXED) != 0;
#endif
}

/* After a yield, on the M that switched away from g: g goes behind the
 * others. run_post does it inline; post_yield is its name for m->post_fn. */
static inline __attribute__((always_inline)) void yield_requeue(co_m_t *m, co_g_t *g) {
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
    co_p_t *p = m->p;
    if (p && !__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE)) {
        /* The fresh deque empty too: while the slot is taken nothing goes
         * on it, so co_yield's swap need not look (sched_impl.h) */
        if (__atomic_load_n(&co__yslot_on, __ATOMIC_RELAXED) && !co__yslot_peek(p) &&
            yslot_fits(p) && p->flbot == __atomic_load_n(&p->fltop, __ATOMIC_RELAXED) &&
            co__yslot_open(p)) {
            /* release: g's state before it, for whoever takes it (sysmon) */
            __atomic_store_n(&p->yieldg, g, __ATOMIC_RELEASE);
            co__yslot_close(p);
            return;
        }
        runqput_(p, g, false, true);
        /* With a P idle (the slot was refused for that), someone must take
         * it: an idle P's M sleeps until woken, and nothing else would wake
         * it (two coroutines yielding to each other on one P kept the
         * other P asleep for good). */
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
 * and post (post_yield: the ring or the global queue; spawn.c's
 * post_yield_global: the global queue) requeues it after the switch, with
 * post_arg unused. Out of line, to keep co_yield's fast path short: it
 * saves no registers. */
__attribute__((noinline)) void co__yield_slow(co_m_t *m, co_g_t *g, co_p_t *p,
                                              void (*post)(co_g_t *, void *)) {
    co_g_t *next = runq_next_fast(p);
    if (!next) {
        if (!p || (!__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE) &&
                   !__atomic_load_n(&co__sched.nstranded, __ATOMIC_RELAXED)))
            return; /* nothing else is runnable here: keep running */
        /* our P was lent away (requeue globally via g0), or an M waits
         * for it (g0 hands it over, g in its queue) */
        next = &m->g0;
    }
    co__stack_check(g);
    m->post_fn = post; /* run_post handles post_yield inline */
    m->post_g = g;
    gogo(m, g, next, false, CO__TEV_YIELD);
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
     * so this path saves no registers (the switch saves the caller's). */
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

/* co_yield's fast path stepping aside (yield_stand_aside): with a P idle,
 * the ring's way (the yielder where a thief can take it); with only a
 * trace on, the slot's way with the switch recorded first (a traced yield
 * costs a record, not the ring's way). */
static __attribute__((noinline)) void yield_aside(co_m_t *m, co_g_t *g, co_p_t *p,
                                                  co_g_t *next, uint32_t tick) {
    if (__atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED) == 0 && co__yslot_open(p)) {
        __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED); /* as co_yield's */
        co__trace_switch(CO__TEV_YIELD, g, next);
        if (CO_UNLIKELY(!g->stack.guarded)) co__stack_check_canary(g);
        yield_fast_switch(m, g, p, next);
        return;
    }
    co__yield_slow(m, g, p, post_yield);
}

void co_gosched(void) __attribute__((alias("co_yield")));
void co_yield(void) {
    co_m_t *m = getm();
    if (!m || !m->p) { /* a plain thread, or inside co_blocking */
        sched_yield();
        return;
    }
    co_g_t *g = m->curg;
    co_p_t *p = m->p;
    co_g_t *next;
    /* The fast path: the yield slot holds the other party of a ping-pong
     * and nothing else is queued here (yslot.h). No CAS, no ring. Every
     * 61st schedule goes the long
     * way, for the global queue's check, and so does a yield while a P is
     * idle (the yielder should be where a thief can take it). g goes in
     * the slot before it is saved: the window stays open across the switch
     * (run_post closes it on the other side, post_yslot), and until then
     * nobody else may take from the slot (yslot.h). */
    if (p && (next = co__yslot_peek(p)) != NULL) {
        uint32_t tick = p->schedtick + 1;
        if (tick % 61 != 0 && yslot_fits_local(p)) {
            if (CO_UNLIKELY(yield_stand_aside())) {
                yield_aside(m, g, p, next, tick);
                return;
            }
            if (co__yslot_open(p)) {
                /* Still next: only a sysmon could have emptied the slot
                 * since the peek, and only with p retiring, when the window
                 * cannot open. */
                /* relaxed store: sysmon reads it to spot a P that stopped scheduling */
                __atomic_store_n(&p->schedtick, tick, __ATOMIC_RELAXED);
                /* co__stack_check's call out of line: with no call but the
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
    }
    co__yield_slow(m, g, p, post_yield);
}


/* ---- affine Gs: back to the thread they parked on ------------------------
 * Foreign code may keep the address of errno or of a thread-local across a
 * call that parks (the hook's read, say). co_thread_return brings such a
 * coroutine back to the M it parked on: the M that woke it queues it on
 * that M's affq (sched.lock), and that M runs it at its next look:
 * findrunnable, every 61st schedule (runq_next_fast), or, asleep on the
 * idle list, with the P of the M that sent it (as Go's startlockedm),
 * an idle P, or the next P to go idle (co__affine_handoff_locked).
 * Queued, such a G is RUNNABLE: the deadlock detector counts it so. */

void *co_thread_home(void) {
    co_m_t *m = getm();
    return m && m->curg ? m : NULL;
}

co_g_t *co__affq_take(co_m_t *m) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    co_g_t *g = m->affq;
    if (g) {
        /* relaxed store: the owner's hint (see co_m_t) */
        __atomic_store_n(&m->affq, g->schedlink, __ATOMIC_RELAXED);
        if (!g->schedlink) m->affq_tail = NULL;
        g->schedlink = NULL;
        s->naffq--;
    }
    co__unlock(&s->lock);
    return g;
}

/* sched.lock held. m leaves the idle list with p, woken. */
static void affine_wake_locked(co_m_t *m, co_p_t *p) {
    co_sched_t *s = &co__sched;
    for (co_m_t **pp = &s->midle; *pp; pp = &(*pp)->link) {
        if (*pp == m) {
            *pp = m->link;
            s->nmidle--;
            break;
        }
    }
    m->onmidle = false;
    co__unstrand_locked(m);
    m->spinning = false;
    m->nextp = p;
    /* store-release: publishes nextp to the woken M's acquire load (stopm) */
    __atomic_store_n(&m->park, 1, __ATOMIC_RELEASE);
    co__futex_wake(&m->park, 1);
}

/* sched.lock held: the first M asleep on the idle list with Gs on its
 * affq (stranded: no P was handed to it), or NULL. */
static co_m_t *stranded_home_locked(void) {
    for (co_m_t *m = co__sched.midle; m; m = m->link)
        if (m->affq && m->onmidle) return m;
    return NULL;
}

/* sched.lock held: p, which its M has let go, to home, woken with it. */
static void hand_p_locked(co_p_t *p, co_m_t *home) {
    p->m = NULL;
    __atomic_store_n(&p->status, CO_P_IDLE, __ATOMIC_RELEASE);
    affine_wake_locked(home, p);
}

bool co__affine_handoff_locked(co_p_t *p) {
    co_sched_t *s = &co__sched;
    if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) return false;
    co_m_t *m = stranded_home_locked();
    if (m) {
        hand_p_locked(p, m);
        return true;
    }
    /* none asleep: the one with Gs may be the poller; it takes p after */
    co__netpoll_break();
    return false;
}

void co__strand_locked(co_m_t *m) {
    if (m->stranded) return;
    m->stranded = true;
    co_sched_t *s = &co__sched;
    __atomic_store_n(&s->nstranded, s->nstranded + 1, __ATOMIC_RELAXED);
}

void co__unstrand_locked(co_m_t *m) {
    if (!m->stranded) return;
    m->stranded = false;
    co_sched_t *s = &co__sched;
    __atomic_store_n(&s->nstranded, s->nstranded - 1, __ATOMIC_RELAXED);
}

/* sched.lock held: m, on g0, gives its P p to home, asleep on the idle
 * list (as Go's startlockedm), and goes on P-less, on its way to sleep. */
static void give_p_locked(co_m_t *m, co_p_t *p, co_m_t *home) {
    CO_TRACE(CO__TEV_P_RELEASE, p->id, 0);
    m->p = NULL;
    co__transit_begin_locked(m);
    hand_p_locked(p, home);
}

bool co__relieve_stranded(co_m_t *m) {
    co_sched_t *s = &co__sched;
    co_p_t *p = m->p;
    co__lock(&s->lock);
    co_m_t *home = NULL;
    if (p && !__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE) &&
        !__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE))
        home = stranded_home_locked();
    if (!home) {
        co__unlock(&s->lock);
        return false;
    }
    /* P-less, this M must not count as spinning (see findrunnable) */
    if (m->spinning) {
        m->spinning = false;
        __atomic_sub_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
    }
    give_p_locked(m, p, home);
    co__unlock(&s->lock);
    return true;
}

/* g0 of the M that woke g, after g switched away: g goes to its home M's
 * queue; an asleep home gets this M's P (this M then looks for another). */
static void post_affine(co_g_t *g, void *arg) {
    co_m_t *home = arg;
    co_m_t *m = getm();
    co_sched_t *s = &co__sched;
    CO_TRACE(CO__TEV_READY, g, 0);
#ifdef CO_TSAN
    co__race_ready(g);
#endif
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
    co__lock(&s->lock);
    g->schedlink = NULL;
    if (home->affq_tail)
        home->affq_tail->schedlink = g;
    else
        __atomic_store_n(&home->affq, g, __ATOMIC_RELAXED); /* the owner's hint */
    home->affq_tail = g;
    s->naffq++;
    co_p_t *p = m->p;
    co_p_t *hp = NULL; /* the P an asleep home wakes with */
    if (home->onmidle && !__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        if (p && !__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE)) {
            hp = p;
            give_p_locked(m, p, home);
        } else {
            /* This M's P cannot go (sysmon lent it away meanwhile): an
             * idle P, or else a busy P's next look (co__relieve_stranded)
             * or the next P to go idle (pidleput_locked's handoff).
             * Without this, with every P already idle, nothing woke home
             * again. */
            hp = co__pidleget_locked();
            if (hp)
                affine_wake_locked(home, hp);
            else
                co__strand_locked(home);
        }
    }
    co__unlock(&s->lock);
    /* home may be the poller, or on its way to sleep: it looks again. The
     * break writes only to a poller that has set its sleeping flag: the
     * fence orders the queueing above before that load, as co__netpoll
     * orders its store of the flag before its load of affq (else both
     * could miss the other and the poller sleep with g queued). */
    if (!hp) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        co__netpoll_break();
    }
}

/* m's current G to home's affq, by way of g0 (post_affine), until home
 * runs it. */
static void park_to_home(co_m_t *m, co_m_t *home) {
    co_g_t *g = m->curg;
    __atomic_store_n(&g->wait_reason, (int8_t)CO__WR_NONE, __ATOMIC_RELAXED);
    co__stack_check(g);
    m->post_fn = post_affine;
    m->post_g = g;
    m->post_arg = home;
    /* on g0: post_affine may give the P away; traced as a park */
    gogo(m, g, &m->g0, false, CO__TEV_PARK);
#ifdef CO_TSAN
    co__race_woken(g);
#endif
}

void co__park_home(void) {
    co_m_t *m = getm();
    park_to_home(m, m);
}

void co_thread_return(void *home) {
    co_m_t *m = getm();
    if (!home || m == home || !m || !m->curg || !m->p) return;
    park_to_home(m, home);
}


/* ---- M main loop -------------------------------------------------------- */

static void resetspinning(co_m_t *m) {
    CO_TRACE(CO__TEV_M_SPIN_END, 0, 0);
    m->spinning = false;
    __atomic_sub_fetch(&co__sched.nmspinning, 1, __ATOMIC_SEQ_CST);
    co__wakep();
}

/* Find a runnable G for m (which holds a P). Blocks. NULL on shutdown. */
static co_g_t *findrunnable(co_m_t *m) {
    co_sched_t *s = &co__sched;
    for (;;) {
        if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) return NULL;
        co_p_t *p = m->p;
        if (p && CO_UNLIKELY(__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE))) {
            /* Without a P this M goes to co__block_idle: it must stop spinning
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
            co__block_idle(m);
            continue;
        }
        co_g_t *g;
        /* this M's own sent-home Gs first: a P handed over for them must
         * not be handed on before they run */
        if (CO_UNLIKELY(__atomic_load_n(&m->affq, __ATOMIC_RELAXED) != NULL) &&
            (g = co__affq_take(m)))
            return g;
        /* An M asleep with Gs only it may run, every P busy: this one */
        if (CO_UNLIKELY(__atomic_load_n(&s->nstranded, __ATOMIC_RELAXED) != 0) &&
            co__relieve_stranded(m))
            continue;
        int64_t tw = __atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE);
        if (tw && tw <= co_now()) co__timers_run(p, co_now());
        g = runq_next_fast(p);
        if (g) return g;
        /* Lent away just now, or an M stranded since the look above:
         * runq_next_fast gave up without looking at the queue, which may
         * be full. Retire or hand over at the top; never steal into it. */
        if (CO_UNLIKELY(__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE)) ||
            CO_UNLIKELY(__atomic_load_n(&s->nstranded, __ATOMIC_RELAXED) != 0))
            continue;
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
                CO_TRACE(CO__TEV_M_SPIN, 0, 0);
                m->spinning = true;
                __atomic_add_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
            }
            if ((g = co__stealwork(m))) return g;
        }
        /* Nothing: give up the P. */
        bool moved = co__globq_lock();
        if ((g = co__globrunqget_locked(p, 0))) {
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
        co__transit_begin_locked(m);
        co__unlock(&s->lock);
        if (CO_UNLIKELY(s->chaos) || co__test_failing(CO__FAIL_SLOW_IDLE))
            co__transit_pause(); /* widens the window in which m is in transit */
        bool was_spinning = m->spinning;
        if (was_spinning) {
            CO_TRACE(CO__TEV_M_SPIN_END, 0, 0);
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
        co__block_idle(m);
    }
}

/* An M's thread (newm, proc.c): its g0 runs a G after another until the
 * runtime shuts down. */
void *co__mstart(void *arg) {
    co_m_t *m = arg;
    co__tls_m = m;
    m->tid = (int)syscall(SYS_gettid);
    if (pthread_getcpuclockid(pthread_self(), &m->cpuclock) != 0)
        m->cpuclock = CLOCK_THREAD_CPUTIME_ID; /* unusable from sysmon: judged unknown */
    m->g0.is_g0 = true;
    m->g0.id = 0;
    strcpy(m->g0.name, "g0");
#ifdef CO_TSAN
    co__m_race_start(m);
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
        co_g_t *g = m->g0_next;
        if (g) {
            m->g0_next = NULL;
        } else {
            g = findrunnable(m);
            if (!g) break;
            if (m->spinning) resetspinning(m);
        }
        gogo(m, &m->g0, g, false, 0);
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
            co__retire_p_nowake(m); /* lent away: it belongs on pspare, not the idle list */
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
