/*
 * ants' spinlock (pkg/sync/spinlock.go): a 32-bit word, CAS 0 -> 1 to lock;
 * after each failed attempt yield `backoff` times and double backoff up to
 * 16 (1, 2, 4, 8, 16, 16, ...). Yielding is co_yield() in a coroutine (the
 * holder may be a coroutine waiting for this P) and sched_yield() on a
 * plain thread. Unlock stores 0.
 *
 * It never parks: hold it only for short critical sections. It does not
 * need the runtime, so plain threads may use it before co_init. A NULL
 * spinlock aborts naming the call (co__fatal is base's: no runtime).
 */
#include "runtime/runtime.h"

#include <sched.h>

#define MAX_BACKOFF 16

/* A NULL spinlock's fatal line, reached by a jump (as sync.c's
 * null_fatal: a call would give the lock's fast path a frame). */
#if defined(__clang__)
#define NULL_FATAL_ATTR __attribute__((noinline, cold))
#else
#define NULL_FATAL_ATTR __attribute__((noinline, noipa, cold))
#endif
static NULL_FATAL_ATTR void null_fatal(const char *call) {
    co__fatal("%s(NULL): NULL spinlock", call);
}

void co_spinlock_lock(co_spinlock_t *l) {
    if (CO_UNLIKELY(l == NULL)) {
        null_fatal("co_spinlock_lock");
        return;
    }
    uint32_t *v = &l->_opaque;
    int backoff = 1;
    for (;;) {
        uint32_t z = 0;
        /* acquire: pairs with the release store in co_spinlock_unlock */
        if (__atomic_compare_exchange_n(v, &z, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
        bool in_co = co__cur_g() != NULL;
        for (int i = 0; i < backoff; i++) {
            if (in_co)
                co_yield();
            else
                sched_yield();
        }
        if (backoff < MAX_BACKOFF) backoff <<= 1;
    }
}

void co_spinlock_unlock(co_spinlock_t *l) {
    if (CO_UNLIKELY(l == NULL)) {
        null_fatal("co_spinlock_unlock");
        return;
    }
    /* release: publishes the critical section to the next locker */
    if (__atomic_exchange_n(&l->_opaque, 0, __ATOMIC_RELEASE) != 1)
        co__fatal("co_spinlock_unlock(%p): unlock of unlocked spinlock", (void *)l);
}
