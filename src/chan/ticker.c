/*
 * Tickers: Go's time.Ticker on a runtime timer.
 *
 * The ticker owns a channel of int64_t with capacity 1 and a co__timer_t.
 * Each expiry the timer callback sends co_now() with a past deadline (a
 * non-blocking send: it never parks; it may take the channel lock briefly
 * and co__unpark a waiting receiver), so a tick a slow reader has not
 * taken yet makes the next one be dropped, as in Go. Then it re-arms the
 * timer for the next multiple of the period after now, skipping periods
 * that were missed (Go's `when += period * (1 + -delta/period)`).
 *
 * Stopping: co_ticker_stop sets `stopped` and removes the timer. A callback
 * that already read stopped == 0 may still re-arm the timer while stop
 * waits for it in co__timer_del, so stop repeats the removal until the
 * timer is neither pending nor running; a callback that runs after
 * `stopped` was set returns without touching anything else.
 */
#include "runtime/runtime.h"

#include "chan/chan_impl.h"

#include <stdlib.h>

struct co_ticker {
    co__timer_t tm;
    co_chan_t *ch;
    int64_t period;
    int64_t when;     /* the expiry being served; only the callback (and new) touch it */
    uint32_t stopped; /* atomic: 0 -> 1 once, by co_ticker_stop (seq_cst); read by the callback */
    uint32_t tag;     /* CO__TAG_TICKER until the stop frees it (chan/chan.h); new and stop write it */
};
_Static_assert(offsetof(struct co_ticker, tag) >= 32, "the tag must lie past what free() writes");

#define TICKER_CHECK(t, call) CO__HANDLE_CHECK(t, CO__TAG_TICKER, call)

static void ticker_fire(void *arg) {
    co_ticker_t *t = arg;
    /* seq_cst: pairs with the store in co_ticker_stop */
    if (__atomic_load_n(&t->stopped, __ATOMIC_SEQ_CST)) return;
    int64_t now = co_now();
    (void)co_chan_send(t->ch, &now, 0); /* full: the reader is behind, drop it */
    int64_t next = co__time_add(t->when, t->period);
    if (next <= now) next = co__time_add(t->when, t->period * (1 + (now - t->when) / t->period));
    t->when = next;
    co__timer_add(&t->tm, next); /* last touch of *t in this callback */
}

int co_ticker_new(co_ticker_t **out, int64_t period_ns) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    if (period_ns <= 0) return CO_EINVAL;
    /* Its timer needs the runtime until co_ticker_stop: co_shutdown fails
     * with CO_EBUSY meanwhile. */
    int rc = co__rt_hold(CO__HOLD_TICKER);
    if (rc < 0) return rc;
    co_ticker_t *t = calloc(1, sizeof *t);
    if (!t) {
        co__rt_unhold(CO__HOLD_TICKER);
        return CO_ENOMEM;
    }
    rc = co_chan_new(&t->ch, sizeof(int64_t), 1);
    if (rc < 0) {
        free(t);
        co__rt_unhold(CO__HOLD_TICKER);
        return rc;
    }
    t->period = period_ns;
    t->tm.fn = ticker_fire;
    t->tm.arg = t;
    t->tm.period = period_ns;
    t->tm.slot = -1;
    t->when = co__time_add(co_now(), period_ns); /* a period past INT64_MAX: never */
    t->tag = CO__TAG_TICKER;
    co__timer_add(&t->tm, t->when);
    *out = t;
    return 0;
}

co_chan_t *co_ticker_chan(co_ticker_t *t) {
    if (!t) return NULL;
    TICKER_CHECK(t, "co_ticker_chan");
    return t->ch;
}

void co_ticker_stop(co_ticker_t *t) {
    if (!t) return;
    TICKER_CHECK(t, "co_ticker_stop");
    __atomic_store_n(&t->stopped, 1, __ATOMIC_SEQ_CST);
    /* co__timer_del waits for a running callback; that callback may have
     * re-armed the timer, so remove again until it is idle. Terminates: any
     * callback started after the store above returns without re-arming. */
    for (;;) {
        co__timer_del(&t->tm);
        if (__atomic_load_n(&t->tm.state, __ATOMIC_ACQUIRE) == CO__TM_IDLE) break;
    }
    co_chan_free(t->ch);
    CO__HANDLE_KILL(t, CO__TAG_TICKER);
    free(t);
    co__rt_unhold(CO__HOLD_TICKER);
}
