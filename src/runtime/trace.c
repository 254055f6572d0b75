/*
 * The execution trace: scheduler events into bounded per-thread buffers,
 * emptied by a writer thread into a scratch file, turned into Chrome
 * trace-event JSON at co_trace_stop (docs/trace.md has the format).
 *
 * Recording. Each thread that records takes a slot (its M's, a plain
 * thread's, sysmon's) the first time it records in a session. A slot holds
 * one chunk of the session's pool (allocated at start: nothing is
 * allocated on the recording path) and fills it; a full chunk goes on the
 * full list, and the thread takes a free chunk. With none free (the writer
 * behind), events are dropped and counted; the next chunk the thread gets
 * starts with a "lost events" record of how many. Recording never waits:
 * the scheduler is never held up by the trace.
 *
 * Order. The events are put in order by their stamps alone, so a stamp
 * is never the clock's bare reading: it is raised, where needed, to
 * TS_STEP ticks past the last stamp of the recording thread, of each
 * coroutine the event is about (g->trace_ts) and of the P it runs on
 * (pstamp). Whatever one event causes on another thread (a park and the
 * ready that ends it, a ready and the start, a P given up and taken) is
 * about the same G or P, so it sorts after it even where the clock cannot
 * tell them apart: a counter ticking once a microsecond (qemu-user's
 * cntvct), one read out of order with memory (AArch64's, x86's rdtsc),
 * two threads' counters a little apart. A stamp is the clock's reading,
 * or a few ticks past an event it follows (docs/trace.md).
 *
 * Stopping. co_trace_stop clears co__trace_on, waits for every slot's
 * thread's busy word to clear (an event being written), hands their partial
 * chunks to the writer, joins it, then sorts the events by time and writes
 * the JSON. Conversion at the end, not as events come: a wake-up and the
 * start it causes are often recorded by two threads whose chunks reach the
 * writer in any order.
 */
#include "runtime/sched_impl.h"
#include "runtime/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/membarrier.h>
#if defined(__GLIBC__)
#include <dlfcn.h>
#endif

uint32_t co__trace_on;

#define MAX_SLOTS 512
#define DEF_CHUNKS 256       /* 8 MiB of buffers by default */
#define DEF_CHUNK_EV 2048    /* 32 KiB a chunk (16-byte records) */
#define NO_P 0xffff
#define WRITER_POLL_NS (10 * 1000000LL)

/* The converter's event: a record decoded, its thread's slot added. */
typedef struct tev {
    uint64_t ts;   /* co__cycles(), or co_now() where there is no counter */
    uint64_t a, b; /* per kind (trace.h), G pointers already turned into ids */
    uint32_t slot; /* the recording thread's slot */
    uint16_t kind;
    uint16_t p;    /* the recording M's P id, NO_P for none */
} tev_t;

/* A record, as the recording path writes it: 16 bytes.
 *   w0: the clock less the session's start (48 bits, two's complement) | P id << 48
 *   w1: kind | b (16 bits) << 8 | a (40 bits) << 24
 * CREATE is followed by one raw record holding its entry function (w0)
 * and, if the G is named, one holding the first 16 bytes of its name. A
 * chunk in the scratch file starts with a header record: HDR_MAGIC << 32 |
 * slot, then the number of records. */
typedef struct rec {
    uint64_t w0, w1;
} rec_t;
_Static_assert(sizeof(rec_t) == 16, "a trace record is 16 bytes");
#define TS_BITS 48
#define TS_MASK ((1ull << TS_BITS) - 1)
#define A_MASK ((1ull << 40) - 1)
#define HDR_MAGIC 0xc01f7aceull
#define EV_MAX_RECS 3 /* the most records one event takes */
/* The least gap between a stamp and one it follows: 2 ns or more on the
 * clocks in use (TSC up to 4 GHz, the AArch64 counter up to 1 GHz), so
 * that the JSON's nanoseconds keep the two apart. */
#if defined(__x86_64__)
#define TS_STEP 8
#else
#define TS_STEP 2
#endif

/* A recording thread's slot: its records of one session. Set up by the
 * thread under T.setup (slot_setup); then written only by it while its
 * busy word is set and the session is on (enter()), and by co_trace_stop
 * once it has seen that word clear with the trace off. */
typedef struct slot {
    _Alignas(64) uint32_t *busyp; /* its thread's busy word (bword_t) */
    uint32_t gen;     /* the session that set it up */
    int32_t chunk;    /* index of the chunk it fills, -1 none */
    uint32_t n;       /* records in that chunk */
    uint32_t cap;     /* n's limit: the chunk's size, 0 with no chunk */
    uint64_t lost;    /* events dropped since its last recorded one */
    uint64_t last;    /* the stamp of its last record */
    int m;            /* the thread's M id, -1 a thread without one */
} slot_t;

enum { CH_FREE = 0, CH_OWNED, CH_FULL };

/* The session. api protects active, the buffers' allocation and all the
 * fields written by start and stop. */
static struct {
    pthread_mutex_t api;
    bool active;
    pid_t pid;                /* the process that started it (a fork's child stops quietly) */
    uint32_t gen;             /* atomic: the session's number, set (release) by start; 1
                               * before the first (a thread's tls_gen starts at 0, so a
                               * stale read never matches it) */
    bool fenced;              /* stop waits out recorders with membarrier: they take busy
                               * with plain stores (set by start, before the trace is on) */
    int nchunks, chunk_ev;
    rec_t *evmem;             /* nchunks * chunk_ev records, mapped populated by start (no
                               * page faults while recording) */
    size_t evbytes;           /* evmem's length */
    uint32_t *cn;             /* records in each chunk, set by its filler before it goes full */
    uint16_t *cslot;          /* its filler's slot, likewise */
    int32_t *cnext;           /* the full list's links, written by the pusher */
    uint8_t *cstate;          /* atomic CH_*: FREE -> OWNED by a filler's CAS (acquire), OWNED ->
                               * FULL by its push (release), FULL -> FREE by the writer (release) */
    uint32_t chint;           /* atomic relaxed: where the next free-chunk search starts */
    int32_t full_head;        /* atomic: pushed chunks (index + 1, 0 empty); pushers CAS
                               * (release), the writer takes all by exchange (acquire) */
    uint32_t wword;           /* futex: bumped to wake the writer */
    uint32_t nfull;           /* atomic relaxed: chunks pushed and not yet taken by the
                               * writer (a hint for when to wake it, not a count it trusts) */
    uint32_t wake_at;         /* atomic relaxed: nfull's value whose push wakes the writer;
                               * set by start, lowered by slot_setup as slots take chunks */
    uint32_t wstop, whold;    /* atomic: the writer's orders */
    int werr;                 /* the writer's first write error (errno); read after its join */
    pthread_t writer;
    int rawfd;
    FILE *out;
    char *path;
    /* The slots, reused by every session. Handed out under setup, which
     * start and stop hold while they reset them or close them: a thread
     * whose last event of an ended session was delayed across a stop and
     * a start writes only its own busy word, never a slot. */
    slot_t *slots;
    pthread_mutex_t setup;
    uint32_t setup_gen;       /* setup: the session slots are handed out for, 0 none */
    uint32_t nslots;          /* setup: slots handed out this session */
    uint64_t c0, c1;          /* clock at start and stop */
    int64_t t0, t1;           /* co_now() at start and stop */
    bool ns_clock;            /* no cycle counter: events carry co_now() */
    int64_t lost_global;      /* atomic: events dropped with no slot to count them in */
    int64_t lost_total;       /* the last stopped session's lost events */
} T = {.api = PTHREAD_MUTEX_INITIALIZER, .setup = PTHREAD_MUTEX_INITIALIZER, .gen = 1};

static slot_t slot_mem[MAX_SLOTS];

/* A thread's busy word, set while it writes an event (enter()). Each
 * thread has its own for as long as it lives, in memory never freed (a
 * word is reused by a later thread once its own has exited), so that
 * co_trace_stop may read the word of any slot at any time, and a delayed
 * write by its thread lands on nothing but the word. */
typedef struct bword {
    _Alignas(64) uint32_t busy; /* atomic: see enter() */
    struct bword *next;         /* bw.lock: the free list */
    struct bword *all;          /* every word made (never freed) */
} bword_t;
static struct {
    pthread_mutex_t lock;
    pthread_key_t key;          /* its destructor frees a thread's word */
    bword_t *free, *all;        /* lock */
} bw = {.lock = PTHREAD_MUTEX_INITIALIZER};
static __thread bword_t *tls_bw;

/* Each P id's last stamp (see Order above), a line each: the M holding
 * the P writes it at every event. Relaxed atomics: the M that takes the P
 * next got it through the scheduler's own hand-over (the idle list's lock,
 * a retake's CAS), which carries the store along; a racing access (a
 * retake beside the event of the M leaving co_blocking) costs at most the
 * order of two events that were at the same time. Never reset: a stamp of
 * an earlier session is an earlier time. */
static struct {
    _Alignas(64) uint64_t ts;
} pstamp[CO_MAX_PROCS];

static __thread uint32_t tls_gen;
static __thread slot_t *tls_slot;

/* ---- recording ---------------------------------------------------------- */

static inline uint64_t now_ts(void) {
    return T.ns_clock ? (uint64_t)co_now() : co__cycles();
}

/* t raised to TS_STEP past the stamp at o (if any). Relaxed: as pstamp's;
 * g->trace_ts is handed on with the G itself (a run queue's release and
 * acquire, a wait list's lock), so the recorder of the G's next event
 * reads this one's store. */
static inline uint64_t after(uint64_t t, const uint64_t *o) {
    uint64_t v = __atomic_load_n(o, __ATOMIC_RELAXED) + TS_STEP;
    return v > t ? v : t;
}
static inline void mark(uint64_t *o, uint64_t t) { __atomic_store_n(o, t, __ATOMIC_RELAXED); }

/* The stamp of an event of slot s (busy held) on P p (NO_P none) about
 * g1 and g2 (NULL: none): the clock, raised past the slot's, the P's and
 * the Gs' last stamps; all of them then marked with it. */
static inline uint64_t stamp(slot_t *s, uint16_t p, co_g_t *g1, co_g_t *g2) {
    uint64_t t = now_ts(), v = s->last + TS_STEP;
    if (v > t) t = v;
    uint64_t *ps = p < CO_MAX_PROCS ? &pstamp[p].ts : NULL;
    if (ps) t = after(t, ps);
    if (g1) t = after(t, &g1->trace_ts);
    if (g2) t = after(t, &g2->trace_ts);
    s->last = t;
    if (ps) mark(ps, t);
    if (g1) mark(&g1->trace_ts, t);
    if (g2) mark(&g2->trace_ts, t);
    return t;
}

/* Bumps the writer's futex word and wakes it. release: an order stored
 * before (whold, wstop) is seen by the writer's acquire load of wword. */
static void wake_writer(void) {
    __atomic_add_fetch(&T.wword, 1, __ATOMIC_RELEASE);
    co__futex_wake(&T.wword, 1);
}

/* Slot s (busy held): its chunk, if any, goes to the writer; takes a free
 * one. false if none is free. Once per chunk_ev records. */
static bool chunk_next(slot_t *s) {
    if (s->chunk >= 0) {
        int32_t c = s->chunk;
        T.cn[c] = s->n;
        T.cslot[c] = (uint16_t)(s - T.slots);
        __atomic_store_n(&T.cstate[c], CH_FULL, __ATOMIC_RELAXED);
        int32_t h = __atomic_load_n(&T.full_head, __ATOMIC_RELAXED);
        do
            T.cnext[c] = h;
        while (!__atomic_compare_exchange_n(&T.full_head, &h, c + 1, true, __ATOMIC_RELEASE,
                                            __ATOMIC_RELAXED));
        s->chunk = -1;
        s->cap = 0;
        /* The writer is woken once per wake_at chunks, and polls between:
         * a wake-up is a system call and, here, an interrupt to another
         * CPU, several records' worth of time each. Only the push that
         * brings the count to wake_at wakes (the count passes through it
         * on its way up: pushes add one at a time). */
        if (__atomic_add_fetch(&T.nfull, 1, __ATOMIC_RELAXED) ==
            __atomic_load_n(&T.wake_at, __ATOMIC_RELAXED))
            wake_writer();
    }
    int n = T.nchunks;
    uint32_t start = __atomic_fetch_add(&T.chint, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++) {
        int32_t c = (int32_t)((start + (uint32_t)i) % (uint32_t)n);
        uint8_t f = CH_FREE;
        if (__atomic_load_n(&T.cstate[c], __ATOMIC_RELAXED) == CH_FREE &&
            __atomic_compare_exchange_n(&T.cstate[c], &f, CH_OWNED, false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            s->chunk = c;
            s->n = 0;
            s->cap = (uint32_t)T.chunk_ev;
            return true;
        }
    }
    /* none free: whatever is full must go out now, not at the next poll
     * (the count may never have reached wake_at, the slots holding the rest) */
    if (__atomic_load_n(&T.nfull, __ATOMIC_RELAXED) != 0) wake_writer();
    return false;
}

static inline uint64_t w0_of(uint64_t ts, uint16_t p) {
    return ((ts - T.c0) & TS_MASK) | (uint64_t)p << TS_BITS;
}
static inline uint64_t w1_of(int kind, uint64_t a, uint64_t b) {
    return (uint64_t)(kind & 0xff) | (b & 0xffff) << 8 | (a & A_MASK) << 24;
}

/* Room for k records in s's chunk (busy held), a lost count first if
 * there is one; NULL (the event dropped and counted) if none is free. */
static rec_t *reserve_slow(slot_t *s, uint32_t k, uint64_t ts, uint16_t p);
static inline rec_t *reserve(slot_t *s, uint32_t k, uint64_t ts, uint16_t p) {
    if (CO_UNLIKELY(s->n + k > s->cap || s->lost)) return reserve_slow(s, k, ts, p);
    rec_t *r = &T.evmem[(size_t)s->chunk * (size_t)T.chunk_ev + s->n];
    s->n += k;
    return r;
}
static __attribute__((noinline)) rec_t *reserve_slow(slot_t *s, uint32_t k, uint64_t ts,
                                                    uint16_t p) {
    if (s->n + k + (s->lost ? 1 : 0) > s->cap && !chunk_next(s)) {
        s->lost++;
        return NULL;
    }
    rec_t *r = &T.evmem[(size_t)s->chunk * (size_t)T.chunk_ev + s->n];
    if (s->lost) { /* a fresh chunk: the count goes first */
        r->w0 = w0_of(ts, p);
        r->w1 = w1_of(CO__TEV_LOST_, s->lost > A_MASK ? A_MASK : s->lost, 0);
        s->lost = 0;
        r++;
        s->n++;
    }
    s->n += k;
    return r;
}

static inline void busy_release(void) {
    /* release: the records written before it, for stop's acquire load */
    __atomic_store_n(&tls_bw->busy, 0, __ATOMIC_RELEASE);
}

static void bw_exit(void *w) {
    bword_t *b = w;
    pthread_mutex_lock(&bw.lock);
    b->next = bw.free;
    bw.free = b;
    pthread_mutex_unlock(&bw.lock);
    /* an event after this (another destructor's) sets up anew */
    tls_bw = NULL;
    tls_gen = 0;
}
static void bw_key(void) {
    if (pthread_key_create(&bw.key, bw_exit) != 0) bw.key = (pthread_key_t)-1;
}
/* The calling thread's busy word, made or reused; NULL without memory. */
static bword_t *bw_get(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, bw_key);
    if (bw.key == (pthread_key_t)-1) return NULL;
    pthread_mutex_lock(&bw.lock);
    bword_t *b = bw.free;
    if (b) {
        bw.free = b->next;
    } else if ((b = aligned_alloc(64, sizeof *b)) != NULL) {
        b->all = bw.all;
        bw.all = b;
    }
    pthread_mutex_unlock(&bw.lock);
    if (!b) return NULL;
    __atomic_store_n(&b->busy, 0, __ATOMIC_RELAXED); /* its last owner left it clear */
    if (pthread_setspecific(bw.key, b) != 0) {
        bw_exit(b);
        return NULL;
    }
    tls_bw = b;
    return b;
}

/* Sets the thread's busy word, then reads the trace's flag and number
 * again: true if session gen is still on (busy held), else false (busy
 * clear). The usual way has no atomic read-modify-write and no fence:
 * busy is set by a plain store; co_trace_stop clears the flag, then makes
 * every thread execute a full barrier (membarrier), then waits for busy to
 * clear. So either stop sees busy set and waits for the event, or this
 * sees the trace off (an asymmetric Dekker, as yslot.h's windows).
 * Without membarrier (and under TSan): a seq_cst exchange of busy and
 * seq_cst load of the flag, against stop's seq_cst store of the flag and
 * seq_cst loads of busy. The number is read after the flag (pairing with
 * start's release stores of the number, then the flag): an event of a
 * session that ended meanwhile is dropped. */
static inline bool busy_take(uint32_t gen) {
    if (CO_LIKELY(T.fenced)) {
        __atomic_store_n(&tls_bw->busy, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* no compiler reordering with the load below */
        if (CO_LIKELY(__atomic_load_n(&co__trace_on, __ATOMIC_ACQUIRE) &&
                      __atomic_load_n(&T.gen, __ATOMIC_RELAXED) == gen))
            return true;
    } else {
        (void)__atomic_exchange_n(&tls_bw->busy, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&co__trace_on, __ATOMIC_SEQ_CST) &&
            __atomic_load_n(&T.gen, __ATOMIC_RELAXED) == gen)
            return true;
    }
    busy_release();
    return false;
}

/* The first event of this thread in session gen: a slot of its own, set
 * up under T.setup (a wait of microseconds at most, while a start or a
 * stop resets or closes the slots). busy held on return, NULL (none held)
 * if the trace went off or no slot is left. */
static __attribute__((noinline)) slot_t *slot_setup(uint32_t gen) {
    if (!tls_bw && !bw_get()) {
        __atomic_add_fetch(&T.lost_global, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    co_m_t *m = getm();
    slot_t *s = NULL;
    pthread_mutex_lock(&T.setup);
    if (T.setup_gen == gen && T.nslots < MAX_SLOTS) {
        s = &T.slots[T.nslots++];
        /* each slot keeps a chunk: wake the writer before half of those
         * left to be filled are full */
        uint32_t left = T.nchunks > (int)T.nslots ? (uint32_t)T.nchunks - T.nslots : 0;
        if (left / 2 < __atomic_load_n(&T.wake_at, __ATOMIC_RELAXED))
            __atomic_store_n(&T.wake_at, left / 2 > 1 ? left / 2 : 1, __ATOMIC_RELAXED);
        s->busyp = &tls_bw->busy;
        s->gen = gen;
        s->chunk = -1;
        s->n = s->cap = 0;
        s->lost = 0;
        s->last = 0;
        s->m = m ? m->id : -1;
        tls_slot = s;
        tls_gen = gen;
    } else if (T.setup_gen == gen) {
        __atomic_add_fetch(&T.lost_global, 1, __ATOMIC_RELAXED); /* no slot left */
    }
    pthread_mutex_unlock(&T.setup);
    if (!s || !busy_take(gen)) return NULL;
    /* what runs here now, for the converter: its slice began before */
    uint16_t p = m && m->p ? (uint16_t)m->p->id : NO_P;
    uint64_t ts = stamp(s, p, m ? m->curg : NULL, NULL);
    rec_t *r = reserve(s, 1, ts, p);
    if (r) {
        r->w0 = w0_of(ts, p);
        r->w1 = w1_of(CO__TEV_CUR_, m && m->curg ? m->curg->id : 0, 0);
    }
    return s;
}

/* The calling thread's slot, busy held, for an event of the session that
 * is on; NULL (nothing held) if none is (busy_take has the orders). */
static inline slot_t *enter(void) {
    /* acquire: pairs with start's release; the session's set-up happened before */
    uint32_t gen = __atomic_load_n(&T.gen, __ATOMIC_ACQUIRE);
    if (CO_UNLIKELY(tls_gen != gen)) return slot_setup(gen);
    return busy_take(gen) ? tls_slot : NULL;
}

static inline uint16_t cur_p(co_m_t *m) { return m && m->p ? (uint16_t)m->p->id : NO_P; }

void co__trace_ev(int kind, uint64_t a, uint64_t b) {
    slot_t *s = enter();
    if (!s) return;
    uint16_t p = cur_p(getm());
    co_g_t *g = (co_g_t *)(uintptr_t)a;
    bool about_g = false;
    switch (kind) {
    case CO__TEV_CREATE: case CO__TEV_START: case CO__TEV_PARK: case CO__TEV_YIELD:
    case CO__TEV_READY: case CO__TEV_EXIT: case CO__TEV_STEAL: case CO__TEV_BLOCK:
    case CO__TEV_BLOCK_END:
        about_g = true;
        break;
    case CO__TEV_P_ACQUIRE: case CO__TEV_P_RELEASE: case CO__TEV_RETAKE:
        /* about the P it names (a retake's is not this thread's) */
        if (a < CO_MAX_PROCS) p = (uint16_t)a;
        break;
    }
    uint64_t ts = stamp(s, p, about_g ? g : NULL, NULL);
    if (kind == CO__TEV_P_ACQUIRE || kind == CO__TEV_P_RELEASE || kind == CO__TEV_RETAKE)
        p = cur_p(getm());
    rec_t *r;
    switch (kind) {
    case CO__TEV_CREATE:
        r = reserve(s, g->named ? 3 : 2, ts, p);
        if (!r) break;
        r[0].w0 = w0_of(ts, p);
        r[0].w1 = w1_of(kind, g->id, g->named);
        r[1].w0 = (uint64_t)(uintptr_t)g->fn;
        r[1].w1 = 0;
        if (g->named) {
            uint64_t w[2] = {0, 0};
            memcpy(w, g->name, strnlen(g->name, sizeof w));
            r[2].w0 = w[0];
            r[2].w1 = w[1];
        }
        break;
    case CO__TEV_START:
        if (g->is_g0) break;
        /* fall through */
    case CO__TEV_PARK: case CO__TEV_YIELD: case CO__TEV_READY: case CO__TEV_EXIT:
    case CO__TEV_STEAL: case CO__TEV_BLOCK: case CO__TEV_BLOCK_END:
        a = g->id;
        /* fall through */
    default:
        r = reserve(s, 1, ts, p);
        if (!r) break;
        r->w0 = w0_of(ts, p);
        r->w1 = w1_of(kind, a, b);
        break;
    }
    busy_release();
}

void co__trace_switch(int how, void *from, void *to) {
    slot_t *s = enter();
    if (!s) return;
    co_g_t *f = from, *t = to;
    uint16_t p = cur_p(getm());
    uint64_t ts = stamp(s, p, f->is_g0 ? NULL : f, t->is_g0 ? NULL : t);
    uint64_t b = f->is_g0 ? 0 : (uint64_t)how;
    if (how == CO__TEV_PARK && !f->is_g0)
        b |= (uint64_t)(uint16_t)__atomic_load_n(&f->wait_reason, __ATOMIC_RELAXED) << 8;
    rec_t *r = reserve(s, 1, ts, p);
    if (r) {
        r->w0 = w0_of(ts, p);
        r->w1 = w1_of(CO__TEV_SWITCH_, t->is_g0 ? 0 : t->id, b);
    } else if (b && !t->is_g0) {
        s->lost++; /* counted as events: a stop and a start */
    }
    busy_release();
}

/* ---- the writer ----------------------------------------------------------- */

static void write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0 && T.werr == 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            T.werr = errno;
            return;
        }
        p += w;
        len -= (size_t)w;
    }
}

/* Writes the full chunks out, oldest push first, and frees them. */
static bool drain_full(void) {
    int32_t h = __atomic_exchange_n(&T.full_head, 0, __ATOMIC_ACQUIRE);
    if (!h) return false;
    int32_t rev = 0; /* the pushes' order back (a thread's chunks in its order) */
    uint32_t taken = 0;
    while (h) {
        int32_t c = h - 1;
        h = T.cnext[c];
        T.cnext[c] = rev;
        rev = c + 1;
        taken++;
    }
    __atomic_sub_fetch(&T.nfull, taken, __ATOMIC_RELAXED);
    while (rev) {
        int32_t c = rev - 1;
        rev = T.cnext[c];
        rec_t hdr = {HDR_MAGIC << 32 | T.cslot[c], T.cn[c]};
        write_all(T.rawfd, &hdr, sizeof hdr);
        write_all(T.rawfd, &T.evmem[(size_t)c * (size_t)T.chunk_ev], T.cn[c] * sizeof(rec_t));
        /* release: this write of the chunk is done before a filler reuses it */
        __atomic_store_n(&T.cstate[c], CH_FREE, __ATOMIC_RELEASE);
    }
    return true;
}

static void *writer_main(void *arg) {
    (void)arg;
    for (;;) {
        uint32_t w = __atomic_load_n(&T.wword, __ATOMIC_ACQUIRE);
        bool stop = __atomic_load_n(&T.wstop, __ATOMIC_ACQUIRE);
        if (!__atomic_load_n(&T.whold, __ATOMIC_ACQUIRE) || stop) {
            if (drain_full()) continue;
            if (stop) break;
        }
        /* the poll: chunks short of wake_at are written within WRITER_POLL_NS */
        co__futex_wait(&T.wword, w, co_now() + WRITER_POLL_NS);
    }
    return NULL;
}

void co__trace_hold_writer(bool hold) {
    __atomic_store_n(&T.whold, hold, __ATOMIC_RELEASE);
    wake_writer();
}

int64_t co__trace_lost(void) {
    pthread_mutex_lock(&T.api);
    int64_t n = T.lost_total;
    pthread_mutex_unlock(&T.api);
    return n;
}

/* ---- start / stop --------------------------------------------------------- */

/* The fast paths' views of co__trace_on (proc.h): set before it goes on,
 * cleared after it goes off. seq_cst stores: a fast path that still sees
 * the trace off after co__trace_on went on drops its event, as a site
 * racing the start may. */
static void fast_paths_traced(bool on) {
    co_sched_t *s = &co__sched;
    /* traced and every G's trace_sw under allg_lock: a G joining the list
     * (gslab.c) after the walk takes traced's value there */
    co__lock(&s->allg_lock);
    __atomic_store_n(&s->traced, on ? 1u : 0u, __ATOMIC_SEQ_CST);
    for (co_g_t *g = s->allg; g; g = g->alllink_next)
        __atomic_store_n(&g->trace_sw, (uint8_t)on, __ATOMIC_RELAXED);
    co__unlock(&s->allg_lock);
    __atomic_store_n(&s->handover_size, on ? 0 : s->stack_size, __ATOMIC_SEQ_CST);
}

void co__trace_sync(void) {
    pthread_mutex_lock(&T.api);
    fast_paths_traced(__atomic_load_n(&co__trace_on, __ATOMIC_RELAXED) != 0);
    pthread_mutex_unlock(&T.api);
}

/* The same, off, in a fork's child, which runs no coroutine (and whose
 * allg_lock may have been held by a thread of the parent): the Gs' flags
 * are left as they are. */
static void fast_paths_traced_child(void) {
    __atomic_store_n(&co__sched.traced, 0u, __ATOMIC_SEQ_CST);
    __atomic_store_n(&co__sched.handover_size, co__sched.stack_size, __ATOMIC_SEQ_CST);
}

static void trace_forked(void) {
    /* The child has no writer: it records nothing, and stop only forgets. */
    __atomic_store_n(&co__trace_on, 0, __ATOMIC_SEQ_CST);
    fast_paths_traced_child();
}

static void free_buffers(void) {
    if (T.evmem) munmap(T.evmem, T.evbytes);
    free(T.cn);
    free(T.cslot);
    T.cslot = NULL;
    free(T.cnext);
    free(T.cstate);
    T.evmem = NULL;
    T.cn = NULL;
    T.cnext = NULL;
    T.cstate = NULL;
    free(T.path);
    T.path = NULL;
}

/* fork waits for a start or stop under way (prepare takes api), so the
 * child never inherits a half-written JSON in T.out's stdio buffer (its
 * exit would flush it into the parent's file) nor a held api. The child
 * also gets fresh setup and bw locks: a parent's thread may have held
 * one, and the child may start a session of its own. */
static void atfork_prepare(void) { pthread_mutex_lock(&T.api); }
static void atfork_parent(void) { pthread_mutex_unlock(&T.api); }
static void atfork_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    T.api = fresh;
    T.setup = fresh;
    bw.lock = fresh;
    trace_forked();
}

static int membarrier_(int cmd) { return (int)syscall(SYS_membarrier, cmd, 0, 0); }

/* Whether stop can wait out recorders with membarrier (they then take
 * their busy flag with plain stores). Not under TSan, which cannot see
 * membarrier's ordering: it gets the exchanges. Registering again is
 * harmless (yslot.c registers too). */
static bool fenced_ok(void) {
#ifdef CO_TSAN
    return false;
#else
    return membarrier_(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
           membarrier_(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
#endif
}
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

int co__trace_start_with(const char *path, int chunks, int chunk_events) {
    if (!path || !*path || chunks < 0 || chunk_events < 0) return CO_EINVAL;
    if (chunks == 0) chunks = DEF_CHUNKS;
    if (chunk_events == 0) chunk_events = DEF_CHUNK_EV;
    if (chunks < 2 || chunk_events < 4) return CO_EINVAL;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_mutex_lock(&T.api);
    if (T.active) {
        pthread_mutex_unlock(&T.api);
        return CO_EBUSY;
    }
    int rc = 0;
    /* The JSON file first: a path that cannot be written fails here. */
    FILE *out = fopen(path, "w");
    if (!out) {
        rc = -errno;
        goto fail;
    }
    size_t plen = strlen(path);
    char *raw = malloc(plen + 16);
    T.path = strdup(path);
    if (!raw || !T.path) {
        free(raw);
        fclose(out);
        rc = CO_ENOMEM;
        goto fail;
    }
    /* The scratch file beside it, unlinked at once: gone however we end. */
    snprintf(raw, plen + 16, "%s.raw.XXXXXX", path);
    int fd = mkstemp(raw);
    if (fd < 0) {
        rc = -errno;
        free(raw);
        fclose(out);
        goto fail;
    }
    unlink(raw);
    free(raw);
    T.nchunks = chunks;
    T.chunk_ev = chunk_events;
    /* Every page of the buffers faulted in now, not by the first record in
     * each (a page fault is microseconds). MAP_POPULATE, not malloc and a
     * memset: compilers turn that pair into calloc, which touches nothing. */
    T.evbytes = (size_t)chunks * (size_t)chunk_events * sizeof(rec_t);
    T.evmem = mmap(NULL, T.evbytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (T.evmem == MAP_FAILED) T.evmem = NULL;
    T.cn = calloc((size_t)chunks, sizeof *T.cn);
    T.cslot = calloc((size_t)chunks, sizeof *T.cslot);
    T.cnext = calloc((size_t)chunks, sizeof *T.cnext);
    T.cstate = calloc((size_t)chunks, 1);
    if (!T.evmem || !T.cn || !T.cslot || !T.cnext || !T.cstate) {
        close(fd);
        fclose(out);
        rc = CO_ENOMEM;
        goto fail;
    }
    T.out = out;
    T.rawfd = fd;
    /* and written once from here: under shadow page tables (a PVM guest,
     * say) a page's first write from user space faults even after the
     * kernel has populated it */
    for (size_t off = 0; off < T.evbytes; off += 4096) ((volatile char *)T.evmem)[off] = 0;
    /* The slots reset, and handed out for the new session (its number:
     * only start changes T.gen, under api). The last stop closed them. */
    uint32_t ngen = __atomic_load_n(&T.gen, __ATOMIC_RELAXED) + 1;
    if (ngen == 0) ngen = 2; /* 0 is no session's, 1 none's (see T.gen) */
    pthread_mutex_lock(&T.setup);
    memset(slot_mem, 0, sizeof slot_mem);
    for (int i = 0; i < MAX_SLOTS; i++) slot_mem[i].chunk = -1;
    T.slots = slot_mem;
    T.nslots = 0;
    T.setup_gen = ngen;
    pthread_mutex_unlock(&T.setup);
    T.fenced = fenced_ok();
    __atomic_store_n(&T.full_head, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&T.nfull, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&T.wake_at, chunks / 8 > 1 ? (uint32_t)chunks / 8 : 1, __ATOMIC_RELAXED);
    __atomic_store_n(&T.lost_global, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&T.wstop, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&T.whold, 0, __ATOMIC_RELAXED);
    T.werr = 0;
    T.pid = getpid();
    T.c0 = co__cycles();
    T.ns_clock = T.c0 == 0;
    T.t0 = co_now();
    if (T.ns_clock) T.c0 = (uint64_t)T.t0;
    pthread_once(&once, register_atfork);
    __atomic_add_fetch(&co__helper_threads, 1, __ATOMIC_RELAXED); /* deadlock.c */
    int e = pthread_create(&T.writer, NULL, writer_main, NULL);
    if (e) {
        __atomic_sub_fetch(&co__helper_threads, 1, __ATOMIC_RELAXED);
        close(fd);
        fclose(out);
        rc = -e;
        goto fail;
    }
    T.active = true;
    /* release: the resets above happen before a recorder sees the new gen */
    __atomic_store_n(&T.gen, ngen, __ATOMIC_RELEASE);
    fast_paths_traced(true);
    __atomic_store_n(&co__trace_on, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&T.api);
    return 0;
fail:
    free_buffers();
    pthread_mutex_unlock(&T.api);
    return rc;
}

/* ---- the JSON ------------------------------------------------------------- */

static const char *const wr_names[CO__WR_COUNT_] = {
    [CO__WR_NONE] = "runnable", [CO__WR_SLEEP] = "sleep", [CO__WR_CHAN_SEND] = "chan send",
    [CO__WR_CHAN_RECV] = "chan receive", [CO__WR_SELECT] = "select",
    [CO__WR_MUTEX] = "sync.Mutex.Lock", [CO__WR_RWMUTEX] = "sync.RWMutex",
    [CO__WR_COND] = "sync.Cond.Wait", [CO__WR_WAITGROUP] = "sync.WaitGroup.Wait",
    [CO__WR_SEM] = "semacquire", [CO__WR_ONCE] = "sync.Once", [CO__WR_POOL] = "pool",
    [CO__WR_IO] = "IO wait", [CO__WR_MAIN] = "co_main", [CO__WR_GROUP] = "group",
};

typedef struct gi {
    uint64_t key;     /* G id + 1; 0 an empty cell */
    uint64_t flow;    /* the flow (wake-up arrow) waiting for its next start, 0 none */
    bool exited;
    bool started;     /* a start of it was seen */
    char label[56];   /* "G7 name" */
} gi_t;

typedef struct lane {
    bool used, sysmon;
    uint64_t g;       /* the G whose slice is open here, 0 none */
    double gts;
    int gp;           /* its P then, NO_P none */
    double spin_ts, sleep_ts, block_ts; /* open spans, < 0 none */
    uint64_t block_g;
    uint64_t last_create;
    double free_ts;   /* when its last coroutine slice ended (0: the trace's start) */
} lane_t;

typedef struct plane {
    int owner;        /* the slot whose M holds it, -1 none */
    double own_ts;
    uint64_t g;       /* the G whose slice is open on its lane, 0 none */
    double gts;
    bool seen;
} plane_t;

static struct {
    FILE *f;
    const tev_t *ev;
    gi_t *gt;
    size_t gcap, gn;
    lane_t *lanes;
    plane_t *planes;
    int nplanes;
    double ns_per_tick;
    bool first;
    uint64_t flows, anomalies, lost;
} J;

static int cmp_ev(const void *x, const void *y) {
    uint32_t i = *(const uint32_t *)x, k = *(const uint32_t *)y;
    uint64_t a = J.ev[i].ts, b = J.ev[k].ts;
    if (a != b) return a < b ? -1 : 1;
    return i < k ? -1 : i > k;
}

static gi_t *gget(uint64_t id) {
    if (2 * (J.gn + 1) > J.gcap) {
        size_t ncap = J.gcap ? 2 * J.gcap : 1024;
        gi_t *nt = calloc(ncap, sizeof *nt);
        if (!nt) return NULL;
        for (size_t i = 0; i < J.gcap; i++) {
            if (!J.gt[i].key) continue;
            size_t h = (J.gt[i].key * 0x9E3779B97F4A7C15ull) & (ncap - 1);
            while (nt[h].key) h = (h + 1) & (ncap - 1);
            nt[h] = J.gt[i];
        }
        free(J.gt);
        J.gt = nt;
        J.gcap = ncap;
    }
    uint64_t key = id + 1;
    size_t h = (key * 0x9E3779B97F4A7C15ull) & (J.gcap - 1);
    while (J.gt[h].key && J.gt[h].key != key) h = (h + 1) & (J.gcap - 1);
    if (!J.gt[h].key) {
        J.gt[h].key = key;
        snprintf(J.gt[h].label, sizeof J.gt[h].label, "G%llu", (unsigned long long)id);
        J.gn++;
    }
    return &J.gt[h];
}

static const char *glabel(uint64_t id) {
    gi_t *g = gget(id);
    return g ? g->label : "G?";
}

/* The length of the well-formed UTF-8 sequence at s (2 to 4), or 0. */
static int utf8_len(const unsigned char *s) {
    int n = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
          : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (n == 0) return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at the NUL */
    /* overlong forms, surrogates, and past U+10FFFF */
    if (n == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0;
    if (n == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
    return n;
}

/* s as a JSON string: well-formed UTF-8 as it is, control bytes escaped,
 * any other byte (a name cut inside a character, Latin-1) as U+FFFD. */
static void jstr(const char *s) {
    fputc('"', J.f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        int n;
        if (c == '"' || c == '\\')
            fprintf(J.f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(J.f, "\\u%04x", c);
        else if (c < 0x80)
            fputc(c, J.f);
        else if ((n = utf8_len(p)) > 0) {
            fwrite(p, 1, (size_t)n, J.f);
            p += n - 1;
        } else
            fputs("\\ufffd", J.f);
    }
    fputc('"', J.f);
}

static int lane_tid(int slot) {
    int m = T.slots[slot].m;
    return m >= 0 ? m : 1000 + slot;
}

static void sep(void) {
    if (!J.first) fputs(",\n", J.f);
    J.first = false;
}

/* A slice: pid 1 the threads' lanes, 2 the Ps'. args: JSON members or "". */
static void xev(int pid, int tid, const char *name, const char *cat, double ts, double dur,
                const char *args) {
    sep();
    fprintf(J.f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"%s\",\"name\":",
            pid, tid, ts, dur < 0 ? 0 : dur, cat);
    jstr(name);
    if (*args) fprintf(J.f, ",\"args\":{%s}", args);
    fputc('}', J.f);
}

static void flow(char ph, uint64_t id, int tid, double ts) {
    sep();
    fprintf(J.f, "{\"ph\":\"%c\",%s\"id\":%llu,\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"cat\":\"wake\",\"name\":\"wake\"}",
            ph, ph == 'f' ? "\"bp\":\"e\"," : "", (unsigned long long)id, tid, ts);
}

static void close_pg(int p, double ts) {
    plane_t *P = &J.planes[p];
    if (!P->g) return;
    char args[64];
    snprintf(args, sizeof args, "\"g\":%llu", (unsigned long long)P->g);
    xev(2, p, glabel(P->g), "g", P->gts, ts - P->gts, args);
    P->g = 0;
}

static void close_own(int p, double ts) {
    if (p < 0 || p >= J.nplanes) return;
    plane_t *P = &J.planes[p];
    close_pg(p, ts);
    if (P->owner < 0) return;
    char name[32];
    int m = T.slots[P->owner].m;
    if (m >= 0)
        snprintf(name, sizeof name, "M%d", m);
    else
        snprintf(name, sizeof name, "thread %d", P->owner);
    xev(2, p, name, "p", P->own_ts, ts - P->own_ts, "");
    P->owner = -1;
}

static void own(int p, int slot, double ts) {
    if (p < 0 || p >= J.nplanes) return;
    plane_t *P = &J.planes[p];
    P->seen = true;
    if (P->owner == slot) return;
    close_own(p, ts);
    P->owner = slot;
    P->own_ts = ts;
}

static void close_g(lane_t *L, int slot, double ts, const char *end) {
    if (!L->g) return;
    char args[96];
    snprintf(args, sizeof args, "\"g\":%llu,\"end\":\"%s\"", (unsigned long long)L->g, end);
    xev(1, lane_tid(slot), glabel(L->g), "g", L->gts, ts - L->gts, args);
    if (L->gp != NO_P && L->gp < J.nplanes && J.planes[L->gp].g == L->g) close_pg(L->gp, ts);
    L->g = 0;
    L->free_ts = ts;
}

static void close_spans(lane_t *L, int slot, double ts) {
    if (L->spin_ts >= 0) xev(1, lane_tid(slot), "spinning", "m", L->spin_ts, ts - L->spin_ts, "");
    if (L->sleep_ts >= 0) xev(1, lane_tid(slot), "idle", "m", L->sleep_ts, ts - L->sleep_ts, "");
    L->spin_ts = L->sleep_ts = -1;
}

static void open_g(lane_t *L, uint64_t g, int p, double ts) {
    L->g = g;
    L->gts = ts;
    L->gp = p;
    if (p != NO_P && p < J.nplanes) {
        close_pg(p, ts);
        J.planes[p].g = g;
        J.planes[p].gts = ts;
    }
}

static void instant(int slot, const char *name, const char *cat, double ts, const char *args) {
    xev(1, lane_tid(slot), name, cat, ts, 0, args);
}

static void one_event(const tev_t *e, double ts) {
    int slot = (int)e->slot;
    lane_t *L = &J.lanes[slot];
    char name[96], args[96];
    gi_t *g;
    if (e->p != NO_P && e->kind != CO__TEV_P_RELEASE) own(e->p, slot, ts);
    switch (e->kind) {
    case CO__TEV_CREATE:
        g = gget(e->a);
        if (!g) break;
        /* its entry function: by name where the dynamic symbols have it,
         * else its address (addr2line -f -e program ADDR names it) */
        snprintf(g->label, sizeof g->label, "G%llu 0x%llx", (unsigned long long)e->a,
                 (unsigned long long)e->b);
#if defined(__GLIBC__)
        Dl_info di;
        if (dladdr((void *)(uintptr_t)e->b, &di) && di.dli_sname)
            snprintf(g->label, sizeof g->label, "G%llu %s", (unsigned long long)e->a, di.dli_sname);
#endif
        L->last_create = e->a;
        snprintf(name, sizeof name, "create G%llu", (unsigned long long)e->a);
        snprintf(args, sizeof args, "\"g\":%llu", (unsigned long long)e->a);
        instant(slot, name, "create", ts, args);
        g->flow = ++J.flows;
        flow('s', g->flow, lane_tid(slot), ts);
        break;
    case CO__TEV_NAME_: {
        char nm[17] = {0};
        memcpy(nm, &e->a, 8);
        memcpy(nm + 8, &e->b, 8);
        g = gget(L->last_create);
        if (g) snprintf(g->label, sizeof g->label, "G%llu %s", (unsigned long long)L->last_create, nm);
        break;
    }
    case CO__TEV_START:
        close_spans(L, slot, ts);
        if (L->g) {
            J.anomalies++;
            close_g(L, slot, ts, "?");
        }
        open_g(L, e->a, e->p, ts);
        g = gget(e->a);
        if (g && g->exited) J.anomalies++;
        if (g) g->started = true;
        if (g && g->flow) {
            flow('f', g->flow, lane_tid(slot), ts);
            g->flow = 0;
        }
        break;
    case CO__TEV_PARK: case CO__TEV_YIELD: case CO__TEV_EXIT: case CO__TEV_BLOCK: {
        if (!L->g && (g = gget(e->a)) && !g->started && !g->exited) {
            /* it was running here when the trace started */
            g->started = true;
            open_g(L, e->a, e->p, L->free_ts);
        }
        if (L->g != e->a) {
            if (!L->g && L->block_ts >= 0 && L->block_g == e->a) {
                /* left co_blocking with no P to run on (it requeues), or
                 * by a panic: the call ends here */
                xev(1, lane_tid(slot), "co_blocking", "blocking", L->block_ts, ts - L->block_ts, "");
                L->block_ts = -1;
                if (e->kind == CO__TEV_EXIT && (g = gget(e->a))) g->exited = true;
                break;
            }
            J.anomalies++;
            close_g(L, slot, ts, "?");
            break;
        }
        char end[48];
        if (e->kind == CO__TEV_PARK)
            snprintf(end, sizeof end, "park: %s",
                     e->b < CO__WR_COUNT_ && wr_names[e->b] ? wr_names[e->b] : "?");
        else
            snprintf(end, sizeof end, "%s",
                     e->kind == CO__TEV_YIELD ? "yield" : e->kind == CO__TEV_EXIT ? "exit" : "co_blocking");
        close_g(L, slot, ts, end);
        if (e->kind == CO__TEV_EXIT && (g = gget(e->a))) g->exited = true;
        if (e->kind == CO__TEV_BLOCK) {
            L->block_g = e->a;
            L->block_ts = ts;
            if (e->p != NO_P) close_own(e->p, ts);
        }
        break;
    }
    case CO__TEV_BLOCK_END:
        if (L->g == e->a && L->block_ts < 0) break; /* it requeued and runs again: seen above */
        if (L->block_ts >= 0 && L->block_g == e->a) {
            snprintf(args, sizeof args, "\"g\":%llu", (unsigned long long)e->a);
            xev(1, lane_tid(slot), "co_blocking", "blocking", L->block_ts, ts - L->block_ts, args);
        } else {
            J.anomalies++;
        }
        L->block_ts = -1;
        if (L->g) close_g(L, slot, ts, "?");
        open_g(L, e->a, e->p, ts);
        break;
    case CO__TEV_READY:
        g = gget(e->a);
        if (!g) break;
        if (g->flow) J.anomalies++; /* readied twice without a start between */
        snprintf(name, sizeof name, "ready G%llu", (unsigned long long)e->a);
        snprintf(args, sizeof args, "\"g\":%llu", (unsigned long long)e->a);
        instant(slot, name, "ready", ts, args);
        g->flow = ++J.flows;
        flow('s', g->flow, lane_tid(slot), ts);
        break;
    case CO__TEV_P_ACQUIRE:
        own((int)e->a, slot, ts);
        break;
    case CO__TEV_P_RELEASE:
        close_own((int)e->a, ts);
        break;
    case CO__TEV_M_SPIN:
        if (L->spin_ts < 0) L->spin_ts = ts;
        break;
    case CO__TEV_M_SPIN_END:
        if (L->spin_ts >= 0) xev(1, lane_tid(slot), "spinning", "m", L->spin_ts, ts - L->spin_ts, "");
        L->spin_ts = -1;
        break;
    case CO__TEV_M_SLEEP:
        close_spans(L, slot, ts);
        L->sleep_ts = ts;
        break;
    case CO__TEV_M_WAKE:
        close_spans(L, slot, ts);
        break;
    case CO__TEV_STEAL:
        snprintf(name, sizeof name, "steal G%llu from P%llu", (unsigned long long)e->a,
                 (unsigned long long)e->b);
        snprintf(args, sizeof args, "\"g\":%llu,\"from\":%llu", (unsigned long long)e->a,
                 (unsigned long long)e->b);
        instant(slot, name, "steal", ts, args);
        break;
    case CO__TEV_RETAKE:
        L->sysmon = true;
        snprintf(name, sizeof name, "retake P%llu%s", (unsigned long long)e->a,
                 e->b ? " (spare lent)" : " (co_blocking)");
        instant(slot, name, "retake", ts, "");
        break;
    case CO__TEV_SWITCH_: {
        /* the G running here stops (if the trace has it: not after lost
         * events), then e->a starts (0: g0, no start) */
        int how = (int)(e->b & 0xff);
        uint64_t from = L->g ? L->g : L->block_ts >= 0 ? L->block_g : 0;
        if (how && from) {
            tev_t st = *e;
            st.kind = (uint16_t)how;
            st.a = from;
            st.b = e->b >> 8;
            one_event(&st, ts);
        }
        if (e->a) {
            tev_t go = *e;
            go.kind = CO__TEV_START;
            go.b = 0;
            one_event(&go, ts);
        }
        break;
    }
    case CO__TEV_CUR_:
        /* a coroutine running here since before the trace started (or
         * since before this thread's first event): its slice from then */
        if (e->a && !L->g && (g = gget(e->a)) && !g->started && !g->exited) {
            g->started = true;
            open_g(L, e->a, e->p, L->free_ts);
        }
        break;
    case CO__TEV_LOST_:
        snprintf(args, sizeof args, "\"count\":%llu", (unsigned long long)e->a);
        close_g(L, slot, ts, "lost");
        close_spans(L, slot, ts);
        instant(slot, "lost events", "lost", ts, args);
        J.lost += e->a;
        break;
    }
}

/* The scratch file's chunks (nr records) as events, into ev (room for
 * nr); returns how many. */
static size_t decode(const rec_t *raw, size_t nr, tev_t *ev) {
    size_t n = 0;
    for (size_t i = 0; i < nr;) {
        rec_t h = raw[i++];
        uint32_t slot = (uint32_t)h.w0;
        if (h.w0 >> 32 != HDR_MAGIC || slot >= MAX_SLOTS || h.w1 > nr - i) {
            J.anomalies++;
            break;
        }
        size_t end = i + (size_t)h.w1;
        while (i < end) {
            rec_t r = raw[i++];
            tev_t e = {
                .ts = T.c0 + (uint64_t)((int64_t)(r.w0 << (64 - TS_BITS)) >> (64 - TS_BITS)),
                .a = r.w1 >> 24,
                .b = (r.w1 >> 8) & 0xffff,
                .slot = slot,
                .kind = (uint16_t)(r.w1 & 0xff),
                .p = (uint16_t)(r.w0 >> TS_BITS),
            };
            if (e.kind == CO__TEV_CREATE) {
                bool named = e.b;
                if (i >= end) break;
                e.b = raw[i++].w0;
                ev[n++] = e;
                if (named && i < end) {
                    ev[n++] = (tev_t){.ts = e.ts, .a = raw[i].w0, .b = raw[i].w1, .slot = slot,
                                      .kind = CO__TEV_NAME_, .p = e.p};
                    i++;
                }
                continue;
            }
            ev[n++] = e;
        }
    }
    return n;
}

/* Writes the JSON from the scratch file. 0 or a negative code. */
static int convert(void) {
    struct stat st;
    if (fstat(T.rawfd, &st) < 0) return -errno;
    size_t nr = (size_t)st.st_size / sizeof(rec_t), n = 0;
    rec_t *raw = nr ? malloc(nr * sizeof *raw) : NULL;
    tev_t *ev = nr ? malloc(nr * sizeof *ev) : NULL;
    uint32_t *ix = nr ? malloc(nr * sizeof *ix) : NULL;
    int rc = 0;
    memset(&J, 0, sizeof J);
    J.nplanes = CO_MAX_PROCS < NO_P ? CO_MAX_PROCS : NO_P;
    J.lanes = calloc(MAX_SLOTS, sizeof *J.lanes);
    J.planes = calloc((size_t)J.nplanes, sizeof *J.planes);
    if ((nr && (!raw || !ev || !ix)) || !J.lanes || !J.planes) {
        rc = CO_ENOMEM;
        goto out;
    }
    for (size_t done = 0; done < nr * sizeof *raw;) {
        ssize_t r = pread(T.rawfd, (char *)raw + done, nr * sizeof *raw - done, (off_t)done);
        if (r <= 0) {
            rc = r < 0 ? -errno : CO_EINVAL;
            goto out;
        }
        done += (size_t)r;
    }
    n = decode(raw, nr, ev);
    free(raw);
    raw = NULL;
    for (size_t i = 0; i < n; i++) ix[i] = (uint32_t)i;
    J.ev = ev;
    if (n) qsort(ix, n, sizeof *ix, cmp_ev);
    J.f = T.out;
    J.first = true;
    J.ns_per_tick = T.ns_clock || T.c1 == T.c0 ? 1.0 : (double)(T.t1 - T.t0) / (double)(T.c1 - T.c0);
    for (int i = 0; i < MAX_SLOTS; i++) {
        J.lanes[i].spin_ts = J.lanes[i].sleep_ts = J.lanes[i].block_ts = -1;
        J.lanes[i].gp = NO_P;
    }
    for (int i = 0; i < J.nplanes; i++) J.planes[i].owner = -1;
    fputs("{\"traceEvents\":[\n", J.f);
#define US(c) ((double)(int64_t)((c) - T.c0) * J.ns_per_tick / 1000.0)
    for (size_t i = 0; i < n; i++) {
        const tev_t *e = &ev[ix[i]];
        if (e->slot >= MAX_SLOTS || e->kind == 0 || e->kind >= CO__TEV_COUNT_) {
            J.anomalies++;
            continue;
        }
        J.lanes[e->slot].used = true;
        one_event(e, US(e->ts));
    }
    /* the end: the clock at stop, or past it the last stamp (raised) */
    double end = US(T.c1);
    if (n && US(ev[ix[n - 1]].ts) > end) end = US(ev[ix[n - 1]].ts);
    for (int s = 0; s < MAX_SLOTS; s++) {
        lane_t *L = &J.lanes[s];
        if (!L->used) continue;
        close_g(L, s, end, "running");
        close_spans(L, s, end);
        if (L->block_ts >= 0)
            xev(1, lane_tid(s), "co_blocking", "blocking", L->block_ts, end - L->block_ts, "");
    }
    for (int p = 0; p < J.nplanes; p++) close_own(p, end);
#undef US
    /* lanes' names and order: threads (pid 1) above Ps (pid 2) */
    sep();
    fputs("{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"threads (M)\"}},\n"
          "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":1}},\n"
          "{\"ph\":\"M\",\"pid\":2,\"name\":\"process_name\",\"args\":{\"name\":\"processors (P)\"}},\n"
          "{\"ph\":\"M\",\"pid\":2,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":2}}",
          J.f);
    for (int s = 0; s < MAX_SLOTS; s++) {
        if (!J.lanes[s].used) continue;
        int m = T.slots[s].m;
        char nm[32];
        if (m >= 0)
            snprintf(nm, sizeof nm, "M%d", m);
        else
            snprintf(nm, sizeof nm, J.lanes[s].sysmon ? "sysmon" : "thread %d", s);
        fprintf(J.f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}",
                lane_tid(s), nm);
        fprintf(J.f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
                lane_tid(s), lane_tid(s));
    }
    for (int p = 0; p < J.nplanes; p++) {
        if (!J.planes[p].seen) continue;
        fprintf(J.f, ",\n{\"ph\":\"M\",\"pid\":2,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"P%d\"}}",
                p, p);
    }
    uint64_t lost = J.lost + (uint64_t)__atomic_load_n(&T.lost_global, __ATOMIC_RELAXED);
    for (int s = 0; s < MAX_SLOTS; s++) lost += T.slots[s].gen == T.gen ? T.slots[s].lost : 0;
    T.lost_total = (int64_t)lost;
    fprintf(J.f,
            "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"colony_trace\":1,\"events\":%zu,"
            "\"lost_events\":%llu,\"anomalies\":%llu,\"clock\":\"%s\",\"ns_per_tick\":%.6f,"
            "\"duration_us\":%.3f}}\n",
            n, (unsigned long long)lost, (unsigned long long)J.anomalies,
            T.ns_clock ? "CLOCK_MONOTONIC"
#if defined(__x86_64__)
                       : "rdtsc",
#else
                       : "cntvct",
#endif
            J.ns_per_tick, (double)(T.t1 - T.t0) / 1000.0);
out:
    free(raw);
    free(ev);
    free(ix);
    free(J.gt);
    free(J.lanes);
    free(J.planes);
    memset(&J, 0, sizeof J);
    return rc;
}

/* With the trace off (co__trace_on cleared, seq_cst): waits out every
 * event being recorded (a few instructions), then hands the slots' partial
 * chunks to the writer. Nobody records into the session after it: a
 * recorder that comes later sees the trace off (enter()). */
static void close_slots(void) {
    /* no slot is handed out after this */
    pthread_mutex_lock(&T.setup);
    T.setup_gen = 0;
    uint32_t n = T.nslots;
    pthread_mutex_unlock(&T.setup);
    /* every thread executes a full barrier: after it, a recorder's busy
     * store that came before its load of the flag is visible here */
    if (T.fenced)
        while (membarrier_(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) usleep(1000);
    for (uint32_t i = 0; i < n; i++) {
        slot_t *s = &T.slots[i];
        /* acquire: pairs with busy_release, the records are written;
         * seq_cst: against enter()'s exchange where there is no
         * membarrier (busy_take) */
        while (__atomic_load_n(s->busyp, T.fenced ? __ATOMIC_ACQUIRE : __ATOMIC_SEQ_CST))
            sched_yield();
        if (s->lost) {
            /* its count of dropped events goes in as a record: wait for
             * the writer to free a chunk (stop does not hold it up) */
            for (int k = 0; k < 2000 && s->n + 1 > s->cap; k++)
                if (!chunk_next(s)) usleep(1000);
            if (s->n + 1 <= s->cap) {
                rec_t *r = &T.evmem[(size_t)s->chunk * (size_t)T.chunk_ev + s->n++];
                r->w0 = w0_of(stamp(s, NO_P, NULL, NULL), NO_P);
                r->w1 = w1_of(CO__TEV_LOST_, s->lost > A_MASK ? A_MASK : s->lost, 0);
                s->lost = 0;
            }
        }
        if (s->chunk >= 0) {
            /* its partial chunk goes to the writer; the free one it may
             * take here is never used (the pool is freed after the join) */
            chunk_next(s);
        }
    }
}

int co_trace_start(const char *path) { return co__trace_start_with(path, 0, 0); }

int co_trace_stop(void) {
    pthread_mutex_lock(&T.api);
    if (!T.active) {
        pthread_mutex_unlock(&T.api);
        return CO_EINVAL;
    }
    T.active = false;
    if (T.pid != getpid()) { /* a fork's child: the writer is the parent's */
        __atomic_store_n(&co__trace_on, 0, __ATOMIC_SEQ_CST);
        fast_paths_traced_child();
        pthread_mutex_unlock(&T.api);
        return CO_EINVAL;
    }
    /* seq_cst: see co__trace_ev */
    __atomic_store_n(&co__trace_on, 0, __ATOMIC_SEQ_CST);
    fast_paths_traced(false);
    co__trace_hold_writer(false);
    close_slots();
    T.c1 = T.ns_clock ? (uint64_t)co_now() : co__cycles();
    T.t1 = co_now();
    __atomic_store_n(&T.wstop, 1, __ATOMIC_RELEASE);
    wake_writer();
    pthread_join(T.writer, NULL);
    __atomic_sub_fetch(&co__helper_threads, 1, __ATOMIC_RELAXED);
    int rc = T.werr ? -T.werr : convert();
    if (fclose(T.out) != 0 && rc == 0) rc = -errno;
    close(T.rawfd);
    T.out = NULL;
    free_buffers();
    pthread_mutex_unlock(&T.api);
    return rc;
}

/* ---- COLONY_TRACE=path ---------------------------------------------------- */

static void trace_atexit(void) {
    if (!__atomic_load_n(&co__trace_on, __ATOMIC_RELAXED)) return;
    int rc = co_trace_stop();
    if (rc < 0 && rc != CO_EINVAL) fprintf(stderr, "colony: COLONY_TRACE: writing the trace failed (%d)\n", rc);
}

__attribute__((constructor)) static void trace_env(void) {
    const char *p = getenv("COLONY_TRACE");
    if (!p || !*p) return;
    int rc = co_trace_start(p);
    if (rc < 0) {
        fprintf(stderr, "colony: COLONY_TRACE=%s: cannot trace (%s)\n", p,
                rc > -4096 ? strerror(-rc) : "invalid");
        return;
    }
    atexit(trace_atexit);
}
