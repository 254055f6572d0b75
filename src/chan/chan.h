/*
 * The channel layer's door for the layers above it (src/context): channels
 * that such a layer owns and hands out to users as receive-only, as Go's
 * ctx.Done() returns a `<-chan struct{}`. A user may receive from one,
 * select on it for receive, ask its len and cap; a user's co_chan_send,
 * co_chan_close, and a send case of co_select on it answer CO_EPERM, and
 * a user's co_chan_free of it aborts. Its owner closes and frees it with
 * the calls below. chan_impl.h stays private to src/chan.
 */
#ifndef COLONY_CHAN_H
#define COLONY_CHAN_H

#include "base/base.h"

/* ---- handle tags ----------------------------------------------------------
 * Every object a public handle points to (a channel, timer, ticker,
 * context, group, pool, multipool) holds one of these words in its `tag`
 * field: the live value from its making until its free, which overwrites
 * it with the freed value (~live) just before the memory goes back to the
 * allocator. Each public call checks the tag of the handle it is given
 * (after the NULL rule) and, if it is not the live value of its kind,
 * stops with "colony: fatal: <call>: <handle> is not a <kind> (...)"
 * instead of acting on whatever the memory holds. Best effort, as a
 * freed handle is read: the tag sits past the words glibc's free writes
 * into a freed block (its first 32 bytes), so it reads "freed" until the
 * memory is reused; a block reused for another object of the same kind
 * passes (docs/chan.md, "Errors"). The failing branch is out of line. */
enum {
    CO__TAG_CHAN = 0x4e414843u,   /* "CHAN" in memory (little-endian) */
    CO__TAG_TIMER = 0x524d4954u,  /* "TIMR" */
    CO__TAG_TICKER = 0x4b434954u, /* "TICK" */
    CO__TAG_CTX = 0x58544e43u,    /* "CNTX" */
    CO__TAG_GROUP = 0x50555247u,  /* "GRUP" */
    CO__TAG_POOL = 0x4c4f4f50u,   /* "POOL" */
    CO__TAG_MPOOL = 0x4c4f504du,  /* "MPOL" */
};
#define CO__TAG_FREED(live) (~(uint32_t)(live))

/* Print "colony: fatal: <call>: <h> is not a <kind> (freed)", or "(freed
 * or never made)" when *tag is not want's freed value, and abort. */
CO_HIDDEN _Noreturn __attribute__((cold, noinline)) void co__bad_handle(const char *call,
                                                                        const void *h,
                                                                        uint32_t want,
                                                                        const uint32_t *tag);

/* Mark obj freed, just before free(obj). A volatile store: a plain one
 * right before free() is a dead store to the compiler, which drops it. */
#define CO__HANDLE_KILL(obj, live) (*(volatile uint32_t *)&(obj)->tag = CO__TAG_FREED(live))

/* Stop unless obj (not NULL) carries the live tag `want`. The failing
 * branch reads the tag again through its address, so the hot path is a
 * compare of memory with a constant and a branch. */
#define CO__HANDLE_CHECK(obj, want, call)                                                     \
    do {                                                                                      \
        if (CO_UNLIKELY((obj)->tag != (uint32_t)(want)))                                      \
            co__bad_handle(call, (const void *)(obj), (uint32_t)(want), &(obj)->tag);         \
    } while (0)

/* Stop with a fatal line naming `call` unless ch (not NULL) is a live
 * channel: for layers above that take a channel without calling into it
 * at once (signals keep it registered). */
CO_HIDDEN void co__chan_check(const co_chan_t *ch, const char *call);

/* co_chan_new, and the channel is receive-only to users from birth. */
CO_HIDDEN int co__chan_new_recv_only(co_chan_t **out, size_t elem_size, size_t cap);
/* co_chan_close for the owner of a receive-only channel (any channel):
 * 0, or CO_ECLOSED if it was closed already. ch must not be NULL. */
CO_HIDDEN int co__chan_close_by_owner(co_chan_t *ch);
/* co_chan_free for the owner of a receive-only channel (any channel);
 * NULL: no-op. */
CO_HIDDEN void co__chan_free_by_owner(co_chan_t *ch);

#endif
