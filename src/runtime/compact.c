/*
 * Compaction of long-parked coroutines' stacks (docs/stacks.md).
 *
 * A parked coroutine holds its stack's pages, of which it uses a few
 * hundred bytes (saved stack pointer to top). A coroutine that promised
 * that nothing outside it touches its stack while it is parked
 * (co_stack_compactable) and that parks in a compactable wait can have that
 * live part copied to the heap and its pages released (MADV_DONTNEED: the
 * address range stays reserved); the M that next runs it copies the part
 * back to the same address first. A C stack cannot move, but it can be
 * emptied and refilled in place.
 *
 * What still reaches into a parked stack, and how each is kept out of it:
 *  - the wait's records (a waiter linked into an object's queue, its
 *    parker): the compactor takes the queue's lock (a trylock: it skips the
 *    coroutine on contention), checks that the waiter is still linked (so
 *    no waker claimed it: a compactable wait is claimed only by a waker
 *    that pops the waiter under that lock), and relinks the waiter's heap
 *    copy in its place, its parker pointer on the parker's copy. Wakers
 *    then write the heap copy;
 *  - the waiter's data pointer (a receive's destination, a send's source),
 *    when it points into the live part: redirected to the same bytes of
 *    the copy, so the sender writes the copy and the copy-back delivers;
 *  - deadlines (a timer record on the stack), selects (several waiters,
 *    claimed by a CAS from any of their channels): those waits are not
 *    offered, so never compacted;
 *  - the program's own pointers (a local handed to another coroutine): the
 *    reason it is opt-in.
 * On resume the records' pointers that lead into the copy are turned back
 * into stack addresses: the wait code returns as if nothing happened.
 *
 * Ordering: the coroutine publishes its offer (release) after its records;
 * the compactor's CAS to BUSY (acquire) reads them. It copies and relinks
 * under the queue's lock, releases the pages of a batch of stacks after
 * (one call), and only then stores COMPACTED (release). A waker may pop the
 * waiter's copy as soon as the lock is free and ready the coroutine; the M
 * that takes it waits while it is BUSY (a batch: ~100 us; the compactor
 * never blocks meanwhile), and on COMPACTED (acquire) copies back and frees
 * the copy.
 *
 * Under TSan the copies, the copy's allocation and its free are not
 * recorded: the stack's contents are the same before and after, and the
 * compactor must add no happens-before edge between coroutines. Under
 * ASan the copies skip the stack's redzone checks (they copy whole frames).
 */
#include "runtime/proc.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef PIDFD_SELF
#define PIDFD_SELF (-10000) /* Linux 6.14 uapi: the calling thread (so our own mm) */
#endif

/* The live part of a compacted stack: its copy and where it goes back. */
typedef struct co__cbuf {
    char *sp;   /* the saved stack pointer: the copy is [sp, sp + len) */
    size_t len;
    _Alignas(16) char bytes[];
} cbuf_t;

#define COMPACT_DEFAULT_MS 1000
/* A live part larger than this is left alone: it saves little. */
#define COMPACT_MAX_LIVE (64 * 1024)
/* Per sysmon round: at most this many Gs looked at (under allg_lock, which
 * a spawn needing a new record takes) and claimed (a claimed G woken
 * meanwhile waits for the batch to be done: ~100 us). */
#define SCAN_VISIT_MAX 16384
#define SCAN_COMPACT_MAX 64

/* The threshold, in ms: relaxed atomic, set from COLONY_COMPACT_MS once
 * (env_once), or by a test. */
static uint32_t compact_ms = COMPACT_DEFAULT_MS;
static uint32_t env_done; /* atomic: COLONY_COMPACT_MS was read */
/* Gs in OFFERED (a relaxed counter): sysmon scans only while there are. */
static int64_t n_offered;
/* Counts for co_stack_compact_stats and the tests: relaxed atomics. */
static int64_t n_compacted_now;
static uint64_t n_compactions, n_restores;
/* sysmon only, under allg_lock: where the next scan goes on (NULL: allg's
 * head); co__compact_g_released moves it off a G that leaves allg. */
static co_g_t *cursor;
static int64_t next_scan; /* sysmon only */
/* The scan's own cost, for co__test_compact_scan_stats: written by sysmon
 * alone, relaxed atomics (read from any thread). A pass: every offered G
 * looked at once; its time is the sum of its rounds'. */
static uint64_t st_passes, st_pass_ns, st_round_max_ns;
static uint64_t cur_pass_ns; /* sysmon only: the pass under way so far */

static void env_once(void) {
    if (__atomic_load_n(&env_done, __ATOMIC_ACQUIRE)) return;
    const char *e = getenv("COLONY_COMPACT_MS");
    if (e && *e) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(e, &end, 10);
        if (*end || errno || v > 86400000UL || *e == '-')
            fprintf(stderr, "colony: COLONY_COMPACT_MS=%s is not a count of ms (0-86400000): "
                            "compaction keeps its threshold of %u ms\n",
                    e, (unsigned)__atomic_load_n(&compact_ms, __ATOMIC_RELAXED));
        else
            __atomic_store_n(&compact_ms, (uint32_t)v, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&env_done, 1, __ATOMIC_RELEASE);
}

/* co__compact_refuse_entry's entries: atomic, each set once (by CAS). */
#define REFUSED_MAX 8
static void (*refused[REFUSED_MAX])(void *);

void co__compact_refuse_entry(void (*fn)(void *)) {
    for (int i = 0; i < REFUSED_MAX; i++) {
        void (*cur)(void *) = __atomic_load_n(&refused[i], __ATOMIC_ACQUIRE);
        if (cur == fn) return;
        if (!cur) {
            if (__atomic_compare_exchange_n(&refused[i], &cur, fn, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE) ||
                cur == fn)
                return;
        }
    }
    co__fatal("co__compact_refuse_entry: more than %d entries", REFUSED_MAX);
}

static bool entry_refused(void (*fn)(void *)) {
    for (int i = 0; i < REFUSED_MAX; i++) {
        void (*cur)(void *) = __atomic_load_n(&refused[i], __ATOMIC_ACQUIRE);
        if (!cur) return false;
        if (cur == fn) return true;
    }
    return false;
}

int co_stack_compactable(int on) {
    if (on != 0 && on != 1) return CO_EINVAL;
    co_g_t *g = co__running_g();
    if (!g || (on && entry_refused(g->fn))) return CO_EPERM;
    env_once();
    __atomic_store_n(&g->compact_on, (uint8_t)on, __ATOMIC_RELAXED);
    return 0;
}

int64_t co_stack_compacted(void) { return __atomic_load_n(&n_compacted_now, __ATOMIC_RELAXED); }

/* Tests: compactions and restores since the process started. */
CO_HIDDEN void co__test_compact_counts(uint64_t *compactions, uint64_t *restores);
void co__test_compact_counts(uint64_t *compactions, uint64_t *restores) {
    *compactions = __atomic_load_n(&n_compactions, __ATOMIC_RELAXED);
    *restores = __atomic_load_n(&n_restores, __ATOMIC_RELAXED);
}

/* Benchmarks: completed scan passes, their total time, and the longest
 * single round (a lock hold) since the process started. */
CO_HIDDEN void co__test_compact_scan_stats(uint64_t *passes, uint64_t *pass_ns,
                                           uint64_t *round_max_ns);
void co__test_compact_scan_stats(uint64_t *passes, uint64_t *pass_ns, uint64_t *round_max_ns) {
    *passes = __atomic_load_n(&st_passes, __ATOMIC_RELAXED);
    *pass_ns = __atomic_load_n(&st_pass_ns, __ATOMIC_RELAXED);
    *round_max_ns = __atomic_load_n(&st_round_max_ns, __ATOMIC_RELAXED);
}

/* Tests: the threshold in ms (0: the next sysmon round). */
CO_HIDDEN void co__test_compact_set_ms(uint32_t ms);
void co__test_compact_set_ms(uint32_t ms) {
    env_once();
    __atomic_store_n(&compact_ms, ms, __ATOMIC_RELAXED);
}

void co__compact_offer(co_g_t *g, co__lock_t *l, co__waiter_t *w) {
    g->cw_lock = l;
    g->cw_w = w;
    __atomic_add_fetch(&n_offered, 1, __ATOMIC_RELAXED);
    /* release: the records above, for the compactor's CAS (acquire) */
    __atomic_store_n(&g->cstate, CO__CS_OFFERED, __ATOMIC_RELEASE);
}

/* ---- copies that neither sanitizer may see -------------------------------- */

#if defined(CO_ASAN)
#define NO_ASAN __attribute__((no_sanitize("address")))
#else
#define NO_ASAN
#endif

/* n a multiple of 8, both 8-aligned. Word by word through volatile
 * pointers: never turned into a (checked) memcpy call. */
NO_ASAN static void copy_raw(void *dst, const void *src, size_t n) {
    volatile uint64_t *d = dst;
    const volatile uint64_t *s = src;
    for (size_t i = 0; i < n / 8; i++) d[i] = s[i];
}

static inline void hide_begin(void) {
#ifdef CO_TSAN
    __tsan_ignore_thread_begin();
#endif
}
static inline void hide_end(void) {
#ifdef CO_TSAN
    __tsan_ignore_thread_end();
#endif
}

/* ---- the stack's live part ----------------------------------------------- */

static char *saved_sp(co_g_t *g) {
#ifdef COLONY_UCONTEXT
#if defined(__x86_64__)
    return (char *)g->ctx.uc.uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    return (char *)g->ctx.uc.uc_mcontext.sp;
#else
    (void)g;
    return NULL; /* not known here: never compacted */
#endif
#else
    return g->ctx.sp;
#endif
}

static char *stack_top(co_g_t *g) {
#ifdef COLONY_UCONTEXT
    return g->stack.lo + g->stack.size;
#else
    return (char *)co__stack_top(g->stack.lo, g->stack.size, g->id);
#endif
}

/* The compactor, g BUSY, the lock of w's queue held, w linked: copy g's
 * live part out and relink w's copy (its pages are released after, with
 * the batch's). False: left as it was. */
static bool compact_locked(co_g_t *g, co__waiter_t *w) {
    if (__atomic_load_n(&g->status, __ATOMIC_ACQUIRE) != CO_G_WAITING || !g->stack.map) return false;
    char *sp = saved_sp(g), *top = stack_top(g), *lo = g->stack.lo;
    if (!sp || sp <= lo || sp >= top || ((uintptr_t)sp & 7) || top - sp > COMPACT_MAX_LIVE)
        return false;
    co__parker_t *pk = w->pk;
    char *cw = (char *)w, *cpk = (char *)pk, *data = w->data;
    /* The records must lie in the live part (not, say, in ASan's fake
     * frames on the heap), and the data pointer must not lead below it. */
    if (cw < sp || cw + sizeof *w > top || cpk < sp || cpk + sizeof *pk > top) return false;
    bool data_in = data >= sp && data < top;
    if (!data_in && data >= lo && data < top) return false;
    size_t len = (size_t)(top - sp);
    hide_begin();
    cbuf_t *b = malloc(sizeof *b + len);
    if (b) copy_raw(b->bytes, sp, len);
    hide_end();
    if (!b) return false;
    b->sp = sp;
    b->len = len;
    co__waiter_t *hw = (co__waiter_t *)(void *)(b->bytes + (cw - sp));
    hw->pk = (co__parker_t *)(void *)(b->bytes + (cpk - sp));
    if (data_in) hw->data = b->bytes + (data - sp);
    /* relink: w's neighbours (and the queue's ends) now lead to hw */
    co__waitq_t *q = w->q;
    if (w->prev)
        w->prev->next = hw;
    else
        __atomic_store_n(&q->head, hw, __ATOMIC_RELAXED); /* read lock-free too */
    if (w->next)
        w->next->prev = hw;
    else
        q->tail = hw;
    g->cbuf = b;
    return true;
}

/* The pages of n compacted stacks, released: every page of each, the live
 * part's and the deeper ones its earlier calls touched. One
 * process_madvise for all where the kernel takes MADV_DONTNEED that way
 * (Linux 6.13+: one call, its TLB flushes batched), else one madvise
 * each. (A failure only keeps the pages: the copies are in use either
 * way.) */
static int many_dontneed = 1; /* sysmon only: 0 once the batch call was refused */
static void release_pages(co_g_t **gs, int n) {
    struct iovec iov[SCAN_COMPACT_MAX];
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        iov[i].iov_base = gs[i]->stack.lo;
        iov[i].iov_len = gs[i]->stack.size;
        total += gs[i]->stack.size;
    }
#ifdef SYS_process_madvise
    if (many_dontneed && n > 1) {
        long r = syscall(SYS_process_madvise, PIDFD_SELF, iov, (size_t)n, MADV_DONTNEED, 0u);
        if (r >= 0 && (size_t)r == total) return;
        if (r < 0) many_dontneed = 0; /* refused: one by one from now on */
    }
#else
    (void)total;
#endif
    for (int i = 0; i < n; i++) (void)madvise(iov[i].iov_base, iov[i].iov_len, MADV_DONTNEED);
}

/* The compactor, allg_lock held: claim g (BUSY) if it is OFFERED and has
 * been parked long enough. A BUSY G cannot run, so cannot exit: its record
 * stays valid after the unlock. */
static bool claim(co_g_t *g, uint32_t now_units, uint32_t thr_units) {
    if (__atomic_load_n(&g->cstate, __ATOMIC_RELAXED) != CO__CS_OFFERED) return false;
    if (now_units - __atomic_load_n(&g->waitsince, __ATOMIC_RELAXED) < thr_units) return false;
    uint8_t cs = CO__CS_OFFERED;
    /* acquire: pairs with co__compact_offer's release (cw_lock, cw_w) */
    return __atomic_compare_exchange_n(&g->cstate, &cs, CO__CS_BUSY, false, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
}

/* The compactor, g claimed: its live part copied out and its waiter's
 * copy relinked (true; g stays BUSY until its pages are released), or g
 * left OFFERED. */
static bool compact_one(co_g_t *g) {
    co__waiter_t *w = g->cw_w;
    co__lock_t *l = g->cw_lock;
    bool done = false;
    /* g may not be off its stack yet (it offers before it parks), or its
     * waker may be at work: either holds l. */
    if (co__trylock(l)) {
        /* linked: no waker popped (claimed) w, so g is parked and stays so
         * while l is held; once l is released, a waker may pop w's copy
         * and ready g, whose M then waits for BUSY to end */
        if (w->q) done = compact_locked(g, w);
        co__unlock(l);
    }
    if (!done) __atomic_store_n(&g->cstate, CO__CS_OFFERED, __ATOMIC_RELEASE);
    return done;
}

int co__compact_scan(int64_t now) {
    if (__atomic_load_n(&n_offered, __ATOMIC_RELAXED) <= 0) return 0;
    if (now < next_scan) return 0;
    co_sched_t *s = &co__sched;
    uint32_t ms = __atomic_load_n(&compact_ms, __ATOMIC_RELAXED);
    /* coarse_ms ticks are 2^20 ns; round the threshold up to whole ticks */
    uint32_t thr_units = (uint32_t)(((uint64_t)ms * 1000000 + (1u << 20) - 1) >> 20);
    uint32_t now_units = (uint32_t)((uint64_t)now >> 20);
    /* Claimed under allg_lock (only a walk: a spawn that needs a new
     * record waits for it), compacted after it. */
    co_g_t *batch[SCAN_COMPACT_MAX];
    int n = 0, visited = 0;
    int64_t t0 = co_now();
    co__lock(&s->allg_lock);
    co_g_t *g = cursor ? cursor : s->allg;
    for (; g && visited < SCAN_VISIT_MAX && n < SCAN_COMPACT_MAX; g = g->alllink_next, visited++)
        if (__atomic_load_n(&g->compact_on, __ATOMIC_RELAXED) && claim(g, now_units, thr_units))
            batch[n++] = g;
    cursor = g;
    co__unlock(&s->allg_lock);
    int done = 0;
    for (int i = 0; i < n; i++)
        if (compact_one(batch[i])) batch[done++] = batch[i];
    if (done) {
        release_pages(batch, done);
        __atomic_sub_fetch(&n_offered, done, __ATOMIC_RELAXED);
        __atomic_add_fetch(&n_compacted_now, done, __ATOMIC_RELAXED);
        __atomic_add_fetch(&n_compactions, (uint64_t)done, __ATOMIC_RELAXED);
        /* release: the copy and the relinked waiter, for the M that runs
         * the G (it acquires cstate); only now may it copy back, the
         * pages released */
        for (int i = 0; i < done; i++)
            __atomic_store_n(&batch[i]->cstate, CO__CS_COMPACTED, __ATOMIC_RELEASE);
    }
    uint64_t round_ns = (uint64_t)(co_now() - t0);
    cur_pass_ns += round_ns;
    if (round_ns > st_round_max_ns) __atomic_store_n(&st_round_max_ns, round_ns, __ATOMIC_RELAXED);
    /* Through the list: look again after a quarter of the threshold (at
     * least 1 ms, at most 250 ms); else go on at the next round. */
    if (!g) {
        __atomic_store_n(&st_pass_ns, st_pass_ns + cur_pass_ns, __ATOMIC_RELAXED);
        __atomic_store_n(&st_passes, st_passes + 1, __ATOMIC_RELAXED);
        cur_pass_ns = 0;
        int64_t period = (int64_t)ms * 250000;
        if (period < 1000000) period = 1000000;
        if (period > 250000000) period = 250000000;
        next_scan = now + period;
    }
    return done;
}

void co__compact_g_released(co_g_t *g) {
    if (cursor == g) cursor = g->alllink_next;
}

/* A pointer of g's records that leads into the copy, back to the stack. */
static inline void *unmove(const cbuf_t *b, void *p) {
    char *c = p;
    if (c >= b->bytes && c < b->bytes + b->len) return b->sp + (c - b->bytes);
    return p;
}

void co__compact_resume(co_g_t *g) {
    for (int spins = 0;; spins++) {
        /* acquire: pairs with the compactor's release of COMPACTED (seen
         * through the waker's ready) or of OFFERED */
        uint8_t cs = __atomic_load_n(&g->cstate, __ATOMIC_ACQUIRE);
        if (CO_LIKELY(cs == CO__CS_NONE)) return;
        if (cs == CO__CS_COMPACTED) break;
        if (cs == CO__CS_OFFERED) {
            if (__atomic_compare_exchange_n(&g->cstate, &cs, CO__CS_NONE, false, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED)) {
                __atomic_sub_fetch(&n_offered, 1, __ATOMIC_RELAXED);
                return;
            }
            continue;
        }
        /* BUSY: the compactor is at it, for a few microseconds */
        if (spins < 64)
            co__cpu_relax();
        else
            sched_yield();
    }
    cbuf_t *b = g->cbuf;
    hide_begin();
    copy_raw(b->sp, b->bytes, b->len);
    hide_end();
    /* The records as the wait code left them, with stack addresses: the
     * copy's waiter and parker pointed into the copy. */
    co__waiter_t *w = g->cw_w;
    w->pk = unmove(b, w->pk);
    w->data = unmove(b, w->data);
    w->next = unmove(b, w->next);
    w->prev = unmove(b, w->prev);
    w->pk->winner = unmove(b, w->pk->winner);
    if (w->q) co__fatal("compaction: coroutine %llu resumed with its waiter still queued",
                        (unsigned long long)g->id);
    hide_begin();
    free(b);
    hide_end();
    g->cbuf = NULL;
    __atomic_sub_fetch(&n_compacted_now, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&n_restores, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&g->cstate, CO__CS_NONE, __ATOMIC_RELAXED); /* only this M looks now */
}
