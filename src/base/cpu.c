/* CPU probes, run once by co_init. */
#include "base/base.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* co__prefetchw's switch: whether the CPU has PREFETCHW, stored by every
 * co_init (the same value each time); relaxed atomic, a hint. */
int co__has_prefetchw;

static int cpu_has_prefetchw(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    return __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 8)); /* PRFCHW */
#else
    return 0;
#endif
}

/* base/testhook.h: CO__FAIL_* bits a test sets. */
int co__test_fail;

void co__base_init(void) {
    __atomic_store_n(&co__has_prefetchw, cpu_has_prefetchw(), __ATOMIC_RELAXED);
}
