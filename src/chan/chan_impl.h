/*
 * The channel object, shared by chan.c (send, recv, close), select.c and
 * ticker.c. Not part of the public API.
 *
 * A channel is Go's hchan: a lock, a ring buffer of `cap` elements of
 * `elem_size` bytes, and two FIFO wait queues (recvq, sendq) of waiters
 * (co__waiter_t, Go's sudog) whose parkers belong to blocked callers. Every
 * operation that changes the channel runs under `lock`, except that a few
 * fields are also *read* without the lock by the non-blocking fast paths
 * (see "Lock-free reads" below).
 *
 * Invariants (under lock):
 *  - a live (unclaimed) receiver waits in recvq only while the buffer is
 *    empty; a live sender waits in sendq only while the buffer is full (for
 *    cap == 0: always "full" and "empty"). A waker therefore serves waiters
 *    before the buffer, which keeps FIFO order.
 *  - once CHAN_CLOSED is set, both queues stay empty of live waiters
 *    (close claims every waiter; later callers see it before queueing).
 *  - the queues may hold *stale* waiters: their parker was already claimed
 *    by a deadline or by another case of their select, and their owner will
 *    re-lock the channel to unlink them. A waker that pops a stale waiter
 *    (co__claim fails) drops it and counts it in `linger`: its owner still
 *    comes back to lock the channel, finds it unlinked and uncounts it.
 *    co_chan_free waits for linger to drop to 0, so a channel closed and
 *    freed at once (co_ctx_free: cancel, then free) outlives the selects
 *    and timed-out operations it woke or dropped. An owner never re-locks
 *    a channel on which its only waiter was claimed (by a waker, which
 *    does not count it).
 *
 * Lock-free reads (the non-blocking fast paths of chan.go, and select's
 * snapshot of several channels):
 *  - qcount, state, recvq.head, sendq.head are only ever *written* under
 *    `lock`, with __atomic stores (the wait layer's queues store head so);
 *    lock-free readers use __atomic loads.
 *  - ver is a sequence counter: chan_lock() makes it odd before the locked
 *    section touches anything (store, then a release fence), chan_unlock()
 *    makes it even again (store-release) before releasing the lock. A reader
 *    that loads ver (acquire), then state, then issues an acquire fence and
 *    loads ver again, and sees the same even value, read state that no
 *    locked section changed in between (the usual seqlock argument; the
 *    fence pairs with the writer's release fence). select.c uses it to take
 *    a consistent snapshot of several channels without locking them.
 *
 * Waiters live on their owner's stack. A waker may touch a waiter only
 * while holding the channel lock under which it found it, or after winning
 * co__claim() on its parker and until it calls co__unpark().
 */
#ifndef COLONY_CHAN_IMPL_H
#define COLONY_CHAN_IMPL_H

#include "runtime/runtime.h"
#include "chan/chan.h"

#include <string.h>

struct co_chan {
    /* lock protects: buf contents, sendx, recvx, the queue links of every
     * waiter in recvq/sendq (next, prev, q), and the writes of qcount,
     * state, recvq, sendq, ver. Never held across a park (co__park's
     * unlock callback releases it after the caller stopped running). */
    co__lock_t lock;
    uint32_t ver;      /* atomic seq counter: odd while `lock` is held (see above) */
    size_t qcount;     /* atomic: elements in buf; written under lock (relaxed), read lock-free (acquire) */
    uint32_t state;    /* atomic: CHAN_* bits below; set under lock (release), read
                          lock-free (acquire) */
    uint32_t linger;   /* stale waiters popped, whose owners will still lock the
                          channel (see above); under lock */
    co__waitq_t recvq; /* blocked receivers; head also read lock-free */
    co__waitq_t sendq; /* blocked senders; head also read lock-free */
    size_t sendx;      /* next slot to fill (under lock) */
    size_t recvx;      /* next slot to drain (under lock) */
    /* immutable after co_chan_new: */
    size_t elem_size;
    size_t cap;
    char *buf;         /* cap * elem_size bytes right after the struct (never NULL) */
    /* CO__TAG_CHAN from co_chan_new until the free, then its freed value
     * (chan/chan.h). On the line of elem_size and cap, which every
     * operation reads anyway. Written only by new and free. */
    uint32_t tag;
};

/* state. CHAN_CLOSED is set once, by close. CHAN_RECV_ONLY is set at birth
 * on a channel that a layer above owns and users may only receive from (a
 * context's done channel, chan/chan.h): their send and close answer
 * CO_EPERM, only the owner closes or frees it. Both live in one word so
 * that the send paths, which already test "closed", test "closed or
 * receive-only" with the same instructions (state != 0), and only the
 * failing branch tells the two apart; the receive paths test CHAN_CLOSED
 * alone, also at no extra cost. */
enum { CHAN_CLOSED = 1u, CHAN_RECV_ONLY = 2u };

/* ---- the lock and its sequence counter ---------------------------------- */

static inline void chan_lock(co_chan_t *ch) {
    co__lock(&ch->lock);
    uint32_t v = __atomic_load_n(&ch->ver, __ATOMIC_RELAXED);
    __atomic_store_n(&ch->ver, v + 1, __ATOMIC_RELAXED);  /* odd: section in progress */
    /* release fence: orders the odd ver before every store of this section;
     * pairs with the acquire fence of a lock-free reader (select.c) */
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void chan_unlock(co_chan_t *ch) {
    uint32_t v = __atomic_load_n(&ch->ver, __ATOMIC_RELAXED);
    /* store-release: even again; publishes the section's stores to a reader
     * that acquires ver */
    __atomic_store_n(&ch->ver, v + 1, __ATOMIC_RELEASE);
    co__unlock(&ch->lock);
}

/* ---- lock-free readiness (may be stale; a `false` is always safe to act on
 * as "not ready at some instant during the call", see chan.c) ------------- */

static inline bool chan_closed_acq(const co_chan_t *ch) {
    return (__atomic_load_n(&ch->state, __ATOMIC_ACQUIRE) & CHAN_CLOSED) != 0;
}
/* A send cannot wait here: the channel is closed, or receive-only to
 * users (the send fails at once either way). */
static inline bool chan_nosend_acq(const co_chan_t *ch) {
    return __atomic_load_n(&ch->state, __ATOMIC_ACQUIRE) != 0;
}
/* What a send on a channel with state != 0 answers. Out of the way of the
 * hot paths: they test state != 0 only. */
static inline int chan_send_refused(const co_chan_t *ch) {
    return (ch->state & CHAN_RECV_ONLY) ? CO_EPERM : CO_ECLOSED;
}
/* Go's full(): a send would block (ignoring close). */
static inline bool chan_full(const co_chan_t *ch) {
    if (ch->cap == 0) return co__waitq_head_acquire(&ch->recvq) == NULL;
    return __atomic_load_n(&ch->qcount, __ATOMIC_ACQUIRE) == ch->cap;
}
/* Go's empty(): a receive would block (ignoring close). */
static inline bool chan_empty(const co_chan_t *ch) {
    if (ch->cap == 0) return co__waitq_head_acquire(&ch->sendq) == NULL;
    return __atomic_load_n(&ch->qcount, __ATOMIC_ACQUIRE) == 0;
}

/* ---- wait queues ----------------------------------------------------------
 * recvq and sendq are the wait layer's queues (co__waitq_*), under ch->lock;
 * their head is also read lock-free (chan_full, chan_empty above). */

/* w->idx of a waiter: a select case index (>= 0), or one of these for a
 * plain send/recv. */
enum {
    CHAN_W_TIMED = -1, /* plain op with a deadline: the deadline may claim it */
    CHAN_W_EXCL = -2,  /* plain op with CO_FOREVER: nobody but a waker of this
                          channel can claim its parker */
    CHAN_W_OFFERED = -3 /* CHAN_W_EXCL whose coroutine offered the wait for
                           compaction (compact.c), under ch->lock */
};

/* Pop the first waiter whose parker we win; stale waiters are dropped. The
 * returned waiter is ours to fill in until co__unpark(w->pk).
 *
 * An exclusive waiter (CHAN_W_EXCL, CHAN_W_OFFERED) is claimed without
 * the CAS: its parker has no deadline and belongs to no select, so the
 * only parties that could claim it are wakers of this channel, and they
 * are serialised by ch->lock and find the waiter only by popping it
 * (once). The store-release stands for the CAS's effect (state WAITING
 * -> WOKEN, winner recorded); the data hand-over is published to the
 * owner by co__unpark as usual. */
static inline co__waiter_t *chq_claim(co_chan_t *ch, co__waitq_t *q) {
    co__waiter_t *w;
    while ((w = co__waitq_pop(q)) != NULL) {
        if (w->idx <= CHAN_W_EXCL) { /* CHAN_W_EXCL or CHAN_W_OFFERED */
            w->pk->winner = w;
            __atomic_store_n(&w->pk->state, CO__PK_WOKEN, __ATOMIC_RELEASE);
            return w;
        }
        if (co__claim(w->pk, w)) return w;
        ch->linger++; /* stale: its owner will lock ch once more (chq_leave) */
    }
    return NULL;
}

/* A waiter chq_claim returned, before its co__unpark: the compaction offer
 * its coroutine made (CHAN_W_OFFERED) names ch->lock, so it goes while ch
 * is alive (compact.c; a scan that claimed it is waited out). Called after
 * the unlock where this waker is the only one to wake (nobody may free ch
 * before the woken coroutine runs), under ch->lock where it wakes several
 * (a close: the first to run may free ch while the rest are being woken).
 * Not in chq_claim: a call there, inlined into every pop, made select's
 * try keep two more registers (+5 instructions a select). */
static inline void chq_unoffer(co__waiter_t *w) {
    if (CO_UNLIKELY(w->idx == CHAN_W_OFFERED)) co__compact_woken(w->pk->g);
}

/* Under ch->lock, by the owner of w, whose parker was claimed by someone
 * else than a waker popping w: take w off ch for good, or, if a waker
 * already popped it (and counted it), uncount it. After the unlock that
 * follows, the owner must not touch ch again. */
static inline void chq_leave(co_chan_t *ch, co__waiter_t *w) {
    if (w->q)
        co__waitq_remove(w);
    else
        ch->linger--;
}

/* ---- element copies ------------------------------------------------------ */

static inline void chan_copy(void *dst, const void *src, size_t n) {
    if (CO_LIKELY(n == 8)) { /* a pointer or a 64-bit integer: the usual element */
        memcpy(dst, src, 8);
        return;
    }
    switch (n) { /* constant sizes become plain moves */
    case 0: return;
    case 1: memcpy(dst, src, 1); return;
    case 2: memcpy(dst, src, 2); return;
    case 4: memcpy(dst, src, 4); return;
    case 8: memcpy(dst, src, 8); return;
    case 16: memcpy(dst, src, 16); return;
    default: memcpy(dst, src, n); return;
    }
}

static inline char *chan_slot(const co_chan_t *ch, size_t i) { return ch->buf + i * ch->elem_size; }

/* ---- the two halves of every operation, under ch->lock -----------------
 * Each returns 1 if the operation completed, 0 if it would block, or
 * CO_ECLOSED (a send on a receive-only channel: CO_EPERM). *wake is set to
 * a claimed waiter the caller must co__unpark() after unlocking (NULL if
 * none). `elem` may be NULL for a receive (the value is dropped); for a
 * send it is NULL only when elem_size == 0. */

static inline __attribute__((always_inline)) int chan_send_locked(co_chan_t *ch, const void *elem,
                                                                 co__waiter_t **wake) {
    *wake = NULL;
    if (ch->state) return chan_send_refused(ch);
    co__waiter_t *w = chq_claim(ch, &ch->recvq);
    if (w) { /* a receiver waits: the buffer is empty; copy straight into it (sendDirect) */
        if (w->data) chan_copy(w->data, elem, ch->elem_size);
        w->result = 0;
        *wake = w;
        return 1;
    }
    size_t qc = ch->qcount;
    if (qc < ch->cap) {
        chan_copy(chan_slot(ch, ch->sendx), elem, ch->elem_size);
        if (++ch->sendx == ch->cap) ch->sendx = 0;
        __atomic_store_n(&ch->qcount, qc + 1, __ATOMIC_RELAXED); /* under lock */
        return 1;
    }
    return 0;
}

static inline __attribute__((always_inline)) int chan_recv_locked(co_chan_t *ch, void *elem,
                                                                 co__waiter_t **wake) {
    *wake = NULL;
    co__waiter_t *w = chq_claim(ch, &ch->sendq);
    if (w) {
        if (ch->cap == 0) { /* unbuffered: take the sender's value directly */
            if (elem) chan_copy(elem, w->data, ch->elem_size);
        } else {
            /* A live sender waits only while the buffer is full: take the
             * head and put the sender's value at the tail, which is the
             * same slot (recvx == sendx when full). FIFO is kept. */
            char *slot = chan_slot(ch, ch->recvx);
            if (elem) chan_copy(elem, slot, ch->elem_size);
            chan_copy(slot, w->data, ch->elem_size);
            if (++ch->recvx == ch->cap) ch->recvx = 0;
            ch->sendx = ch->recvx;
        }
        w->result = 0;
        *wake = w;
        return 1;
    }
    size_t qc = ch->qcount;
    if (qc > 0) {
        if (elem) chan_copy(elem, chan_slot(ch, ch->recvx), ch->elem_size);
        if (++ch->recvx == ch->cap) ch->recvx = 0;
        __atomic_store_n(&ch->qcount, qc - 1, __ATOMIC_RELAXED); /* under lock */
        return 1;
    }
    if (ch->state & CHAN_CLOSED) return CO_ECLOSED;
    return 0;
}

/* Deadline helpers. CO_FOREVER waits; any other value <= 0 is past without
 * reading the clock; a positive one is compared with co_now() only when the
 * caller is about to block. */
static inline bool chan_dl_cheap_past(int64_t deadline) {
    return deadline != CO_FOREVER && deadline <= 0;
}
static inline bool chan_dl_past(int64_t deadline) {
    return deadline != CO_FOREVER && (deadline <= 0 || deadline <= co_now());
}

#endif
