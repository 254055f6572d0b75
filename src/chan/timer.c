/*
 * One-shot timers: Go's time.NewTimer, time.After and time.AfterFunc on a
 * runtime timer (no thread per timer: a pending timer is one entry on a
 * P's timer heap, runtime/timer.c).
 *
 * A channel timer owns a channel of int64_t with capacity 1; its firing
 * sends co_now() without blocking. A function timer spawns fn(arg) as a
 * coroutine when it fires.
 *
 * Stop and Reset follow Go 1.23: once they return, no value from an
 * earlier arming can be received. Both take `lock` and clear `armed`, so a
 * callback that has not delivered yet never will, then drain the channel's
 * buffered value under the same lock; the callback sends only under
 * `lock` with `armed` set, so no value can slip in after the drain. "The
 * call stopped the timer" (their result) means: its value or function had
 * not been delivered, and now never will be (a pending timer, or a fired
 * one whose value still sat unreceived in the channel), as in Go 1.23.
 *
 * Only after `lock` is released do they remove the runtime timer:
 * co__timer_del waits for a running callback, which may be waiting for
 * `lock`. A function timer's callback that finds no memory for the
 * coroutine re-adds its timer (1 ms later, `armed` kept), so the removal
 * repeats until the timer is idle, as co_ticker_stop does.
 */
#include "runtime/runtime.h"

#include "chan/chan_impl.h"

#include <stdlib.h>

#define SPAWN_RETRY_NS (1000 * 1000)

struct co_timer {
    co__timer_t tm;
    co__lock_t lock;   /* protects armed, and the send into ch against a drain */
    co__lock_t oplock; /* serializes stop, reset and free: each removes and re-adds tm */
    uint32_t armed;    /* under lock: 1 from an arming until its delivery, a stop or a reset */
    co_chan_t *ch;     /* a channel timer's; NULL for a function timer (fixed) */
    void (*fn)(void *arg); /* a function timer's (fixed) */
    void *arg;
    uint32_t tag;      /* CO__TAG_TIMER until co_timer_free (chan/chan.h); make and free write it */
};
_Static_assert(offsetof(struct co_timer, tag) >= 32, "the tag must lie past what free() writes");

#define TIMER_CHECK(t, call) CO__HANDLE_CHECK(t, CO__TAG_TIMER, call)

static void timer_fire(void *arg) {
    co_timer_t *t = arg;
    co__lock(&t->lock);
    if (!t->armed) { /* stopped or reset since it was added */
        co__unlock(&t->lock);
        return;
    }
    if (t->ch) {
        int64_t now = co_now();
        /* never blocks: the channel was drained when it was armed, and only
         * this arming's one delivery sends */
        (void)co_chan_send(t->ch, &now, 0);
        t->armed = 0;
    } else if (co__spawn(t->fn, t->arg, 0, "co_after_func") == 0) {
        t->armed = 0;
    } else {
        /* no memory for the coroutine: try again soon; still armed, so a
         * stop meanwhile still stops it */
        co__timer_add(&t->tm, co__time_add(co_now(), SPAWN_RETRY_NS));
    }
    co__unlock(&t->lock);
}

/* Under oplock: disarm, drain, then remove the runtime timer (waiting for
 * a callback in flight). True if a delivery was prevented. */
static bool timer_stop_locked(co_timer_t *t) {
    co__lock(&t->lock);
    bool stopped = t->armed != 0;
    t->armed = 0;
    /* Go 1.23: a value that fired but was not received is taken back */
    if (t->ch && co_chan_recv(t->ch, NULL, 0) == 0) stopped = true;
    co__unlock(&t->lock);
    /* A callback that read armed == 1 before we cleared it delivered (or
     * re-added the timer) under lock, before we took it; any later one
     * returns at once. So this ends. */
    for (;;) {
        co__timer_del(&t->tm);
        if (__atomic_load_n(&t->tm.state, __ATOMIC_ACQUIRE) == CO__TM_IDLE) break;
    }
    return stopped;
}

/* Arm the idle timer t to fire ns from now (at once if ns <= 0). */
static void timer_arm(co_timer_t *t, int64_t ns) {
    int64_t now = co_now();
    int64_t when = ns <= 0 ? now : co__time_add(now, ns);
    co__lock(&t->lock);
    t->armed = 1;
    co__unlock(&t->lock);
    co__timer_add(&t->tm, when);
}

static int timer_make(co_timer_t **out, int64_t ns, void (*fn)(void *), void *arg, bool chan) {
    /* Its timer needs the runtime until co_timer_free: co_shutdown fails
     * with CO_EBUSY meanwhile. */
    int rc = co__rt_hold(CO__HOLD_TIMER);
    if (rc < 0) return rc;
    co_timer_t *t = calloc(1, sizeof *t);
    if (!t) {
        co__rt_unhold(CO__HOLD_TIMER);
        return CO_ENOMEM;
    }
    if (chan) {
        rc = co_chan_new(&t->ch, sizeof(int64_t), 1);
        if (rc < 0) {
            free(t);
            co__rt_unhold(CO__HOLD_TIMER);
            return rc;
        }
    }
    t->fn = fn;
    t->arg = arg;
    t->tm.fn = timer_fire;
    t->tm.arg = t;
    t->tm.slot = -1;
    t->tag = CO__TAG_TIMER;
    /* before the arming: a function that fires at once may read *out */
    *out = t;
    timer_arm(t, ns);
    return 0;
}

int co_timer_new(co_timer_t **out, int64_t ns) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    return timer_make(out, ns, NULL, NULL, true);
}

int co_after(co_timer_t **out, int64_t ns) { return co_timer_new(out, ns); }

int co_after_func(co_timer_t **out, int64_t ns, void (*fn)(void *arg), void *arg) {
    if (!out) return CO_EINVAL;
    *out = NULL;
    if (!fn) return CO_EINVAL;
    return timer_make(out, ns, fn, arg, false);
}

co_chan_t *co_timer_chan(co_timer_t *t) {
    if (!t) return NULL;
    TIMER_CHECK(t, "co_timer_chan");
    return t->ch;
}

bool co_timer_stop(co_timer_t *t) {
    if (!t) co__fatal("co_timer_stop(NULL): nil timer");
    TIMER_CHECK(t, "co_timer_stop");
    co__lock(&t->oplock);
    bool stopped = timer_stop_locked(t);
    co__unlock(&t->oplock);
    return stopped;
}

int co_timer_reset(co_timer_t *t, int64_t ns) {
    if (!t) return CO_EINVAL;
    TIMER_CHECK(t, "co_timer_reset");
    co__lock(&t->oplock);
    bool stopped = timer_stop_locked(t);
    timer_arm(t, ns);
    co__unlock(&t->oplock);
    return stopped ? 1 : 0;
}

void co_timer_free(co_timer_t *t) {
    if (!t) return;
    TIMER_CHECK(t, "co_timer_free");
    co__lock(&t->oplock);
    (void)timer_stop_locked(t);
    co__unlock(&t->oplock);
    co_chan_free(t->ch);
    CO__HANDLE_KILL(t, CO__TAG_TIMER);
    free(t);
    co__rt_unhold(CO__HOLD_TIMER);
}
