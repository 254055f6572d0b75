/*
 * colony's internal lock and futex helpers.
 *
 * co__lock_t is a futex mutex with its two halves in one 32-bit word:
 * `locked` (0 free, 1 held) and `sleepers` (threads asleep on it, or about
 * to be). Lock: CAS locked 0 -> 1 (acquire). Unlock: load sleepers, store
 * locked = 0 (release), and wake one if there were sleepers. Drepper's
 * three-state mutex ("Futexes are tricky") unlocks with an exchange
 * instead, to learn in the same instruction whether someone sleeps; that
 * locked instruction drains the store buffer on every unlock, which a plain
 * store does not (docs/perf-notes.md has the channel figures). The load
 * comes first because the store must be the unlock's last touch
 * of the lock: its next holder may free it at once (TSan caught a load
 * after the store reading a channel freed meanwhile).
 *
 * The price: an unlock can miss a locker that counts itself in between the
 * unlocker's load and its store (or, on x86-64 and AArch64, whose count is
 * not visible yet), and which then sees the lock still held. Two things
 * cover it, without a fence on the unlock path:
 *  - after counting itself in, a locker keeps trying the CAS for
 *    CO__LOCK_RECHECK cycles (about 1.5 us) before it sleeps. The missed
 *    unlock's store follows its load within nanoseconds (unless its thread
 *    loses the CPU right there), so it is seen and the lock taken;
 *  - the sleep itself is bounded (CO__LOCK_NAP_NS): a locker that still
 *    slept through an unlock wakes, tries again and sleeps again. No
 *    interleaving can leave it asleep on a free lock for longer. And any
 *    later unlock, seeing it counted, wakes it.
 * The futex compares the whole word (both halves): any change
 * of either half between the look and the sleep makes the kernel refuse
 * to sleep, and the locker looks again.
 *
 * The spin is Go's (lock_futex.go): look, and if still taken, pause
 * CO__LOCK_PAUSES times before looking again, CO__LOCK_SPINS rounds.
 * Looking at the line after every single pause (the old shape) kept pulling
 * the lock's cache line away from its holder in the middle of its critical
 * section; pacing the looks leaves it there (docs/perf-notes.md).
 */
#include "base/lock.h"
#include "base/san.h"
#include "arch/ctx.h" /* co__cycles */

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef CO__LOCK_SPINS
#define CO__LOCK_SPINS 4
#endif
#ifndef CO__LOCK_PAUSES
#define CO__LOCK_PAUSES 30
#endif
/* A sleeper's re-check before each sleep, in co__cycles ticks (TSC: ~1.5 us
 * at 2.8 GHz; AArch64's counter ticks slower, so it lasts longer there). */
#ifndef CO__LOCK_RECHECK
#define CO__LOCK_RECHECK 4096
#endif
/* The longest a sleeper sleeps before it looks again. */
#define CO__LOCK_NAP_NS ((int64_t)1000000)


int co__futex_wait(uint32_t *addr, uint32_t val, int64_t deadline) {
    struct timespec ts, *tsp = NULL;
    if (deadline >= 0) {
        int64_t now = co_now();
        if (deadline <= now) return CO_ETIMEDOUT;
        int64_t d = deadline - now;
        ts.tv_sec = d / 1000000000;
        ts.tv_nsec = d % 1000000000;
        tsp = &ts;
    }
    long r = syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, tsp, NULL, 0);
    if (r == 0) return 0;
    if (errno == ETIMEDOUT) return CO_ETIMEDOUT;
    return -errno;
}

void co__futex_wake(uint32_t *addr, int n) {
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* The futex word: both halves (the kernel reads them as one). */
static uint32_t *lock_word(co__lock_t *l) { return (uint32_t *)(void *)l; }

/* co__lock's first CAS failed. */
void co__lock_slow(co__lock_t *l) {
    for (int i = 0; i < CO__LOCK_SPINS; i++) {
        if (co__lock_try_free(l)) goto acquired;
        for (int k = 0; k < CO__LOCK_PAUSES; k++) co__cpu_relax();
    }
    /* seq_cst: visible before our next look at `locked` (an unlock that
     * stores after it sees us; one that stored before, we see) */
    if (__atomic_add_fetch(&l->sleepers, 1, __ATOMIC_SEQ_CST) == UINT16_MAX) {
        /* No room to count one more: keep trying without sleeping. */
        __atomic_sub_fetch(&l->sleepers, 1, __ATOMIC_RELAXED);
        while (!co__lock_try_free(l)) sched_yield();
        goto acquired;
    }
    for (;;) {
        /* The re-check (see the top): an unlock that missed our count
         * cannot stay invisible this long. */
        uint64_t t0 = co__cycles();
        int n = 0; /* bounds it where there is no counter (co__cycles() == 0) */
        do {
            if (co__lock_try_free(l)) goto taken;
            for (int k = 0; k < CO__LOCK_PAUSES; k++) co__cpu_relax();
        } while (co__cycles() - t0 < CO__LOCK_RECHECK && ++n < 64);
        co__lock_t seen;
        seen.locked = __atomic_load_n(&l->locked, __ATOMIC_RELAXED);
        seen.sleepers = __atomic_load_n(&l->sleepers, __ATOMIC_RELAXED);
        if (seen.locked == 0) continue;
        uint32_t word; /* the two halves as the kernel reads them (any byte order) */
        memcpy(&word, &seen, sizeof word);
        /* Sleeps only while the word is still what we saw; bounded. */
        co__futex_wait(lock_word(l), word, co_now() + CO__LOCK_NAP_NS);
    }
taken:
    __atomic_sub_fetch(&l->sleepers, 1, __ATOMIC_RELAXED);
acquired:
#ifdef CO_TSAN
    /* This file is not instrumented under TSan (CMakeLists.txt): the
     * runtime's own locks come here too, and contenders for them must not
     * look synchronised with each other. An upper layer's lock is: its
     * unlock (inline, instrumented) released here. */
    __tsan_acquire(l);
#endif
    return;
}

/* co__unlock saw sleepers: wake one. */
void co__unlock_wake(co__lock_t *l) { co__futex_wake(lock_word(l), 1); }
