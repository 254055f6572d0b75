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
 * Finding them: an offer is an entry (the G, the lock, the waiter, when)
 * in one of NSHARD lists, by the G's id, and a G is OFFERED exactly while
 * its entry is in its list: the offer adds it, and whoever moves the G out
 * of OFFERED removes it, both under the shard's lock. sysmon looks only at
 * those lists, so a pass costs in proportion to the waits offered now, not
 * to the coroutines alive; a claim takes the entry (OFFERED -> BUSY) under
 * the shard's lock, and a G it leaves as it was gets its entry back, to be
 * tried again in the next pass (not in this one: a list of waits too deep
 * to compact would hold a pass in one shard for ever). An offer names the
 * lock of the object the G waits on, and a channel may be freed as soon
 * as its lock is released after the waiter was popped (closed and freed
 * at once, by the closer or by a receiver that saw it closed): so a
 * channel's waker withdraws the offer of a waiter it popped before it
 * readies the coroutine, a close before its unlock (OFFERED -> NONE
 * under the shard's lock, co__compact_woken; one lock shared with the Gs
 * of one shard in sixteen). A claim it finds under way (BUSY) ends
 * without the channel's lock (the scan's trylock fails, or finds the
 * waiter popped) and is waited out. A descriptor's waiter (netpoll.c: its lock is never freed) is
 * withdrawn by the M about to run its G, as any offer still listed then.
 * co_dump, which unwinds a parked G's stack, may see it claimed during
 * its walk: it checks the state after the walk (debug.c).
 *
 * Ordering: the coroutine adds its offer, the records' addresses in it,
 * under the shard's lock; the compactor claims under that lock, so reads
 * them after. It copies and relinks under the queue's lock, releases the
 * pages of a batch of stacks after (one call), and only then stores
 * COMPACTED (release). A waker may pop the waiter's copy as soon as the
 * queue's lock is free and ready the coroutine; the M that takes it waits
 * while it is BUSY (a batch: ~100 us; the compactor never blocks
 * meanwhile), and on COMPACTED (acquire) copies back and frees the copy.
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
    char *sp;       /* the saved stack pointer: the copy is [sp, sp + len) */
    uint32_t len;   /* at most COMPACT_MAX_LIVE */
    uint32_t w_off; /* the offered waiter, at sp + w_off (in the live part) */
    _Alignas(16) char bytes[];
} cbuf_t;

#define COMPACT_DEFAULT_MS 1000
/* A live part larger than this is left alone: it saves little. */
#define COMPACT_MAX_LIVE (64 * 1024)
/* Per sysmon round: at most this many offers looked at, at most
 * SCAN_HOLD_MAX of them per hold of a shard's lock (an offer or a wake-up
 * of that shard waits meanwhile), and at most SCAN_COMPACT_MAX claimed (a
 * claimed G woken meanwhile waits for the batch to be done: ~100 us). */
#define SCAN_VISIT_MAX 16384
#define SCAN_HOLD_MAX 4096
#define SCAN_COMPACT_MAX 64

/* The threshold, in ms: relaxed atomic, set from COLONY_COMPACT_MS once
 * (env_once), or by a test. */
static uint32_t compact_ms = COMPACT_DEFAULT_MS;
static uint32_t env_done; /* atomic: COLONY_COMPACT_MS was read */
/* Counts for co_stack_compacted and the tests: relaxed atomics. */
static int64_t n_compacted_now;
static uint64_t n_compactions, n_restores;

/* An offered wait: what the compactor needs to claim it. */
typedef struct {
    co_g_t *g;
    co__lock_t *lock; /* the lock of the queue w is linked in */
    co__waiter_t *w;  /* g's waiter, on g's stack */
    uint32_t since;   /* co__sched.coarse_ms when offered */
    uint32_t tried;   /* the scan pass that last put it back (pass_seq), or 0 */
} offer_t;

/* The offers: exactly the Gs in OFFERED, each in the shard of its id, so
 * that sysmon looks at those alone (not at every G) and an offer or a
 * withdrawal takes one shard's lock, not a lock all of them share. A
 * shard's entries are an unordered array (a withdrawal moves the last
 * entry into the hole), in chunks of CHUNK entries: chunk k of shard s is
 * chunk k * NSHARD + s of one range reserved at the first offer, which
 * never moves (no copy under a lock), and whose first chunks lie side by
 * side (a few offers cost a page a shard and a page table or two, not
 * sixteen).
 * Only touched pages are committed; sysmon releases those past the
 * entries in use once they are fewer than a quarter of the most since
 * the last release (shard_trim). */
#define NSHARD 16
#define SHARD_MAX ((uint32_t)1 << 20) /* entries a shard holds: 16M offers at once in all */
#define CHUNK 4096u                   /* entries: 128 KiB, a whole number of pages */
_Static_assert(SHARD_MAX % CHUNK == 0 && CHUNK * sizeof(offer_t) % 65536 == 0,
               "a shard is whole chunks, and a chunk whole pages");
typedef struct {
    /* Protects the fields below, the shard's entries, and the cq_slot and
     * the changes to or from OFFERED of the Gs in this shard. */
    _Alignas(64) co__lock_t lock;
    uint32_t n;     /* entries in use */
    uint32_t hiwat; /* entries [0, hiwat) may have committed pages */
    /* (n and hiwat: relaxed atomics, which sysmon also reads unlocked, a
     * hint of whether the shard needs a look) */
} shard_t;
static shard_t shards[NSHARD];
/* The reserved range, or NULL: set once, by CAS (acquire/release: the
 * first offer of two shards may race to map it). */
static char *offers;

static inline shard_t *shard_of(const co_g_t *g) { return &shards[g->id % NSHARD]; }

/* Entry i of sh (offers mapped). */
static inline offer_t *entry(const shard_t *sh, uint32_t i) {
    size_t chunk = (size_t)(i / CHUNK) * NSHARD + (size_t)(sh - shards);
    return (offer_t *)(void *)(offers + (chunk * CHUNK + i % CHUNK) * sizeof(offer_t));
}

/* sysmon only: where the scan goes on (a shard, an index in it: an entry
 * moved below it by a withdrawal waits for the next pass), and when the
 * next pass may start. */
static unsigned cur_shard;
static uint32_t cur_pos;
/* sysmon only: the pass under way, counted from 1. An entry it put back
 * (its G left as it was) is not looked at again in that pass. */
static uint32_t pass_seq = 1;
static int64_t next_scan;
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

/* Tests: how many waits are offered now, every shard looked at under its
 * lock; -1 if an entry is not what the lists promise (its G OFFERED, its
 * slot its index). */
CO_HIDDEN int64_t co__test_compact_offered(void);
int64_t co__test_compact_offered(void) {
    int64_t n = 0;
    for (int s = 0; s < NSHARD; s++) {
        shard_t *sh = &shards[s];
        co__lock(&sh->lock);
        for (uint32_t i = 0; i < sh->n; i++) {
            co_g_t *g = entry(sh, i)->g;
            if (__atomic_load_n(&g->cstate, __ATOMIC_RELAXED) != CO__CS_OFFERED ||
                g->cq_slot != i || shard_of(g) != sh)
                n = INT64_MIN / 2;
        }
        n += sh->n;
        co__unlock(&sh->lock);
    }
    return n < 0 ? -1 : n;
}

/* A forked child that starts a runtime of its own (co__test_reset_after_fork):
 * the parent's offers name Gs it does not own, and a parent's thread may
 * have held a shard's lock. Plain stores; the range stays mapped. */
void co__compact_forget(void) {
    memset(shards, 0, sizeof shards);
    n_compacted_now = 0;
    cur_shard = 0;
    cur_pos = 0;
    next_scan = 0;
}

/* Tests: the threshold in ms (0: the next sysmon round). */
CO_HIDDEN void co__test_compact_set_ms(uint32_t ms);
void co__test_compact_set_ms(uint32_t ms) {
    env_once();
    __atomic_store_n(&compact_ms, ms, __ATOMIC_RELAXED);
}

/* The range reserved for every shard's entries: false if it cannot be. */
static bool offers_map(void) {
    if (CO_LIKELY(__atomic_load_n(&offers, __ATOMIC_ACQUIRE) != NULL)) return true;
    size_t len = (size_t)NSHARD * SHARD_MAX * sizeof(offer_t);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) return false;
    char *none = NULL;
    if (!__atomic_compare_exchange_n(&offers, &none, (char *)m, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        munmap(m, len); /* another shard's first offer mapped it */
    return true;
}

/* sh->lock held: o appended, its G OFFERED. False (no range, or the shard
 * is full): nothing changed. */
static bool shard_add(shard_t *sh, const offer_t *o) {
    uint32_t i = sh->n;
    if (CO_UNLIKELY(i == SHARD_MAX) || CO_UNLIKELY(!offers_map())) return false;
    *entry(sh, i) = *o;
    o->g->cq_slot = i;
    __atomic_store_n(&sh->n, i + 1, __ATOMIC_RELAXED);
    if (i + 1 > sh->hiwat) __atomic_store_n(&sh->hiwat, i + 1, __ATOMIC_RELAXED);
    /* under sh->lock, as every reader that acts on OFFERED reads it */
    __atomic_store_n(&o->g->cstate, CO__CS_OFFERED, __ATOMIC_RELAXED);
    return true;
}

/* sh->lock held: entry i removed (the last one moves into its place). The
 * caller sets its G's new state. */
static void shard_del(shard_t *sh, uint32_t i) {
    uint32_t last = sh->n - 1;
    if (i != last) {
        offer_t *e = entry(sh, i);
        *e = *entry(sh, last);
        e->g->cq_slot = i;
    }
    __atomic_store_n(&sh->n, last, __ATOMIC_RELAXED);
}

/* sysmon, sh->lock held, after a walk through the shard: once the
 * entries in use are fewer than a quarter of hiwat (or none), the pages
 * past them released, chunk by chunk. */
static size_t page_bytes; /* sysmon only */
static void shard_trim(shard_t *sh) {
    uint32_t n = sh->n, hi = sh->hiwat;
    if (n != 0 && n >= hi / 4) return;
    if (!page_bytes) page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    uint32_t per_page = (uint32_t)(page_bytes / sizeof(offer_t));
    uint32_t from = (n + per_page - 1) / per_page * per_page; /* page-aligned in its chunk */
    if (from >= hi) return;
    for (uint32_t i = from; i < hi; i = (i / CHUNK + 1) * CHUNK) {
        uint32_t end = (i / CHUNK + 1) * CHUNK;
        if (end > hi) end = hi;
        size_t len = ((size_t)(end - i) * sizeof(offer_t) + page_bytes - 1) / page_bytes * page_bytes;
        (void)madvise(entry(sh, i), len, MADV_DONTNEED);
    }
    __atomic_store_n(&sh->hiwat, from, __ATOMIC_RELAXED);
}

void co__compact_offer(co_g_t *g, co__lock_t *l, co__waiter_t *w) {
    shard_t *sh = shard_of(g);
    offer_t o = {g, l, w, __atomic_load_n(&co__sched.coarse_ms, __ATOMIC_RELAXED), 0};
    co__lock(&sh->lock);
    (void)shard_add(sh, &o); /* false: not offered (stays NONE), so not compacted */
    co__unlock(&sh->lock);
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
    b->len = (uint32_t)len;
    b->w_off = (uint32_t)(cw - sp);
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
static void release_pages(const offer_t *os, int n) {
    struct iovec iov[SCAN_COMPACT_MAX];
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        iov[i].iov_base = os[i].g->stack.lo;
        iov[i].iov_len = os[i].g->stack.size;
        total += os[i].g->stack.size;
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

/* The compactor, o's G claimed (BUSY, its entry removed): its live part
 * copied out and its waiter's copy relinked (true; it stays BUSY until
 * its pages are released), or o put back (OFFERED again, or NONE where
 * its shard has no room: then it is not compacted in this wait). */
static bool compact_one(offer_t *o) {
    co_g_t *g = o->g;
    bool done = false;
    /* g may not be off its stack yet (it offers before it parks), or its
     * waker may be at work: either holds o->lock. */
    if (co__trylock(o->lock)) {
        /* linked: no waker popped (claimed) w, so g is parked and stays so
         * while the lock is held; once it is released, a waker may pop
         * w's copy and ready g, whose M then waits for BUSY to end */
        if (o->w->q) done = compact_locked(g, o->w);
        co__unlock(o->lock);
    }
    if (!done) {
        shard_t *sh = shard_of(g);
        o->tried = pass_seq;
        co__lock(&sh->lock);
        if (!shard_add(sh, o)) __atomic_store_n(&g->cstate, CO__CS_NONE, __ATOMIC_RELAXED);
        co__unlock(&sh->lock);
    }
    return done;
}

static bool any_offered(void) {
    for (int i = 0; i < NSHARD; i++)
        if (__atomic_load_n(&shards[i].n, __ATOMIC_RELAXED)) return true;
    return false;
}

int co__compact_scan(int64_t now) {
    if (now < next_scan || !any_offered()) return 0;
    int64_t t0 = co_now();
    uint32_t ms = __atomic_load_n(&compact_ms, __ATOMIC_RELAXED);
    /* coarse_ms ticks are 2^20 ns; round the threshold up to whole ticks */
    uint32_t thr_units = (uint32_t)(((uint64_t)ms * 1000000 + (1u << 20) - 1) >> 20);
    uint32_t now_units = (uint32_t)((uint64_t)now >> 20);
    /* Claimed under their shard's lock (each claim removes the entry),
     * compacted after it. */
    offer_t batch[SCAN_COMPACT_MAX];
    int n = 0, visited = 0;
    bool pass_done = false;
    while (n < SCAN_COMPACT_MAX && visited < SCAN_VISIT_MAX) {
        shard_t *sh = &shards[cur_shard];
        if (__atomic_load_n(&sh->n, __ATOMIC_RELAXED) ||
            __atomic_load_n(&sh->hiwat, __ATOMIC_RELAXED)) {
            co__lock(&sh->lock);
            uint32_t i = cur_pos;
            for (int held = 0; i < sh->n && n < SCAN_COMPACT_MAX && held < SCAN_HOLD_MAX &&
                               visited < SCAN_VISIT_MAX;
                 held++, visited++) {
                offer_t *o = entry(sh, i);
                if (now_units - o->since < thr_units || o->tried == pass_seq) {
                    i++;
                    continue;
                }
                /* OFFERED, as every entry is: BUSY, it alone reads o now
                 * (and the M that would run its G waits) */
                batch[n++] = *o;
                __atomic_store_n(&o->g->cstate, CO__CS_BUSY, __ATOMIC_RELAXED);
                shard_del(sh, i); /* the last entry moved to i: looked at next */
            }
            bool end = i >= sh->n;
            if (end) shard_trim(sh);
            co__unlock(&sh->lock);
            if (!end) {
                cur_pos = i;
                continue; /* the next hold, or the next round if a limit was hit */
            }
        }
        cur_pos = 0;
        if (++cur_shard == NSHARD) {
            cur_shard = 0;
            pass_done = true;
            break;
        }
    }
    int done = 0;
    for (int i = 0; i < n; i++)
        if (compact_one(&batch[i])) batch[done++] = batch[i];
    if (done) {
        release_pages(batch, done);
        __atomic_add_fetch(&n_compacted_now, done, __ATOMIC_RELAXED);
        __atomic_add_fetch(&n_compactions, (uint64_t)done, __ATOMIC_RELAXED);
        /* release: the copy and the relinked waiter, for the M that runs
         * the G (it acquires cstate); only now may it copy back, the
         * pages released */
        for (int i = 0; i < done; i++)
            __atomic_store_n(&batch[i].g->cstate, CO__CS_COMPACTED, __ATOMIC_RELEASE);
    }
    uint64_t round_ns = (uint64_t)(co_now() - t0);
    cur_pass_ns += round_ns;
    if (round_ns > st_round_max_ns) __atomic_store_n(&st_round_max_ns, round_ns, __ATOMIC_RELAXED);
    /* Through every shard: look again after a quarter of the threshold
     * (at least 1 ms, at most 250 ms); else go on at the next round. */
    if (pass_done) {
        __atomic_store_n(&st_pass_ns, st_pass_ns + cur_pass_ns, __ATOMIC_RELAXED);
        __atomic_store_n(&st_passes, st_passes + 1, __ATOMIC_RELAXED);
        cur_pass_ns = 0;
        if (++pass_seq == 0) pass_seq = 1;
        int64_t period = (int64_t)ms * 250000;
        if (period < 1000000) period = 1000000;
        if (period > 250000000) period = 250000000;
        next_scan = now + period;
    }
    return done;
}

/* A pointer of g's records that leads into the copy, back to the stack. */
static inline void *unmove(const cbuf_t *b, void *p) {
    char *c = p;
    if (c >= b->bytes && c < b->bytes + b->len) return b->sp + (c - b->bytes);
    return p;
}

/* OFFERED, g's shard's lock held: its entry removed, NONE. */
static void withdraw_locked(shard_t *sh, co_g_t *g) {
    if (CO_UNLIKELY(g->cq_slot >= sh->n || entry(sh, g->cq_slot)->g != g))
        co__fatal("compaction: coroutine %llu offered but not listed", (unsigned long long)g->id);
    shard_del(sh, g->cq_slot);
    __atomic_store_n(&g->cstate, CO__CS_NONE, __ATOMIC_RELAXED);
}

/* Waits out a scan at work on g (BUSY) and withdraws g's offer if it is
 * still listed. CO__CS_COMPACTED: g's stack is out, for the caller to put
 * back or leave; else CO__CS_NONE (nothing was, or is, out). */
static inline uint8_t settle(co_g_t *g) {
    for (int spins = 0;; spins++) {
        /* acquire: pairs with the compactor's release of COMPACTED (seen
         * through the waker's ready) or of OFFERED, or with the unlock of
         * the shard's lock after a put-back */
        uint8_t cs = __atomic_load_n(&g->cstate, __ATOMIC_ACQUIRE);
        if (CO_LIKELY(cs == CO__CS_NONE) || cs == CO__CS_COMPACTED) return cs;
        if (cs == CO__CS_OFFERED) {
            /* withdrawn under its shard's lock, unless sysmon claimed it
             * first (BUSY: then wait, as below) */
            shard_t *sh = shard_of(g);
            co__lock(&sh->lock);
            bool mine = __atomic_load_n(&g->cstate, __ATOMIC_RELAXED) == CO__CS_OFFERED;
            if (mine) withdraw_locked(sh, g);
            co__unlock(&sh->lock);
            if (mine) return CO__CS_NONE;
            continue;
        }
        /* BUSY: the scan claimed it, for a few microseconds, and ends
         * without the queue's lock (its trylock fails while a waker holds
         * it, or finds the waiter popped) */
        if (spins < 64)
            co__cpu_relax();
        else
            sched_yield();
    }
}

void co__compact_woken(co_g_t *g) { (void)settle(g); }

void co__compact_resume(co_g_t *g) {
    if (settle(g) != CO__CS_COMPACTED) return;
    cbuf_t *b = g->cbuf;
    hide_begin();
    copy_raw(b->sp, b->bytes, b->len);
    hide_end();
    /* The records as the wait code left them, with stack addresses: the
     * copy's waiter and parker pointed into the copy. */
    co__waiter_t *w = (co__waiter_t *)(void *)(b->sp + b->w_off);
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
