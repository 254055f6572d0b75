/*
 * The execution trace (trace.c): scheduler events recorded into bounded
 * per-thread buffers while co_trace_start / COLONY_TRACE is on, written as
 * Chrome trace-event JSON at co_trace_stop (docs/trace.md).
 *
 * An event site is one CO_TRACE line: a relaxed load of co__trace_on and a
 * branch predicted not taken. Its arguments are evaluated only when the
 * trace is on; the work (clock, buffer, G fields) is out of line.
 */
#ifndef COLONY_RUNTIME_TRACE_H
#define COLONY_RUNTIME_TRACE_H

#include "base/base.h"

#include <stdint.h>

/* Event kinds. a and b as listed; a G argument is a co_g_t *. */
enum {
    CO__TEV_CREATE = 1, /* a: the new G (before it is queued) */
    CO__TEV_START,      /* a: the G switched to (g0 ignored) */
    CO__TEV_PARK,       /* a: the running G, b: its CO__WR_* reason */
    CO__TEV_YIELD,      /* a: the running G, which stays runnable */
    CO__TEV_READY,      /* a: the G made runnable */
    CO__TEV_EXIT,       /* a: the exiting G */
    CO__TEV_P_ACQUIRE,  /* a: P id, taken by this thread's M */
    CO__TEV_P_RELEASE,  /* a: P id, given up (idle list, retired) */
    CO__TEV_M_SPIN,     /* this M starts looking for work */
    CO__TEV_M_SPIN_END, /* ... and stops */
    CO__TEV_M_SLEEP,    /* this M sleeps (b: 1 as the poller) */
    CO__TEV_M_WAKE,     /* ... and wakes */
    CO__TEV_STEAL,      /* a: the G stolen, b: the P it came from */
    CO__TEV_RETAKE,     /* a: P id, b: 0 from co_blocking, 1 lent a spare (sysmon) */
    CO__TEV_BLOCK,      /* a: the running G enters co_blocking */
    CO__TEV_BLOCK_END,  /* a: the running G leaves it (holding a P again or not) */
    CO__TEV_NAME_,      /* internal: a G's name, 16 bytes in a and b */
    CO__TEV_LOST_,      /* internal: a: events this thread dropped before this one */
    CO__TEV_COUNT_
};

/* Nonzero while a trace is on. Written by co_trace_start/stop (seq_cst);
 * read relaxed at event sites: an event racing the switch may be dropped
 * or recorded, co__trace_ev re-checks under its buffer's flag. */
CO_HIDDEN extern uint32_t co__trace_on;

CO_HIDDEN void co__trace_ev(int kind, uint64_t a, uint64_t b);

/* For a path that must not hold a call (co_yield's fast path keeps nothing
 * in callee-saved registers): true while tracing, to take the slow path. */
#define CO_TRACING() __builtin_expect(__atomic_load_n(&co__trace_on, __ATOMIC_RELAXED) != 0, 0)

#define CO_TRACE(kind, a, b)                                                                \
    do {                                                                                    \
        if (__builtin_expect(__atomic_load_n(&co__trace_on, __ATOMIC_RELAXED) != 0, 0))     \
            co__trace_ev((kind), (uint64_t)(uintptr_t)(a), (uint64_t)(uintptr_t)(b));       \
    } while (0)

/* Tests (through t_internal.h): a session with `chunks` buffers of
 * `chunk_events` events each (0: the defaults); co__trace_hold_writer(true)
 * stops the writer from emptying full buffers, so that they run out. */
CO_HIDDEN int co__trace_start_with(const char *path, int chunks, int chunk_events);
CO_HIDDEN void co__trace_hold_writer(bool hold);
CO_HIDDEN int64_t co__trace_lost(void);

#endif
