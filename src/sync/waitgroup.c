/*
 * Go's sync.WaitGroup.
 *
 * state (atomic u64) = counter << 32 | waiters, as Go's WaitGroup. The rule
 * that makes `co_waitgroup_done(); ...the waiter frees the wg` safe: after
 * the counter reaches zero the adder touches the waitgroup only if waiters
 * were counted, and no counted waiter returns before the adder's last touch
 * (its store of 0 into state):
 *  - a woken waiter is unparked after that store;
 *  - a waiter whose deadline fired leaves by CAS-decrementing the waiter
 *    count only while the counter is non-zero; if the counter already hit
 *    zero, an adder is releasing it, and it waits for the store of 0.
 */
#include "runtime/runtime.h"
#include "base/testhook.h"

#include <stdlib.h>

typedef struct wg_impl {
    co__lock_t lock;      /* protects q */
    uint32_t pad;
    uint64_t state;       /* atomic: counter << 32 | waiters (see above) */
    co__waitq_t q;        /* waiters, FIFO */
} wg_impl_t;
CO_STATIC_ASSERT(sizeof(wg_impl_t) <= sizeof(co_waitgroup_t), "co_waitgroup_t too small");

#define WG_COUNT(s) ((int32_t)((s) >> 32))
#define WG_WAITERS(s) ((uint32_t)(s))

/* The waiters a release claimed, to be unparked once it no longer touches
 * the waitgroup. Their coroutines are kept in an array, so that the list
 * of waiters, a chain of dependent cache misses, is walked once, and the
 * unparking can prefetch ahead (co__ready_many). A coroutine waits with
 * its own waiter (co__self_pkw), so the one walk touches records allocated
 * close together, not a stack page per waiter. Plain threads' waiters, and
 * every waiter when there is no memory for the array, are linked through
 * their `next` instead. */
typedef struct wg_release {
    struct co_g **gs;      /* [0, ng): coroutines */
    size_t ng, cap;
    co__waiter_t *list;    /* the rest, newest first */
    struct co_g *small[16];
} wg_release_t;

static void wg_release_init(wg_release_t *r, uint32_t nwaiters) {
    r->ng = 0;
    r->list = NULL;
    r->cap = sizeof r->small / sizeof r->small[0];
    r->gs = r->small;
    if (nwaiters > r->cap && !co__test_failing(CO__FAIL_WG_ARRAY)) {
        struct co_g **v = malloc(nwaiters * sizeof *v);
        if (v) {
            r->gs = v;
            r->cap = nwaiters;
        }
    }
}

/* w's parker is claimed: remember whom to unpark. */
static void wg_release_add(wg_release_t *r, co__waiter_t *w) {
    if (w->pk->g && r->ng < r->cap) {
        r->gs[r->ng++] = w->pk->g;
    } else {
        w->next = r->list;
        r->list = w;
    }
}

static void wg_release_run(wg_release_t *r) {
    if (r->ng > 8) {
        co__ready_many(r->gs, r->ng);
    } else {
        for (size_t i = 0; i < r->ng; i++) co__ready(r->gs[i]);
    }
    while (r->list) {
        co__waiter_t *n = r->list->next;
        co__unpark(r->list->pk);
        r->list = n;
    }
    if (r->gs != r->small) free(r->gs);
}

/* The counter reached zero with waiters counted (state s): release them.
 * Out of line, so that the common add and done set up no frame for it
 * (wg_release_t is 160 bytes of stack). */
static __attribute__((noinline)) void wg_release(wg_impl_t *wg, uint64_t s) {
    /* The counter is zero: no waiter joins or leaves the count any more, so
     * at most WG_WAITERS(s) are queued. */
    wg_release_t r;
    wg_release_init(&r, WG_WAITERS(s));
    co__lock(&wg->lock);
    co__waiter_t *w;
    while ((w = co__waitq_pop(&wg->q)))
        if (co__claim(w->pk, w)) wg_release_add(&r, w);
    co__unlock(&wg->lock);
    /* release: the last touch of *wg by this adder (see above). With the
     * counter at zero nothing else changes the state (a waiter that times
     * out now waits for this store; a new one returns at once), but an
     * add that races the release (a reuse before the waits returned, which
     * Go reports as misuse) would be wiped out by a plain store: the next
     * done would then find a negative counter, or a wait return early. */
    uint64_t exp = s;
    if (CO_UNLIKELY(!__atomic_compare_exchange_n(&wg->state, &exp, 0, false, __ATOMIC_RELEASE,
                                                 __ATOMIC_RELAXED)))
        co__fatal("co_waitgroup %p: co_waitgroup_add while its waiters were being released "
                  "(reused before co_waitgroup_wait returned)",
                  (void *)wg);
    wg_release_run(&r);
}

/* The fatal lines of add and done, out of line and reached by a jump: a
 * call from the fast path would give it a stack frame to set up. GCC
 * would see that they never return and call them: noipa hides that. */
#if defined(__clang__)
#define WG_FATAL __attribute__((noinline, cold))
#else
#define WG_FATAL __attribute__((noinline, noipa, cold))
#endif
static WG_FATAL void wg_fatal_null(const char *call) {
    co__fatal("%s(NULL): NULL waitgroup", call);
}
static WG_FATAL void wg_fatal_negative(co_waitgroup_t *wg, int32_t v) {
    co__fatal("co_waitgroup %p: negative counter (%d)", (void *)wg, v);
}

static inline __attribute__((always_inline)) void wg_add(co_waitgroup_t *wg_, int delta) {
    wg_impl_t *wg = (wg_impl_t *)wg_;
    /* acq_rel: Done's writes happen before a waiter's return */
    uint64_t s = __atomic_add_fetch(&wg->state, (uint64_t)(int64_t)delta << 32, __ATOMIC_ACQ_REL);
    int32_t v = WG_COUNT(s);
    if (CO_UNLIKELY(v < 0)) {
        wg_fatal_negative(wg_, v);
        return;
    }
    if (v != 0 || WG_WAITERS(s) == 0 || delta == 0) return;
    wg_release(wg, s);
}

/* A NULL waitgroup: the void calls abort naming themselves (they cannot
 * answer), wait_until answers CO_EINVAL (colony.h's rule). */
void co_waitgroup_add(co_waitgroup_t *wg, int delta) {
    if (CO_UNLIKELY(wg == NULL)) {
        wg_fatal_null("co_waitgroup_add");
        return;
    }
    wg_add(wg, delta);
}

void co_waitgroup_done(co_waitgroup_t *wg) {
    if (CO_UNLIKELY(wg == NULL)) {
        wg_fatal_null("co_waitgroup_done");
        return;
    }
    wg_add(wg, -1);
}

static inline __attribute__((always_inline)) int wg_wait(co_waitgroup_t *wg_, int64_t deadline) {
    wg_impl_t *wg = (wg_impl_t *)wg_;
    uint64_t s = __atomic_load_n(&wg->state, __ATOMIC_ACQUIRE);
    if (WG_COUNT(s) == 0) return 0;
    if (deadline != CO_FOREVER && deadline <= co_now()) return CO_ETIMEDOUT;
    /* A coroutine waits with its own waiter (co__self_pkw), a plain thread
     * with one on its stack, in one line. */
    co__pkw_t stackw __attribute__((aligned(64)));
    co__pkw_t *pw = co__self_pkw(CO__WR_WAITGROUP);
    if (!pw) {
        pw = &stackw;
        co__wait_prepare(pw, CO__WR_WAITGROUP);
    }
    co__waiter_t *const wp = &pw->w;
    co__lock(&wg->lock);
    do {
        s = __atomic_load_n(&wg->state, __ATOMIC_ACQUIRE);
        if (WG_COUNT(s) == 0) {
            co__unlock(&wg->lock);
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&wg->state, &s, s + 1, false, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    co__waitq_push(&wg->q, wp);
    if (co__wait(wp, &wg->lock, deadline, CO__WAIT_KEEP_LOCK) == 0) return 0;
    s = __atomic_load_n(&wg->state, __ATOMIC_ACQUIRE);
    while (WG_COUNT(s) != 0) {
        if (__atomic_compare_exchange_n(&wg->state, &s, s - 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            co__waitq_remove(wp);
            co__unlock(&wg->lock);
            return CO_ETIMEDOUT;
        }
    }
    co__unlock(&wg->lock);
    /* The counter reached zero and an adder is releasing the waiters: wait
     * for its last touch, then report success. */
    while (WG_WAITERS(__atomic_load_n(&wg->state, __ATOMIC_ACQUIRE)) != 0)
        co_yield(); /* sched_yield() on a plain thread */
    return 0;
}

int co_waitgroup_wait_until(co_waitgroup_t *wg, int64_t deadline) {
    if (wg == NULL) return CO_EINVAL;
    return wg_wait(wg, deadline);
}

/* Through co_waitgroup_wait_until, which holds the waiting body inline: a
 * parked waiter's stack then names a public call (gdb, co_dump). */
void co_waitgroup_wait(co_waitgroup_t *wg) {
    if (wg == NULL) co__fatal("co_waitgroup_wait(NULL): NULL waitgroup");
    (void)co_waitgroup_wait_until(wg, CO_FOREVER);
}
