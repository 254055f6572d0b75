/*
 * The execution trace (trace.c): scheduler events recorded into bounded
 * per-thread buffers while co_trace_start / COLONY_TRACE is on, written as
 * Chrome trace-event JSON at co_trace_stop (docs/trace.md).
 *
 * An event site is one CO_TRACE line. With the trace off it costs one
 * compare of co__trace_on with zero and a branch predicted not taken (two
 * instructions on x86-64); its arguments are evaluated only when the trace
 * is on, and the work (clock, buffer, G fields) is out of line. A switch
 * is one site (CO_TRACE_SWITCH), not two: the stop of the G switched from
 * and the start of the one switched to go in one record.
 */
#ifndef COLONY_RUNTIME_TRACE_H
#define COLONY_RUNTIME_TRACE_H

#include "base/base.h"
#include "base/san.h"

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
    CO__TEV_SWITCH_,    /* internal: a: the G started, b: how the one before stopped
                         * (CO__TEV_PARK/YIELD/EXIT, PARK's reason << 8; 0 from g0) */
    CO__TEV_CUR_,       /* internal: a: the G running on this thread when it first records */
    CO__TEV_COUNT_
};

/* Nonzero while a trace is on. Written by co_trace_start/stop (seq_cst);
 * read relaxed at event sites: an event racing the switch may be dropped
 * or recorded, co__trace_ev re-checks under its slot's busy flag. */
CO_HIDDEN extern uint32_t co__trace_on;

CO_HIDDEN void co__trace_ev(int kind, uint64_t a, uint64_t b);
/* The running G `from` stops (how: CO__TEV_PARK with its wait_reason,
 * CO__TEV_YIELD, CO__TEV_EXIT; ignored for g0) and `to` starts (ignored
 * for g0): one record. */
CO_HIDDEN void co__trace_switch(int how, void *from, void *to);
/* co_init, after it sets co__sched up: the fast paths' views of the trace
 * (proc.h: co__sched.traced and handover_size) made to match it. */
CO_HIDDEN void co__trace_sync(void);

/* The site's test. On x86-64 (but under TSan, which must see the load as
 * an atomic one) an asm goto: `cmpl $0, co__trace_on(%rip); jne`, the
 * load folded into the compare, where GCC gives an __atomic load a
 * register and a test of its own (three instructions). The asm's load is
 * a relaxed atomic one as far as the language goes (an aligned 32-bit
 * load is one on x86-64). Elsewhere the __atomic relaxed load. */
#if defined(CO_TRACE_NO_SITES)
/* A measurement build (bench/trace.sh's second build dir, made with
 * CFLAGS=-DCO_TRACE_NO_SITES): every site compiled out, to weigh what the
 * sites cost with the trace off. Such a build records nothing. */
#define CO_TRACING() 0
#define CO__TRACE_SITE_(call)                                                               \
    do {                                                                                    \
    } while (0)
#elif defined(__x86_64__) && !defined(CO_TSAN)
#if defined(__clang__)
#define CO__TRACE_COLD_
#else
#define CO__TRACE_COLD_ __attribute__((cold))
#endif
#define CO__TRACE_IF_ON_(on) \
    __asm__ goto("cmpl $0, %0\n\tjne %l1" : : "m"(co__trace_on) : "cc" : on)
/* true while tracing (a path that must take another way then) */
#define CO_TRACING()                                                                        \
    __extension__({                                                                         \
        __label__ co_tr_on_, co_tr_done_;                                                   \
        int co_tr_r_;                                                                       \
        CO__TRACE_IF_ON_(co_tr_on_);                                                        \
        co_tr_r_ = 0;                                                                       \
        goto co_tr_done_;                                                                   \
    co_tr_on_:                                                                              \
        CO__TRACE_COLD_ co_tr_r_ = 1;                                                       \
    co_tr_done_:                                                                            \
        __builtin_expect(co_tr_r_, 0);                                                      \
    })
#define CO__TRACE_SITE_(call)                                                               \
    do {                                                                                    \
        __label__ co_tr_on_, co_tr_off_;                                                    \
        CO__TRACE_IF_ON_(co_tr_on_);                                                        \
        goto co_tr_off_;                                                                    \
    co_tr_on_:                                                                              \
        CO__TRACE_COLD_ call;                                                               \
    co_tr_off_:;                                                                            \
    } while (0)
#else
#define CO_TRACING() __builtin_expect(__atomic_load_n(&co__trace_on, __ATOMIC_RELAXED) != 0, 0)
#define CO__TRACE_SITE_(call)                                                               \
    do {                                                                                    \
        if (CO_TRACING()) call;                                                             \
    } while (0)
#endif

#define CO_TRACE(kind, a, b)                                                                \
    CO__TRACE_SITE_(co__trace_ev((kind), (uint64_t)(uintptr_t)(a), (uint64_t)(uintptr_t)(b)))
#define CO_TRACE_SWITCH(how, from, to) CO__TRACE_SITE_(co__trace_switch((how), (from), (to)))

/* Tests (through t_internal.h): a session with `chunks` buffers of
 * `chunk_events` events each (0: the defaults); co__trace_hold_writer(true)
 * stops the writer from emptying full buffers, so that they run out. */
CO_HIDDEN int co__trace_start_with(const char *path, int chunks, int chunk_events);
CO_HIDDEN void co__trace_hold_writer(bool hold);
CO_HIDDEN int64_t co__trace_lost(void);

#endif
