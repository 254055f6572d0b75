/* Builds the initial frame that co__jump pops for a fresh coroutine. */
#ifndef COLONY_UCONTEXT
#include "ctx.h"

#include <stdint.h>
#include <string.h>

extern void co__trampoline(void) __attribute__((visibility("hidden")));

void co__ctx_make(co__ctx_t *ctx, void *lo, size_t size, struct co_g *g, uint64_t fpenv,
                  uint64_t seed) {
    uintptr_t top = co__stack_top(lo, size, seed);
#if defined(__x86_64__)
    /* Frame of 72 bytes (see the .S diagram); after `ret` pops the return
     * address rsp = top, 16-byte aligned, as co__trampoline expects. */
    uint64_t *sp = (uint64_t *)(top - 72);
    memset(sp, 0, 72);
    uint32_t mxcsr = (uint32_t)fpenv;
    uint16_t fpcw = (uint16_t)(fpenv >> 32);
    memcpy((char *)sp + 8, &mxcsr, 4);
    memcpy((char *)sp + 12, &fpcw, 2);
    sp[5] = (uint64_t)(uintptr_t)g;                      /* r12 */
    sp[8] = (uint64_t)(uintptr_t)&co__trampoline;        /* return address */
    ctx->sp = sp;
#elif defined(__aarch64__)
    uint64_t *sp = (uint64_t *)(top - 176);
    memset(sp, 0, 176);
    sp[0] = (uint64_t)(uintptr_t)g;                      /* x19 */
    sp[11] = (uint64_t)(uintptr_t)&co__trampoline;       /* x30 */
    sp[20] = fpenv; /* FPCR */
    ctx->sp = sp;
#else
#error "no assembly context switch for this ISA: build with -DCOLONY_UCONTEXT=ON"
#endif
}
#endif
