/* Stacks of coroutines: libunwind where the build found it (DWARF CFI, so
 * the library and programs need no frame pointers), else a frame-pointer
 * walk bounded by the coroutine's own stack, else nothing. */
#include "runtime/unwind.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(CO_HAVE_LIBUNWIND)
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <ucontext.h>
#endif

const char *co__unwinder(void) {
#if defined(CO_HAVE_LIBUNWIND)
    return "libunwind";
#elif !defined(COLONY_UCONTEXT) && (defined(__x86_64__) || defined(__aarch64__))
    return "frame pointers";
#else
    return "none";
#endif
}

#if defined(CO_HAVE_LIBUNWIND)
static int walk(unw_cursor_t *c, void **pcs, int max) {
    int n = 0;
    while (n < max) {
        unw_word_t ip = 0;
        if (unw_get_reg(c, UNW_REG_IP, &ip) < 0 || ip == 0) break;
        pcs[n++] = (void *)ip;
        if (unw_step(c) <= 0) break;
    }
    return n;
}
#endif

int co__unwind_self(void **pcs, int max) {
#if defined(CO_HAVE_LIBUNWIND)
    unw_context_t uc;
    unw_cursor_t c;
    if (unw_getcontext(&uc) < 0 || unw_init_local(&c, &uc) < 0) return 0;
    if (unw_step(&c) <= 0) return 0; /* skip this function */
    return walk(&c, pcs, max);
#else
    (void)pcs;
    (void)max;
    return 0;
#endif
}

int co__unwind_parked(const co_g_t *g, void **pcs, int max) {
    if (max <= 0 || !g->stack.lo) return 0;
    /* compacted (compact.c): its frames are on the heap, its pages empty */
    if (__atomic_load_n(&g->cstate, __ATOMIC_ACQUIRE) >= CO__CS_BUSY) return 0;
    uintptr_t lo = (uintptr_t)g->stack.lo, hi = lo + g->stack.size;
#if defined(CO_HAVE_LIBUNWIND) && defined(COLONY_UCONTEXT) && defined(__x86_64__)
    (void)lo;
    (void)hi;
    /* unw_context_t is a ucontext_t on x86-64 Linux: the swapcontext one. */
    unw_context_t uc;
    memcpy(&uc, &g->ctx.uc, sizeof uc);
    unw_cursor_t c;
    if (unw_init_local(&c, &uc) < 0) return 0;
    return walk(&c, pcs, max);
#elif defined(CO_HAVE_LIBUNWIND) && defined(__x86_64__)
    /* co__jump's frame (src/arch/jump_x86_64_sysv_elf_gas.S): at sp+16..56
     * r15 r14 r13 r12 rbx rbp, then the return address; the caller's rsp
     * is just above it. */
    uintptr_t sp = (uintptr_t)g->ctx.sp;
    if (sp < lo || sp + 72 > hi) return 0;
    const uint64_t *f = (const uint64_t *)sp;
    unw_context_t uc;
    memset(&uc, 0, sizeof uc);
    greg_t *r = uc.uc_mcontext.gregs;
    r[REG_R15] = (greg_t)f[2];
    r[REG_R14] = (greg_t)f[3];
    r[REG_R13] = (greg_t)f[4];
    r[REG_R12] = (greg_t)f[5];
    r[REG_RBX] = (greg_t)f[6];
    r[REG_RBP] = (greg_t)f[7];
    r[REG_RIP] = (greg_t)f[8];
    r[REG_RSP] = (greg_t)(sp + 72);
    unw_cursor_t c;
    if (unw_init_local(&c, &uc) < 0) return 0;
    return walk(&c, pcs, max);
#elif !defined(COLONY_UCONTEXT) && (defined(__x86_64__) || defined(__aarch64__))
    /* Frame pointers: the saved one and the return address from co__jump's
     * frame, then the chain, every link checked to lie inside this stack
     * and to climb (a build without frame pointers stops at once). */
    uintptr_t sp = (uintptr_t)g->ctx.sp;
#if defined(__x86_64__)
    const size_t fp_at = 56, ra_at = 64;
#else
    const size_t fp_at = 80, ra_at = 88; /* x29, x30 (jump_arm64_aapcs_elf_gas.S) */
#endif
    if (sp < lo || sp + ra_at + 8 > hi) return 0;
    int n = 0;
    pcs[n++] = *(void *const *)(sp + ra_at);
    uintptr_t fp = *(const uintptr_t *)(sp + fp_at);
    while (n < max && fp >= sp && fp + 16 <= hi && (fp & 7) == 0) {
        void *ra = ((void *const *)fp)[1];
        if (!ra) break;
        pcs[n++] = ra;
        uintptr_t next = *(const uintptr_t *)fp;
        if (next <= fp) break;
        fp = next;
    }
    return n;
#else
    (void)g;
    (void)pcs;
    (void)lo;
    (void)hi;
    return 0;
#endif
}

int co__unwind_uctx(void *uctx, void **pcs, int max) {
#if defined(CO_HAVE_LIBUNWIND)
    unw_cursor_t c;
    if (unw_init_local2(&c, (unw_context_t *)uctx, UNW_INIT_SIGNAL_FRAME) < 0) return 0;
    return walk(&c, pcs, max);
#else
    (void)uctx;
    (void)pcs;
    (void)max;
    return 0;
#endif
}

bool co__symbol(void *pc, char *buf, size_t len, uintptr_t *off) {
#if defined(CO_HAVE_LIBUNWIND)
    /* a cursor whose first frame is at pc: unw_get_proc_name reads the
     * ELF symbol tables, so static functions have names too */
    unw_context_t uc;
    unw_cursor_t c;
    unw_word_t o = 0;
    if (unw_getcontext(&uc) == 0) {
        /* one byte on: libunwind looks a return address up at ip - 1,
         * and pc may be a function's first byte */
        uc.uc_mcontext.gregs[REG_RIP] = (greg_t)((uintptr_t)pc + 1);
        if (unw_init_local(&c, &uc) == 0 && unw_get_proc_name(&c, buf, len, &o) == 0) {
            *off = (uintptr_t)o - 1;
            return true;
        }
    }
#endif
    Dl_info di;
    if (dladdr(pc, &di) && di.dli_sname && strlen(di.dli_sname) < len) {
        strcpy(buf, di.dli_sname);
        *off = (uintptr_t)pc - (uintptr_t)di.dli_saddr;
        return true;
    }
    return false;
}

void co__symbolize(void *pc, char *buf, size_t len) {
    uintptr_t off = 0;
    if (co__symbol(pc, buf, len, &off)) {
        size_t l = strlen(buf);
        if (l + 1 < len) snprintf(buf + l, len - l, "+0x%llx", (unsigned long long)off);
        return;
    }
    Dl_info di;
    if (dladdr(pc, &di) && di.dli_fname)
        snprintf(buf, len, "?? (%s+0x%llx)", di.dli_fname,
                 (unsigned long long)((uintptr_t)pc - (uintptr_t)di.dli_fbase));
    else
        snprintf(buf, len, "?? (%p)", pc);
}
