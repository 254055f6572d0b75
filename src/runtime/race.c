/*
 * The race detector's view of coroutines (TSan builds; empty otherwise).
 * docs/hacking.md, "The race detector", has the model; in short:
 *
 * The runtime is compiled without TSan's instrumentation (CMakeLists.txt):
 * its bookkeeping (M fields, run queues, G records) is touched by one
 * coroutine after another on one thread, and TSan would otherwise see
 * races there, or, told that a switch synchronises, order every coroutine
 * after the one before it and miss the races between them. Each coroutine
 * lifetime is a TSan fiber of its own, and switches imply nothing
 * (co__race_enter, from run_post). What a program may rely on is annotated
 * instead, as Go's race build annotates its runtime:
 *  - a spawn happens before the coroutine starts (its fiber inherits the
 *    spawner's past; a token's, its submitter's through the token);
 *  - a waker's hand-over (a channel's element, a waiter's result) before
 *    the woken coroutine's return from its park: co__ready releases on the
 *    lifetime's key, the park's return acquires it (park_m); a timeout or
 *    a network event (co__ready_cold) hands nothing over;
 *  - a timer's arming before its callback (timer.c), which runs on its
 *    M's g0 fiber;
 *  - every exit before a successful co_shutdown's return; co_init before
 *    every M's start, and an M's start before the coroutines it runs;
 *  - the runtime's own locking of an upper layer's lock (park.c) as that
 *    lock's, and a pinned section's end before co__pin_wait's return
 *    (proc.c).
 */
#include "runtime/proc.h"

#ifdef CO_TSAN
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

/* Every coroutine's exit releases here; a successful co_shutdown acquires
 * it (lifecycle.c): what they did happens before its return. */
static char exit_key;

/* A new fiber for g, named after it for reports. inherit: it starts with
 * the caller's past (a spawn); else with none (a token's G, made wherever
 * the scheduler took the token: its submitter's past comes through the
 * token, co__race_start). */
static void fiber_make(co_g_t *g, bool inherit) {
    if (!inherit) AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
    void *f = __tsan_create_fiber(0);
    if (!inherit) AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    char name[64]; /* (written by snprintf, on a stack not always the caller's: unrecorded) */
    __tsan_ignore_thread_begin();
    if (g->named)
        snprintf(name, sizeof name, "coroutine %llu (%s)", (unsigned long long)g->id, g->name);
    else
        snprintf(name, sizeof name, "coroutine %llu", (unsigned long long)g->id);
    __tsan_ignore_thread_end();
    __tsan_set_fiber_name(f, name);
    g->tsan_fiber = f;
}

void co__race_spawn(co_g_t *g) {
    /* The key, released as well: a takeover (co__race_take) has no fiber
     * to inherit from. Without memory, no key: a park then returns without
     * its waker's past, and a report may follow (never a crash). */
    g->tsan_key = malloc(1);
    if (g->tsan_key) __tsan_release(g->tsan_key);
    g->tsan_tok = NULL;
    fiber_make(g, true); /* its start happens after this, and after nothing else */
}

void co__race_token_g(co_g_t *g, co__token_t *t) {
    fiber_make(g, false);
    g->tsan_tok = t;
    g->tsan_key = NULL; /* made by g itself, when it starts */
}

void co__race_start(co_g_t *g) {
    if (g->tsan_tok) { /* its submitter's co__spawn_token released there */
        __tsan_acquire(g->tsan_tok);
        g->tsan_tok = NULL;
    }
    if (!g->tsan_key) g->tsan_key = malloc(1);
}

void co__race_exit(co_g_t *g) {
    __tsan_release(&exit_key);
    free(g->tsan_key); /* and its history with it (TSan's free) */
    g->tsan_key = NULL;
}

void co__race_take(co_g_t *g) {
    /* what co__race_start would acquire, for the coroutine taking it over */
    if (g->tsan_key)
        __tsan_acquire(g->tsan_key);
    else if (g->tsan_tok)
        __tsan_acquire(g->tsan_tok);
    free(g->tsan_key);
    g->tsan_key = NULL;
    g->tsan_tok = NULL;
    __tsan_destroy_fiber(g->tsan_fiber); /* it never ran */
    g->tsan_fiber = NULL;
}

bool co__race_claim(co__parker_t *pk, void *winner) { return co__claim_cas(pk, winner); }

void co__race_ready(co_g_t *g) {
    /* g cannot exit before it is readied, so its key is still there */
    if (g->tsan_key) __tsan_release(g->tsan_key);
}

void co__race_woken(co_g_t *g) {
    if (g->tsan_key) __tsan_acquire(g->tsan_key);
}

/* co_init's past (the netpoller's descriptors, say), for every M's start:
 * they start with nothing else (proc.c's newm). */
static char init_key;
void co__race_init(void) { __tsan_release(&init_key); }
void co__race_init_seen(void) { __tsan_acquire(&init_key); }

void co__m_race_start(co_m_t *m) {
    __tsan_acquire(&init_key);
    m->g0.tsan_fiber = __tsan_get_current_fiber();
    m->g0.tsan_on = 1;
    m->tsan_cur = &m->g0;
    /* TSan marks a new thread's thread-locals written by it (its g0 here):
     * the coroutines that run on it later read and write them (errno) */
    __tsan_release(&m->g0);
}

void co__race_enter(co_m_t *m) {
    co_g_t *self = m->curg ? m->curg : &m->g0;
    co_g_t *prev = m->tsan_cur;
    if (self == prev) return;
    if (CO_UNLIKELY(!self->tsan_fiber)) fiber_make(self, false); /* (every G has one) */
    /* The M that ran self last may still be on self's fiber: it switches
     * away only after the post-switch action that made self runnable
     * (run_post). A fiber is current on one thread at a time: wait for it
     * (a few instructions of that M's). */
    for (int i = 0; __atomic_load_n(&self->tsan_on, __ATOMIC_ACQUIRE); i++) {
        if (i < 128)
            co__cpu_relax();
        else
            sched_yield(); /* that M's thread may be preempted */
    }
    __atomic_store_n(&self->tsan_on, 1, __ATOMIC_RELAXED);
    __tsan_switch_to_fiber(self->tsan_fiber, CO_TSAN_NO_SYNC);
    m->tsan_cur = self;
    /* release: our last use of its fiber, before another M's first */
    __atomic_store_n(&prev->tsan_on, 0, __ATOMIC_RELEASE);
    if (self != &m->g0) __tsan_acquire(&m->g0); /* this thread's start (co__m_race_start) */
}

void co__race_timers_run(co_m_t *m, co_p_t *p, int64_t now) {
    /* Timer callbacks are not the running coroutine's doing: on its M's
     * g0 fiber, as if g0 ran them (Go runs them on a per-P context). */
    void *self = __tsan_get_current_fiber();
    if (self == m->g0.tsan_fiber) {
        co__timers_run(p, now);
        return;
    }
    __tsan_switch_to_fiber(m->g0.tsan_fiber, CO_TSAN_NO_SYNC);
    co__timers_run(p, now);
    __tsan_switch_to_fiber(self, CO_TSAN_NO_SYNC);
}

void co__race_shutdown(void) { __tsan_acquire(&exit_key); }
#endif
