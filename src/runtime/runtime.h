/*
 * The runtime's door: the one header through which the layers above it
 * (sync, chan, io, context, pool) reach the runtime, as Go's
 * sync/runtime.go does. Nothing here is public. The G, P and M types are
 * private to src/runtime (proc.h); upper layers see them only as opaque
 * pointers, and the base layer's lock and macros come through here.
 *
 * The one rule of blocking in colony: everything that waits goes through a
 * co__parker_t (park.c). A parker belongs to one blocked caller, coroutine
 * or plain thread; waiters (co__waiter_t, Go's sudog) link that parker into
 * the wait queues of one or more objects. A waker must win co__claim() on
 * the parker (a CAS) before it may hand over data and call co__unpark();
 * a timeout claims it the same way, so exactly one party wins.
 */
#ifndef COLONY_RUNTIME_RUNTIME_H
#define COLONY_RUNTIME_RUNTIME_H

#define _GNU_SOURCE 1
#include "colony.h"
#include "base/base.h"
#include "base/lock.h"
#include "base/san.h"
#include "arch/ctx.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The runtime as a whole (lifecycle.c): changed only under its init lock;
 * STOPPING while co_shutdown tears it down; FORKED, for good, in the child
 * of a fork() that the runtime was not down for (its threads are not
 * there: every use of colony that needs them is a fatal error). */
enum { CO__RT_DOWN = 0, CO__RT_STOPPING = 1, CO__RT_UP = 2, CO__RT_FORKED = 3 };
CO_HIDDEN extern uint32_t co__rt_state; /* atomic: CO__RT_* */
/* A fatal error ("colony used in a child of fork() ...") if this process
 * is such a child: for slow paths that would need the parent's threads
 * (a plain thread's wait, a wake-up of an M). One relaxed load. */
CO_HIDDEN _Noreturn void co__forked_fatal(void);
static inline void co__forked_check(void) {
    if (__builtin_expect(__atomic_load_n(&co__rt_state, __ATOMIC_RELAXED) == CO__RT_FORKED, 0))
        co__forked_fatal();
}

/* Starts the runtime with defaults if nothing started it yet. Cheap after the
 * first call (one acquire load, inline). Returns 0 or a negative code. */
static inline int co__ensure_init(void) {
    /* acquire: pairs with co_init's store-release of CO__RT_UP */
    if (__builtin_expect(__atomic_load_n(&co__rt_state, __ATOMIC_ACQUIRE) == CO__RT_UP, 1))
        return 0;
    return co_init(NULL); /* waits for a shutdown under way */
}

/* Objects that outlive calls and need the runtime while they exist (a
 * pool: its purge timer, its workers' pins; a ticker: its timer) hold it:
 * co_shutdown fails with CO_EBUSY while any is held. co__rt_hold starts
 * the runtime if needed (waiting for a shutdown under way, then starting
 * a fresh one) and returns 0 with the hold taken, or a negative code;
 * co__rt_unhold gives it back. */
/* What holds it, for co_alive's report (counted per kind, relaxed). */
enum co__hold_kind {
    CO__HOLD_POOL,   /* a pool, from co_pool_new to its release */
    CO__HOLD_TIMER,  /* a co_timer / co_after_func timer not yet freed */
    CO__HOLD_TICKER, /* a ticker not yet stopped */
    CO__HOLD_CACHE,  /* a co_cache holding objects */
    CO__HOLD_IO,     /* a plain thread's I/O call under way */
    CO__HOLD_KINDS
};
/* Ps whose running coroutine sysmon has asked to yield (it held its P
 * 10 ms without a schedule). Relaxed atomic: the I/O layer reads it at
 * the end of each operation and calls co__preempt_point only while it is
 * not 0, so the usual cost is one load of a line that is rarely written. */
CO_HIDDEN extern uint32_t co__preempt_pending;
/* A coroutine's safe point: if sysmon asked its P's coroutine to yield,
 * yield (the request is its own P's; a no-op on a plain thread, in g0 or
 * without a P). */
CO_HIDDEN void co__preempt_point(void);

CO_HIDDEN int co__rt_hold(int kind);
CO_HIDDEN void co__rt_unhold(int kind);
CO_HIDDEN bool co__rt_hold_if_up(int kind);
/* How many holds of kind are taken now (a snapshot). */
CO_HIDDEN int64_t co__rt_holds_of(int kind);

/* A shutdown hook: what a layer above that keeps the runtime in use by
 * itself (the default pool) registers, once, with co__at_shutdown. Any
 * function may be NULL.
 *  shutdown  run at the start of co_shutdown(), before live coroutines are
 *            counted: gives back what the layer owns and returns 0, or
 *            CO_EBUSY when that is still in use (left working), and
 *            co_shutdown fails with that at once;
 *  holds     how many holds on the runtime (co__rt_hold) its shutdown
 *            gives back: co_shutdown's first look does not count them;
 *  forget    in a forked child (its pthread_atfork handler, and
 *            co__test_reset_after_fork): forget what the parent's runtime
 *            left, which the child does not own, locks included (plain
 *            stores only: it runs inside fork()).
 * At most 8 hooks; registering one twice is a no-op. */
typedef struct co__rt_hook {
    int (*shutdown)(void);
    int (*holds)(void);
    void (*forget)(void);
} co__rt_hook_t;
CO_HIDDEN void co__at_shutdown(const co__rt_hook_t *h);

/* ---- coroutines --------------------------------------------------------- */
struct co_g;
/* The coroutine that would park if the caller blocked now: NULL on a plain
 * thread, and inside co_blocking's fn, whose M holds no P and so waits as
 * a plain thread does (futex, netpoller). Never cached across a switch. */
CO_HIDDEN struct co_g *co__cur_g(void);
/* The coroutine running on this thread, inside co_blocking too (its id,
 * name and panic chain); NULL on a plain thread. */
CO_HIDDEN struct co_g *co__running_g(void);
CO_HIDDEN uint64_t co__g_id(const struct co_g *g);
CO_HIDDEN const char *co__g_name(const struct co_g *g); /* never NULL ("" if unnamed) */
/* Per-coroutine slot for the panic/recover chain (per-thread on a plain
 * thread). Owned by panic.c. */
CO_HIDDEN void **co__panic_slot(void);
/* co_recover with a tag stored in its frame (panic.c), so that code can
 * tell whether it runs inside a frame of its own: a pool's workers run
 * their tasks under a frame tagged with the pool (a submit from one of
 * them to its full pool is CO_EDEADLK), co_blocking its fn under its own.
 * Returns 0 if fn returned, 1 if it panicked (*value = the panic value). */
CO_HIDDEN int co__recover_tagged(void (*fn)(void *), void *arg, void **value, const void *tag);
/* True if the calling coroutine (or thread) runs inside a frame tagged `tag`. */
CO_HIDDEN bool co__recover_has_tag(const void *tag);
/* Spawn with an explicit stack size (0 = default); same as co_go_with. */
CO_HIDDEN int co__spawn(void (*fn)(void *), void *arg, size_t stack_size, const char *name);
/* Spawn back-pressure (sched.c): from a coroutine whose P has a full run
 * queue, yield once. Call with no lock held, after a spawn. */
CO_HIDDEN void co__spawn_backpressure(void);
/* A coroutine to be (sched.c, co__spawn_token): fn(the token) once run.
 * link: the global queue's list when it has no memory for its arrays, or
 * the injection stack's (globq.c; a tagged entry there, set by the pusher
 * and then owned by the M that takes the stack). */
typedef struct co__token {
    void (*fn)(void *);
    union {
        struct co__token *link; /* the scheduler's, while the token is queued */
        void *owner_link;       /* its owner's, while the token is not queued (a
                                 * pool record's list link: pool_impl.h) */
    };
    uint64_t fpenv; /* the spawner's FP control words, for the G made from it */
} co__token_t;
/* Queues t and, from a coroutine, yields once if its P's queue is full (as
 * co_go does: co__spawn_backpressure). */
CO_HIDDEN void co__spawn_token(co__token_t *t);
/* The running coroutine takes over the next coroutine of its P if that one
 * never ran and runs fn: see sched.c. Returns its arg, or NULL. */
CO_HIDDEN void *co__take_unstarted(void (*fn)(void *), bool (*accept)(void *arg, void *ctx),
                                   void *ctx);

/* Pinned sections (sched.c). A coroutine that still reads a structure that
 * another thread frees once co__pin_wait returns marks its M for the
 * duration (pool.c's chute: a worker re-reads its pool after handing its
 * record back). Cheaper than a shared reference count: two stores to the
 * M's own line. Enter returns the M (NULL on a plain thread, which must
 * use something else), to pass to exit; nothing in between may switch
 * (park, yield, or a lock that yields), or exit would run on another M.
 * co__pin_wait returns once every M that was inside a section when it
 * was called has left it: anything published before an entry (its
 * caller's push) and seen by the waiter is no longer read. */
CO_HIDDEN void *co__pin_enter(void);
CO_HIDDEN void co__pin_exit(void *m);
CO_HIDDEN void co__pin_wait(void);

/* ---- parking: the wait layer ------------------------------------------- */
enum {
    CO__PK_WAITING = 0, /* parked or about to park; nobody claimed it yet */
    CO__PK_WOKEN = 1,   /* a waker claimed it (co__claim) */
    CO__PK_TIMEDOUT = 2 /* its deadline claimed it */
};

typedef struct co__parker {
    uint32_t state;   /* atomic: CO__PK_*; WAITING -> WOKEN|TIMEDOUT by one CAS */
    uint32_t futex;   /* plain-thread wake word (0 sleeping, 1 released) */
    struct co_g *g;   /* the parked coroutine; NULL for a plain thread */
    void *winner;     /* set by the claimer: which waiter fired (select) */
    int wait_reason;  /* CO__WR_*, for co_dump */
    /* A plain thread parked with no deadline counts itself in
     * co__plain_parked_forever and sets this to co__plain_gen; whoever
     * swaps it back to 0 (its waker, before the release, or itself)
     * uncounts it if it was counted in this process's generation: the
     * count never includes a thread already released (deadlock.c). Atomic. */
    uint32_t counted;
} co__parker_t;

/* Wait reasons, shown by co_dump. Never reuse one; add new ones. */
enum {
    CO__WR_NONE = 0, CO__WR_SLEEP, CO__WR_CHAN_SEND, CO__WR_CHAN_RECV, CO__WR_SELECT,
    CO__WR_MUTEX, CO__WR_RWMUTEX, CO__WR_COND, CO__WR_WAITGROUP, CO__WR_SEM, CO__WR_ONCE,
    CO__WR_POOL, CO__WR_IO, CO__WR_MAIN, CO__WR_GROUP, CO__WR_COUNT_
};

/* Prepare a parker for coroutine g (NULL: the calling plain thread). */
static inline void co__parker_init_g(co__parker_t *pk, struct co_g *g, int wait_reason) {
    pk->state = CO__PK_WAITING;
    pk->futex = 0;
    pk->g = g;
    pk->winner = NULL;
    pk->wait_reason = wait_reason;
    pk->counted = 0;
}
/* Prepare a parker for the calling coroutine or thread. */
static inline void co__parker_init(co__parker_t *pk, int wait_reason) {
    co__parker_init_g(pk, co__cur_g(), wait_reason);
}

/* Block until claimed. `unlockf(arg)` (may be NULL) is called exactly once
 * after the caller can no longer run: for a coroutine, once it has switched
 * away (so a waker that finds the parker under the object's lock can never
 * ready a coroutine that is still running); for a thread, before it sleeps.
 * If `deadline` is not CO_FOREVER a timer claims the parker with
 * CO__PK_TIMEDOUT when it passes (a deadline already past is fine: the
 * parker is claimed at once). Returns 0 if woken by a claim, CO_ETIMEDOUT if
 * the deadline claimed it. On return the lock released by unlockf is not
 * held; a timed-out caller must re-lock and unlink its waiters. */
CO_HIDDEN int co__park(co__parker_t *pk, int64_t deadline, void (*unlockf)(void *), void *arg);
/* Park the running coroutine with a post-switch action of its own:
 * post(g, arg) runs on the next context once g is off its stack, and must
 * mark it WAITING (co__g_set_waiting) before it lets a waker find it. The
 * channel's no-deadline block uses it (one indirect call fewer than
 * co__park, on colony's hottest park); everything else uses co__park. */
CO_HIDDEN void co__park_current(void (*post)(struct co_g *g, void *arg), void *arg, int reason);
/* The one field of the runtime's private G record an upper layer may
 * touch, inline because it sits on that path: its status word, right
 * after the saved context (proc.h asserts both facts). */
#define CO__G_STATUS_OFFSET sizeof(co__ctx_t)
#define CO__G_STATUS_WAITING 3
static inline void co__g_set_waiting(struct co_g *g) {
    __atomic_store_n((uint32_t *)(void *)((char *)g + CO__G_STATUS_OFFSET), CO__G_STATUS_WAITING,
                     __ATOMIC_RELAXED);
}
/* Compaction (compact.c, docs/stacks.md): a coroutine that promised that
 * nothing outside it touches its stack while it is parked
 * (co_stack_compactable) has compact_on set, a byte of its G at a known
 * offset (proc.h asserts it). A wait site whose waker reaches the parked
 * stack only through one waiter w, linked in a queue under lock l, that
 * no timer or select can claim (only a waker that pops w under l), offers
 * the wait right before it parks, l held and w linked: sysmon may then
 * move the stack's live part (w and its parker with it) to the heap and
 * relink w's copy in its place, and the G's next run copies it back. */
#define CO__G_COMPACT_OFFSET (CO__G_STATUS_OFFSET + 4)
static inline bool co__g_compact_on(struct co_g *g) {
    return __atomic_load_n((uint8_t *)(void *)((char *)g + CO__G_COMPACT_OFFSET),
                           __ATOMIC_RELAXED) != 0;
}
struct co__waiter;
CO_HIDDEN void co__compact_offer(struct co_g *g, co__lock_t *l, struct co__waiter *w);
/* A waker that popped g's waiter (under the lock the offer names, l
 * above) and has not readied g yet, g's compact_on set: g's offer, if
 * listed, withdrawn, and a scan that claimed it waited out (it ends
 * without l: its trylock fails, or finds the waiter popped). After this
 * no scan takes l for g's wait, so the object may be freed (a channel,
 * compact.c). */
CO_HIDDEN void co__compact_woken(struct co_g *g);
/* A coroutine whose entry is fn runs code of several owners one after
 * another (a pool's worker): co_stack_compactable refuses it (CO_EPERM), as
 * none of them can promise for the others. Idempotent; at most 8 entries. */
CO_HIDDEN void co__compact_refuse_entry(void (*fn)(void *));
/* Convenience: unlockf = co__unlock(l). */
CO_HIDDEN int co__park_lock(co__parker_t *pk, int64_t deadline, co__lock_t *l);

/* Claim: CAS WAITING->WOKEN; records `winner`. True if this caller now owns
 * the wake-up and must call co__unpark() (after handing over any data).
 * Inline: a release claims each of its waiters in turn. */
static inline bool co__claim_cas(co__parker_t *pk, void *winner) {
    uint32_t w = CO__PK_WAITING;
    /* acq_rel: the claimer's hand-over happens before the unpark; pairs
     * with the parked side's acquire load of state after it resumes. */
    if (!__atomic_compare_exchange_n(&pk->state, &w, CO__PK_WOKEN, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return false;
    pk->winner = winner;
    return true;
}
#ifdef CO_TSAN
/* race.c: co__claim_cas, unseen by TSan, as the rest of the wait layer's
 * protocol: the edge a program relies on is the unpark's (co__ready), and
 * the CAS, on a parker that lives on a stack, would tie every claimer to
 * the claimers of the parkers that lived there before. */
CO_HIDDEN bool co__race_claim(co__parker_t *pk, void *winner);
#endif
static inline bool co__claim(co__parker_t *pk, void *winner) {
#if defined(CO_TSAN) && !defined(COLONY_TSAN_PLAIN)
    return co__race_claim(pk, winner);
#else
    return co__claim_cas(pk, winner);
#endif
}
/* Make a claimed parker's owner run again: readies the coroutine (into the
 * current P's runnext, like Go's goready) or futex-wakes the thread. The
 * parker's memory may be gone once this returns. */
CO_HIDDEN void co__ready(struct co_g *g);          /* sched.c */
/* co__ready for a G parked on a timer or the network (likely for long): it
 * prefetches all of its stack in use (up to 1 KiB, not just the top lines)
 * and the first two lines of its argument. */
CO_HIDDEN void co__ready_cold(struct co_g *g);     /* sched.c */
/* co__ready of n Gs at once, in order, at the tail of the current P's queue
 * (the global one from a plain thread), without prefetching their stacks:
 * for releasing many waiters (sched.c). */
CO_HIDDEN void co__ready_many(struct co_g *const *gs, size_t n);
CO_HIDDEN void co__unpark_thread(co__parker_t *pk); /* park.c */
static inline void co__unpark_as(co__parker_t *pk, bool cold) {
    struct co_g *g = pk->g; /* read before readying: pk dies once g runs */
#ifdef CO_TSAN
    /* The waker's hand-over happens before a plain thread's return from
     * its park (co__ready does it for a coroutine; a timeout or a network
     * event hands nothing over: cold). */
    if (!g && !cold) __tsan_release(pk);
#endif
    if (!g)
        co__unpark_thread(pk);
    else if (cold)
        co__ready_cold(g);
    else
        co__ready(g);
}
static inline void co__unpark(co__parker_t *pk) { co__unpark_as(pk, false); }
/* co__unpark for a timeout or a network event (co__ready_cold). */
static inline void co__unpark_cold(co__parker_t *pk) { co__unpark_as(pk, true); }

/* A waiter: one entry of an object's wait queue (Go's sudog). */
typedef struct co__waiter {
    struct co__waiter *next, *prev;
    struct co__waitq *q;   /* queue it is linked in, NULL if none */
    co__parker_t *pk;
    void *data;            /* payload: element pointer, request size, ... */
    int64_t n;             /* payload: a count (semaphores) */
    int result;            /* set by the waker before co__unpark */
    int idx;               /* select: case index */
} co__waiter_t;

/* A parker and a waiter together, the parker first: what a waitgroup's
 * release reads of a waiter (the parker's state and G, the waiter's links)
 * then sits within 64 bytes. */
typedef struct co__pkw {
    co__parker_t pk;
    co__waiter_t w;
} co__pkw_t;

/* The running coroutine's own parker and waiter, kept in its G record,
 * prepared as co__wait_prepare does; NULL on a plain thread (which waits
 * with one on its stack). For waits whose waker walks many waiters (a
 * waitgroup's release): their records are allocated close together, where
 * waiters on stacks would cost a page each. A coroutine waits on one
 * object at a time, so one is enough; the lock of the queue it is linked
 * in protects its links. */
CO_HIDDEN co__pkw_t *co__self_pkw(int wait_reason);

/* Intrusive FIFO of waiters. Protected by the lock of the object that
 * embeds it; zero-initialised == empty. Every write of head is a relaxed
 * atomic store, so that head alone may also be read without the lock
 * (co__waitq_head_acquire). */
typedef struct co__waitq {
    co__waiter_t *head, *tail;
} co__waitq_t;
/* At the tail. Inline, as is pop: a channel's every block and wake.
 * (The links are the wait layer's, uninstrumented under TSan as the rest of
 * the runtime is, race.c: a waiter's node is written by those who queue
 * behind it, and it may be woken by the network or a deadline, which order
 * nothing before its next wait.) */
static inline CO_TSAN_RUNTIME void co__waitq_push(co__waitq_t *q, co__waiter_t *w) {
    w->q = q;
    w->next = NULL;
    w->prev = q->tail;
    if (q->tail)
        q->tail->next = w;
    else
        __atomic_store_n(&q->head, w, __ATOMIC_RELAXED);
    q->tail = w;
}
/* The first waiter, unlinked; NULL if empty. */
static inline CO_TSAN_RUNTIME co__waiter_t *co__waitq_pop(co__waitq_t *q) {
    co__waiter_t *w = q->head;
    if (!w) return NULL;
    co__waiter_t *n = w->next;
    __atomic_store_n(&q->head, n, __ATOMIC_RELAXED);
    if (n)
        n->prev = NULL;
    else
        q->tail = NULL;
    w->next = w->prev = NULL;
    w->q = NULL;
    return w;
}
CO_HIDDEN void co__waitq_push_front(co__waitq_t *q, co__waiter_t *w); /* at the head */
/* Before the first waiter whose n is larger (at the tail if none): a queue
 * kept in order of n. Walks from the head. */
CO_HIDDEN void co__waitq_insert_by_n(co__waitq_t *q, co__waiter_t *w);
CO_HIDDEN void co__waitq_remove(co__waiter_t *w);                     /* no-op if unlinked */
static inline bool co__waitq_empty(const co__waitq_t *q) { return q->head == NULL; }
/* The first waiter, read without the queue's lock: a snapshot that may be
 * stale at once (a channel's non-blocking paths). acquire: the reads after
 * it stay after it. */
static inline co__waiter_t *co__waitq_head_acquire(const co__waitq_t *q) {
    return __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
}

/* ---- the wait helper: how every blocking call site waits --------------- */
/* Prepare a caller's parker and waiter (pw on its stack) for the calling
 * coroutine or thread; the waiter's payload starts zeroed. */
static inline void co__wait_prepare(co__pkw_t *pw, int wait_reason) {
    co__parker_init(&pw->pk, wait_reason);
    pw->w.next = pw->w.prev = NULL;
    pw->w.q = NULL;
    pw->w.pk = &pw->pk;
    pw->w.data = NULL;
    pw->w.n = 0;
    pw->w.result = 0;
    pw->w.idx = 0;
}
enum { CO__WAIT_KEEP_LOCK = 1 };
/* Wait, with w linked on a queue protected by l and l held: park, release
 * l once the caller can no longer run, and return
 *  0             a waker claimed w: w->result and w->pk->winner hold what
 *                it handed over; l is not held;
 *  CO_ETIMEDOUT  the deadline claimed it: w is unlinked (a waker that
 *                popped it and lost the claim did so already) and l is not
 *                held. With CO__WAIT_KEEP_LOCK, l is held instead and w
 *                left as the waker left it (still linked iff w->q): for a
 *                site whose timeout must do more under the lock.
 * A deadline already past times out at once, unless a waker claimed first. */
CO_HIDDEN int co__wait_timedout(co__waiter_t *w, co__lock_t *l, int flags); /* co__wait's slow half */
static inline int co__wait(co__waiter_t *w, co__lock_t *l, int64_t deadline, int flags) {
    if (CO_LIKELY(co__park_lock(w->pk, deadline, l) == 0)) return 0;
    return co__wait_timedout(w, l, flags);
}

/* ---- timers ------------------------------------------------------------- */
/* A runtime timer on a per-P 4-ary heap. `fn(arg)` runs on some M, without
 * any timer lock held, at or after `when`; it must be short and must not
 * block (typically: claim a parker and unpark it). It may re-add its own
 * timer (tickers). Embed it; zero-init, then set fn/arg. */
typedef struct co__timer {
    int64_t when;
    int64_t period;          /* informational; re-adding is the callback's job */
    void (*fn)(void *arg);
    void *arg;
    struct co_p *p;          /* heap it is on (under that heap's lock) */
    int32_t slot;            /* while pending: its slot on p's heap (>= 0), its
                              * entry in p's run (-2 - index), or CO__TSLOT_LIST on
                              * p's overflow list; -1 otherwise */
    uint32_t state;          /* atomic: CO__TM_IDLE/PENDING, changed under p's heap lock */
    uint32_t running;        /* atomic: callbacks in flight (see timer.c) */
    struct co__timer *lnext, *lprev; /* p's overflow list (timer.c), under p's heap lock */
} co__timer_t;
#define CO__TSLOT_LIST INT32_MIN
enum { CO__TM_IDLE = 0, CO__TM_PENDING = 1 };
CO_HIDDEN void co__timer_add(co__timer_t *t, int64_t when); /* t must not be pending */
/* Remove a timer. Returns true if it was pending and will now never run.
 * If its callback is running on another M, waits until it returns, so the
 * timer's memory can be freed once this returns. Never call it from a
 * timer callback: callbacks due together run one after another on one M,
 * each counted as running until it returns (timer.c). */
CO_HIDDEN bool co__timer_del(co__timer_t *t);
/* co__timer_del for a timer known to have fired (its callback has started,
 * and nobody re-adds it): no lock, only the wait for its callback's end. */
CO_HIDDEN void co__timer_wait_fired(co__timer_t *t);

/* ---- netpoll hooks (netpoll_epoll.c) ----------------------------------- */
CO_HIDDEN int co__netpoll_init(void);
CO_HIDDEN void co__netpoll_fini(void);
/* In a forked child that starts a runtime of its own: drop the parent's
 * epoll set and break eventfd, open file descriptions the two share (the
 * parent's poller would take the child's breaks and events), and the
 * descriptor table, without the locks a parent's thread may hold. */
CO_HIDDEN void co__netpoll_forget(void);
/* Wait up to delay_ns (<0 forever, 0 poll) and unpark every waiter whose fd
 * became ready. Returns the number of waiters made runnable. */
CO_HIDDEN int co__netpoll(int64_t delay_ns);
CO_HIDDEN void co__netpoll_break(void); /* wake an M blocked in co__netpoll */
CO_HIDDEN bool co__netpoll_has_waiters(void);
/* sched.c: a new edge will be seen soon: an M is blocked in co__netpoll
 * (or about to be), or one polled less than CO__POLL_RECENT_NS before
 * `now` (Ms poll whenever they run out of work). A hint (may be stale). */
#define CO__POLL_RECENT_NS 1000000
CO_HIDDEN bool co__netpoll_soon(int64_t now);
CO_HIDDEN void co__netpoll_want(void); /* a plain thread parks on the netpoller */
/* Poll descriptors (netpoll.c), their waiting and waking, and the backend's
 * registration: runtime/netpoll.h, which the fd layer (src/io) includes. */

#endif
