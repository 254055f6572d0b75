/*
 * The base layer: what every other layer may use and that needs nothing
 * of the runtime: visibility and branch macros, CPU hints, monotonic time,
 * saturating deadlines and the fatal-error line. Nothing here calls up.
 */
#ifndef COLONY_BASE_H
#define COLONY_BASE_H

#define _GNU_SOURCE 1
#include "colony.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CO_HIDDEN __attribute__((visibility("hidden")))
#define CO_LIKELY(x) __builtin_expect(!!(x), 1)
#define CO_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define CO_CONTAINER_OF(p, T, m) ((T *)((char *)(p)-offsetof(T, m)))
#define CO_STATIC_ASSERT(c, msg) _Static_assert(c, msg)

/* Prefetch a line the caller is about to write: it comes exclusive, so the
 * stores need no second trip to take it from the CPU that last wrote it.
 * GCC turns __builtin_prefetch(a, 1) into a plain read prefetch on x86-64
 * unless built for a CPU with PREFETCHW, so it is emitted by hand where
 * CPUID has it (co__has_prefetchw: atomic, set by co_init, relaxed: a
 * hint). AArch64: PRFM PSTL1KEEP. Any address may be prefetched: nothing
 * faults. Used only where it measured better (the spawn path's G
 * records); the other __builtin_prefetch(a, 1) calls stay read prefetches
 * on x86-64, where exclusive ones slowed a plain thread's pool submits
 * (docs/perf-notes.md). */
CO_HIDDEN extern int co__has_prefetchw;
static inline __attribute__((always_inline)) void co__prefetchw(const void *a) {
#if defined(__x86_64__)
    if (CO_LIKELY(__atomic_load_n(&co__has_prefetchw, __ATOMIC_RELAXED)))
        __asm__ volatile("prefetchw (%0)" : : "r"(a));
    else
        __builtin_prefetch(a, 1);
#else
    __builtin_prefetch(a, 1);
#endif
}

/* t + d for a time t and a duration d >= 0, INT64_MAX where that overflows
 * (a deadline that far off never comes: the sleep or timer waits forever). */
static inline int64_t co__time_add(int64_t t, int64_t d) {
    return d > INT64_MAX - t ? INT64_MAX : t + d;
}

/* Print "colony: fatal: <msg>" and abort. Used for misuse Go would panic on. */
CO_HIDDEN _Noreturn void co__fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A spin-wait's pause between two looks. */
static inline void co__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Set once by co__base_init (cpu.c): whether PREFETCHW exists. */
CO_HIDDEN void co__base_init(void);

#endif
