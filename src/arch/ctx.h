/*
 * The context switch. One assembly file per ISA/ABI exports
 *   void co__jump(void **save_sp, void *to_sp);
 * which pushes the callee-saved registers and the FP control words of the
 * caller, stores its stack pointer into *save_sp, loads to_sp and pops the
 * other context's registers. A fresh context starts in co__trampoline, which
 * calls co__g_entry(g) with the G stored in a callee-saved slot.
 * The portable fallback (ctx_ucontext.c, -DCOLONY_UCONTEXT=ON) uses
 * makecontext/swapcontext with the same two entry points.
 */
#ifndef COLONY_ARCH_CTX_H
#define COLONY_ARCH_CTX_H
#include <stddef.h>
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
/* Prepare ctx so that switching to it runs co__g_entry(g) on [lo, lo+size). */
__attribute__((visibility("hidden"))) void co__ctx_make(co__ctx_t *ctx, void *lo, size_t size,
                                                        struct co_g *g);
#ifdef COLONY_UCONTEXT
__attribute__((visibility("hidden"))) void co__ctx_switch(co__ctx_t *from, co__ctx_t *to);
#else
__attribute__((visibility("hidden"))) void co__jump(void **save_sp, void *to_sp);
static inline void co__ctx_switch(co__ctx_t *from, co__ctx_t *to) { co__jump(&from->sp, to->sp); }
#endif
#endif
