/*
 * The base layer's futex lock and futex helpers (lock.c). Every layer's
 * short critical sections use co__lock_t; it never switches coroutines.
 */
#ifndef COLONY_BASE_LOCK_H
#define COLONY_BASE_LOCK_H

#include "base/base.h"

/* ---- futex-backed internal lock ---------------------------------------- */
/* A futex mutex (lock.c has the design): one CAS to lock uncontended, and a
 * plain store to unlock; contended lockers spin briefly, then count
 * themselves in `sleepers` and sleep in the kernel. It blocks the OS
 * thread, never switches coroutines: hold it only for short, non-blocking
 * critical sections. Zero-initialised == unlocked. The two halves are
 * separate atomics (never accessed as one in C); the futex is the 32-bit
 * word they make together. */
typedef struct co__lock {
    _Alignas(4) uint16_t locked; /* 0 free, 1 held */
    uint16_t sleepers;           /* threads asleep in co__lock_slow, or about to be */
} co__lock_t;
_Static_assert(sizeof(co__lock_t) == 4, "co__lock_t is one futex word");
CO_HIDDEN void co__lock_slow(co__lock_t *l);
CO_HIDDEN void co__unlock_wake(co__lock_t *l);

/* The uncontended halves are inline (lock.c has the rest). */
static inline bool co__trylock(co__lock_t *l) {
    uint16_t z = 0;
    /* acquire: pairs with the release store in co__unlock */
    return __atomic_compare_exchange_n(&l->locked, &z, 1, false, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
}
/* A contended locker's try: look first, and CAS only a free lock (a CAS
 * would take the line from the holder for nothing). */
static inline bool co__lock_try_free(co__lock_t *l) {
    return __atomic_load_n(&l->locked, __ATOMIC_RELAXED) == 0 && co__trylock(l);
}
static inline void co__lock(co__lock_t *l) {
    if (!__builtin_expect(co__trylock(l), 1)) co__lock_slow(l);
}
static inline void co__unlock(co__lock_t *l) {
    /* No locked instruction. Sleepers are looked at before the store: the
     * store must be this unlock's last touch of *l, since the next holder
     * may free it at once (a channel, a waitgroup's owner). A locker that
     * counts itself in between is missed; co__lock_slow covers that
     * (lock.c). release: publishes the critical section to the next
     * acquirer, and keeps the load before the store. */
    uint16_t sleepers = __atomic_load_n(&l->sleepers, __ATOMIC_RELAXED);
    __atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE);
    if (__builtin_expect(sleepers != 0, 0)) co__unlock_wake(l); /* a futex on the address only */
}

/* futex helpers on a 32-bit word (private futexes). */
CO_HIDDEN int co__futex_wait(uint32_t *addr, uint32_t val, int64_t deadline); /* 0 / CO_ETIMEDOUT / -EAGAIN/-EINTR */
CO_HIDDEN void co__futex_wake(uint32_t *addr, int n);

#endif
