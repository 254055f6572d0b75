/*
 * The context switch. One assembly file per ISA/ABI exports
 *   void co__jump(void **save_sp, void *to_sp);
 * which pushes the callee-saved registers and the FP control words of the
 * caller, stores its stack pointer into *save_sp, loads to_sp and pops the
 * other context's registers. A fresh context starts in co__trampoline, which
 * calls co__g_entry(g) with the G stored in a callee-saved slot.
 * co__jump_post and co__jump_yslot do the same, then have the other side
 * call the post-switch work before it returns to where it was.
 * The portable fallback (ctx_ucontext.c, -DCOLONY_UCONTEXT=ON) uses
 * makecontext/swapcontext with the same two entry points.
 */
#ifndef COLONY_ARCH_CTX_H
#define COLONY_ARCH_CTX_H
#include <stddef.h>
#include <stdint.h>
#ifdef COLONY_UCONTEXT
#include <ucontext.h>
#endif

typedef struct co__ctx {
    void *sp;
#ifdef COLONY_UCONTEXT
    ucontext_t uc;
#endif
} co__ctx_t;

struct co_g;
/* Entry point of every coroutine (sched.c); never returns. */
__attribute__((visibility("hidden"), noreturn)) void co__g_entry(struct co_g *g);
/*
 * Stack colouring. Every stack is a page-aligned mapping, so two coroutines
 * at the same depth have stack pointers equal in their low 12 bits. A
 * switch stores one side's registers and then loads the other side's from
 * the same offsets within a page, and the CPU takes each such load for one
 * that may depend on the stores still in flight (4K aliasing): two
 * coroutines that yield to each other paid for it on every switch. So a
 * context starts CO__STACK_COLOR_STEP bytes lower for each step of its
 * colour (its coroutine's id modulo CO__STACK_COLORS): coroutines created
 * one after another differ. A stack gives up
 * at most 288 bytes of its size to it; the portable fallback does not
 * colour.
 */
#define CO__STACK_COLORS 4u
#define CO__STACK_COLOR_STEP 96u /* more than a saved frame, a multiple of 16 */
static inline uintptr_t co__stack_top(void *lo, size_t size, uint64_t seed) {
    uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
    return top - (uintptr_t)(seed % CO__STACK_COLORS) * CO__STACK_COLOR_STEP;
}

/* Prepare ctx so that switching to it runs co__g_entry(g) on [lo, lo+size),
 * with the FP control words fpenv (from co__fpenv_save), starting at
 * co__stack_top(lo, size, seed): seed is the coroutine's id. */
__attribute__((visibility("hidden"))) void co__ctx_make(co__ctx_t *ctx, void *lo, size_t size,
                                                        struct co_g *g, uint64_t fpenv,
                                                        uint64_t seed);

/* The caller's FP control words, as a new context should start with them:
 * x86-64: MXCSR in the low 32 bits, the x87 control word above; AArch64:
 * FPCR. 0 (nothing kept) elsewhere. */
static inline uint64_t co__fpenv_save(void) {
#if defined(__x86_64__)
    uint32_t mxcsr;
    uint16_t fpcw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpcw));
    return mxcsr | (uint64_t)fpcw << 32;
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return fpcr;
#else
    return 0;
#endif
}
/* co__fpenv_save's value, written to *dst. On x86-64 the control words are
 * stored straight into *dst: reading them back into a register (as
 * co__fpenv_save must) waits for the microcoded stmxcsr to finish, which
 * costs a spawn ~2.5 ns here (microbenchmark). *dst is read much later. */
static inline void co__fpenv_store(uint64_t *dst) {
#if defined(__x86_64__)
    /* little-endian: MXCSR in bytes 0-3, the x87 control word in 4-5 */
    __asm__ volatile("stmxcsr (%1)\n\tfnstcw 4(%1)\n\tmovw $0, 6(%1)" : "=m"(*dst) : "r"(dst));
#else
    *dst = co__fpenv_save();
#endif
}
/* Makes fpenv (from co__fpenv_save) the caller's FP control words.
 * Cheaper than co__fpenv_save: a store-then-read of the control registers
 * waits for the microcoded store, a load does not wait for anything. */
static inline void co__fpenv_load(uint64_t fpenv) {
#if defined(__x86_64__)
    uint32_t mxcsr = (uint32_t)fpenv;
    uint16_t fpcw = (uint16_t)(fpenv >> 32);
    __asm__ volatile("ldmxcsr %0" : : "m"(mxcsr));
    __asm__ volatile("fldcw %0" : : "m"(fpcw));
#elif defined(__aarch64__)
    __asm__ volatile("msr fpcr, %0" : : "r"(fpenv));
#else
    (void)fpenv;
#endif
}
/* A cheap tick count for rate limits, never for time: x86-64 TSC (about
 * 10 ns to read here, against 24 ns for clock_gettime(MONOTONIC)), AArch64
 * virtual counter; always 0 elsewhere. CO__CYCLES_SHORT ticks last about
 * 2 microseconds at most on the clocks these count at (TSC: 1-5 GHz, so
 * 0.4-2 us; AArch64 counter: 24 MHz-1 GHz, so 0.03-1.3 us). */
#if defined(__x86_64__)
#define CO__CYCLES_SHORT 2048
#else
#define CO__CYCLES_SHORT 32
#endif
static inline uint64_t co__cycles(void) {
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return lo | (uint64_t)hi << 32;
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return 0;
#endif
}
#ifdef COLONY_UCONTEXT
__attribute__((visibility("hidden"))) void co__ctx_switch(co__ctx_t *from, co__ctx_t *to);
#else
__attribute__((visibility("hidden"))) void co__jump(void **save_sp, void *to_sp);
static inline void co__ctx_switch(co__ctx_t *from, co__ctx_t *to) { co__jump(&from->sp, to->sp); }
/* co__jump whose other side first calls co__switch_post() (sched.c), as if
 * from where it was: the post-switch work runs inside the switch, and a
 * C caller with nothing left to do after the switch tail-calls it.
 * co__jump_yslot is the same with co__post_yslot(), co_yield's fast
 * path's. A build switches only through co__jump, or only through these
 * two (the frames are the same; what follows the restore is not). */
__attribute__((visibility("hidden"))) void co__jump_post(void **save_sp, void *to_sp);
__attribute__((visibility("hidden"))) void co__jump_yslot(void **save_sp, void *to_sp);
__attribute__((visibility("hidden"))) void co__switch_post(void);
__attribute__((visibility("hidden"))) void co__post_yslot(void);
/* Start g afresh on the stack whose 16-byte aligned top is `top`, dropping
 * the caller's frames (they may be on that stack): the exit of a coroutine
 * whose stack goes straight to one that never ran (sched.c's goexit). */
__attribute__((visibility("hidden"), noreturn)) void co__fresh_start(void *top, struct co_g *g,
                                                                      uint64_t fpenv);
#define CO__HAVE_FRESH_START 1
#endif
#endif
