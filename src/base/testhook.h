/*
 * Fault injection for tests, named. A test sets bits of co__test_fail
 * (through tests/t_internal.h) between phases; the library's slow paths
 * ask co__test_failing(what) before the allocation or thread creation
 * they stand for, and take their fallback as if it had failed. Relaxed
 * atomic: a test sets it and then waits for its effects, nothing pairs.
 */
#ifndef COLONY_BASE_TESTHOOK_H
#define COLONY_BASE_TESTHOOK_H

#include "base/base.h"

enum {
    CO__FAIL_TOKEN_G = 1 << 0,    /* a G made for a token (runtime/spawn.c) */
    CO__FAIL_GLOBQ_CHUNK = 1 << 1, /* the global run queue's chunk (runtime/globq.c) */
    CO__FAIL_WG_ARRAY = 1 << 2,   /* a waitgroup release's array (its list fallback) */
    CO__FAIL_TIMER_GROW = 1 << 3, /* a timer heap or run that grows (runtime/timer.c) */
    CO__FAIL_SELECT_MEM = 1 << 4, /* a select's scratch arrays past 16 cases (chan/select.c) */
    CO__FAIL_NO_M = 1 << 5,       /* co__startm finds no idle M and cannot make one */
    CO__FAIL_SLOW_IDLE = 1 << 6,  /* an M that gave its P up is slow to sleep (runtime/sched.c) */
    CO__FAIL_SLOW_ALLOC = 1 << 7, /* a pool submit's worker record takes 100 ms (pool/submit.c) */
};

CO_HIDDEN extern int co__test_fail; /* CO__FAIL_* bits; defined in base/cpu.c */

static inline bool co__test_failing(int what) {
    return CO_UNLIKELY(__atomic_load_n(&co__test_fail, __ATOMIC_RELAXED) & what);
}

#endif
