/*
 * The one door from the tests into colony's internals. A test that looks
 * at internal state (queue lengths, counters, the fault-injection bits)
 * includes this header and nothing else of src/; tests/check_layers.sh
 * fails `make test` when a test includes src/ headers directly or
 * declares a library internal by hand.
 */
#ifndef COLONY_TESTS_T_INTERNAL_H
#define COLONY_TESTS_T_INTERNAL_H

#include "base/lock.h"
#include "base/testhook.h"
#include "runtime/runtime.h"
#include "runtime/proc.h"
#include "runtime/trace.h"
#include "chan/chan_impl.h"
#include "io/io.h"
#include "runtime/netpoll.h" /* co__pd_peek: a number's slot, NULL if its chunk was never made */
#include "pool/pool_impl.h"

/* Fault injection (base/testhook.h): turn CO__FAIL_* bits on or off. */
static inline void t_fail(int bits, bool on) {
    if (on)
        __atomic_or_fetch(&co__test_fail, bits, __ATOMIC_RELAXED);
    else
        __atomic_and_fetch(&co__test_fail, ~bits, __ATOMIC_RELAXED);
}

/* Counters and probes the library keeps for its tests. */
CO_HIDDEN int co__test_chan_receivers(co_chan_t *ch);   /* chan/chan.c */
CO_HIDDEN int co__sem_waiters(co_sem_t *s);             /* sync/sema.c */
CO_HIDDEN int32_t co__rwmutex_reader_count(co_rwmutex_t *rw); /* sync/sync.c */
CO_HIDDEN extern uint64_t co__mutex_starvation_count;  /* sync/sync.c */
CO_HIDDEN bool co__recover_has_tag(const void *tag);    /* runtime/panic.c */
CO_HIDDEN int64_t co__test_timers_listed(void);         /* runtime/timer.c */
CO_HIDDEN uint64_t co__test_cache_sweeps(co_cache_t *c); /* sync/cache.c */
/* Stack compaction (runtime/compact.c): its threshold in ms (0: the next
 * sysmon round), and its compactions and restores since the start. */
CO_HIDDEN void co__test_compact_set_ms(uint32_t ms);
CO_HIDDEN void co__test_compact_counts(uint64_t *compactions, uint64_t *restores);
static inline uint64_t t_compactions(void) {
    uint64_t c, r;
    co__test_compact_counts(&c, &r);
    return c;
}
static inline uint64_t t_restores(void) {
    uint64_t c, r;
    co__test_compact_counts(&c, &r);
    return r;
}
/* Yields at I/O safe points that sysmon asked for (runtime/sysmon.c). */
CO_HIDDEN extern uint64_t co__preempt_yields;
/* The per-P fresh deque (runtime/runq.c): the owner's push (false: full)
 * and pop, and a thief's take of the oldest entry (NULL: empty). */
CO_HIDDEN bool co__test_flifo_push(co_p_t *p, co_g_t *g);
CO_HIDDEN co_g_t *co__test_flifo_pop(co_p_t *p);
CO_HIDDEN co_g_t *co__flifo_steal(co_p_t *p);
/* The waits offered for compaction now (-1: the offer lists are not
 * consistent). */
CO_HIDDEN int64_t co__test_compact_offered(void);
/* A forked child forgets its parent's runtime and may start a fresh one
 * (runtime/lifecycle.c). */
CO_HIDDEN int co__test_reset_after_fork(void);

#endif
