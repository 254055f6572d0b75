/*
 * Channels: Go's chan.go for C. See chan_impl.h for the object, its lock,
 * its invariants and the lock-free fields; docs/chan.md for the contract.
 *
 * send:  closed -> CO_ECLOSED; a waiting receiver -> copy straight into its
 *        buffer and wake it; room in the ring -> enqueue; else block (or
 *        CO_ETIMEDOUT if the deadline has passed).
 * recv:  a waiting sender -> unbuffered: take its value; buffered (the ring
 *        is full): take the head, move the sender's value to the tail; else
 *        the ring's head; else closed -> CO_ECLOSED; else block.
 * close: mark closed, claim every waiter on both queues (CO_ECLOSED), wake
 *        them after unlocking. Receivers still drain the ring afterwards.
 *
 * A receive-only channel (CHAN_RECV_ONLY, made by co__chan_new_recv_only
 * for a layer above: a context's done channel) refuses the user's send
 * and close with CO_EPERM and aborts on the user's free; its owner closes
 * and frees it through chan/chan.h.
 *
 * Non-blocking fast paths (deadline already past, cheaply known: <= 0 and
 * not CO_FOREVER), decided without the lock as chan.go does:
 *  - send: read state, then full (cap 0: no receiver waits); open (state
 *    0: neither closed nor receive-only, which is set before the channel
 *    is published) and full -> CO_ETIMEDOUT. If a close came between the
 *    two reads, the
 *    channel was full when it closed (a closed channel never becomes full,
 *    nothing can be sent to it), so just before the close it was open and
 *    full: the result is right at that instant (Go's argument).
 *  - recv: if empty, read closed; if open, fail (empty and open at the
 *    instant of the closed read, since emptiness was observed before it and
 *    "open" held then too); if closed, re-check emptiness: a closed channel
 *    never gains elements, so empty now means drained for good ->
 *    CO_ECLOSED.
 * The loads are acquire so that they are performed in program order.
 */
#include "runtime/runtime.h"

#include "chan/chan.h"
#include "chan/chan_impl.h"

#include <stdlib.h>
#include <string.h>

CO_STATIC_ASSERT(sizeof(struct co_chan) <= 128, "co_chan grew past two cache lines");
CO_STATIC_ASSERT(offsetof(struct co_chan, tag) >= 32, "the tag must lie past what free() writes");

/* ---- handle tags (chan/chan.h) ------------------------------------------ */

static const char *tag_kind(uint32_t tag) {
    switch (tag) {
    case CO__TAG_CHAN: return "channel";
    case CO__TAG_TIMER: return "timer";
    case CO__TAG_TICKER: return "ticker";
    case CO__TAG_CTX: return "context";
    case CO__TAG_GROUP: return "group";
    case CO__TAG_POOL: return "pool";
    case CO__TAG_MPOOL: return "multipool";
    default: return "?";
    }
}

void co__bad_handle(const char *call, const void *h, uint32_t want, const uint32_t *tag) {
    uint32_t got = *tag;
    /* the freed value: the object was freed and its memory not yet reused */
    co__fatal("%s: %p is not a %s (%s)", call, h, tag_kind(want),
              got == CO__TAG_FREED(want) ? "freed" : "freed or never made");
}

#define CHAN_CHECK(ch, call) CO__HANDLE_CHECK(ch, CO__TAG_CHAN, call)

void co__chan_check(const co_chan_t *ch, const char *call) { CHAN_CHECK(ch, call); }

int co_chan_new(co_chan_t **out, size_t elem_size, size_t cap) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    int rc = co__ensure_init();
    if (rc < 0) return rc;
    size_t hdr = (sizeof(struct co_chan) + 63) & ~(size_t)63;
    size_t bytes = 0;
    if (elem_size && cap > (SIZE_MAX - hdr - 64) / elem_size) return CO_ENOMEM;
    bytes = elem_size * cap;
    size_t total = (hdr + bytes + 63) & ~(size_t)63;
    co_chan_t *ch = aligned_alloc(64, total);
    if (!ch) return CO_ENOMEM;
    memset(ch, 0, sizeof *ch);
    ch->elem_size = elem_size;
    ch->cap = cap;
    ch->buf = (char *)ch + hdr; /* one past the header (and the end when bytes == 0) */
    ch->tag = CO__TAG_CHAN;
    *out = ch;
    return 0;
}

int co__chan_new_recv_only(co_chan_t **out, size_t elem_size, size_t cap) {
    int rc = co_chan_new(out, elem_size, cap);
    /* before anyone else can see it: no lock needed, and a lock-free
     * reader never sees the channel without the bit */
    if (rc == 0) (*out)->state = CHAN_RECV_ONLY;
    return rc;
}

static void chan_free(co_chan_t *ch) {
    chan_lock(ch);
    /* Misuse check: with correct use nobody is blocked on ch now. */
    const char *busy = ch->recvq.head ? "receivers" : ch->sendq.head ? "senders" : NULL;
    if (busy) {
        chan_unlock(ch);
        co__fatal("co_chan_free(%p): the channel still has blocked %s", (void *)ch, busy);
    }
    /* Operations this channel woke or dropped without claiming them (a
     * select another case won, a receive whose deadline fired as the
     * channel closed) still lock it once to finish: wait for them. They
     * hold no other lock we could need, and do it at once when they run. */
    while (ch->linger != 0) {
        chan_unlock(ch);
        co_yield(); /* sched_yield() on a plain thread */
        chan_lock(ch);
    }
    chan_unlock(ch);
    CO__HANDLE_KILL(ch, CO__TAG_CHAN);
    free(ch);
}

void co_chan_free(co_chan_t *ch) {
    if (!ch) return;
    CHAN_CHECK(ch, "co_chan_free");
    /* state's CHAN_RECV_ONLY is immutable after co__chan_new_recv_only */
    if (CO_UNLIKELY(__atomic_load_n(&ch->state, __ATOMIC_RELAXED) & CHAN_RECV_ONLY))
        co__fatal("co_chan_free(%p): the channel is receive-only (a context's done channel): "
                  "its owner frees it",
                  (void *)ch);
    chan_free(ch);
}

void co__chan_free_by_owner(co_chan_t *ch) {
    if (ch) chan_free(ch);
}

size_t co_chan_len(const co_chan_t *ch) {
    if (!ch) return 0;
    CHAN_CHECK(ch, "co_chan_len");
    return __atomic_load_n(&ch->qcount, __ATOMIC_RELAXED); /* a snapshot, like Go's len(ch) */
}

size_t co_chan_cap(const co_chan_t *ch) {
    if (!ch) return 0;
    CHAN_CHECK(ch, "co_chan_cap");
    return ch->cap;
}

/* For tests (hidden; tests link the static library): how many waiters are
 * queued to receive on ch now. A select's waiter is queued before it parks
 * and dropped only by its wake-up, so a test can tell that a select has
 * got as far as waiting before it frees what the select waits on. */
CO_HIDDEN int co__test_chan_receivers(co_chan_t *ch);
int co__test_chan_receivers(co_chan_t *ch) {
    int n = 0;
    co__lock(&ch->lock);
    for (co__waiter_t *w = ch->recvq.head; w; w = w->next) n++;
    co__unlock(&ch->lock);
    return n;
}

/* co__park unlock callback: releases the channel lock once the caller can
 * no longer run. Touches only *ch, which outlives the operation. */
static void chan_unlock_cb(void *arg) { chan_unlock((co_chan_t *)arg); }

/* co__park_current post-switch action of a coroutine blocked with no
 * deadline: what co__park's would do (the G is WAITING, then the lock is
 * released), without the indirection. */
static void chan_post_park(struct co_g *g, void *arg) {
    co__g_set_waiting(g);
    chan_unlock((co_chan_t *)arg);
}

/* Block on q (sendq or recvq) until a waker fills in the result or the
 * deadline passes. Called with ch->lock held; returns with it released. */
static int chan_block(co_chan_t *ch, co__waitq_t *q, void *data, int64_t deadline, int reason) {
    co__parker_t pk;
    co__parker_init(&pk, reason);
    co__waiter_t w;
    w.pk = &pk;
    w.data = data;
    w.n = 0;
    w.result = 0;
    w.idx = deadline == CO_FOREVER ? CHAN_W_EXCL : CHAN_W_TIMED;
    co__waitq_push(q, &w);
    if (CO_LIKELY(deadline == CO_FOREVER && pk.g)) {
        /* co__park's no-deadline coroutine case, one layer shorter (the
         * ping-pong path): only a waker can claim pk, so we run again
         * only once it has set w.result. Only such a waker (popping w
         * under ch->lock) reaches this stack: the wait may be compacted. */
        if (CO_UNLIKELY(co__g_compact_on(pk.g))) {
            w.idx = CHAN_W_OFFERED; /* its waker withdraws the offer (chq_unoffer) */
            co__compact_offer(pk.g, &ch->lock, &w);
        }
        co__park_current(chan_post_park, ch, reason);
        return w.result;
    }
    int rc = co__park(&pk, deadline, chan_unlock_cb, ch);
    if (CO_UNLIKELY(rc == CO_ETIMEDOUT)) {
        /* The deadline claimed the parker, so no waker will touch w; a
         * waker may already have popped it (its claim failed, and it
         * counted w in linger, which keeps ch alive for this lock). */
        chan_lock(ch);
        chq_leave(ch, &w);
        chan_unlock(ch);
        return CO_ETIMEDOUT;
    }
    /* Claimed by a waker: it set w.result (0 or CO_ECLOSED) and moved the
     * data before co__unpark, which orders those writes before our return. */
    return w.result;
}

/* A receive that found the channel closed and drained gets the zero value
 * in its buffer, as in Go (a receiver that reuses one variable then never
 * sees a stale element). elem may be NULL (the element is discarded). */
static void chan_zero_elem(const co_chan_t *ch, void *elem) {
    if (elem && ch->elem_size) memset(elem, 0, ch->elem_size);
}

int co_chan_send(co_chan_t *ch, const void *elem, int64_t deadline) {
    if (CO_UNLIKELY(!ch)) return CO_EINVAL;
    CHAN_CHECK(ch, "co_chan_send");
    if (CO_UNLIKELY(!elem && ch->elem_size)) return CO_EINVAL;
    if (chan_dl_cheap_past(deadline) && !chan_nosend_acq(ch) && chan_full(ch))
        return CO_ETIMEDOUT; /* Go's select-with-default fast path, no lock */

    chan_lock(ch);
    co__waiter_t *wake;
    int rc = chan_send_locked(ch, elem, &wake);
    if (rc != 0) {
        chan_unlock(ch);
        if (wake) {
            chq_unoffer(wake);
            co__unpark(wake->pk);
        }
        return rc == 1 ? 0 : rc;
    }
    if (chan_dl_past(deadline)) {
        chan_unlock(ch);
        return CO_ETIMEDOUT;
    }
    return chan_block(ch, &ch->sendq, (void *)elem, deadline, CO__WR_CHAN_SEND);
}

int co_chan_recv(co_chan_t *ch, void *elem, int64_t deadline) {
    if (CO_UNLIKELY(!ch)) return CO_EINVAL;
    CHAN_CHECK(ch, "co_chan_recv");
    if (chan_dl_cheap_past(deadline) && chan_empty(ch)) {
        if (!chan_closed_acq(ch)) return CO_ETIMEDOUT;
        if (chan_empty(ch)) {
            chan_zero_elem(ch, elem);
            return CO_ECLOSED;
        }
    }

    chan_lock(ch);
    co__waiter_t *wake;
    int rc = chan_recv_locked(ch, elem, &wake);
    if (rc != 0) {
        if (rc == CO_ECLOSED) chan_zero_elem(ch, elem); /* elem_size is fixed: no lock needed */
        chan_unlock(ch);
        if (wake) {
            chq_unoffer(wake);
            co__unpark(wake->pk);
        }
        return rc == 1 ? 0 : rc;
    }
    if (chan_dl_past(deadline)) {
        chan_unlock(ch);
        return CO_ETIMEDOUT;
    }
    return chan_block(ch, &ch->recvq, elem, deadline, CO__WR_CHAN_RECV);
}

/* deny: the state bits that refuse this close besides CHAN_CLOSED
 * (CHAN_RECV_ONLY for a user's close, none for the owner's). */
static int chan_close(co_chan_t *ch, uint32_t deny) {
    chan_lock(ch);
    uint32_t st = ch->state;
    if (st & (CHAN_CLOSED | deny)) {
        chan_unlock(ch);
        return (st & deny) ? CO_EPERM : CO_ECLOSED;
    }
    /* store-release; pairs with the acquire loads of the fast paths */
    __atomic_store_n(&ch->state, st | CHAN_CLOSED, __ATOMIC_RELEASE);
    /* Claim every waiter, receivers first, in queue order; collect them on
     * a private list (their links are ours once claimed) and wake them
     * after unlocking, as Go's closechan does with its glist. */
    co__waiter_t *head = NULL, **tail = &head, *w;
    while ((w = chq_claim(ch, &ch->recvq)) != NULL) {
        chq_unoffer(w); /* under the lock: see there */
        w->result = CO_ECLOSED;
        chan_zero_elem(ch, w->data); /* Go's zero value; ours until the unpark */
        *tail = w;
        tail = &w->next;
    }
    while ((w = chq_claim(ch, &ch->sendq)) != NULL) {
        chq_unoffer(w);
        w->result = CO_ECLOSED;
        *tail = w;
        tail = &w->next;
    }
    *tail = NULL;
    chan_unlock(ch);
    while (head) {
        w = head;
        head = w->next; /* read before the wake: w dies once its owner runs */
        co__unpark(w->pk);
    }
    return 0;
}

int co_chan_close(co_chan_t *ch) {
    if (!ch) return CO_EINVAL;
    CHAN_CHECK(ch, "co_chan_close");
    return chan_close(ch, CHAN_RECV_ONLY);
}

int co__chan_close_by_owner(co_chan_t *ch) { return chan_close(ch, 0); }
