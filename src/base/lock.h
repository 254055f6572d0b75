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

/* ---- Lock order -----------------------------------------------------------
 * Every internal lock, ranked as Go's runtime/lockrank.go ranks its own:
 * rank 1 is taken first (outermost), the last ranks are leaves. A lock is
 * taken only while holding locks listed in its "Under:" (each of a lower
 * rank); locks of one rank nest only as its line says. Found by reading
 * every lock call and its callees, and by recording the pairs the test
 * suite takes (chaos runs too): no two locks are taken in both orders.
 *
 * Two paths nest locks with no call in sight:
 *  - parking: a lock that co__park's unlock callback releases ([park]
 *    below) is still held while the parking M picks the next G (co__park_m:
 *    sched.lock for the global queue, gcache_lock for a first run's stack,
 *    allg_lock and gcache_lock for a pool token's G) and, with a deadline,
 *    adds the timer (post_park: timers_lock, then sched.lock to wake an M).
 *  - readying: co__ready/co__unpark may take sched.lock (a full run queue
 *    spills to the global queue; co__wakep starts an M).
 * Timer callbacks run holding no lock, but co__timer_del waits for one that
 * is running: a lock held across it ranks above every lock the callback
 * takes.
 *
 *  1 shutdown_mu    lifecycle.c, a pthread mutex: one co_shutdown at a time
 *                   (the shutdown hooks run under it). Under: nothing; plain
 *                   threads only.
 *  2 dflt_lock      default_pool.c: the default pool's making and its
 *                   shutdown hook. Under: shutdown_mu.
 *  3 init_lock      lifecycle.c: co__rt_state, co_init and co_shutdown's
 *                   work, the hook table. Under: shutdown_mu, dflt_lock
 *                   (co_pool_new's co__rt_hold, co__at_shutdown).
 *  4 pool lock      co_pool_t.lock (pool_impl.h, co__plock_t): a pool's idle
 *                   queue, records, waiter queues, counters. [park] Under:
 *                   shutdown_mu, dflt_lock (plain threads; a coroutine that
 *                   finds it taken yields, so it holds nothing then). A
 *                   multipool's life (a co_mutex, which parks) is held above.
 *  5 group lock     co_group_t.lock (group.c): counts, slot and wait queues.
 *                   [park] Under: nothing.
 *  6 ctx lock       co_ctx_t.lock (context.c): canceled, freed, child list.
 *                   Under: group lock (task_done's co_ctx_cancel); its
 *                   ancestors' ctx locks (cancel_tree: parent before child).
 *  7 cond lock      cond_t.lock (sync.c): a co_cond's waiter queue. [park]
 *                   Under: nothing.
 *  8 sema lock      sema_t.lock (sync.c: in co_mutex, co_rwmutex, co_once):
 *                   waiter queue, count increments. [park] Under: cond lock
 *                   (co_cond_wait unlocks the mutex holding it).
 *  9 sem lock       sem_t_.lock (sema.c): a co_sem's tokens and waiter
 *                   queue. [park] Under: nothing.
 *  9a cache lock    co_cache.lock (cache.c): a co_cache's shared and victim
 *                   stacks, shard vector, armed. Under: nothing (a cache's
 *                   constructor and destructor run without it).
 * 10 wg lock        wg_impl_t.lock (park.c): a waitgroup's waiter queue.
 *                   [park] Under: nothing.
 * 11 chan lock      co_chan_t.lock (chan_impl.h): buffer, indices, waiter
 *                   queues. [park] Under: ctx lock (a done channel closed
 *                   in mark_canceled), group lock (through it); chan locks
 *                   of lower addresses (co_select only: sorted, each once).
 * 12 pd lock        co__pd_t.lock (netpoll.h): a descriptor's waiter queues,
 *                   kind, is_sock. [park] Under: init_lock, shutdown_mu
 *                   (co__netpoll_fini's co__pd_forget_all). The pd's write
 *                   lock (pd->wlock, which parks) is held above it.
 * 13 sched.lock     co_sched_t.lock (proc.h): idle P and M lists, allm, the
 *                   global run queue, pretiring, pspare. Under: [park] locks;
 *                   ctx, cond and group locks (they ready Gs); init_lock,
 *                   shutdown_mu, dflt_lock (co__pin_wait).
 * 14 timers_lock    co_p_t.timers_lock (proc.h), one per P: its timer heap,
 *                   run, overflow list, timers_closed, timer0_when. Under:
 *                   [park] locks that park with a deadline (chan, pd, wg,
 *                   sem, cond, pool); pool lock (purge_arm_locked); group
 *                   lock and dflt_lock (co__timer_del); cache lock (its sweep timer's
 *                   arming and re-arming); init_lock,
 *                   shutdown_mu; one other P's timers_lock: the P being
 *                   emptied before its replacement (co__timers_move).
 * 15 gcache_lock    co_sched_t.gcache_lock (proc.h): the global dead-G and
 *                   stack caches, stackwait, tokwait. Under: [park] locks.
 * 16 allg_lock      co_sched_t.allg_lock (proc.h): the all-G list, each
 *                   G's trace_sw, sched.traced's writes. Under: [park]
 *                   locks, init_lock, shutdown_mu, trace.c's api mutex
 *                   (a pthread mutex, itself under init_lock: co_init's
 *                   co__trace_sync).
 * 17 offer lock     a compaction shard's lock (compact.c): its offered
 *                   waits. Under: chan and pd locks (an offer is made
 *                   holding its queue's lock); [park] locks (the M that
 *                   withdraws a G's offer, about to run it, may still hold
 *                   the lock its previous G parked with); chan lock (a
 *                   close withdraws the offers of the waiters it pops).
 *                   sysmon takes it
 *                   holding no lock, and tries a queue's lock only after
 *                   releasing it.
 * Ranks 13 to 17 take no lock while held (timers_lock only its one pair).
 */

#endif
