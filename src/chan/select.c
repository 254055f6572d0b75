/*
 * co_select: Go's selectgo for C (runtime/select.go), over the channel
 * object of chan_impl.h.
 *
 *  0. Non-blocking select (deadline <= 0, Go's `default:`) first takes a
 *     lock-free snapshot: for each channel read ver (must be even), then
 *     its readiness; an acquire fence; then every ver again. If nothing was
 *     ready and no ver moved, there was one instant at which no case was
 *     ready (each channel was unchanged over an interval, and all these
 *     intervals contain the moment between the two rounds of reads), so
 *     the select returns CO_ETIMEDOUT without taking a lock. Anything else
 *     falls through to the locked algorithm.
 *  1. pollorder: a random permutation of the cases with a channel (Go's
 *     inside-out Fisher-Yates with a cheap per-thread generator), so every
 *     ready case is chosen with equal probability. lockorder: the same cases
 *     sorted by channel address; all channel locks are taken in that order
 *     (a channel that appears in several cases is locked once). Every
 *     multi-channel locker in colony uses this order, so no deadlock.
 *  2. pass 0: while validating the cases, one of those that look ready
 *     without a lock is picked uniformly at random (reservoir sampling)
 *     and tried under its own channel's lock alone (the common ready
 *     select then costs one lock, not all of them, and no permutation); if
 *     it lost a race, pass 1:
 *     under all locks, the first case in pollorder that can proceed
 *     fires (the same per-channel code as send/recv). A receive on a closed
 *     channel fires with result CO_ECLOSED; so does a send on a closed
 *     channel (Go would panic), and a send on a receive-only one (a
 *     context's done channel) fires with CO_EPERM.
 *  3. pass 2: one waiter per case, in lockorder, all sharing one parker;
 *     park, releasing every lock once we can no longer run. lockorder is
 *     sorted from pollorder, so several cases on one channel are queued in
 *     random order and the peer that arrives later picks one of them at
 *     random, as in Go.
 *  4. the waker of any case claims the shared parker with co__claim(pk, w),
 *     which records the winning waiter; wakers of other cases fail the claim
 *     and drop our waiters. A deadline claims it with no winner.
 *  5. pass 3: re-lock all, unlink every waiter except the winner (a no-op
 *     for those a waker already dropped), unlock. No waiter is left behind.
 *
 * Hot-path memory: with at most SEL_STACK cases everything is on the stack;
 * more cases use one malloc (CO_ENOMEM if it fails).
 */
#include "runtime/runtime.h"

#include "chan/chan_impl.h"
#include "base/testhook.h"

#include <stdlib.h>
#include <string.h>

#define SEL_STACK 16

/* ---- randomness: wyrand, per thread -------------------------------------
 * The state is thread-local; it is read and advanced in one non-inlined
 * call (never cached across a switch: a coroutine may resume on another
 * thread). The rest of a permutation comes from a local generator seeded by
 * it. */
static __thread uint64_t sel_rng __attribute__((tls_model("initial-exec"))); /* see tls_m */

static inline uint64_t wy_mix(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)(r >> 64) ^ (uint64_t)r;
}

/* The thread's counter steps once per select; the select's own generator
 * starts from a mix of it, never from the counter itself: rng_below steps
 * by the same constant, so a select's later draws would be the next
 * select's first ones, and the choices of consecutive selects correlated. */
static __attribute__((noinline)) CO_THREAD_STATE uint64_t sel_seed(void) {
    uint64_t s = sel_rng;
    if (CO_UNLIKELY(s == 0)) s = (uint64_t)(uintptr_t)&sel_rng ^ ((uint64_t)co_now() << 1) ^ 1;
    s += 0xa0761d6478bd642fULL;
    sel_rng = s;
    return wy_mix(s, s ^ 0x8ebc6af09c88c6e3ULL);
}

/* Uniform in [0, n) (Lemire's multiply-shift; bias < n / 2^32). */
static inline uint32_t rng_below(uint64_t *s, uint32_t n) {
    *s += 0xa0761d6478bd642fULL;
    uint32_t r = (uint32_t)wy_mix(*s, *s ^ 0xe7037ed1a0b428dbULL);
    return (uint32_t)(((uint64_t)r * n) >> 32);
}

/* ---- lock order ---------------------------------------------------------- */

typedef struct sel {
    co_case_t *cases;
    int *lockorder; /* indices of the cases with a channel, by channel address */
    int nn;         /* how many */
    int unlocked;   /* atomic: set (release) by the park's unlock callback once
                     * it let go of every lock and of *s; pass 3 waits for it
                     * (acquire) before the select may return */
} sel_t;

static inline co_chan_t *lo_ch(const sel_t *s, int k) { return s->cases[s->lockorder[k]].ch; }

static void sort_lockorder(sel_t *s) {
    int n = s->nn, *a = s->lockorder;
    if (n <= SEL_STACK) { /* insertion sort */
        for (int i = 1; i < n; i++) {
            int x = a[i];
            uintptr_t kx = (uintptr_t)s->cases[x].ch;
            int j = i;
            for (; j > 0 && (uintptr_t)s->cases[a[j - 1]].ch > kx; j--) a[j] = a[j - 1];
            a[j] = x;
        }
        return;
    }
    /* heapsort, as Go does, so a large select stays O(n log n) */
#define KEY(k) ((uintptr_t)s->cases[a[k]].ch)
    for (int start = n / 2 - 1; start >= 0; start--) {
        int r = start;
        for (;;) {
            int c = 2 * r + 1;
            if (c >= n) break;
            if (c + 1 < n && KEY(c + 1) > KEY(c)) c++;
            if (KEY(r) >= KEY(c)) break;
            int t = a[r]; a[r] = a[c]; a[c] = t;
            r = c;
        }
    }
    for (int end = n - 1; end > 0; end--) {
        int t = a[0]; a[0] = a[end]; a[end] = t;
        int r = 0;
        for (;;) {
            int c = 2 * r + 1;
            if (c >= end) break;
            if (c + 1 < end && KEY(c + 1) > KEY(c)) c++;
            if (KEY(r) >= KEY(c)) break;
            t = a[r]; a[r] = a[c]; a[c] = t;
            r = c;
        }
    }
#undef KEY
}

static void sel_lock(const sel_t *s) {
    co_chan_t *prev = NULL;
    for (int k = 0; k < s->nn; k++) {
        co_chan_t *c = lo_ch(s, k);
        if (c != prev) chan_lock(c);
        prev = c;
    }
}

/* Unlock in reverse order. */
static void sel_unlock(const sel_t *s) {
    for (int k = s->nn - 1; k >= 0; k--) {
        co_chan_t *c = lo_ch(s, k);
        if (k > 0 && lo_ch(s, k - 1) == c) continue;
        chan_unlock(c);
    }
}

/* co__park's unlock callback, on the parking M after the select stopped
 * running. A waker may take a channel's lock as soon as it is released
 * and wake the select, which may then run on another M while this still
 * unlocks the rest: pass 3 waits for `unlocked` before it touches a
 * channel or returns (Go's select relies on re-locking every channel for
 * this; here pass 3 skips the channel a close woke it on, which may be
 * freed by then). The store is this callback's last touch of *s. */
static void sel_unlock_cb(void *arg) {
    sel_t *s = arg;
    sel_unlock(s);
    __atomic_store_n(&s->unlocked, 1, __ATOMIC_RELEASE);
}

/* Pass 3's locks: only the channels where a waiter of ours other than the
 * winner may still sit (or was popped stale and counted: chq_leave). The
 * winner's channel is left alone unless another case of ours is on it: its
 * waker claimed us there and is done with us, and the channel may already
 * be gone (co_ctx_free closes a context's done channel, then frees it). */
static bool sel_needs(const sel_t *s, const co__waiter_t *ws, const co__waiter_t *win, int k0,
                      int *k1) {
    co_chan_t *c = lo_ch(s, k0);
    bool need = false;
    int k = k0;
    for (; k < s->nn && lo_ch(s, k) == c; k++)
        if (&ws[k] != win) need = true;
    *k1 = k;
    return need;
}

/* ---- step 0: the lock-free snapshot ------------------------------------- */

static inline bool case_ready_nolock(const co_case_t *k) {
    const co_chan_t *c = k->ch;
    if (k->op == CO_RECV) return !chan_empty(c) || chan_closed_acq(c);
    return !chan_full(c) || chan_nosend_acq(c);
}

/* True if no case was ready at one instant during the call. n <= SEL_STACK. */
static bool sel_nothing_ready(const co_case_t *cases, int n) {
    uint32_t ver[SEL_STACK];
    for (int i = 0; i < n; i++) {
        const co_chan_t *c = cases[i].ch;
        if (!c) continue;
        CO__HANDLE_CHECK(c, CO__TAG_CHAN, "co_select");
        /* a malformed case: let co_select's checks report it */
        if (cases[i].op != CO_SEND && cases[i].op != CO_RECV) return false;
        /* load-acquire: the state reads below are not hoisted above it;
         * pairs with the store-release in chan_unlock */
        ver[i] = __atomic_load_n(&c->ver, __ATOMIC_ACQUIRE);
        if ((ver[i] & 1) || case_ready_nolock(&cases[i])) return false;
    }
    /* acquire fence: if a state read above saw a store of a locked section,
     * the ver loads below see that section's odd (or a later) value; pairs
     * with the release fence in chan_lock */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        const co_chan_t *c = cases[i].ch;
        if (c && __atomic_load_n(&c->ver, __ATOMIC_RELAXED) != ver[i]) return false;
    }
    return true;
}

/* A receive case that fired on a closed, drained channel gets the zero
 * value, as in Go (co_chan_close does the same for a parked one). */
static void sel_zero_recv(co_case_t *cs) {
    if (cs->op == CO_RECV && cs->elem && cs->ch->elem_size) memset(cs->elem, 0, cs->ch->elem_size);
}

/* ---- the locked algorithm ----------------------------------------------- */

static int sel_run(co_case_t *cases, int n, int nn, int64_t deadline, int *pollorder,
                   int *lockorder, co__waiter_t *ws) {
    /* pollorder: inside-out Fisher-Yates over the cases with a channel */
    uint64_t rs = nn > 1 ? sel_seed() : 0;
    int np = 0;
    for (int i = 0; i < n; i++) {
        if (!cases[i].ch) continue;
        uint32_t j = np > 0 ? rng_below(&rs, (uint32_t)np + 1) : 0;
        if ((int)j != np) pollorder[np] = pollorder[j];
        pollorder[j] = i;
        np++;
    }
    /* lockorder starts as pollorder, so cases on one channel keep their
     * random relative order through the (stable, for small selects) sort:
     * pass 2 enqueues in lockorder, and the first of them in the channel's
     * queue is the one a later peer wakes. Go derives lockorder from
     * pollorder for the same reason (TestPseudoRandomSend). */
    for (int k = 0; k < nn; k++) lockorder[k] = pollorder[k];
    sel_t s = {.cases = cases, .lockorder = lockorder, .nn = nn, .unlocked = 0};
    if (nn > 1) sort_lockorder(&s);

    sel_lock(&s);

    /* pass 1: the first ready case in pollorder fires */
    for (int k = 0; k < nn; k++) {
        int i = pollorder[k];
        co_case_t *cs = &cases[i];
        co__waiter_t *wake;
        int r = cs->op == CO_SEND ? chan_send_locked(cs->ch, cs->elem, &wake)
                                  : chan_recv_locked(cs->ch, cs->elem, &wake);
        if (r != 0) {
            if (r == CO_ECLOSED) sel_zero_recv(cs);
            sel_unlock(&s);
            if (wake) {
                chq_unoffer(wake);
                co__unpark(wake->pk);
            }
            cs->result = r == 1 ? 0 : r;
            return i;
        }
    }
    if (chan_dl_past(deadline)) {
        sel_unlock(&s);
        return CO_ETIMEDOUT;
    }

    /* pass 2: a waiter per case, sharing one parker, enqueued in lockorder
     * (cases on the same channel in random order: see above) */
    co__parker_t pk;
    co__parker_init(&pk, CO__WR_SELECT);
    for (int k = 0; k < nn; k++) {
        int i = lockorder[k];
        co__waiter_t *w = &ws[k];
        w->pk = &pk;
        w->data = cases[i].elem;
        w->n = 0;
        w->result = 0;
        w->idx = i;
        co__waitq_push(cases[i].op == CO_SEND ? &cases[i].ch->sendq : &cases[i].ch->recvq, w);
    }
    int prc = co__park(&pk, deadline, sel_unlock_cb, &s);

    /* pass 3: whoever claimed pk recorded its waiter (none for a deadline).
     * Wait for the unlock callback to be done with s (see sel_unlock_cb);
     * then take each other waiter off its channel, one channel at a time
     * (no deadlock: we hold one lock at most, and the winner's claim is
     * already made, so nobody waits on us). */
    for (unsigned spin = 0; !__atomic_load_n(&s.unlocked, __ATOMIC_ACQUIRE); spin++) {
        co__cpu_relax();
        if (spin % 64 == 63) co_yield(); /* its M was preempted: let it run */
    }
    co__waiter_t *win = prc == 0 ? (co__waiter_t *)pk.winner : NULL;
    for (int k = 0, k1; k < nn; k = k1) {
        if (!sel_needs(&s, ws, win, k, &k1)) continue;
        co_chan_t *c = lo_ch(&s, k);
        chan_lock(c);
        for (int j = k; j < k1; j++)
            if (&ws[j] != win) chq_leave(c, &ws[j]);
        chan_unlock(c); /* our last touch of c: co_chan_free may free it now */
    }
    if (!win) return CO_ETIMEDOUT;
    cases[win->idx].result = win->result; /* 0 or CO_ECLOSED, set before co__unpark */
    return win->idx;
}

/* Pass 0: fire case i under its own channel's lock alone, if it can
 * proceed. Returns i, or -1 if it lost a race. */
static int sel_try_one(co_case_t *cs, int i) {
    co__waiter_t *wake;
    chan_lock(cs->ch);
    int r = cs->op == CO_SEND ? chan_send_locked(cs->ch, cs->elem, &wake)
                              : chan_recv_locked(cs->ch, cs->elem, &wake);
    chan_unlock(cs->ch);
    if (r == 0) return -1;
    if (r == CO_ECLOSED) sel_zero_recv(cs);
    if (wake) {
        chq_unoffer(wake);
        co__unpark(wake->pk);
    }
    cs->result = r == 1 ? 0 : r;
    return i;
}

/* CO_EINVAL if a case is malformed, else 0. */
static int sel_check(const co_case_t *cases, int n) {
    for (int i = 0; i < n; i++) {
        int op = cases[i].op;
        if (op != CO_SEND && op != CO_RECV) return CO_EINVAL;
        if (op == CO_SEND && cases[i].ch && !cases[i].elem && cases[i].ch->elem_size)
            return CO_EINVAL;
    }
    return 0;
}

int co_select(co_case_t *cases, int n, int64_t deadline) {
    if (!cases || n <= 0) return CO_EINVAL;
    /* step 0: a non-blocking select over channels none of which is ready
     * returns without a lock (the cases are still checked) */
    if (chan_dl_cheap_past(deadline) && n <= SEL_STACK && sel_nothing_ready(cases, n)) {
        int rc = sel_check(cases, n);
        return rc < 0 ? rc : CO_ETIMEDOUT;
    }
    int nn = 0, pick = -1;
    uint32_t nready = 0;
    uint64_t rs = 0;
    for (int i = 0; i < n; i++) {
        int op = cases[i].op;
        if (op != CO_SEND && op != CO_RECV) return CO_EINVAL;
        co_chan_t *c = cases[i].ch;
        if (!c) continue;
        CO__HANDLE_CHECK(c, CO__TAG_CHAN, "co_select");
        if (op == CO_SEND && !cases[i].elem && c->elem_size) return CO_EINVAL;
        nn++;
        if (!case_ready_nolock(&cases[i])) continue;
        /* Reservoir sampling: the k-th case seen ready replaces the pick
         * with probability 1/k, so each looks-ready case ends up picked
         * with probability 1/nready (Go's random pollorder, then its first
         * ready case, gives the same distribution). */
        if (++nready == 1) {
            pick = i;
        } else {
            if (nready == 2) rs = sel_seed();
            if (rng_below(&rs, nready) == 0) pick = i;
        }
    }
    /* pass 0: the case picked above is tried under its own lock only.
     * Firing it is right at that instant: it could proceed, and it was
     * chosen uniformly among the cases seen ready just before (a case seen
     * not ready may have become ready a moment after; Go's select has the
     * same window). If it lost a race, the locked passes decide. */
    if (pick >= 0 && sel_try_one(&cases[pick], pick) >= 0) return pick;

    if (nn == 0) {
        /* Every channel is NULL: nothing can ever be ready, so this waits
         * for the deadline (forever with CO_FOREVER, like Go's select with
         * only nil channels). Nobody but the deadline can claim pk. */
        if (chan_dl_past(deadline)) return CO_ETIMEDOUT;
        co__parker_t pk;
        co__parker_init(&pk, CO__WR_SELECT);
        co__park(&pk, deadline, NULL, NULL);
        return CO_ETIMEDOUT;
    }

    if (nn <= SEL_STACK) {
        int pollorder[SEL_STACK], lockorder[SEL_STACK];
        co__waiter_t ws[SEL_STACK];
        return sel_run(cases, n, nn, deadline, pollorder, lockorder, ws);
    }
    size_t sz = (size_t)nn * (2 * sizeof(int) + sizeof(co__waiter_t));
    char *mem = co__test_failing(CO__FAIL_SELECT_MEM)
                    ? NULL
                    : malloc(sz);
    if (!mem) {
        /* No memory to lock them all or wait on them: a case that can go
         * at once still goes (each tried under its own lock, from a random
         * start, as pass 0 tried one). Only a select that would have to
         * wait fails, or times out if it was a try. */
        uint64_t r2 = sel_seed();
        int start = (int)rng_below(&r2, (uint32_t)n);
        for (int k = 0; k < n; k++) {
            int i = (start + k) % n;
            if (cases[i].ch && sel_try_one(&cases[i], i) >= 0) return i;
        }
        return chan_dl_past(deadline) ? CO_ETIMEDOUT : CO_ENOMEM;
    }
    co__waiter_t *ws = (co__waiter_t *)mem;
    int *pollorder = (int *)(mem + (size_t)nn * sizeof(co__waiter_t));
    int rc = sel_run(cases, n, nn, deadline, pollorder, pollorder + nn, ws);
    free(mem);
    return rc;
}
