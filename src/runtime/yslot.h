/*
 * The yield slot: per P, one coroutine that yielded while its P had nothing
 * else queued, kept where thieves never look.
 *
 * Why. A yield puts the running coroutine behind its P's queue and runs the
 * queue's head. The ring's head is shared with thieves, so the owner takes
 * it with a locked CAS: 7 ns of a 25 ns yield on the Xeon of
 * bench/RESULTS.md. Two coroutines taking turns on one P (the yield
 * benchmark, a producer and a consumer that yield to each other, a
 * computation that yields now and then beside another) never need a thief:
 * the slot hands them over with plain loads and stores (12.6 ns).
 *
 * When. yield_requeue (sched.c) puts the yielder in the slot, instead of the
 * ring, only if the slot, the ring and runnext are empty and no P is idle:
 * with an idle P about, a yielder stays where a thief can take it. The slot
 * is older than anything queued after it, so the owner runs it before the
 * ring (after runnext, which is "run next" by definition).
 *
 * The windows guard the owner's batch too (runtime.h's p->ob and p->obn,
 * sched_impl.h's runqget): entries the owner took from its ring's head in one
 * CAS, to run next. Same rules: the owner in a window, and once retire is
 * set, an exchange of obn by the owner or by sysmon.
 *
 * Who touches it. p->yieldg and p->yseq:
 *  - the P's owner M, inside a window (co__yslot_open .. co__yslot_close):
 *    relaxed loads, release stores; a window opens only while p->retire is
 *    clear;
 *  - once p->retire is set (sysmon lends a spare in p's place: p's
 *    coroutine ran 10 ms without entering the scheduler, and the one in the
 *    slot may be what it waits for): the owner when it retires p, and
 *    sysmon (co__yslot_steal), each by an exchange, so one of them gets it.
 *
 * The handshake with sysmon (an asymmetric Dekker). The owner opens a window
 * by making yseq odd, then reads retire; it closes it by making yseq even.
 * Sysmon, after setting retire, reads yseq (even: no window open, or none
 * visible yet), calls membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which
 * makes every running thread of the process execute a full barrier, and
 * reads yseq again. Unchanged means: any window the owner opened before its
 * barrier would show (its odd store is then visible), and any window opened
 * after it reads retire == 1 and touches nothing. So the owner pays no
 * fence: only sysmon pays, rarely, a system call. Where membarrier is
 * missing (kernels before 4.14, seccomp, emulators) the slot is never used.
 */
#ifndef COLONY_YSLOT_H
#define COLONY_YSLOT_H

#include "runtime/proc.h"

/* Set once at co_init (co__yslot_init), read by the owner's yield path:
 * whether membarrier works here and the slot may be used. */
CO_HIDDEN extern int co__yslot_on;

CO_HIDDEN void co__yslot_init(void);
/* Any thread but p's owner, with p->retire set: take the slot's coroutine
 * and the owner's batch (runtime.h's p->ob, which windows guard too) if
 * the owner is outside a window. They go to out (room for 1 + CO_OBATCH),
 * in the order they were to run, as ring entries (tagged); returns how
 * many (0 also when a window is open: the caller tries again later). */
CO_HIDDEN int co__yslot_steal(co_p_t *p, co_g_t **out);
/* The same without the handshake, for a P that nobody owns (being handed
 * off, or retired by its own M) or whose owner cannot open a window any
 * more: the slot's coroutine and the batch, by exchange, into out. */
CO_HIDDEN int co__yslot_take(co_p_t *p, co_g_t **out);

/* Owner: open a window; false (none open) if p is retiring. */
static inline __attribute__((always_inline)) bool co__yslot_open(co_p_t *p) {
    uint32_t q = p->yseq;
    /* relaxed: sysmon's membarrier orders it before the load below */
    __atomic_store_n(&p->yseq, q + 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* no compiler reordering */
    if (CO_LIKELY(!__atomic_load_n(&p->retire, __ATOMIC_RELAXED))) return true;
    __atomic_store_n(&p->yseq, q + 2, __ATOMIC_RELEASE);
    return false;
}

/* Owner: close the window. release: the slot's store (and the coroutine's
 * state before it) is visible to a sysmon that reads yseq even. */
static inline __attribute__((always_inline)) void co__yslot_close(co_p_t *p) {
    __atomic_store_n(&p->yseq, p->yseq + 1, __ATOMIC_RELEASE);
}

/* Anyone: a hint (the owner only: exact). */
static inline co_g_t *co__yslot_peek(co_p_t *p) {
    return __atomic_load_n(&p->yieldg, __ATOMIC_RELAXED);
}

#endif
