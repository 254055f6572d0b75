/*
 * The scheduler's types: G (coroutine), P (logical processor), M (OS thread)
 * and the global scheduler state. Types only, like Go's runtime2.go; the
 * code is in sched.c (switching, park/ready/yield, the M loop), runq.c
 * (run queues), proc.c (Ps and Ms), spawn.c (making coroutines), with
 * sched_impl.h their shared inline helpers, globq.c (the global run
 * queue), lifecycle.c (co_init, co_shutdown), main.c (co_main), stack.c,
 * gcache.c, timer.c, park.c (the wait layer), netpoll.c with its
 * backend, sysmon.c (sysmon, co_blocking), panic.c and debug.c.
 */
#ifndef COLONY_RUNTIME_PROC_H
#define COLONY_RUNTIME_PROC_H

#include "runtime/runtime.h"
#include "arch/ctx.h"
#include "base/san.h"
#include "base/testhook.h"

#include <pthread.h>

#define CO_RUNQ_SIZE 256   /* per-P ring, as Go's runq [256]guintptr */
#define CO_GFREE_LOCAL 256 /* dead Gs cached per P before spilling half to global */
#define CO_OBATCH 8        /* ring entries the owner claims at once (runqget) */
#define CO_FLIFO 256       /* fresh spawns the owner keeps to run newest first (runqget) */
#define CO_SFREE_LOCAL 32  /* free stacks cached per P before spilling half to global */
#define CO_MAX_PROCS 1024
#define CO_DEFAULT_STACK ((size_t)256 * 1024)

/* G status. Who may change it:
 *  RUNNABLE -> RUNNING : the M that took it off a run queue (it owns it now).
 *  RUNNING  -> WAITING : the running G itself, in co__park (post-switch).
 *  WAITING  -> RUNNABLE: whoever claimed its parker (co__unpark) or a timer.
 *  RUNNING  -> RUNNABLE: the G itself (yield; published post-switch).
 *  RUNNING  -> DEAD    : the G itself on exit (freed post-switch).
 * The stack of a RUNNABLE or WAITING G is owned by nobody: only the M that
 * next switches to it may touch it. */
enum { CO_G_IDLE = 0, CO_G_RUNNABLE, CO_G_RUNNING, CO_G_WAITING, CO_G_DEAD };

typedef struct co__stack {
    char *map;        /* mmap base (includes the guard page when guarded) */
    size_t map_size;
    char *lo;         /* lowest usable byte */
    size_t size;      /* usable bytes */
    bool guarded;     /* a guard page below lo; else a zero canary zone at lo */
    bool light_guard; /* that guard is a MADV_GUARD_INSTALL marker (no map entry) */
    unsigned vg_id;   /* valgrind stack id */
} co__stack_t;

#define CO_CANARY_BYTES 64 /* zero bytes at the bottom of an unguarded stack */

/* Laid out for the cache: what a spawn writes and a first run reads
 * (context, status, entry, id, FP words, whether it has a stack) sits in
 * the first 64 bytes. A queued G is usually cold: these cost one or two
 * misses to spawn it and to start it, not three or four. */
typedef struct co_g {
    co__ctx_t ctx;             /* saved context; valid while not RUNNING */
    uint32_t status;           /* atomic; CO_G_* (see above) */
    /* compact_on, is_g0 and trace_sw: gogo tests the three in one load
     * (any set: the G needs more than a plain switch). */
    uint8_t compact_on;        /* co_stack_compactable (compact.c): relaxed atomic, written
                                * by the G itself (and 0 by its spawn), read by the G's
                                * wait sites and by whoever switches to the G */
    bool is_g0;
    /* A switch to it is recorded (a trace is on: co__sched.traced). Relaxed
     * atomic, written under allg_lock: by trace.c for every G on the all-G
     * list as the trace goes on and off, by gslab.c as the G joins it. */
    uint8_t trace_sw;
    bool named;                /* name[] holds a name (else name[0] == 0) */
    void (*fn)(void *);
    void *arg;                 /* fn's argument; a takeover (co__take_unstarted) sets it
                                * to the taken task's, and co__ready_cold prefetches it */
    uint64_t id;
    void *panic_top;           /* co__panic_slot; only the G itself */
    uint64_t fpenv;            /* its creator's FP control words, to start with */
    /* Empty (map NULL) until the G first runs: a default-size stack is
     * attached then (gcache.c). Other sizes are allocated at spawn. */
    co__stack_t stack;
    /* When it last parked, in co__sched.coarse_ms units (about 1 ms,
     * wrapping after 49 days); written by the G itself as it parks, next to
     * the stack fields that park reads anyway. A relaxed atomic: co_dump
     * reads it from any thread for "[chan receive, 3 minutes]". */
    uint32_t waitsince;
    uint8_t cstate;            /* atomic: CO__CS_* (compact.c says who changes it) */
    int8_t wait_reason;        /* CO__WR_*, written by the G itself before parking, beside
                                * waitsince; relaxed atomic (co_dump reads it) */
    struct co_g *schedlink;    /* global run queue / stackwait lists, owned by the list's
                                * lock; the injection stack's link (globq.c), owned by
                                * its pusher, then by the M that takes the stack */
    struct co_g *alllink_next, *alllink_prev; /* all-G list, under sched.allg_lock */
    char name[32];
    /* Where it was made: the return address in its spawner's frame (the
     * code that called co_go / co_go_with / co__spawn; NULL for a pool
     * token's G) and the spawner coroutine's id (0: a plain thread). Set
     * by the spawn before the release store of RUNNABLE; read by co_dump. */
    void *gopc;
    uint64_t parent_id;
    /* Its waiter while it waits on a waitgroup (sync/waitgroup.c, through co__self_pkw): a release walks
     * these, records allocated close together, not the waiters' stacks,
     * a page each. The G's own while it waits; the waitgroup's lock
     * protects the links. */
    co__pkw_t wgwait;
    /* Its compaction (compact.c): while cstate is OFFERED, where its offer
     * is in its shard (under the shard's lock); while COMPACTED, the copy
     * of its stack's live part. */
    union {
        uint32_t cq_slot;
        struct co__cbuf *cbuf;
    };
    /* The stamp of the last trace event about it (trace.c): an event about
     * it is stamped after this one. A relaxed atomic, read and written only
     * while a trace is on, by whoever records an event about it. */
    uint64_t trace_ts;
    struct co__gslab *slab;       /* the slab its record was carved from (gslab.c); fixed */
#ifdef CO_ASAN
    void *asan_fake;           /* ASan fake stack of this fiber while switched out */
#endif
#ifdef CO_TSAN
    /* This lifetime's TSan fiber (race.c): made at spawn (a token's, when
     * its G is made), destroyed once it has exited and is off its stack. */
    void *tsan_fiber;
    /* This lifetime's happens-before key: a byte of its own on the heap,
     * freed at its exit (so the key's history goes with it). Every waker
     * that readies it releases on it, and it acquires it whenever a park
     * returns; the spawn releases on it too, for a takeover of it unstarted
     * (its fiber inherits the spawner's past). */
    void *tsan_key;
    void *tsan_tok;            /* a token's G: the token, acquired when it starts */
    uint32_t tsan_on;          /* atomic: its fiber is TSan's current one on some M */
#endif
} co_g_t;
#ifndef COLONY_UCONTEXT
_Static_assert(offsetof(co_g_t, stack.map) + sizeof(char *) <= 64,
               "a G's spawn and first-run fields fit its first cache line");
#endif

_Static_assert(offsetof(co_g_t, status) == CO__G_STATUS_OFFSET && CO_G_WAITING == CO__G_STATUS_WAITING,
               "runtime.h's co__g_set_waiting knows where a G's status is");
_Static_assert(offsetof(co_g_t, compact_on) == CO__G_COMPACT_OFFSET &&
                   offsetof(co_g_t, is_g0) == offsetof(co_g_t, compact_on) + 1 &&
                   sizeof(bool) == 1,
               "runtime.h's co__g_compact_on knows where a G's compact_on is; gogo reads "
               "it with is_g0 in one load");
_Static_assert(offsetof(co_g_t, trace_sw) == offsetof(co_g_t, compact_on) + 2 &&
                   offsetof(co_g_t, compact_on) % 4 == 0,
               "gogo reads compact_on, is_g0 and trace_sw in one aligned 32-bit load");

/* cstate: a G's compaction (compact.c). A G is OFFERED exactly while its
 * offer is in its shard's list; every change to or from OFFERED is made
 * under that shard's lock, with the entry's addition or removal.
 *  NONE -> OFFERED     : the G itself, parking in a compactable wait (co__compact_offer).
 *  OFFERED -> BUSY     : the compactor (sysmon), taking the entry; it alone then reads it.
 *  BUSY -> COMPACTED   : the compactor, its stack copied out and released.
 *  BUSY -> OFFERED     : the compactor, which left it as it was (its entry put back;
 *                        BUSY -> NONE where the shard has no room).
 *  OFFERED -> NONE     : a channel's waker that popped the G's waiter, before it
 *                        readies the G (co__compact_woken); else the M about to
 *                        run the G (co__compact_resume).
 *  COMPACTED -> NONE   : the M about to run the G, once the stack is back.
 * BUSY lasts a trylock, a copy and a madvise: the M that would run the G
 * waits it out. */
enum { CO__CS_NONE = 0, CO__CS_OFFERED, CO__CS_BUSY, CO__CS_COMPACTED };
CO_HIDDEN void co__compact_resume(co_g_t *g);     /* g about to run, compact_on set */
CO_HIDDEN int co__compact_scan(int64_t now);       /* sysmon, each round: how many compacted */
CO_HIDDEN void co__compact_forget(void);           /* a forked child's fresh start */

/* A global cache of free items (gcache.c): an array, so moving a batch in
 * or out under sched.gcache_lock copies pointers and never touches a cold G.
 * n: atomic (written under sched.gcache_lock, read lock-free as a hint). low:
 * the fewest items held since sysmon's last trim. */
typedef struct co__freevec {
    char *a;
    int n, cap, low;
} co__freevec_t;

/* P status. RUNNING: owned by an M (p->m); only that M changes it, except
 * SYSCALL -> IDLE by sysmon's retake (a CAS). IDLE: on the idle list, under
 * sched.lock. SYSCALL: its M is inside co_blocking and does not touch it. */
enum { CO_P_IDLE = 0, CO_P_RUNNING, CO_P_SYSCALL, CO_P_DEAD };

/* A timer heap entry: the deadline and the timer's slot (below) sit in the
 * heap's own array, so sifting neither loads nor writes a timer (timers
 * live on parked coroutines' stacks: cold memory, a page each). */
typedef struct co__theap {
    int64_t when;
    uint32_t slot; /* index into the P's tslots */
    uint32_t _pad;
} co__theap_t;
/* An entry of a P's timer run (timer.c): a timer added no earlier than the
 * run's last entry is appended there instead of going on the heap; t is
 * NULL once the timer was deleted (the entry stays until it reaches the
 * head or the run is compacted). */
typedef struct co__trun {
    int64_t when;
    co__timer_t *t;
} co__trun_t;
/* A P's timer slot: the timer, and the position of its heap entry (kept up
 * to date by every sift). A free slot chains the next free one in pos. */
typedef struct co__tslot {
    co__timer_t *t;
    int32_t pos;
    int32_t _pad;
} co__tslot_t;

typedef struct co_p {
    /* Its slot in allp. Set by co_init, or by sysmon when it puts a spare
     * P in service (under timers_lock: a thread holding a stale pointer to
     * this P reads it under that lock, co__timer_add). */
    int id;
    uint64_t goidcache, goidcacheend; /* owner only: ids [cache, end) are this P's to hand out */
    /* Coroutines spawned on this P minus those that exited on it (may be
     * negative). Written by the owner only (relaxed atomic stores), read
     * by co_count; folded into lifecycle.c's live_global when the P retires. Each
     * spawn and exit once bumped one shared counter, a cache line that
     * bounced between the spawning and the exiting M. */
    int64_t ngo;
    uint32_t status;           /* atomic; CO_P_* */
    struct co_m *m;            /* owner M while RUNNING/SYSCALL */
    struct co_p *link;         /* idle list, under sched.lock */
    uint32_t schedtick;        /* owner only; incremented per schedule */
    /* The yield slot (yslot.h): a coroutine that yielded with nothing else
     * queued here, invisible to thieves. Atomic; the owner inside a window
     * of yseq, or anyone by exchange once retire is set. */
    uint32_t yseq;             /* atomic; owner-written: odd while a window is open */
    co_g_t *yieldg;
    uint32_t syscalltick;      /* owner; incremented per co_blocking (sysmon reads) */

    /* Run queue: the owner pushes at tail (store-release); the owner and
     * thieves pop at head by CAS (acquire/release). runnext: atomic pointer,
     * owner stores, owner and thieves CAS it out. */
    uint32_t runqhead;
    uint32_t runqtail;
    co_g_t *runq[CO_RUNQ_SIZE];
    co_g_t *runnext;
    /* Owner only: runq_sp[i] is the saved stack pointer of the G the owner
     * put in runq[i] (NULL if it never ran), for prefetching its stack a
     * turn ahead without reading a G this M may no longer own (runqget,
     * sched_impl.h). Stale for slots a steal filled: a prefetch of any
     * address is harmless. */
    void *runq_sp[CO_RUNQ_SIZE];

    /* The owner's batch (runqget, sched_impl.h): entries claimed from the
     * ring's head by one CAS, to run before the ring; ob[obn - 1] runs
     * first, ob_sp[i] is ob[i]'s runq_sp. Thieves never look here. obn is
     * atomic; the owner changes it and the arrays inside a yield-slot
     * window (yslot.h), anyone else only once p->retire is set, by an
     * exchange of obn (the owner retiring p, or sysmon's co__yslot_steal:
     * one of them gets the entries). */
    uint32_t obn;
    co_g_t *ob[CO_OBATCH];
    void *ob_sp[CO_OBATCH];

    /* The fresh deque (sched_impl.h's "work-first"): coroutines spawned
     * while runnext was taken and never run, the owner's to run newest
     * first (at flbot - 1), thieves' to take oldest first (at fltop): a
     * Chase-Lev deque. fl[i % CO_FLIFO] for fltop <= i < flbot. The owner
     * writes flbot and the slots; it and thieves move fltop by CAS
     * (seq_cst); an owner's pop stores flbot before it loads fltop, a
     * thief loads fltop before flbot, each with a seq_cst fence between
     * (the pair orders them, so the last entry goes to one of them); the
     * slots are
     * relaxed (published by the release of flbot's store). fl_seen,
     * fl_age and fl_limit: owner only, the fairness tick's record of the
     * oldest entry (runq.c's flifo_fair). */
    uint32_t fltop;
    uint32_t flbot;
    uint32_t fl_age, fl_limit;
    co_g_t *fl_seen;
    co_g_t *fl[CO_FLIFO];

    /* gcache.c, owner only: dead Gs (bare: no stack) and free stacks of
     * the runtime's default size. */
    int gfree_n, sfree_n;
    co_g_t *gfree[CO_GFREE_LOCAL];
    co__stack_t sfree[CO_SFREE_LOCAL];

    /* Timers: a 4-ary min-heap on `when`, the run and the overflow list
     * (timer.c). timers_lock protects timers_closed, the heap, the run, the
     * list, the tslots fields and every pending co__timer_t's slot/p/links.
     * timer0_when mirrors the earliest of the heap's root, the run's head
     * and the list's head (0 if all are empty); written under the lock with
     * release, read lock-free with acquire by any M. */
    co__lock_t timers_lock;
    co__theap_t *timers;       /* entries carry `when` and a slot: sifting never touches a timer */
    int timers_len, timers_cap;
    co__tslot_t *tslots;       /* slot -> timer and heap position */
    int tslots_hw, tslots_cap; /* slots ever handed out; allocated */
    int tslot_free;            /* first free slot + 1 (0: none) */
    co__trun_t *trun;          /* the run: a ring of trun_mask + 1 entries, `when`
                                * non-decreasing from trun_head to trun_tail */
    uint32_t trun_head, trun_tail; /* free-running indexes; the head entry is live */
    uint32_t trun_mask;        /* ring size - 1 (a power of two), 0 before the first */
    uint32_t trun_dead;        /* deleted entries between head and tail */
    co__timer_t *tlist;        /* the overflow list: timers that found no memory for the
                                * heap or the run, sorted by `when` (timer.c) */
    int tlist_len;
    int64_t timer0_when;
    bool timers_closed;        /* retired (on pspare): timers go to allp[id] instead */

    /* Set by sysmon when it lent a spare P in place of this one because its
     * coroutine ran > 10 ms without yielding; the owner M retires the P at
     * its next scheduler entry. atomic: sysmon store-release, owner acquire. */
    uint32_t retire;
    /* How many times it was lent away so (retire set). Written by sysmon
     * under sched.lock, relaxed; read by tests: a P seen again with the
     * same count was not retired meanwhile, even if it came back from
     * pspare to the same M. */
    uint32_t lends;

    /* sysmon bookkeeping (sysmon only). */
    uint32_t sysmon_tick;
    int64_t sysmon_when;
    uint32_t sysmon_schedtick;
    uint32_t sysmon_timertick; /* sysmon only: schedtick when it last saw overdue timers here */
    int64_t sysmon_schedwhen;
    /* sysmon only, judging whether the host runs the owner M's thread once
     * p has gone FORCE_PREEMPT_NS without a schedule (lend_spare): the
     * thread's CPU time (ns) when the judging began and at its last look,
     * and when that look was; sysmon_judgewhen < sysmon_schedwhen: not
     * judged since the last schedule */
    int64_t sysmon_cpu0, sysmon_cpuns, sysmon_judgewhen;
    int64_t sysmon_preemptwhen; /* sysmon only: when it last asked p's coroutine to yield */
    /* 1: sysmon asks the coroutine running on p to yield at its next I/O
     * call (co__preempt_point). Atomic: set by sysmon's CAS 0 -> 1, cleared
     * by whoever exchanges it back to 0 (the owner yielding, sysmon seeing
     * a schedule, a lend reusing p); each 0 -> 1 counts in
     * co__preempt_pending and each 1 -> 0 uncounts it. */
    uint32_t preempt;
    /* The owner M's thread id and CPU clock: relaxed atomics, stored by
     * whoever gives p an M (owner_hint), read by sysmon as a hint (a stale
     * or mismatched pair costs one round's judgement). */
    int owner_tid;
    clockid_t owner_clock;
} co_p_t;

typedef struct co_m {
    int id;
#ifdef CO_TSAN
    co_g_t *tsan_cur;          /* whose fiber is TSan's current one on this thread (race.c) */
#endif
    pthread_t thread;
    int tid;                   /* the thread's kernel id, set before it runs anything */
    clockid_t cpuclock;        /* the thread's CPU-time clock, set with tid */
    uint32_t exited;           /* atomic: set (release) by the M's thread as its last act;
                                * co_shutdown joins it only then */
    co_g_t g0;                 /* the scheduler context on the thread's own stack */
    co_g_t *curg;              /* running G, or NULL while in g0 */
    co_p_t *p;                 /* attached P (owned), NULL when none */
    co_p_t *nextp;             /* P handed over by startm, read after wake-up */
    co_p_t *syscallp;          /* P left in SYSCALL by co_blocking; written by the M
                                * itself, read by the deadlock check (atomic, relaxed:
                                * that check looks twice, 500 ms apart) */
    bool spinning;             /* this M is looking for work (counted in sched.nmspinning) */
    uint32_t park;             /* futex word: 0 sleeping, 1 woken */
    struct co_m *link;         /* idle M list, under sched.lock */
    struct co_m *alllink;      /* all Ms, under sched.lock */
    uint64_t fastrand;         /* owner only */

    /* Post-switch action: set by a G before it switches away, run by
     * whoever resumes on this M (the next G or g0) right after the switch,
     * when the old G's stack is no longer in use. Owner only. */
    void (*post_fn)(co_g_t *g, void *arg);
    co_g_t *post_g;
    void *post_arg;
    /* A G taken to run whose first stack must be mapped: a G switching to
     * it goes to g0 instead, which maps it and runs it next. The mapping
     * (an mmap and two madvise calls) then comes after the switching G's
     * post-switch action, which may release a lock that others wait on (a
     * parked receive's channel). Owner only. */
    co_g_t *g0_next;

    void *altstack;            /* sigaltstack for the overflow report */
    bool altstack_heap;        /* altstack came from malloc (mmap refused) */
    bool exiting;
    uint64_t tcheck;           /* co__cycles() at run_post's last timer check; owner only */
    bool np_batch;             /* inside co__netpoll's event loop, or past the first callback
                                * of co__timers_run: the network's and the timers' wake-ups
                                * go to the ring's tail, not runnext; owner only */
    /* Gs that must run on this M (co_thread_return): FIFO through
     * schedlink, under sched.lock. The owner peeks at affq (relaxed) as a
     * hint and takes from it under the lock; a missed push is found at the
     * owner's next look (findrunnable, every 61st schedule, stopm). */
    co_g_t *affq, *affq_tail;
    bool onmidle;              /* under sched.lock: asleep in stopm, on the idle M list */
    /* Under sched.lock: on the idle list with Gs on affq and no P handed
     * to it (counted in sched.nstranded). Set by stopm and post_affine,
     * cleared by whatever takes it off the idle list. */
    bool stranded;
    bool transit;              /* under sched.lock, set and cleared by the M itself: counted
                                * in sched.ntransit */
    uint32_t pin;              /* co__pin_enter's sequence, odd inside a pinned section:
                                * stored by the owner only (relaxed on entry, release on
                                * exit), loaded by co__pin_wait (acquire) */
} co_m_t;

#define CO_MAX_HOOKS 8

typedef struct co_sched {
    /* Grouped by who writes: the read-mostly fields, the lock and what it
     * guards, the spinning-M counters every co__ready reads, and the live
     * count every spawn and exit writes each get their own cache lines. */
    _Alignas(64) int nprocs;
    co_p_t **allp;             /* entries: atomic; replaced only by sysmon (lending) */
    size_t stack_size;
    /* stack_size, or 0 while a trace is on: goexit hands its stack
     * straight to a G that never ran only for this size, and that hand-over
     * records nothing, so a traced exit takes gogo's way. Written with
     * traced below (same orders), read relaxed. */
    size_t handover_size;
    int64_t start_ns;
    int64_t schedtrace_ms;     /* COLONY_DEBUG=schedtrace=MS; 0 off */
    int chaos;                 /* COLONY_DEBUG=chaos: widen race windows (tests) */
    int no_yslot;              /* COLONY_DEBUG=noyieldslot: never use the yield slot */
    int no_deadlock;           /* COLONY_DEBUG=nodeadlock: no deadlock detection (deadlock.c) */
    /* Whether the global queue's front list (fronthead) is non-empty: a hint
     * every schedule reads (runq_next_fast), so it sits in this read-mostly
     * line, not under the lock's. Stored under lock by the front list's
     * push and pop only (relaxed; readers take the lock before acting). */
    uint32_t front_pending;

    /* lock protects: pidle, npidle writes, midle, nmidle, allm, mcount,
     * runq (the global queue), runqsize, pspare, pretiring. */
    _Alignas(64) co__lock_t lock;
    co_p_t *pidle;
    co_m_t *midle;
    int nmidle;
    /* The M in co__block_idle's blocking poll, without a P, while it may
     * still take one handed over (its nextp) instead of co__startm making
     * a thread; NULL when none, or once handed one or leaving the poll. */
    co_m_t *poller;
    co_m_t *allm;
    int mcount;
    /* lock: the next M's id. Like goidgen, kept by co_init across a
     * restart, so that ids name one thread (one G) over the process's
     * life: a trace spanning a restart keeps both runtimes apart. */
    int midgen;
    /* Ms in transit: without a P, outside co_blocking's fn, on their way to
     * sleep (stopm, the poller) or to a P. co__startm, finding no M asleep,
     * leaves its P idle for one of them rather than make a thread while one
     * is about to be spare (nwanted counts those Ps); an M leaving transit
     * takes one then (an idle P, at stopm or the poll), or wakes for it if
     * it took a P of its own. nwanted <= ntransit, and <= npidle (a P left
     * idle and taken by another M is that M's to run). Both under lock. */
    int ntransit;
    int nwanted;
    /* The global run queue: arrays of G pointers in chunks, so moving Gs in
     * and out under the lock never touches the Gs themselves (a linked list
     * through cold Gs cost a cache miss per G with the lock held). If a
     * chunk cannot be allocated, Gs queue on the list through schedlink
     * (runqhead/runqtail) instead, taken after the chunks. */
    struct co__gchunk *rq_first, *rq_last, *rq_spare;
    int rq_nspare;
    co_g_t *runqhead, *runqtail;
    struct co__token *tokhead, *toktail; /* tokens, when no chunk could be allocated */
    /* Gs back from co_blocking that found no P: FIFO through schedlink,
     * taken before everything else of the global queue (they must not
     * wait behind it); counted in runqsize. */
    co_g_t *fronthead, *fronttail;
    int64_t runqsize;          /* atomic for lock-free emptiness checks: all Gs queued */
    co_p_t *pspare;            /* retired Ps, ready to be lent again */
    co_p_t *pretiring;         /* Ps lent away whose M has not retired them yet */
    int naffq;                 /* Gs queued on Ms' affq (under lock): a P going idle
                                * goes to an idle M with one instead (pidleput_locked) */
    /* Ms with co_m_t.stranded set: written under sched.lock; loaded
     * relaxed, as a hint, by every 61st schedule (runq_next_fast), which
     * then goes to g0 to hand its P over (co__relieve_stranded), and by
     * sysmon. With every P busy, nothing else would give those Ms one. */
    uint32_t nstranded;

    /* gcache_lock protects the caches of gcache.c: gfree, sfree,
     * stackwait, tokwait, nstackwait. Not sched.lock: dead Gs spilled by
     * one M and taken by another would contend with the global run queue. */
    _Alignas(64) co__lock_t gcache_lock;
    co__freevec_t gfree;       /* dead Gs (co_g_t *) */
    co__freevec_t sfree;       /* free default-size stacks (co__stack_t) */
    co_g_t *stackwait;         /* Gs that found no stack to start on */
    struct co__token *tokwait, *tokwait_tail; /* tokens that found no memory for a G */
    int nstackwait;            /* atomic (written under gcache_lock, read lock-free):
                                * how many wait on stackwait and tokwait; sysmon
                                * requeues them every STACKWAIT_RETRY_NS */

    /* npidle and traced, side by side: co_yield's fast path tests both
     * with one 64-bit load (sched.c's yield_stand_aside). */
    _Alignas(64) union {
        struct {
            uint32_t npidle; /* atomic (written under lock, read lock-free) */
            /* co__trace_on as the fast paths see it (trace.c, co__trace_sync):
             * set before it goes on, cleared after it goes off (seq_cst
             * stores, relaxed loads). A reader that sees it takes the traced
             * way, whose record re-checks co__trace_on. */
            uint32_t traced;
        };
        uint64_t npidle_traced; /* both at once (x86-64; relaxed load) */
    };
    uint32_t nmspinning;       /* atomic; Ms spinning (see sched.c's essay) */

    /* The injection stack (globq.c): run-queue entries from plain threads,
     * pushed by CAS (seq_cst) and taken whole by an exchange (seq_cst) by an
     * M about to take sched.lock for the global queue. Its own line: the
     * pushing thread and the Ms polling it would drag the lock's line along. */
    _Alignas(64) co_g_t *inject;

    _Alignas(64) uint64_t goidgen; /* atomic: id generator; Ps take ids in batches */

    /* One M at a time blocks in co__netpoll with a timeout (the poller).
     * poll_until: atomic; when it will wake (0: nobody is blocked, INT64_MAX:
     * blocked without timeout). Adding an earlier timer breaks it. */
    _Alignas(64) uint32_t polling; /* atomic flag: an M owns the blocking poll */
    /* seq_cst: set by co__startm when it hands a P to the poller (below),
     * before it reads the poll's sleeping flag to break it; the poller
     * stores that flag (seq_cst) and then reads this one before it blocks,
     * so one of them sees the other. Cleared by the poller under lock. */
    uint32_t poller_given;
    int64_t poll_until;
    int64_t lastpoll;          /* atomic: last co__netpoll time */
    /* co_now() >> 20 (units of 1.05 ms), as of sysmon's last round (at
     * most 10 ms old while the runtime is up): a clock a park can read
     * for free. Relaxed atomic: written by co_init and sysmon, read by
     * parks and co_dump; only a hint. */
    uint32_t coarse_ms;

    uint32_t stopping;         /* atomic; set by co_shutdown */

    /* all Gs (for co_dump), under allg_lock */
    co__lock_t allg_lock;
    co_g_t *allg;

    pthread_t sysmon_thread;
    uint32_t sysmon_wake;      /* futex word to kick sysmon out of a long sleep */
    uint32_t sysmon_sleeping;  /* atomic: sysmon in a long (>1 ms) sleep */
} co_sched_t;

extern co_sched_t co__sched;

/* A reader of the scheduler's state from any thread: true if the runtime
 * is up, and then it stays allocated until co__stats_exit (lifecycle.c). */
CO_HIDDEN bool co__stats_enter(void);
CO_HIDDEN void co__stats_exit(void);
/* A plain thread making a coroutine runnable (a spawn, a wake-up) holds the
 * scheduler from co__plain_ready_begin to co__plain_ready_end, around the
 * push and its last look at the scheduler (the wake-up of an M after it):
 * that coroutine may run and exit at once, and co_shutdown then succeed;
 * it waits for the hold (as for a reader). Not needed for a pool's tokens:
 * the pool holds the runtime for as long as a submit may run. lifecycle.c. */
CO_HIDDEN void co__plain_ready_begin(void);
static inline void co__plain_ready_end(void) { co__stats_exit(); }
static inline co_p_t *co__allp(int i) {
    return __atomic_load_n(&co__sched.allp[i], __ATOMIC_ACQUIRE);
}

/* m takes p: the hint sysmon reads to judge whether the host runs p's
 * owner (see owner_tid). */
static inline void co__p_owner_hint(co_p_t *p, co_m_t *m) {
    __atomic_store_n(&p->owner_tid, m->tid, __ATOMIC_RELAXED);
    __atomic_store_n(&p->owner_clock, m->cpuclock, __ATOMIC_RELAXED);
}

/* The walk of the all-G list (spawn.c), for co_dump, co_alive, co_shutdown
 * and the deadlock check: fn(g, status, arg) for each G whose status is
 * RUNNABLE, RUNNING or WAITING, until fn returns false. status is g's as
 * loaded (acquire: pairs with the spawn's release store of RUNNABLE, so
 * what g_init wrote is seen); it may change at once, so what fn reports is
 * a snapshot. fn runs under sched.allg_lock, a leaf lock (co_dump takes the
 * stack walk lock under it, a leaf too): it takes no other lock
 * of colony's, never spawns, parks, yields or frees a G, and reads g only
 * (g stays allocated until fn returns: freeing one takes the lock). The
 * caller keeps the runtime up meanwhile (co__stats_enter, or it is the
 * runtime's own: shutdown, sysmon). */
typedef bool co__g_visit_fn(co_g_t *g, uint32_t status, void *arg);
CO_HIDDEN void co__each_live_g(co__g_visit_fn *fn, void *arg);

/* Internal functions shared by the runtime files. */
CO_HIDDEN co_m_t *co__getm(void);         /* noinline; NULL on a plain thread */
CO_HIDDEN void co__preempt_clear(co_p_t *p); /* sysmon.c: withdraw p's request to yield */
CO_HIDDEN void co__ready(co_g_t *g);      /* make a WAITING G runnable (runnext) */
/* co__park_current for a caller that already has co__getm() (its M, read
 * after its last switch). */
CO_HIDDEN void co__park_m(co_m_t *m, void (*post)(co_g_t *, void *), void *arg, int reason);
CO_HIDDEN void co__wakep(void);
CO_HIDDEN void co__startm(co_p_t *p, bool spinning);
CO_HIDDEN void co__handoffp(co_p_t *p);
CO_HIDDEN co_p_t *co__pidleget(void);
CO_HIDDEN void co__transit_begin(co_m_t *m);     /* m is in transit (sched.ntransit) */
CO_HIDDEN void co__transit_begin_locked(co_m_t *m); /* the same, sched.lock held */
CO_HIDDEN void co__transit_end(co_m_t *m);       /* m, in transit, took a P itself */
/* An idle P, or, with none, m in transit (in one section: sched.lock). */
CO_HIDDEN co_p_t *co__pidleget_or_transit(co_m_t *m);
CO_HIDDEN void co__transit_pause(void); /* chaos and tests: sleep a little in transit */
CO_HIDDEN extern uint64_t co__transit_taken; /* Ps taken at sleep, left for an M in transit */
/* sched.lock held, s->naffq > 0: hand p to an M asleep on the idle list
 * with Gs on its affq; false if there is none (sched.c) */
CO_HIDDEN bool co__affine_handoff_locked(co_p_t *p);
/* sched.lock held: m, on the idle list with Gs on its affq, waits for a
 * P (co_m_t.stranded); co__unstrand_locked when it leaves the list. */
CO_HIDDEN void co__strand_locked(co_m_t *m);
CO_HIDDEN void co__unstrand_locked(co_m_t *m);
/* The current G, on a P-less M (co_blocking_on_thread's way back), waits
 * on its own M's affq to go on there once the M gets a P (sched.c). */
CO_HIDDEN void co__park_home(void);
/* g0 of m, which holds a P: give it to a stranded M; false if none. */
CO_HIDDEN bool co__relieve_stranded(co_m_t *m);
CO_HIDDEN co_p_t *co__pidleget_locked(void); /* sched.lock held: an idle P, or NULL */
/* m's first affine G, or NULL (sched.c) */
CO_HIDDEN co_g_t *co__affq_take(co_m_t *m);
/* Run-queue entries: in the Ps' rings (runq.c), globq.c's global queue
 * and its injection stack. Ring entries carry a tag in bit 0 (Gs are at least
 * 8-byte aligned): set when the G never ran (it has no stack yet), so that
 * co__take_unstarted (spawn.c) can pass over any other head without taking
 * it. A hint kept only in the rings: every consumer strips it, and the
 * global queue holds bare pointers. */
#define RQ_FRESH ((uintptr_t)1)
/* Bit 1: not a G but a token (co__spawn_token): a coroutine to be, made
 * into a G only by whoever takes it to run it (token_g, sched_impl.h). Kept in
 * the rings and in the global queue. */
#define RQ_TOKEN ((uintptr_t)2)
static inline bool rq_is_token(co_g_t *e) { return ((uintptr_t)e & RQ_TOKEN) != 0; }
static inline co_g_t *rq_unfresh(co_g_t *e) { return (co_g_t *)((uintptr_t)e & ~RQ_FRESH); }
static inline co_g_t *rq_strip(co_g_t *e) {
    return (co_g_t *)((uintptr_t)e & ~(RQ_FRESH | RQ_TOKEN));
}
/* globq.c: the global run queue and the injection stack */
CO_HIDDEN void co__globrunqput(co_g_t **gs, int n); /* n Gs, in order, to the global queue */
CO_HIDDEN void co__globrunqput_front(co_g_t *g); /* ahead of the global queue (FIFO among these) */
/* A plain thread's run-queue entry (a G, or a tagged token), lock-free. */
CO_HIDDEN void co__globrunq_inject(co_g_t *e);
/* Entries in the global queue (the injection stack moved into it first). */
CO_HIDDEN int64_t co__globrunq_len(void);
/* Take sched.lock for the global queue, the injection stack moved into it
 * first; true if that moved anything (the caller then wakes an M after the
 * unlock if entries are still queued: see globq.c). */
CO_HIDDEN bool co__globq_lock(void);
/* sched.lock held. How many entries a P takes from the global queue (a
 * fair share, at most max if max > 0, at most half a ring; 0 if it is
 * empty), already counted out of runqsize: pop them with
 * co__globrunq_pop_n_locked, n at a time into out[] (as many as counted). */
static inline int co__globrunq_share_locked(int max) {
    co_sched_t *s = &co__sched;
    int64_t sz = s->runqsize;
    if (sz == 0) return 0;
    int64_t n = sz / s->nprocs + 1; /* as Go's globrunqget */
    if (n > sz) n = sz;
    if (max > 0 && n > max) n = max;
    if (n > CO_RUNQ_SIZE / 2) n = CO_RUNQ_SIZE / 2;
    __atomic_store_n(&s->runqsize, sz - n, __ATOMIC_RELEASE);
    return (int)n;
}
CO_HIDDEN void co__globrunq_pop_n_locked(co_g_t **out, int n);
/* Whether the global queue or the injection stack holds anything (loads
 * with `order`: seq_cst where it is half of a StoreLoad pairing). */
static inline bool co__globrunq_pending(int order) {
    return __atomic_load_n(&co__sched.runqsize, order) > 0 ||
           __atomic_load_n(&co__sched.inject, order) != NULL;
}
CO_HIDDEN void co__globrunq_free(void);              /* shutdown: the chunks */
/* lifecycle.c: the runtime's counts (see live_global there) */
CO_HIDDEN void co__live_global_add(int64_t d); /* coroutines counted on no P */
/* Count a coroutine a plain thread is about to spawn, the runtime up: 0,
 * or a negative code (nothing counted then). */
CO_HIDDEN int co__plain_spawn_enter(void);
/* the scheduler's helpers (sched.c, runq.c, proc.c) for the other files */
CO_HIDDEN void co__pidleput_locked(co_p_t *p); /* sched.lock held, or no M yet */
CO_HIDDEN void co__tls_m_forget(void);         /* this thread is no M (after a fork) */
CO_HIDDEN bool co__runq_empty(co_p_t *p);
/* sysmon lending np in p's place, before np is handed off (nobody else
 * pushes onto np yet): p's fresh deque onto np's, oldest first, so that
 * np's M runs it in the same order (runq.c; sched_impl.h's
 * "work-first"); what does not fit goes to the global queue. */
CO_HIDDEN void co__flifo_move(co_p_t *p, co_p_t *np);
CO_HIDDEN bool co__work_stranded(void);
CO_HIDDEN int co__runq_len(co_p_t *p);
CO_HIDDEN uint32_t co__fastrand(void);
/* gcache.c: dead Gs and free stacks */
CO_HIDDEN co_g_t *co__gfget_slow(co_p_t *p);
CO_HIDDEN void co__gfput_slow(co_p_t *p, co_g_t *g);
/* A bare G, or NULL; p may be NULL. Inline: the P's own cache (p's owner
 * only), the rest in gcache.c; a call each way would cost every spawn and
 * exit. */
static inline co_g_t *co__gfget(co_p_t *p) {
    if (CO_LIKELY(p && p->gfree_n)) {
        co_g_t *g = p->gfree[--p->gfree_n];
        /* the next spawn's G: start its (likely cold) first line coming */
        if (p->gfree_n) co__prefetchw(p->gfree[p->gfree_n - 1]);
        return g;
    }
    return co__gfget_slow(p);
}
/* A dead G: it and its stack to the caches (a stackless one to p's own
 * inline, while there is room). */
static inline void co__gfput(co_p_t *p, co_g_t *g) {
    if (CO_LIKELY(p && !g->stack.map && p->gfree_n < CO_GFREE_LOCAL)) {
        p->gfree[p->gfree_n++] = g;
        return;
    }
    co__gfput_slow(p, g);
}
CO_HIDDEN void co__g_release(co_g_t *g);          /* free a G that is on no list */
/* gslab.c: G records. A zeroed record on the all-G list (NULL without
 * memory); a record back, off the list; shutdown, every record back. */
CO_HIDDEN co_g_t *co__gslab_get(void);
CO_HIDDEN void co__gslab_put(co_g_t *g);
CO_HIDDEN void co__gslab_fini(void);
CO_HIDDEN int64_t co__gslab_slabs(void); /* slabs mapped now (tests read it) */
/* g's first stack, from the caches or (may_map) a new mapping: 1 attached,
 * 0 g waits on stackwait, -1 (!may_map) the caches are empty. */
CO_HIDDEN int co__stack_attach(co_m_t *m, co_g_t *g, bool may_map);
CO_HIDDEN extern void (*co__test_stack_map_probe)(void); /* tests: before each batch is mapped */
CO_HIDDEN int co__stackwait_retry(void);          /* sysmon: requeue them; returns how many */
/* Append t to the token list head..tail (linked through t->link). */
static inline void co__toklist_append(struct co__token **head, struct co__token **tail,
                                      struct co__token *t) {
    t->link = NULL;
    if (*tail)
        (*tail)->link = t;
    else
        *head = t;
    *tail = t;
}
/* A token that found no memory for its G waits on tokwait (gcache.c). */
CO_HIDDEN void co__tokwait_put(struct co__token *t);
/* Queue a token on the global run queue again (globq.c). */
CO_HIDDEN void co__token_requeue(struct co__token *t);
CO_HIDDEN int co__gfree_trim(int keep);           /* sysmon: free cold Gs and stacks */
CO_HIDDEN void co__gcache_free_p(co_p_t *p);      /* shutdown */
CO_HIDDEN void co__gcache_free_global(void);      /* shutdown */
/* stack.c */
CO_HIDDEN void co__stack_setup(void);
CO_HIDDEN bool co__stack_light_guards_probe(void); /* MADV_GUARD_INSTALL guards for real */
CO_HIDDEN int co__stack_alloc(co__stack_t *s, size_t size);
/* A stack size as it is mapped: rounded up to whole pages. Sizes are
 * compared with the default's (reuse through the caches, the exit
 * hand-over), so each is rounded where it enters (co_init, co_go_with). */
CO_HIDDEN size_t co__stack_round(size_t size);
CO_HIDDEN int co__stack_alloc_n(co__stack_t *out, int n, size_t size); /* >= 1 made, or error */
/* The same with the top pages of only `need` of them committed ahead
 * (where guards are batched): the lowest, out[0], and the highest, which
 * a cache that takes the last put first hands out first. */
CO_HIDDEN int co__stack_alloc_need(co__stack_t *out, int n, size_t size, int need);
/* How many default stacks to map at once: 8 while each gets a guard of
 * its own cheaply, CO_STACK_BATCH_MAX once they do not (fewer bottom
 * guards, stack.c). */
#define CO_STACK_BATCH_MAX 64
CO_HIDDEN int co__stack_batch(void);
/* How many batches of CO_STACK_BATCH_MAX to map at once (1, growing to
 * CO_STACK_RUNS_MAX with the stacks mapped now), and the mapping of them:
 * every batch but one handed to put, that one into out (CO_STACK_BATCH_MAX
 * entries); returns how many out holds, or CO_ENOMEM (stack.c). */
#define CO_STACK_RUNS_MAX 4
CO_HIDDEN int co__stack_runs(void);
CO_HIDDEN int co__stack_alloc_runs(co__stack_t *out, int runs, size_t size, int need,
                                   void (*put)(co__stack_t *run, int n, void *arg), void *arg);
CO_HIDDEN void co__stack_free(co__stack_t *s);
/* co_dump's walk of a parked stack holds this; a stack's munmap waits for it */
/* co_dump, straight to out when !buffered (the crash report) */
CO_HIDDEN void co__dump_to(FILE *out, bool buffered);
CO_HIDDEN void co__stack_walk_lock(void);
CO_HIDDEN void co__stack_walk_unlock(void);
/* munmap(p, len), then *dec down and *inc up by one (either may be NULL);
 * stack: under the walk lock (co_dump's walk reads parked stacks). If the
 * kernel refuses (at vm.max_map_count), the pages are released and the
 * range is kept for co__unmap_retry, which moves the counts once it goes;
 * false then. */
CO_HIDDEN bool co__unmap(void *p, size_t len, int64_t *dec, int64_t *inc, bool stack);
CO_HIDDEN int co__unmap_retry(void);     /* sysmon, co_shutdown: ranges unmapped now */
CO_HIDDEN int co__unmap_deferred(void);  /* ranges waiting (tests) */
CO_HIDDEN int64_t co__unmap_lost(void);  /* ranges left mapped for good (tests) */
CO_HIDDEN int64_t co__stacks_mapped(void);        /* stacks mapped now (tests read it) */
CO_HIDDEN int64_t co__stacks_mapped_total(void);  /* stacks ever mapped (tests) */
CO_HIDDEN void co__stack_check_canary(co_g_t *g);
/* Called when g switches away or exits: an unguarded stack's canary must
 * still be zero (stack.c). Guarded stacks and g0 have nothing to check. */
static inline void co__stack_check(co_g_t *g) {
    if (!g->stack.guarded && !g->is_g0) co__stack_check_canary(g);
}
CO_HIDDEN void co__stack_m_init(co_m_t *m);
CO_HIDDEN void co__stack_m_fini(co_m_t *m);
/* timer.c */
CO_HIDDEN int co__timers_run(co_p_t *p, int64_t now);  /* run due timers; returns how many */
/* True on a thread while co__timers_run runs callbacks there without a P
 * (sysmon, an idle M): what they ready goes to the front of the global
 * queue, not behind everything queued there. Owner thread only. */
CO_HIDDEN extern __thread bool co__timer_ready_front __attribute__((tls_model("initial-exec")));
CO_HIDDEN int64_t co__timers_next(void);               /* earliest timer over all Ps, 0 if none */
/* Timers pending on the Ps (each P's count under its lock): co_shutdown
 * refuses to free heaps that still hold some. */
CO_HIDDEN int64_t co__timers_pending(void);
CO_HIDDEN void co__timers_free(co_p_t *p);
/* Every timer of from onto to (or onto to's replacement in allp, if to has
 * retired). close: from is retiring and takes no timer again until lent. */
CO_HIDDEN void co__timers_move(co_p_t *from, co_p_t *to, bool close);
CO_HIDDEN void co__retire_p(co_m_t *m);                   /* proc.c: drop a lent-away P */
CO_HIDDEN void co__runq_drain_global(co_p_t *p);          /* runq.c: its queue to the global one */
/* sysmon.c */
CO_HIDDEN int co__sysmon_start(void);
CO_HIDDEN void co__sysmon_stop(void);
CO_HIDDEN void co__sysmon_kick(void);
/* procstat.c: sysmon's looks at /proc, read by a thread with a file table
 * of its own so that no number of the program's is ever taken; started at
 * the first look, gone after a second without one. co__procstat_start
 * before sysmon starts, co__procstat_stop after it has been joined. */
CO_HIDDEN void co__procstat_start(void);
CO_HIDDEN void co__procstat_stop(void);
/* sysmon: tid's state letter; 0 if it cannot be read, CO__PROCSTAT_LATE
 * if the reader did not answer in time (it may not have run). */
CO_HIDDEN int co__procstat_state(int tid);
#define CO__PROCSTAT_LATE '?'
CO_HIDDEN int co__procstat_threads(void); /* sysmon: the process's threads, -1 unknown or late */
CO_HIDDEN int co__procstat_threads_own(void); /* sysmon: threads of its own now, 1 or 0 */
/* debug.c */
CO_HIDDEN void co__schedtrace(FILE *out);
/* Deadlock detection (deadlock.c), called by sysmon each round. */
CO_HIDDEN void co__deadlock_check(int64_t now);
/* Plain threads parked in a colony call (park.c counts them, deadlock.c
 * reads them): atomics, relaxed. */
CO_HIDDEN extern uint32_t co__plain_parked_forever, co__plain_parked_timed;
/* Which process generation counted a parker (co__parker_t.counted): never
 * 0; a fork's child moves it on and zeroes both counts (lifecycle.c), so a
 * parent's thread, not in the child, is neither counted there nor uncounted
 * if a child wakes its copied parker. Written only by the child's single
 * thread at fork; relaxed. */
CO_HIDDEN extern uint32_t co__plain_gen;
/* colony's own threads that never wake a coroutine, beside the Ms, sysmon
 * and the /proc reader (the trace's writer): counted from before their
 * pthread_create to after their join, so the deadlock check may count
 * them as its own. Atomic, relaxed; zeroed in a fork's child. */
CO_HIDDEN extern uint32_t co__helper_threads;
CO_HIDDEN void co__debug_parse_env(void);
CO_HIDDEN void co__debug_signals_setup(void); /* SIGQUIT dumps (debug.c) */
CO_HIDDEN void co__debug_sysmon_tick(void);   /* each sysmon round: a pending dump */
CO_HIDDEN void co__debug_leaks(void);         /* co_main's function returned */
#ifdef CO_TSAN
/* race.c: the race detector's edges (docs/hacking.md, "The race detector") */
CO_HIDDEN void co__race_spawn(co_g_t *g);   /* the spawner: g's fiber and key */
CO_HIDDEN void co__race_token_g(co_g_t *g, co__token_t *t); /* g made for token t */
CO_HIDDEN void co__race_start(co_g_t *g);   /* g, first thing: its spawn's past */
CO_HIDDEN void co__race_exit(co_g_t *g);    /* g, last thing before goexit */
CO_HIDDEN void co__race_take(co_g_t *g);    /* unstarted g, taken over: its spawn's past is the
                                             * taker's; its fiber and key go */
CO_HIDDEN void co__race_ready(co_g_t *g);   /* a waker, readying g: its past is g's */
CO_HIDDEN void co__race_woken(co_g_t *g);   /* g, back from a park: its wakers' past */
CO_HIDDEN void co__race_init(void);          /* co_init, before the runtime is up */
CO_HIDDEN void co__race_init_seen(void);     /* a plain thread: co_init's past (its fds) */
CO_HIDDEN void co__m_race_start(co_m_t *m); /* an M's thread, first thing: its g0's fiber */
CO_HIDDEN void co__race_enter(co_m_t *m);   /* after a switch: the fiber of whoever runs now */
CO_HIDDEN void co__race_timers_run(co_m_t *m, co_p_t *p, int64_t now); /* on g0's fiber */
CO_HIDDEN void co__race_shutdown(void);     /* co_shutdown: every exit's past */
#endif

#endif
