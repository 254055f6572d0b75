/* Portable context switch on makecontext/swapcontext (-DCOLONY_UCONTEXT=ON).
 * Slower (swapcontext saves the signal mask with a syscall) but needs no
 * assembly; CI runs the whole suite with it. */
#ifdef COLONY_UCONTEXT
#include "ctx.h"

#include <stdint.h>
#include <stdlib.h>

/* The new context's FP control words: setcontext loaded those of whoever
 * called co__ctx_make; the coroutine starts with its creator's. */
static void uc_entry(unsigned hi, unsigned lo, unsigned fhi, unsigned flo) {
    struct co_g *g = (struct co_g *)(((uintptr_t)hi << 32) | (uintptr_t)lo);
    co__fpenv_load(((uint64_t)fhi << 32) | flo);
    co__g_entry(g);
}

void co__ctx_make(co__ctx_t *ctx, void *lo, size_t size, struct co_g *g, uint64_t fpenv,
                  uint64_t seed) {
    (void)seed; /* no colouring here: makecontext places the frame */
    if (getcontext(&ctx->uc) != 0) abort();
    ctx->uc.uc_stack.ss_sp = lo;
    ctx->uc.uc_stack.ss_size = size;
    ctx->uc.uc_link = NULL;
    uintptr_t v = (uintptr_t)g;
    makecontext(&ctx->uc, (void (*)(void))uc_entry, 4, (unsigned)(v >> 32), (unsigned)v,
                (unsigned)(fpenv >> 32), (unsigned)fpenv);
}

void co__ctx_switch(co__ctx_t *from, co__ctx_t *to) {
    if (swapcontext(&from->uc, &to->uc) != 0) abort();
}
#endif
