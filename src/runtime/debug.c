/* COLONY_DEBUG, schedtrace, co_sched_stats and co_dump. */
#include "runtime/proc.h"
#include "runtime/unwind.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

/* COLONY_DEBUG=leaks=1: written by co__debug_parse_env on the init path,
 * before any coroutine runs; read when co_main's function returns. */
static bool leaks_report;

void co__debug_parse_env(void) {
    const char *e = getenv("COLONY_DEBUG");
    leaks_report = false;
    if (!e) return;
    const char *k = strstr(e, "schedtrace=");
    if (k) {
        /* at most a year between lines: MS * 1000000 stays far from overflow
         * (an overflowed period printed a line every half millisecond) */
        long long ms = atoll(k + strlen("schedtrace="));
        const long long year_ms = 365LL * 24 * 3600 * 1000;
        co__sched.schedtrace_ms = ms < 0 ? 0 : ms > year_ms ? year_ms : ms;
    }
    /* chaos: a test mode that makes the scheduler's rare interleavings
     * common. A spinning M sometimes stalls for a few ms (as when the OS
     * preempts it on a loaded machine) and sysmon lends Ps after 1 ms of
     * no scheduling instead of 10 ms. Behaviour must not change. */
    if (strstr(e, "chaos")) co__sched.chaos = 1;
    /* noyieldslot: yields always go through the ring, and owners take
     * from it one at a time, with no batch (yslot.h), for A/B
     * measurements */
    if (strstr(e, "noyieldslot")) co__sched.no_yslot = 1;
    /* nodeadlock: never report "all coroutines are asleep" (deadlock.c) */
    if (strstr(e, "nodeadlock")) co__sched.no_deadlock = 1;
    leaks_report = strstr(e, "leaks=1") != NULL;
}

/* When co_main's function returns, the coroutines still alive besides it,
 * each with its entry function and stack (co_dump). */
void co__debug_leaks(void) {
    if (!leaks_report) return;
    int n = co_count();
    if (n <= 1) return; /* only co_main's own */
    fprintf(stderr,
            "colony: leaks: %d coroutine%s still alive when co_main's function returned "
            "(the dump lists 'main' too, still running):\n",
            n - 1, n - 1 == 1 ? "" : "s");
    co_dump(stderr);
    fflush(stderr);
}

/* SIGQUIT (Go's default): every coroutine's stack, then exit status 2.
 * The handler only raises a flag and wakes sysmon, which dumps: co_dump
 * takes locks that the interrupted thread may hold. */
static uint32_t sigquit_pending; /* atomic: handler sets (release), sysmon reads (acquire) */
static bool sigquit_installed;   /* co__debug_signals_setup, on the init path */

static void sigquit_handler(int sig) {
    /* No runtime (after co_shutdown): no sysmon to dump, so the default
     * action, as if colony had never been there */
    if (__atomic_load_n(&co__rt_state, __ATOMIC_ACQUIRE) != CO__RT_UP) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    __atomic_store_n(&sigquit_pending, 1, __ATOMIC_RELEASE);
    co__sysmon_kick(); /* an atomic add and a futex wake: async-signal-safe */
}

void co__debug_signals_setup(void) {
    /* a SIGQUIT the last runtime took but did not act on is not this one's */
    __atomic_store_n(&sigquit_pending, 0, __ATOMIC_RELAXED);
    const char *e = getenv("COLONY_DEBUG");
    if (sigquit_installed || (e && strstr(e, "nosigquit"))) return;
    /* Only where the program left SIGQUIT to its default: an ignored or
     * handled SIGQUIT stays the program's. */
    struct sigaction old;
    if (sigaction(SIGQUIT, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sigquit_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGQUIT, &sa, NULL) == 0) sigquit_installed = true;
}

void co__debug_sysmon_tick(void) {
    co__deadlock_check(co_now());
    if (!__atomic_load_n(&sigquit_pending, __ATOMIC_ACQUIRE)) return;
    fprintf(stderr, "SIGQUIT: quit\n\n");
    co_dump(stderr);
    fflush(stderr);
    _exit(2);
}

void co_sched_stats(co_sched_stats_t *out) {
    /* void: it cannot answer CO_EINVAL (colony.h's NULL rule) */
    if (!out) co__fatal("co_sched_stats(NULL): NULL stats");
    memset(out, 0, sizeof *out);
    co_sched_t *s = &co__sched;
    if (!co__stats_enter()) return; /* not running: zeros */
    out->global_runq = co__globrunq_len();
    co__lock(&s->lock);
    out->procs = s->nprocs;
    out->idle_procs = (int)s->npidle;
    out->threads = s->mcount + 1; /* + sysmon */
    out->idle_threads = s->nmidle;
    co__unlock(&s->lock);
    out->spinning_threads = (int)__atomic_load_n(&s->nmspinning, __ATOMIC_ACQUIRE);
    out->coroutines = co_count();
    co__stats_exit();
}

int co_sched_runq_lens(int *lens, int max) {
    co_sched_t *s = &co__sched;
    if (max <= 0) return 0; /* nothing to write: lens may be NULL */
    if (!lens) return CO_EINVAL;
    if (!co__stats_enter()) return 0;
    /* under sched.lock, which holds allp still (a lent P is swapped in
     * under it) */
    co__lock(&s->lock);
    int n = 0;
    if (s->allp) {
        n = s->nprocs < max ? s->nprocs : max;
        for (int i = 0; i < n; i++) lens[i] = co__runq_len(co__allp(i));
    }
    co__unlock(&s->lock);
    co__stats_exit();
    return n;
}

void co__schedtrace(FILE *out) {
    co_sched_stats_t st;
    co_sched_stats(&st);
    if (st.procs == 0) return; /* shutting down */
    /* Every P's queue length (up to 1024 of them, "256 " each at most):
     * on the heap, since a coroutine with a small stack may call co_dump.
     * Without memory, the line stops after the first 64. */
    int small[64], *lens = small, cap = 64;
    char sbuf[1024], *buf = sbuf;
    size_t bufsz = sizeof sbuf;
    if (st.procs > 64) {
        int *l = malloc((size_t)st.procs * sizeof *l);
        char *b = malloc((size_t)st.procs * 12 + 256);
        if (l && b) {
            lens = l;
            cap = st.procs;
            buf = b;
            bufsz = (size_t)st.procs * 12 + 256;
        } else {
            free(l);
            free(b);
        }
    }
    int n = snprintf(buf, bufsz,
                     "SCHED %lldms: gomaxprocs=%d idleprocs=%d threads=%d spinningthreads=%d "
                     "idlethreads=%d runqueue=%lld [",
                     (long long)((co_now() - co__sched.start_ns) / 1000000), st.procs,
                     st.idle_procs, st.threads, st.spinning_threads, st.idle_threads,
                     (long long)st.global_runq);
    int np = co_sched_runq_lens(lens, cap);
    for (int i = 0; i < np && n < (int)bufsz - 16; i++)
        n += snprintf(buf + n, bufsz - (size_t)n, i ? " %d" : "%d", lens[i]);
    fprintf(out, "%s]\n", buf);
    fflush(out);
    if (lens != small) free(lens);
    if (buf != sbuf) free(buf);
}

static const char *const wait_reasons[CO__WR_COUNT_] = {
    [CO__WR_NONE] = "", [CO__WR_SLEEP] = "sleep", [CO__WR_CHAN_SEND] = "chan send",
    [CO__WR_CHAN_RECV] = "chan receive", [CO__WR_SELECT] = "select",
    [CO__WR_MUTEX] = "sync.Mutex.Lock", [CO__WR_RWMUTEX] = "sync.RWMutex",
    [CO__WR_COND] = "sync.Cond.Wait", [CO__WR_WAITGROUP] = "sync.WaitGroup.Wait",
    [CO__WR_SEM] = "semacquire", [CO__WR_ONCE] = "sync.Once", [CO__WR_POOL] = "pool",
    [CO__WR_IO] = "IO wait", [CO__WR_MAIN] = "co_main", [CO__WR_GROUP] = "group",
};

#define CO_DUMP_FRAMES 32
#define SYM_CACHE 512

/* Names already looked up, by address: a dump of many coroutines shows the
 * same few functions, and a lookup reads the ELF symbol tables. Direct
 * mapped; only co_dump touches it, under sched.allg_lock (its walk). */
static struct {
    void *pc;
    char name[120];
} sym_cache[SYM_CACHE];

static const char *sym_of(void *pc) {
    size_t h = ((uintptr_t)pc >> 2) * 0x9E3779B97F4A7C15ull >> 55; /* 9 bits */
    if (sym_cache[h].pc != pc) {
        co__symbolize(pc, sym_cache[h].name, sizeof sym_cache[h].name);
        sym_cache[h].pc = pc;
    }
    return sym_cache[h].name;
}

/* One coroutine's frames into pcs, before anything of it is printed (a
 * print may block on a slow reader, long enough for a parked coroutine to
 * wake and exit, and its stack to go): unwound from its saved context when
 * it is parked (WAITING) or from here when it is the caller. The count;
 * -1 for a coroutine running or runnable elsewhere (its stack may be in
 * use), -2 for one that woke while it was unwound, -3 for one compacted
 * (its frames are dropped: the walk may have read a stack being reused or
 * released). */
static int unwind_g(co_g_t *g, uint32_t status, co_g_t *self, void **pcs) {
    if (g == self) return co__unwind_self(pcs, CO_DUMP_FRAMES);
    if (status != CO_G_WAITING) return -1;
    /* No stack is unmapped while the walk lock is held; one unmapped
     * before it was taken was its coroutine's after that one's exit, which
     * the status, loaded again under the lock (acquire), shows. */
    co__stack_walk_lock();
    int n = __atomic_load_n(&g->status, __ATOMIC_ACQUIRE) == CO_G_WAITING
                ? co__unwind_parked(g, pcs, CO_DUMP_FRAMES)
                : -2;
    co__stack_walk_unlock();
    if (n == -2) return -2;
    /* looked at after the walk: sysmon may have claimed it meanwhile (the
     * walk then read pages being released) */
    if (__atomic_load_n(&g->cstate, __ATOMIC_ACQUIRE) >= CO__CS_BUSY) return -3;
    if (__atomic_load_n(&g->status, __ATOMIC_ACQUIRE) != CO_G_WAITING) return -2;
    return n;
}

static void dump_frames(FILE *out, co_g_t *g, uint32_t status, void **pcs, int n) {
    fprintf(out, "  entry: %s\n", sym_of((void *)(uintptr_t)g->fn));
    if (n == -1)
        fprintf(out, "  (%s on another thread: stack not shown)\n",
                status == CO_G_RUNNING ? "running" : "runnable");
    else if (n == -2)
        fprintf(out, "  (woke while dumped: frames not shown)\n");
    else if (n == -3)
        fprintf(out, "  (stack compacted while parked: frames not shown)\n");
    else if (n == 0)
        fprintf(out, "  (no frames: unwinder %s)\n", co__unwinder());
    for (int i = 0; i < n; i++) fprintf(out, "  %s\n", sym_of(pcs[i]));
}

/* Go's "created by": the spawner's frame and the spawner, if known. */
static void dump_creator(FILE *out, co_g_t *g) {
    if (!g->gopc) return;
    if (g->parent_id)
        fprintf(out, "  created by %s in coroutine %llu\n", sym_of(g->gopc),
                (unsigned long long)g->parent_id);
    else
        fprintf(out, "  created by %s on a plain thread\n", sym_of(g->gopc));
}

/* How long a waiting coroutine has waited, Go's way but finer: nothing
 * under a second (a dump of a busy program stays quiet), then seconds,
 * then minutes from two minutes on. The park read sysmon's coarse clock,
 * which lags by up to a sysmon round (10 ms, more on a host that does not
 * run sysmon), so a wait may show a little longer, never shorter: the
 * dump's own time is read afresh, in the same 2^20 ns units. */
static void wait_for(char *buf, size_t len, co_g_t *g) {
    uint32_t since = __atomic_load_n(&g->waitsince, __ATOMIC_RELAXED);
    uint32_t now = (uint32_t)((uint64_t)co_now() >> 20);
    uint64_t sec = (uint64_t)(uint32_t)(now - since) * (1u << 20) / 1000000000u;
    buf[0] = 0;
    if (sec >= 120)
        snprintf(buf, len, ", %llu minutes", (unsigned long long)(sec / 60));
    else if (sec >= 1)
        snprintf(buf, len, ", %llu second%s", (unsigned long long)sec, sec == 1 ? "" : "s");
}

struct dump_walk {
    FILE *out;
    co_g_t *self; /* the caller's coroutine, or NULL on a plain thread */
};

/* One coroutine's entry in co_dump: a co__g_visit_fn. */
static bool dump_g(co_g_t *g, uint32_t status, void *arg) {
    static const char *const st[] = {"idle", "runnable", "running", "waiting", "dead"};
    struct dump_walk *w = arg;
    FILE *out = w->out;
    void *pcs[CO_DUMP_FRAMES];
    int n = unwind_g(g, status, w->self, pcs); /* first: see unwind_g */
    /* A record that exits and is reused for a new coroutine during these
     * few reads may show that one's id and name: a snapshot, like the rest. */
    int wr = __atomic_load_n(&g->wait_reason, __ATOMIC_RELAXED);
    char waited[32] = "";
    if (status == CO_G_WAITING) wait_for(waited, sizeof waited, g);
    fprintf(out, "coroutine %llu%s%s%s [%s%s%s%s]:\n", (unsigned long long)g->id,
            g->name[0] ? " '" : "", g->name, g->name[0] ? "'" : "", st[status],
            status == CO_G_WAITING && wr > 0 && wr < CO__WR_COUNT_ ? ", " : "",
            status == CO_G_WAITING && wr > 0 && wr < CO__WR_COUNT_ ? wait_reasons[wr] : "",
            waited);
    dump_frames(out, g, status, pcs, n);
    dump_creator(out, g);
    return true;
}

/* co_dump. buffered: the coroutines' entries are written into memory
 * during the walk, under the all-coroutines lock, and to out after it, so
 * that a reader of out that is slow (a pipe nobody drains yet) holds up
 * nothing but this call: not a spawn that needs a new record, nor
 * sysmon's deadlock check, nor an exit that unmaps a stack. Unbuffered
 * (or without memory for the buffer): straight to out, as the crash
 * report does (no malloc after a fault). */
void co__dump_to(FILE *out, bool buffered) {
    if (!out) out = stderr;
    /* counted in as a reader (co__stats_enter): co_init and co_shutdown
     * wait for it before they reset or free what it walks */
    if (!co__stats_enter()) {
        fprintf(out, "colony: runtime not started\n");
        return;
    }
    co__schedtrace(out);
    co_m_t *m = co__getm();
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = buffered ? open_memstream(&buf, &len) : NULL;
    struct dump_walk w = {mem ? mem : out, m ? m->curg : NULL};
    co__each_live_g(dump_g, &w);
    co__stats_exit();
    if (mem) {
        fclose(mem);
        if (buf) fwrite(buf, 1, len, out);
        free(buf);
        fflush(out);
    }
}

void co_dump(FILE *out) { co__dump_to(out, true); }

/* ---- what is alive (co_alive, co_dump_alive) ---------------------------- */

struct count_walk {
    co_alive_t *a;
    int *by_reason; /* may be NULL */
};

/* One coroutine counted by state, and a waiting one by wait reason: a
 * co__g_visit_fn. */
static bool count_g(co_g_t *g, uint32_t status, void *arg) {
    struct count_walk *w = arg;
    co_alive_t *a = w->a;
    a->coroutines++;
    if (status == CO_G_RUNNABLE) a->runnable++;
    else if (status == CO_G_RUNNING) a->running++;
    else if (status == CO_G_WAITING) {
        a->waiting++;
        int wr = __atomic_load_n(&g->wait_reason, __ATOMIC_RELAXED);
        if (w->by_reason) w->by_reason[wr > 0 && wr < CO__WR_COUNT_ ? wr : 0]++;
    }
    return true;
}

static void alive_fill(co_alive_t *a, int *by_reason) {
    memset(a, 0, sizeof *a);
    if (!co__stats_enter()) return; /* down: nothing alive */
    struct count_walk w = {a, by_reason};
    co__each_live_g(count_g, &w);
    a->plain_parked = (int)(__atomic_load_n(&co__plain_parked_forever, __ATOMIC_RELAXED) +
                            __atomic_load_n(&co__plain_parked_timed, __ATOMIC_RELAXED));
    int busy = 0;
    (void)co_blocking_stats(&busy, NULL);
    a->blocking = busy;
    a->pools = (int)co__rt_holds_of(CO__HOLD_POOL);
    a->timers = (int)co__rt_holds_of(CO__HOLD_TIMER);
    a->tickers = (int)co__rt_holds_of(CO__HOLD_TICKER);
    a->caches = (int)co__rt_holds_of(CO__HOLD_CACHE);
    a->plain_io = (int)co__rt_holds_of(CO__HOLD_IO);
    co__stats_exit();
}

int co_alive(co_alive_t *out) {
    if (!out) return CO_EINVAL;
    alive_fill(out, NULL);
    return 0;
}

void co_dump_alive(FILE *out) {
    if (!out) out = stderr;
    co_alive_t a;
    int by_reason[CO__WR_COUNT_] = {0};
    alive_fill(&a, by_reason);
    fprintf(out,
            "colony: alive: %d coroutine%s (%d runnable, %d running, %d waiting), %d pool%s, "
            "%d timer%s, %d ticker%s, %d cache%s holding objects, %d in co_blocking, "
            "%d plain thread%s parked in colony calls, %d plain-thread I/O call%s\n",
            a.coroutines, a.coroutines == 1 ? "" : "s", a.runnable, a.running, a.waiting, a.pools,
            a.pools == 1 ? "" : "s", a.timers, a.timers == 1 ? "" : "s", a.tickers,
            a.tickers == 1 ? "" : "s", a.caches, a.caches == 1 ? "" : "s", a.blocking,
            a.plain_parked, a.plain_parked == 1 ? "" : "s", a.plain_io, a.plain_io == 1 ? "" : "s");
    for (int r = 0; r < CO__WR_COUNT_; r++)
        if (by_reason[r])
            fprintf(out, "  %d waiting: %s\n", by_reason[r],
                    r > 0 && wait_reasons[r] ? wait_reasons[r] : "(no reason)");
}
