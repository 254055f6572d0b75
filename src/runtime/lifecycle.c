/*
 * The runtime's life: co_init, co_shutdown and the counts they go by.
 *
 * The runtime is DOWN, UP or STOPPING (co__rt_state, runtime.h). Anything
 * may start it (co__ensure_init); co_shutdown stops it only when nothing
 * lives: no coroutine (the Ps' counts and live_global), no hold (pools,
 * tickers: co__rt_hold), no pending timer. Spawns from plain threads and
 * new holds count themselves in before they look at the state, and
 * co_shutdown stores STOPPING before its last look at the counts, so one
 * of the two always sees the other (see live_global).
 *
 * fork(): the child has one thread, and none of the runtime's. A
 * pthread_atfork handler (fork_child) resets the locks and counts a
 * parent's thread may have held or left half-way. If the runtime was down
 * that is all: the child may start its own. Otherwise the state becomes
 * FORKED for good, and every call that would need the parent's threads
 * is a fatal error rather than a call that returns 0 and whose work never
 * runs or that waits for ever: starting or spawning (co_init, through
 * co__ensure_init and the plain-thread counts), anything a thread pushes
 * for an M to run (a pool's token, a woken coroutine: co__wakep, see
 * fork_child), and a plain thread's wait (co__forked_check in park.c),
 * each on a path that is slow anyway. The thread that
 * called fork() is no M there, even if it forked inside a coroutine: it
 * goes on as a plain thread, so nothing of the parent's scheduler ever
 * runs in the child.
 */
#include "runtime/proc.h"
#include "runtime/trace.h"
#include "runtime/yslot.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* States of the runtime as a whole. Changed only under init_lock; STOPPING
 * while co_shutdown tears it down (co__ensure_init then waits on init_lock
 * and starts a fresh one). */
uint32_t co__rt_state; /* atomic: CO__RT_* (runtime.h); acquire load on the fast path */
/* Readers of the scheduler's state from any thread (co_count,
 * co_sched_stats, co_sched_runq_lens; and plain threads making a coroutine
 * runnable, co__plain_ready_begin, which need no check): each counts
 * itself in (seq_cst) and then checks co__rt_state (seq_cst); co_shutdown stores STOPPING
 * (seq_cst) and waits for the count to drop before it frees anything,
 * and co_init waits for it before it resets the state: a reader either
 * sees the runtime not up and touches nothing, or is waited for. */
static uint32_t stat_readers;
/* Live coroutines not counted on a P's ngo: plain threads' spawns, exits
 * with no P, retired Ps' counts. Outside co__sched, which co_init zeroes:
 * a plain thread's spawn counts itself here (seq_cst) before it checks
 * that the runtime is up (seq_cst), and co_shutdown stores STOPPING
 * (seq_cst) before its last look at the count: either the spawn sees the
 * runtime stopping and takes its count back (then retries on the next
 * runtime), or co_shutdown sees it and fails with CO_EBUSY. A count taken
 * back after a restart must land on the same counter. co_shutdown folds
 * the Ps' counts in before it frees them. */
static int64_t live_global;
/* Holds on the runtime (co__rt_hold): pools and tickers alive. Same
 * protocol with co_shutdown as live_global. */
static int64_t rt_holds;
static co__lock_t init_lock;
/* Registered under init_lock and never removed: the first nhooks stay as
 * they are, so they may be read after nhooks without the lock. */
static const co__rt_hook_t *hooks[CO_MAX_HOOKS];
static int nhooks;

void co__live_global_add(int64_t d) { __atomic_add_fetch(&live_global, d, __ATOMIC_SEQ_CST); }

/* Add one to *count (live_global or rt_holds), the runtime up, by their
 * protocol with co_shutdown (see live_global). If it is not up: with
 * `start`, start it again (co_init waits for a shutdown under way) and
 * retry: 0, or co_init's negative code; without, wait out a shutdown under
 * way (it ends with the runtime down, or up again if it failed): 0, or 1
 * if the runtime is down. Nothing is added unless 0 is returned. */
static int count_in_up(int64_t *count, bool start) {
    for (;;) {
        __atomic_add_fetch(count, 1, __ATOMIC_SEQ_CST);
        uint32_t st = __atomic_load_n(&co__rt_state, __ATOMIC_SEQ_CST);
        if (CO_LIKELY(st == CO__RT_UP)) return 0;
        __atomic_sub_fetch(count, 1, __ATOMIC_SEQ_CST);
        if (st == CO__RT_FORKED) co__forked_fatal();
        if (start) {
            int rc = co_init(NULL);
            if (rc < 0) return rc;
        } else if (st == CO__RT_DOWN) {
            return 1;
        } else {
            sched_yield();
        }
    }
}

/* Count a coroutine a plain thread is about to spawn, the runtime up. */
int co__plain_spawn_enter(void) { return count_in_up(&live_global, true); }

/* Holds by kind, for co_alive only: relaxed atomics, moved after rt_holds
 * is, never read to decide anything. */
static int64_t holds_by_kind[CO__HOLD_KINDS];

static void hold_kind_add(int kind, int64_t d) {
    if (kind >= 0 && kind < CO__HOLD_KINDS)
        __atomic_add_fetch(&holds_by_kind[kind], d, __ATOMIC_RELAXED);
}

int co__rt_hold(int kind) {
    int rc = count_in_up(&rt_holds, true);
    if (rc == 0) hold_kind_add(kind, 1);
    return rc;
}
void co__rt_unhold(int kind) {
    hold_kind_add(kind, -1);
    __atomic_sub_fetch(&rt_holds, 1, __ATOMIC_SEQ_CST);
}

/* A hold taken only if the runtime is up; false, and none taken, if it is
 * down (a shutdown under way is waited out). */
bool co__rt_hold_if_up(int kind) {
    if (count_in_up(&rt_holds, false) != 0) return false;
    hold_kind_add(kind, 1);
    return true;
}

int64_t co__rt_holds_of(int kind) {
    if (kind < 0 || kind >= CO__HOLD_KINDS) return 0;
    int64_t n = __atomic_load_n(&holds_by_kind[kind], __ATOMIC_RELAXED);
    return n < 0 ? 0 : n;
}

/* ---- init / shutdown ---------------------------------------------------- */

void co__at_shutdown(const co__rt_hook_t *h) {
    co__lock(&init_lock);
    for (int i = 0; i < nhooks; i++)
        if (hooks[i] == h) {
            co__unlock(&init_lock);
            return;
        }
    if (nhooks < CO_MAX_HOOKS) hooks[nhooks++] = h;
    co__unlock(&init_lock);
}

static int hooks_count(void) {
    co__lock(&init_lock);
    int n = nhooks;
    co__unlock(&init_lock);
    return n;
}

/* The holds on the runtime that the first n hooks give back. */
static int64_t hooks_holds(int n) {
    int64_t held = 0;
    for (int i = 0; i < n; i++)
        if (hooks[i]->holds) held += hooks[i]->holds();
    return held;
}

static int default_procs(void) {
    const char *e = getenv("COLONY_PROCS");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end == 0 && v > 0 && v <= CO_MAX_PROCS) return (int)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > CO_MAX_PROCS) n = CO_MAX_PROCS;
    return (int)n;
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void);

int co_init(const co_config_t *cfg) {
    if (__atomic_load_n(&co__rt_state, __ATOMIC_RELAXED) == CO__RT_FORKED) co__forked_fatal();
    /* before the runtime can first be up: a fork must find the handler */
    pthread_once(&atfork_once, atfork_register);
    if (cfg && (cfg->procs < 0 || cfg->procs > CO_MAX_PROCS)) return CO_EINVAL;
    if (cfg && cfg->stack_size != 0 &&
        (cfg->stack_size < CO_STACK_MIN || cfg->stack_size > CO_STACK_MAX))
        return CO_EINVAL;
    co_sched_t *s = &co__sched;
    co__lock(&init_lock);
    if (__atomic_load_n(&co__rt_state, __ATOMIC_ACQUIRE) == CO__RT_UP) {
        bool same = !cfg || ((cfg->procs == 0 || cfg->procs == s->nprocs) &&
                             (cfg->stack_size == 0 ||
                              co__stack_round(cfg->stack_size) == s->stack_size));
        co__unlock(&init_lock);
        return same ? 0 : CO_EINVAL;
    }
    /* A reader that saw the old runtime up may still be reading. */
    while (__atomic_load_n(&stat_readers, __ATOMIC_SEQ_CST) != 0) sched_yield();
    /* ids go on from the last runtime's (proc.h, midgen) */
    uint64_t goidgen = s->goidgen;
    int midgen = s->midgen;
    memset(s, 0, sizeof *s);
    s->goidgen = goidgen;
    s->midgen = midgen;
    s->nprocs = cfg && cfg->procs ? cfg->procs : default_procs();
    /* in whole pages: a size that is not would never equal a mapped one,
     * and every exit would unmap its stack */
    s->stack_size = co__stack_round(cfg && cfg->stack_size ? cfg->stack_size : CO_DEFAULT_STACK);
    co__trace_sync(); /* a trace started before (COLONY_TRACE) */
    s->start_ns = co_now();
    s->allp = calloc((size_t)s->nprocs, sizeof *s->allp);
    if (!s->allp) goto nomem;
    for (int i = s->nprocs - 1; i >= 0; i--) {
        co_p_t *p = calloc(1, sizeof *p);
        if (!p) goto nomem;
        p->id = i;
        s->allp[i] = p;
        co__pidleput_locked(p); /* single-threaded here: no lock needed yet */
    }
    co__stack_setup();
    int rc = co__netpoll_init();
    if (rc < 0) goto fail; /* no fd for epoll (EMFILE): nothing started yet */
    co__debug_parse_env();
    co__debug_signals_setup();
    co__yslot_init();
    co__base_init();
    /* Before the runtime is up: nobody can have used it if this fails (no
     * thread for sysmon: a runtime without it would never lend a P or
     * retry a coroutine waiting for a stack). */
    if (co__sysmon_start() != 0) {
        co__netpoll_fini();
        goto nomem;
    }
#ifdef CO_TSAN
    co__race_init(); /* what co_init set up happens before every M's start */
#endif
    __atomic_store_n(&co__rt_state, CO__RT_UP, __ATOMIC_RELEASE);
    co__unlock(&init_lock);
    return 0;
nomem:
    rc = CO_ENOMEM;
fail:
    if (s->allp)
        for (int i = 0; i < s->nprocs; i++) free(s->allp[i]);
    free(s->allp);
    s->allp = NULL;
    co__unlock(&init_lock);
    return rc;
}

/* ---- fork ----------------------------------------------------------------- */

/* One co_shutdown at a time: a second caller waits for the first and then
 * finds the runtime down (or still up, if the first failed). A plain mutex:
 * only plain threads get here. */
static pthread_mutex_t shutdown_mu = PTHREAD_MUTEX_INITIALIZER;

void co__forked_fatal(void) {
    co__fatal("colony used in a child of fork() (pid %d) while the parent's runtime was "
              "running: its threads are not here; only exec or _exit in such a child, or "
              "co_shutdown before fork()",
              (int)getpid());
}

/* What a parent's thread may have held or left half-way when it was
 * copied: locks, reader and user counts. Only this thread exists now. */
static void forget_locks_and_counts(void) {
    memset(&init_lock, 0, sizeof init_lock);
    pthread_mutex_t unlocked = PTHREAD_MUTEX_INITIALIZER;
    shutdown_mu = unlocked;
    stat_readers = 0;
    /* the parent's plain threads parked in colony calls are not here */
    co__plain_parked_forever = co__plain_parked_timed = 0;
    co__helper_threads = 0; /* the parent's trace writer, say */
    if (++co__plain_gen == 0) co__plain_gen = 1;
    for (int i = 0; i < nhooks; i++)
        if (hooks[i]->forget) hooks[i]->forget();
}

/* The child's pthread_atfork handler (see the top of this file). Cheap, so
 * that a fork followed by exec stays cheap: plain stores. */
static void fork_child(void) {
    forget_locks_and_counts();
    if (co__rt_state == CO__RT_DOWN) {
        /* Counts a parent's spawner had taken and was about to give back. */
        live_global = 0;
        rt_holds = 0;
        memset(holds_by_kind, 0, sizeof holds_by_kind);
        return;
    }
    co__rt_state = CO__RT_FORKED;
    /* No M is started or woken here (newm and co__wakep look at
     * `stopping`), and the scheduler looks idle, so that every push from
     * a thread (a spawn, a pool's token, a wake-up) calls co__wakep,
     * which finds `stopping` and, in such a child, fails: the check costs
     * the hot paths nothing. */
    co__sched.stopping = 1;
    co__sched.npidle = 1;
    co__sched.nmspinning = 0;
    co__tls_m_forget(); /* forked inside a coroutine: a plain thread here */
}

static void atfork_register(void) {
    if (pthread_atfork(NULL, NULL, fork_child) != 0)
        co__fatal("pthread_atfork failed: no memory for colony's fork handler");
}

/* For tests that fork: forget the parent's runtime (its threads do not
 * exist in the child) and start afresh. Leaks the old state on purpose. */
CO_HIDDEN int co__test_reset_after_fork(void);
int co__test_reset_after_fork(void) {
    forget_locks_and_counts();
    memset(&co__sched, 0, sizeof co__sched);
    co__compact_forget();
    live_global = 0; /* the parent's coroutines and pools are not ours */
    rt_holds = 0;
    memset(holds_by_kind, 0, sizeof holds_by_kind);
    co__tls_m_forget();
    co__netpoll_forget();
    __atomic_store_n(&co__rt_state, CO__RT_DOWN, __ATOMIC_RELEASE);
    return co_init(NULL);
}

/* The sum of the Ps' counts and the global one, under sched.lock (which
 * holds allp, pretiring and pspare still). Exact when nothing spawns or
 * exits meanwhile; otherwise a moment's approximation, as Go's. */
/* sched.lock held. The Ps' own counts: allp's and those retiring. */
static int64_t p_counts_locked(void) {
    co_sched_t *s = &co__sched;
    int64_t n = 0;
    for (int i = 0; s->allp && i < s->nprocs; i++)
        n += __atomic_load_n(&s->allp[i]->ngo, __ATOMIC_RELAXED);
    for (co_p_t *q = s->pretiring; q; q = q->link) n += __atomic_load_n(&q->ngo, __ATOMIC_RELAXED);
    return n;
}

static int64_t count_live(void) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    /* seq_cst: after co_shutdown's store of STOPPING (see live_global) */
    int64_t n = __atomic_load_n(&live_global, __ATOMIC_SEQ_CST) + p_counts_locked();
    co__unlock(&s->lock);
    return n < 0 ? 0 : n;
}

/* any_alive's co__g_visit_fn: one coroutine found is enough. */
static bool found_alive(co_g_t *g, uint32_t status, void *arg) {
    (void)g, (void)status;
    *(bool *)arg = true;
    return false;
}
/* co_shutdown's check: a coroutine alive all along is found for sure (its
 * status leaves DEAD/IDLE only at spawn and returns there only at exit). */
static bool any_alive(void) {
    bool alive = false;
    co__each_live_g(found_alive, &alive);
    return alive;
}

/* Shutdown: a P that no M holds, with its caches and timers. */
static void free_p(co_p_t *p) {
    co__gcache_free_p(p);
    co__timers_free(p);
    free(p);
}

static int shutdown_locked(void);

int co_shutdown(void) {
    if (co__getm()) return CO_EPERM; /* from inside the runtime */
    pthread_mutex_lock(&shutdown_mu);
    int rc = shutdown_locked();
    pthread_mutex_unlock(&shutdown_mu);
    return rc;
}

/* Shutdown, sched.lock held: every idle M off the idle list and awake
 * (it sees `stopping` and exits). */
static void wake_idle_ms_locked(void) {
    co_sched_t *s = &co__sched;
    for (co_m_t *m = s->midle; m; m = m->link) {
        m->onmidle = false;
        co__unstrand_locked(m);
        __atomic_store_n(&m->park, 1, __ATOMIC_RELEASE);
        co__futex_wake(&m->park, 1);
    }
    s->midle = NULL;
}

/* co_shutdown's grace: a coroutine that just signalled its waiter may
 * still be returning. Waits up to 100 ms for none to be alive; true if
 * none is. */
static bool quiet_after_grace(void) {
    for (int i = 0;; i++) {
        if (count_live() == 0 && !any_alive()) return true;
        if (i == 100) return false;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static int shutdown_locked(void) {
    co_sched_t *s = &co__sched;
    if (__atomic_load_n(&co__rt_state, __ATOMIC_ACQUIRE) != CO__RT_UP) return 0;
    /* Checked before the hooks run, so that CO_EBUSY changes nothing (the
     * default pool's busy workers are coroutines, counted here). The holds
     * the hooks give back (the default pool's) do not count. */
    if (!quiet_after_grace()) return CO_EBUSY;
    int n = hooks_count();
    if (__atomic_load_n(&rt_holds, __ATOMIC_SEQ_CST) != hooks_holds(n)) return CO_EBUSY;
    for (int i = 0; i < n; i++)
        if (hooks[i]->shutdown && hooks[i]->shutdown() != 0)
            return CO_EBUSY; /* a task came in meanwhile: left working */
    /* The same grace for what the hooks waited for: the default pool's
     * last workers are done with their tasks but may still be exiting (and
     * a plain thread's pool task, counted only once an M takes it from the
     * injection stack, may not have counted in the first look). The last
     * look below decides. */
    (void)quiet_after_grace();
    co__lock(&init_lock);
    /* STOPPING first, then the last look (see live_global): a plain
     * thread's spawn, a pool or a ticker made meanwhile is seen here, or
     * sees STOPPING and waits for init_lock. A timer still pending (a
     * context's deadline, a ticker) would outlive the heap it is on. */
    __atomic_store_n(&co__rt_state, CO__RT_STOPPING, __ATOMIC_SEQ_CST);
    if (count_live() != 0 || any_alive() || __atomic_load_n(&rt_holds, __ATOMIC_SEQ_CST) != 0 ||
        co__timers_pending() != 0) {
        __atomic_store_n(&co__rt_state, CO__RT_UP, __ATOMIC_RELEASE);
        co__unlock(&init_lock);
        return CO_EBUSY;
    }
    while (__atomic_load_n(&stat_readers, __ATOMIC_SEQ_CST) != 0) sched_yield();
    __atomic_store_n(&s->stopping, 1, __ATOMIC_SEQ_CST);
    co__sysmon_stop();
    /* Wake everyone: idle Ms, the poller. */
    co__lock(&s->lock);
    wake_idle_ms_locked();
    s->nmidle = 0;
    co_m_t *all = s->allm;
    co__unlock(&s->lock);
    for (co_m_t *m = all; m; m = m->alllink) {
        /* Wait for the M's last act, waking idle Ms and the poller again
         * every 10 ms (an M may have gone idle after the wake above), then
         * join it. Not pthread_timedjoin_np: TSan (LLVM 14) forgets the
         * thread when one times out and aborts on the next. */
        for (int i = 0;; i++) {
            if (i % 100 == 0) co__netpoll_break();
            if (__atomic_load_n(&m->exited, __ATOMIC_ACQUIRE)) break;
            struct timespec ts = {0, 100 * 1000};
            nanosleep(&ts, NULL);
            if (i % 100 != 99) continue;
            co__lock(&s->lock);
            wake_idle_ms_locked();
            co__unlock(&s->lock);
        }
        pthread_join(m->thread, NULL);
    }
    /* Unlinked before they are freed: a crash handler walks allm without
     * the lock (m_of_altstack), and must never reach a freed M. */
    co__lock(&s->lock);
    __atomic_store_n(&s->allm, NULL, __ATOMIC_RELEASE);
    co__unlock(&s->lock);
    while (all) {
        co_m_t *next = all->alllink;
        free(all);
        all = next;
    }
    /* Detach the Ps under sched.lock: co_count, from any thread, looks at
     * them under it. */
    co__lock(&s->lock);
    /* The Ps' counts sum to -live_global (nothing lives): fold them in, so
     * the next runtime starts at 0 (see live_global) */
    __atomic_add_fetch(&live_global, p_counts_locked(), __ATOMIC_SEQ_CST);
    co_p_t **allp = s->allp, *spare = s->pspare;
    s->allp = NULL;
    s->pspare = NULL;
    /* Every M has exited and retired its lent P; none is left pretiring.
     * Should one be, it is freed with the spares rather than leaked. */
    while (s->pretiring) {
        co_p_t *p = s->pretiring;
        s->pretiring = p->link;
        p->link = spare;
        spare = p;
    }
    co__unlock(&s->lock);
    for (int i = 0; i < s->nprocs; i++) free_p(allp[i]);
    while (spare) {
        co_p_t *p = spare;
        spare = p->link;
        free_p(p);
    }
    co__gcache_free_global();
    (void)co__unmap_retry(); /* any the kernel refused before */
    free(allp);
    co__globrunq_free();
    co__netpoll_fini();
#ifdef CO_TSAN
    co__race_shutdown(); /* every coroutine's exit happens before the return */
#endif
    __atomic_store_n(&co__rt_state, CO__RT_DOWN, __ATOMIC_RELEASE);
    co__unlock(&init_lock);
    return 0;
}

int co_procs(void) {
    if (co__ensure_init() < 0) return 0;
    return co__sched.nprocs;
}

bool co__stats_enter(void) {
    __atomic_add_fetch(&stat_readers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&co__rt_state, __ATOMIC_SEQ_CST) == CO__RT_UP) return true;
    __atomic_sub_fetch(&stat_readers, 1, __ATOMIC_SEQ_CST);
    return false;
}
void co__stats_exit(void) { __atomic_sub_fetch(&stat_readers, 1, __ATOMIC_SEQ_CST); }

/* A plain thread that makes a coroutine runnable (runtime.h). The
 * runtime is up (that coroutine is alive), so no check: once it is pushed
 * it may run and exit, and a co_shutdown then succeed while this thread
 * still wakes an M; counted as a reader, it is waited for. */
void co__plain_ready_begin(void) { __atomic_add_fetch(&stat_readers, 1, __ATOMIC_SEQ_CST); }

int co_count(void) {
    /* Not under init_lock: co_shutdown holds it while it joins sysmon,
     * whose schedtrace line counts coroutines. */
    if (!co__stats_enter()) return 0;
    int n = (int)count_live();
    co__stats_exit();
    return n;
}
