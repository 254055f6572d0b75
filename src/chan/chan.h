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

/* co_chan_new, and the channel is receive-only to users from birth. */
CO_HIDDEN int co__chan_new_recv_only(co_chan_t **out, size_t elem_size, size_t cap);
/* co_chan_close for the owner of a receive-only channel (any channel):
 * 0, or CO_ECLOSED if it was closed already. ch must not be NULL. */
CO_HIDDEN int co__chan_close_by_owner(co_chan_t *ch);
/* co_chan_free for the owner of a receive-only channel (any channel);
 * NULL: no-op. */
CO_HIDDEN void co__chan_free_by_owner(co_chan_t *ch);

#endif
