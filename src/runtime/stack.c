/*
 * Coroutine stacks.
 *
 * A stack is a private anonymous mapping (MAP_NORESERVE): virtual address
 * space only, pages committed by the kernel when first touched. A G takes
 * one when it first runs and gives it back when it dies; free stacks are
 * cached per P and globally (gcache.c), so steady state does no
 * mmap/munmap. When the caches are empty, stacks are mapped 8 per mmap
 * (co__stack_alloc_n), and 64 once a program has mapped a few batches
 * where one process_madvise call guards a whole batch (Linux 6.14+);
 * each keeps a page below it (the guard, or a spare page when unguarded)
 * and is unmapped on its own.
 *
 * Once a program holds many stacks (1,024 and more mapped at once), one mmap
 * maps 2, then 4 such batches of 64 (co__stack_runs): a burst that keeps
 * missing the caches takes the address space's write lock for fewer
 * mmaps, while the top pages committed ahead of use stay a small share of
 * those in use. Each batch's guards are installed as one, as above.
 *
 * Overflow is always reported, never silent:
 *  - guarded stacks have a guard page below them; a fault there lands in
 *    our SIGSEGV handler (on a per-M sigaltstack) which names the coroutine
 *    and aborts.
 *  - where the kernel has lightweight guard regions (Linux 6.13+:
 *    madvise(MADV_GUARD_INSTALL), a marker in the page table, not a
 *    mapping of its own), every stack gets one: no map entry is spent, the
 *    mapping is not split, and installing it takes the address space's
 *    lock only for reading, so the other Ms' page faults do not wait.
 *  - otherwise a guard is an mprotect(PROT_NONE) page, which splits the
 *    mapping (two entries of the kernel's map-count limit,
 *    vm.max_map_count, 65530 by default, per stack) and takes that lock
 *    for writing. Past a budget (a quarter of the limit) stacks are
 *    unguarded: adjacent mappings merge into one entry, and the lowest
 *    CO_CANARY_BYTES of each stack must stay zero. Those bytes are never
 *    written (reading them maps the shared zero page, so they cost no
 *    memory); co__stack_check verifies them each time the coroutine
 *    switches away and when it exits, and a write there is reported as an
 *    overflow. This is how a million coroutines fit under the default
 *    limit on older kernels.
 *  - whatever the mode (COLONY_DEBUG=noguard included) and the budget, the
 *    lowest stack of every mapping is guarded: below it lies memory that
 *    is not ours (another thread's stack with its TLS at the top, the
 *    heap), which an overflow must never reach. An unguarded stack only
 *    ever borders the stack below it in its own mapping, and the canary
 *    reports what it overwrote there. Unguarded batches are mapped 64 at
 *    a time, so their bottom guards cost few map entries. Only a kernel
 *    out of map entries, refusing even that guard, leaves a mapping's
 *    bottom open.
 *
 * The SIGSEGV handler finds its M from the sigaltstack it runs on, not
 * from thread-local storage, which an overflow may have damaged.
 */
#include "runtime/proc.h"
#include "runtime/unwind.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define CO_HAVE_VALGRIND 1
#endif
#endif
#ifndef CO_HAVE_VALGRIND
#define VALGRIND_STACK_REGISTER(a, b) 0
#define VALGRIND_STACK_DEREGISTER(id) ((void)(id))
#endif

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102 /* Linux 6.13 uapi; older headers lack it */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 uapi */
#endif
#ifndef PIDFD_SELF
#define PIDFD_SELF (-10000) /* Linux 6.14 uapi: the calling thread (so our own mm) */
#endif

static size_t page_size;
static int64_t guard_budget;      /* atomic: mprotect-guarded stacks we may still create */
static bool no_guards;            /* set once at setup: COLONY_DEBUG=noguard (tests) */
static int light_guards = 1;      /* atomic relaxed: 0 when the probe at setup found
                                   * MADV_GUARD_INSTALL missing or not guarding, or once
                                   * it was refused as unknown (kernel older than 6.13) */
static int many_advice = 1;       /* atomic relaxed: 0 when the probe at setup found that
                                   * process_madvise(PIDFD_SELF) cannot install guard
                                   * regions on many ranges at once, or once it refused */
static int64_t stacks_mapped;     /* atomic relaxed: stacks mapped and not yet unmapped (tests) */

int64_t co__stacks_mapped(void) { return __atomic_load_n(&stacks_mapped, __ATOMIC_RELAXED); }
static int64_t stacks_mapped_total; /* atomic relaxed: stacks ever mapped (tests) */
int64_t co__stacks_mapped_total(void) {
    return __atomic_load_n(&stacks_mapped_total, __ATOMIC_RELAXED);
}
#ifndef CO_ASAN /* ASan reports overflows itself: no handler of ours then */
/* The crash signals colony reports (docs/debugging.md) and the actions
 * that were there before it, which it chains to: written once by
 * co__stack_setup before any coroutine runs, read by the handler. */
static const int crash_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define N_CRASH_SIGS (sizeof crash_sigs / sizeof crash_sigs[0])
static struct sigaction prev_act[N_CRASH_SIGS];
static bool segv_installed;
static bool crash_reports; /* COLONY_DEBUG has no "nocrash"; set with prev_act */
static bool crash_all;     /* COLONY_DEBUG has "crashall": list the others too */
#endif

/* The report is built by hand: printf's family may read thread-local
 * state (the locale), and the handler must not depend on any. */
static size_t put_str(char *b, size_t at, size_t cap, const char *s) {
    while (*s && at + 1 < cap) b[at++] = *s++;
    return at;
}
static size_t put_u64(char *b, size_t at, size_t cap, uint64_t v) {
    char d[24];
    int n = 0;
    do d[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    while (n > 0 && at + 1 < cap) b[at++] = d[--n];
    return at;
}
static void overflow_report(co_g_t *g, const char *how) {
    char buf[256];
    char name[sizeof g->name + 1];
    memcpy(name, g->name, sizeof g->name);
    name[sizeof g->name] = 0;
    size_t n = put_str(buf, 0, sizeof buf, "colony: fatal: stack overflow in coroutine ");
    n = put_u64(buf, n, sizeof buf, g->id);
    n = put_str(buf, n, sizeof buf, " '");
    n = put_str(buf, n, sizeof buf, name);
    n = put_str(buf, n, sizeof buf, "' (stack ");
    n = put_u64(buf, n, sizeof buf, g->stack.size);
    n = put_str(buf, n, sizeof buf, " bytes, ");
    n = put_str(buf, n, sizeof buf, how);
    n = put_str(buf, n, sizeof buf, ")\n");
    (void)!write(2, buf, n);
}

#define ALTSTACK_SIZE (64 * 1024)

#ifndef CO_ASAN
/* The M whose signal stack this handler runs on, found by walking the M
 * list (Ms are freed only by co_shutdown) instead of reading the thread
 * pointer's storage. NULL if the handler runs elsewhere (no altstack: then
 * the caller falls back to thread-local storage). */
static co_m_t *m_of_altstack(void) {
    char here;
    uintptr_t a = (uintptr_t)&here;
    /* relaxed: a racy read is fine for a process about to die; Ms are
     * prepended under sched.lock and stay linked until co_shutdown */
    for (co_m_t *m = __atomic_load_n(&co__sched.allm, __ATOMIC_RELAXED); m;
         m = __atomic_load_n(&m->alllink, __ATOMIC_RELAXED)) {
        uintptr_t lo = (uintptr_t)m->altstack;
        if (lo && a >= lo && a < lo + ALTSTACK_SIZE) return m;
    }
    return NULL;
}
#endif

#ifndef CO_ASAN
static size_t put_hex(char *b, size_t at, size_t cap, uint64_t v) {
    char d[16];
    int n = 0;
    do d[n++] = "0123456789abcdef"[v & 15]; while ((v >>= 4) != 0);
    at = put_str(b, at, cap, "0x");
    while (n > 0 && at + 1 < cap) b[at++] = d[--n];
    return at;
}
static void put_frame(const char *pre, void *pc) {
    char buf[320], sym[256];
    uintptr_t off = 0;
    size_t n = put_str(buf, 0, sizeof buf, pre);
    if (co__symbol(pc, sym, sizeof sym, &off)) {
        n = put_str(buf, n, sizeof buf, sym);
        n = put_str(buf, n, sizeof buf, "+");
        n = put_hex(buf, n, sizeof buf, off);
    } else {
        n = put_str(buf, n, sizeof buf, "?? (");
        n = put_hex(buf, n, sizeof buf, (uintptr_t)pc);
        n = put_str(buf, n, sizeof buf, ")");
    }
    n = put_str(buf, n, sizeof buf, "\n");
    (void)!write(2, buf, n);
}
/* The crash report: signal, address, the coroutine, its entry and stack.
 * write(2) only; the symbol lookup (libunwind's, reading the ELF tables)
 * takes no lock of colony's and allocates nothing. */
/* COLONY_DEBUG=crashall: the other coroutines after the crashed one's
 * report, through co_dump (stdio, locks: not async-signal-safe, hence
 * opt-in). Only if the all-coroutines lock is free now: a crash inside a
 * walk of it (or with another thread in one) would otherwise hang here. */
static void crash_others(void) {
    /* co_dump takes the scheduler's lock (its first line) and then the
     * list's: both must be free, or a crash inside either could hang */
    co__lock_t *l = &co__sched.allg_lock, *sl = &co__sched.lock;
    bool free_now = co__lock_try_free(sl);
    if (free_now) {
        co__unlock(sl);
        free_now = co__lock_try_free(l);
        if (free_now) co__unlock(l);
    }
    if (!free_now) {
        static const char msg[] =
            "\n(other coroutines not listed: the scheduler or its coroutine list is locked)\n";
        (void)!write(2, msg, sizeof msg - 1);
        return;
    }
    static const char hdr[] = "\nother coroutines:\n";
    (void)!write(2, hdr, sizeof hdr - 1);
    co__dump_to(stderr, false); /* no malloc in a crash */
    fflush(stderr);
}

static void crash_report(int sig, siginfo_t *si, void *uctx, co_g_t *g, bool chained) {
    static const char *const names[] = {"SIGSEGV: segmentation violation", "SIGBUS: bus error",
                                        "SIGFPE: floating-point exception",
                                        "SIGILL: illegal instruction", "SIGABRT: abort"};
    const char *what = "signal";
    for (size_t i = 0; i < N_CRASH_SIGS; i++)
        if (crash_sigs[i] == sig) what = names[i];
    char buf[256];
    char name[sizeof g->name + 1];
    memcpy(name, g->name, sizeof g->name);
    name[sizeof g->name] = 0;
    /* chained: the program's own handler runs next and may handle the
     * signal and go on, so this is not called fatal */
    size_t n = put_str(buf, 0, sizeof buf, chained ? "colony: " : "colony: fatal: ");
    n = put_str(buf, n, sizeof buf, what);
    if (sig != SIGABRT) {
        n = put_str(buf, n, sizeof buf, " at address ");
        n = put_hex(buf, n, sizeof buf, (uintptr_t)si->si_addr);
    }
    if (chained) n = put_str(buf, n, sizeof buf, " (the program's own handler runs next)");
    n = put_str(buf, n, sizeof buf, "\n\ncoroutine ");
    n = put_u64(buf, n, sizeof buf, g->id);
    if (name[0]) {
        n = put_str(buf, n, sizeof buf, " '");
        n = put_str(buf, n, sizeof buf, name);
        n = put_str(buf, n, sizeof buf, "'");
    }
    n = put_str(buf, n, sizeof buf, " [running]:\n");
    (void)!write(2, buf, n);
    put_frame("  entry: ", (void *)(uintptr_t)g->fn);
    void *pcs[48];
    int np = co__unwind_uctx(uctx, pcs, 48);
    for (int i = 0; i < np; i++) put_frame("  ", pcs[i]);
    if (np == 0) {
        static const char msg[] = "  (no frames: this build has no unwinder for signals)\n";
        (void)!write(2, msg, sizeof msg - 1);
    }
    if (crash_all) crash_others();
}

static void segv_handler(int sig, siginfo_t *si, void *uctx) {
    co_m_t *m = m_of_altstack();
    if (!m) m = co__getm();
    co_g_t *g = m ? m->curg : NULL;
    if (g && (sig == SIGSEGV || sig == SIGBUS)) {
        /* Ours if the fault is in the guard page, or the coroutine's stack
         * pointer has left its stack downwards (an unguarded stack runs
         * into whatever lies below until something faults). */
        char *a = (char *)si->si_addr;
        uintptr_t sp = 0;
#if defined(__x86_64__)
        sp = (uintptr_t)((ucontext_t *)uctx)->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
        sp = (uintptr_t)((ucontext_t *)uctx)->uc_mcontext.sp;
#endif
        uintptr_t lo = (uintptr_t)g->stack.lo;
        bool in_guard = g->stack.guarded && a >= g->stack.map && a < g->stack.lo + 64;
        bool sp_out = sp != 0 && sp < lo + 64 && lo - sp < ((uintptr_t)1 << 30);
        if (in_guard || sp_out) {
            overflow_report(g, in_guard ? "hit the guard page" : "ran below its stack");
            signal(SIGABRT, SIG_DFL);
            abort();
        }
    }
    struct sigaction *prev = NULL;
    for (size_t i = 0; i < N_CRASH_SIGS; i++)
        if (crash_sigs[i] == sig) prev = &prev_act[i];
    /* A handler the program installed first still runs, after the report:
     * it may be one that handles the fault and goes on, so the report is
     * printed for the first such signal of the process only (relaxed
     * exchange: only which handler prints matters). */
    /* sa_handler and sa_sigaction share their storage: SIG_DFL and SIG_IGN
     * read the same through either, SA_SIGINFO or not */
    /* An ignored signal that no fault raised (kill, sigqueue): ignored, as
     * the program asked. A fault's is not ignorable (the kernel would kill). */
    if (prev && prev->sa_handler == SIG_IGN && si && si->si_code <= 0) return;
    bool user = prev && prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN;
    if (user) {
        static uint32_t chained_reported; /* atomic: 1 once a chained report was printed */
        if (g && crash_reports && !__atomic_exchange_n(&chained_reported, 1, __ATOMIC_RELAXED))
            crash_report(sig, si, uctx, g, true);
        /* As the kernel would call it: with its mask, and once only if it
         * asked for SA_RESETHAND (the next fault then dies the default
         * way, which is what such a handler counts on). */
        struct sigaction h = *prev;
        if (h.sa_flags & SA_RESETHAND) {
            prev->sa_handler = SIG_DFL;
            prev->sa_flags = 0;
        }
        sigset_t old;
        pthread_sigmask(SIG_BLOCK, &h.sa_mask, &old);
        if (h.sa_flags & SA_SIGINFO)
            h.sa_sigaction(sig, si, uctx);
        else
            h.sa_handler(sig);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return;
    }
    /* Dying the default way: say where first. */
    if (g && crash_reports) crash_report(sig, si, uctx, g, false);
    signal(sig, SIG_DFL);
    raise(sig);
}
#endif

/* Whether MADV_GUARD_INSTALL really guards a page. A kernel without it
 * says EINVAL, but an emulator may say yes and do nothing (qemu-user up to
 * at least 7.2 ignores every madvise), which would leave every stack
 * unguarded while we count it guarded: an overflow would then run into
 * the stack below. The kernel's own read of a guard region fails with
 * EFAULT, so a one-byte write() from the page into a pipe tells, without
 * a fault of ours. Anything that stops the probe (no memory, no fds) says
 * no: mprotect guards are the safe side. */
/* process_madvise of the calling process's own ranges, n of them in one
 * call: the whole length, or false. */
static bool advise_many(const struct iovec *iov, int n, int advice) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].iov_len;
#ifdef SYS_process_madvise
    long r = syscall(SYS_process_madvise, PIDFD_SELF, iov, (size_t)n, advice, 0u);
    return r >= 0 && (size_t)r == total;
#else
    (void)advice;
    return total == 0;
#endif
}

static bool guard_probe(bool many) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    bool ok = false;
    int fd[2];
    struct iovec iov[2] = {{p, pg}, {p + pg, pg}};
    bool installed = many ? advise_many(iov, 2, MADV_GUARD_INSTALL)
                          : madvise(p, pg, MADV_GUARD_INSTALL) == 0;
    if (installed && pipe2(fd, O_CLOEXEC) == 0) {
        ok = write(fd[1], p, 1) < 0 && errno == EFAULT;
        if (many) ok = ok && write(fd[1], p + pg, 1) < 0 && errno == EFAULT;
        close(fd[0]);
        close(fd[1]);
    }
    munmap(p, 2 * pg);
    return ok;
}
bool co__stack_light_guards_probe(void) { return guard_probe(false); }

size_t co__stack_round(size_t size) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (size + pg - 1) / pg * pg;
}

void co__stack_setup(void) {
    page_size = (size_t)sysconf(_SC_PAGESIZE);
    bool light = co__stack_light_guards_probe();
    __atomic_store_n(&light_guards, light ? 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&many_advice, light && guard_probe(true) ? 1 : 0, __ATOMIC_RELAXED);
    long maxmap = 65530;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%ld", &maxmap) != 1) maxmap = 65530;
        fclose(f);
    }
    guard_budget = maxmap / 4;
    const char *dbg = getenv("COLONY_DEBUG");
    no_guards = dbg && strstr(dbg, "noguard") != NULL;
    if (no_guards) guard_budget = 0; /* canaries only (tests) */
#ifndef CO_ASAN
    if (!segv_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = segv_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGSEGV, &sa, &prev_act[0]) == 0) segv_installed = true;
        /* the other crash signals, unless COLONY_DEBUG=nocrash; not under
         * TSan, whose own handling of them comes first and turns a
         * re-raised abort into an exit */
        bool crash = !CO_TSAN_ON && !(dbg && strstr(dbg, "nocrash"));
        crash_reports = crash;
        crash_all = crash && strstr(dbg ? dbg : "", "crashall") != NULL;
        for (size_t i = 1; crash && i < N_CRASH_SIGS; i++) {
            if (sigaction(crash_sigs[i], &sa, &prev_act[i]) != 0)
                prev_act[i].sa_handler = SIG_DFL;
            else if (prev_act[i].sa_handler == SIG_IGN) /* the program's: left so */
                sigaction(crash_sigs[i], &prev_act[i], NULL);
        }
    }
#endif
}

void co__stack_m_init(co_m_t *m) {
    size_t sz = ALTSTACK_SIZE;
    void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bool heap = p == MAP_FAILED;
    if (heap) p = malloc(sz); /* a refused mmap (map count): the heap's brk may still grow */
    if (!p) {
        /* without a signal stack an overflow on this M dies unreported
         * (its handler cannot run on the stack it overflowed): say so,
         * once */
        static int said; /* atomic relaxed */
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "colony: warning: no memory for a thread's signal stack; "
                            "a stack overflow on it will not be reported\n");
        return;
    }
    stack_t ss = {.ss_sp = p, .ss_size = sz, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) == 0) {
        m->altstack = p;
        m->altstack_heap = heap;
    } else if (heap) {
        free(p);
    } else {
        munmap(p, sz);
    }
}

void co__stack_m_fini(co_m_t *m) {
    if (!m->altstack) return;
    stack_t ss = {.ss_flags = SS_DISABLE};
    sigaltstack(&ss, NULL);
    if (m->altstack_heap)
        free(m->altstack);
    else
        munmap(m->altstack, ALTSTACK_SIZE);
    m->altstack = NULL;
}

/* A lightweight guard region on the page at base; false if the kernel
 * refused (then the caller falls back to mprotect). */
static bool light_guard(char *base) {
    if (!__atomic_load_n(&light_guards, __ATOMIC_RELAXED)) return false;
    if (madvise(base, page_size, MADV_GUARD_INSTALL) == 0) return true;
    /* EINVAL: the kernel does not know the advice; stop asking. Anything
     * else (a locked mapping, ENOMEM) is this stack's problem only. */
    if (errno == EINVAL) __atomic_store_n(&light_guards, 0, __ATOMIC_RELAXED);
    return false;
}

/* An mprotect(PROT_NONE) guard on the page at base, while the budget lasts;
 * false when it is spent or the kernel is out of map entries. */
static bool mprotect_guard(char *base) {
    /* relaxed: the budget is a soft limit; a race costs at most a few guards */
    if (__atomic_sub_fetch(&guard_budget, 1, __ATOMIC_RELAXED) < 0) {
        __atomic_add_fetch(&guard_budget, 1, __ATOMIC_RELAXED);
        return false;
    }
    if (mprotect(base, page_size, PROT_NONE) == 0) return true;
    __atomic_store_n(&guard_budget, 0, __ATOMIC_RELAXED); /* out of map entries: no more */
    return false;
}

/* The guard below a mapping's lowest stack: a lightweight one where the
 * kernel has them, else mprotect, counted against the budget (which may go
 * below zero for these) and given back by co__stack_free like any other.
 * Under noguard always mprotect: a core dump (gdb's gcore) leaves out a
 * whole mapping that holds a guard marker, but only the page of an
 * mprotect guard. False only if the kernel refused. */
static bool bottom_guard(char *base, bool *light) {
    if (!no_guards && __atomic_load_n(&light_guards, __ATOMIC_RELAXED) &&
        madvise(base, page_size, MADV_GUARD_INSTALL) == 0) {
        *light = true;
        return true;
    }
    *light = false;
    __atomic_sub_fetch(&guard_budget, 1, __ATOMIC_RELAXED);
    if (mprotect(base, page_size, PROT_NONE) == 0) return true;
    __atomic_add_fetch(&guard_budget, 1, __ATOMIC_RELAXED);
    return false;
}

int co__stack_batch(void) {
    bool light = __atomic_load_n(&light_guards, __ATOMIC_RELAXED) && !no_guards;
    /* one call guards (and touches) a whole batch: after the first few
     * batches, which a small program is all it maps, map 64 at a time */
    if (light && __atomic_load_n(&many_advice, __ATOMIC_RELAXED) &&
        __atomic_load_n(&stacks_mapped_total, __ATOMIC_RELAXED) >= 4 * 8)
        return CO_STACK_BATCH_MAX;
    bool cheap = light || __atomic_load_n(&guard_budget, __ATOMIC_RELAXED) > 0;
    return cheap ? 8 : CO_STACK_BATCH_MAX;
}

/* The batch of n stacks `one` bytes apart from p, each of `size` bytes
 * above its guard page: every guard installed by one process_madvise call
 * (one trip into the kernel, the address space's lock taken for reading
 * once), and the top page of npop stacks, where their coroutines' first
 * frames go, written in by a second, which spares each first run a page
 * fault: the lowest stack and the npop - 1 highest, the ones the caches
 * hand out first (gcache.c keeps the lowest and caches the rest in order,
 * the last cached taken first). A stack left out is committed by its
 * first run's fault, if it ever runs. False if the guards could not all
 * be installed (the caller guards each stack on its own then). */
static bool guard_batch(char *p, int n, size_t one, size_t size, int npop) {
    if (n < 2 || no_guards || !__atomic_load_n(&light_guards, __ATOMIC_RELAXED) ||
        !__atomic_load_n(&many_advice, __ATOMIC_RELAXED))
        return false;
    struct iovec iov[CO_STACK_BATCH_MAX];
    for (int i = 0; i < n; i++) iov[i] = (struct iovec){p + (size_t)i * one, page_size};
    if (!advise_many(iov, n, MADV_GUARD_INSTALL)) {
        /* refused: the per-stack way from now on (some guards may be in:
         * installing one again is harmless) */
        __atomic_store_n(&many_advice, 0, __ATOMIC_RELAXED);
        return false;
    }
    if (npop > n) npop = n;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 || i >= n - (npop - 1))
            iov[k++] = (struct iovec){p + (size_t)i * one + page_size + size - page_size, page_size};
    if (npop > 0) /* only an optimisation: faults do it otherwise */
        (void)advise_many(iov, k, MADV_POPULATE_WRITE);
    return true;
}

/* Up to n stacks of `size` bytes in one mapping: one mmap, and one madvise
 * (or mprotect) per guard page. A burst of first runs then maps stacks in
 * batches; each mmap takes the address space's write lock, which the other
 * Ms' page faults wait on. Each stack remains its own range (map,
 * map_size), which co__stack_free unmaps alone. Returns how many were made
 * (>= 1), or CO_ENOMEM. */
static void stacks_make(co__stack_t *out, char *p, int n, size_t one, size_t size, int npop);

int co__stack_alloc_need(co__stack_t *out, int n, size_t size, int need) {
    size = (size + page_size - 1) & ~(page_size - 1);
    size_t one = size + page_size; /* a guard page, or a spare one below lo */
    char *p = mmap(NULL, one * (size_t)n, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return n > 1 ? co__stack_alloc_need(out, 1, size, 1) : CO_ENOMEM;
    stacks_make(out, p, n, one, size, need);
    return n;
}

int co__stack_alloc_n(co__stack_t *out, int n, size_t size) {
    return co__stack_alloc_need(out, n, size, n);
}

/* The n stacks `one` bytes apart from p (the lowest at p: the mapping's
 * bottom, or a run above another of the same mapping), each `size`
 * bytes above its guard or spare page, guarded and counted; npop of
 * their top pages committed where the guards are batched. */
static void stacks_make(co__stack_t *out, char *p, int n, size_t one, size_t size, int npop) {
    bool batched = n <= CO_STACK_BATCH_MAX && guard_batch(p, n, one, size, npop);
    for (int i = 0; i < n; i++) {
        char *base = p + (size_t)i * one;
        bool light = false, guard;
        if (batched) {
            light = guard = true;
        } else if (i == 0) {
            guard = bottom_guard(base, &light);
        } else {
            light = !no_guards && light_guard(base);
            guard = light || mprotect_guard(base);
        }
        co__stack_t *s = &out[i];
        s->map = base;
        s->map_size = one;
        s->guarded = guard;
        s->light_guard = light;
        s->lo = base + page_size; /* unguarded: zero bytes there are the canary */
        s->size = size;
        s->vg_id = VALGRIND_STACK_REGISTER(s->lo, s->lo + s->size);
    }
    __atomic_add_fetch(&stacks_mapped, n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&stacks_mapped_total, n, __ATOMIC_RELAXED);
}

int co__stack_runs(void) {
    if (co__stack_batch() != CO_STACK_BATCH_MAX || no_guards ||
        !__atomic_load_n(&many_advice, __ATOMIC_RELAXED))
        return 1;
    /* 2 batches from 1,024 stacks mapped now, 4 from 2,048: the top
     * pages committed ahead of use stay within 1/8 of the stacks mapped */
    int64_t now = __atomic_load_n(&stacks_mapped, __ATOMIC_RELAXED);
    int runs = 1;
    while (runs < CO_STACK_RUNS_MAX && now >= (int64_t)runs * 2 * 8 * CO_STACK_BATCH_MAX) runs *= 2;
    return runs;
}

int co__stack_alloc_runs(co__stack_t *out, int runs, size_t size, int need,
                         void (*put)(co__stack_t *run, int n, void *arg), void *arg) {
    int n = CO_STACK_BATCH_MAX;
    if (runs <= 1) return co__stack_alloc_need(out, n, size, need);
    size = (size + page_size - 1) & ~(page_size - 1);
    size_t one = size + page_size;
    char *p = mmap(NULL, one * (size_t)n * (size_t)runs, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return co__stack_alloc_need(out, n, size, need);
    /* the upper runs to put, then the bottom one (which guards the
     * mapping's lowest page even without batched guards) to the caller,
     * whose stacks are taken first: the upper runs' top pages are
     * committed ahead only if more than a run is needed */
    for (int r = runs - 1; r >= 1; r--) {
        stacks_make(out, p + (size_t)r * n * one, n, one, size, need > n ? n : 0);
        put(out, n, arg);
    }
    stacks_make(out, p, n, one, size, need);
    return n;
}

int co__stack_alloc(co__stack_t *s, size_t size) {
    int rc = co__stack_alloc_n(s, 1, size);
    return rc < 0 ? rc : 0;
}

/* ---- unmaps that failed ----------------------------------------------------
 * munmap of a range inside a larger mapping splits it, which the kernel
 * refuses (ENOMEM) when the process is at vm.max_map_count. Such a range's
 * pages are released at once (MADV_DONTNEED) and the range waits here; the
 * counts it stands for (dec: down by one, inc: up by one) move only once
 * it is really unmapped. sysmon tries again each trim round
 * (co__unmap_retry), co_shutdown once more. Past UNMAP_DEFER_MAX ranges
 * one is left mapped for good (its pages released) and counted in
 * unmap_lost. */
#define UNMAP_DEFER_MAX 1024
static co__lock_t defer_lock; /* protects deferred[] and ndeferred */
static struct {
    void *p;
    size_t len;
    int64_t *dec, *inc;
    bool stack; /* unmapped under walk_lock, as co__stack_free does */
} deferred[UNMAP_DEFER_MAX];
static int ndeferred;
static int64_t unmap_lost; /* atomic relaxed: ranges left mapped for good (tests) */
int64_t co__unmap_lost(void) { return __atomic_load_n(&unmap_lost, __ATOMIC_RELAXED); }

/* walk_lock: held by co_dump around each walk of a parked coroutine's
 * stack (and nothing else: not its prints, which may block), and by a
 * stack's munmap, so that a walk never meets a range being unmapped. A
 * leaf lock, taken under allg_lock by the dump. */
static co__lock_t walk_lock;
void co__stack_walk_lock(void) { co__lock(&walk_lock); }
void co__stack_walk_unlock(void) { co__unlock(&walk_lock); }

static int unmap_now(void *p, size_t len, bool stack) {
    if (stack) co__lock(&walk_lock);
    int rc = munmap(p, len);
    if (stack) co__unlock(&walk_lock);
    return rc;
}

bool co__unmap(void *p, size_t len, int64_t *dec, int64_t *inc, bool stack) {
    if (unmap_now(p, len, stack) == 0) {
        if (dec) __atomic_sub_fetch(dec, 1, __ATOMIC_RELAXED);
        if (inc) __atomic_add_fetch(inc, 1, __ATOMIC_RELAXED);
        return true;
    }
    (void)madvise(p, len, MADV_DONTNEED);
    co__lock(&defer_lock);
    bool kept = ndeferred < UNMAP_DEFER_MAX;
    if (kept) {
        deferred[ndeferred].p = p;
        deferred[ndeferred].len = len;
        deferred[ndeferred].dec = dec;
        deferred[ndeferred].inc = inc;
        deferred[ndeferred].stack = stack;
        ndeferred++;
    }
    co__unlock(&defer_lock);
    if (!kept) __atomic_add_fetch(&unmap_lost, 1, __ATOMIC_RELAXED);
    return false;
}

int co__unmap_retry(void) {
    if (__atomic_load_n(&ndeferred, __ATOMIC_RELAXED) == 0) return 0; /* racy peek: next round */
    int done = 0;
    co__lock(&defer_lock);
    for (int i = 0; i < ndeferred;) {
        if (unmap_now(deferred[i].p, deferred[i].len, deferred[i].stack) != 0) {
            i++;
            continue;
        }
        if (deferred[i].dec) __atomic_sub_fetch(deferred[i].dec, 1, __ATOMIC_RELAXED);
        if (deferred[i].inc) __atomic_add_fetch(deferred[i].inc, 1, __ATOMIC_RELAXED);
        deferred[i] = deferred[--ndeferred];
        done++;
    }
    co__unlock(&defer_lock);
    return done;
}

int co__unmap_deferred(void) {
    co__lock(&defer_lock);
    int n = ndeferred;
    co__unlock(&defer_lock);
    return n;
}

void co__stack_free(co__stack_t *s) {
    if (!s->map) return;
#ifdef CO_ASAN
    /* ASan keeps the shadow of an unmapped range: the frames a coroutine
     * left poisoned (it never returned from them) would greet the next
     * mapping there, a stack of another size (cached stacks are cleaned
     * when attached, gcache.c) or any other memory. */
    __asan_unpoison_memory_region(s->lo, s->size);
#endif
    VALGRIND_STACK_DEREGISTER(s->vg_id);
    (void)co__unmap(s->map, s->map_size, &stacks_mapped,
                    s->guarded && !s->light_guard ? &guard_budget : NULL, true);
    s->map = NULL;
}

/* co__stack_check of an unguarded stack, on g's M. */
void co__stack_check_canary(co_g_t *g) {
    const uint64_t *z = (const uint64_t *)g->stack.lo;
    uint64_t acc = 0;
    for (size_t i = 0; i < CO_CANARY_BYTES / 8; i++) acc |= z[i];
    if (CO_UNLIKELY(acc != 0)) {
        overflow_report(g, "overwrote the canary at the bottom of its stack");
        abort();
    }
}
