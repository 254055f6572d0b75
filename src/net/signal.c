/*
 * Signals as channel messages (Go's os/signal): co_signal_notify and
 * co_signal_stop.
 *
 * Delivery: a relayed signal gets a sigaction handler, installed process
 * wide on its first co_signal_notify. The handler may run on any thread
 * that has the signal unblocked -- a runtime M, a coroutine's thread, a
 * plain thread the program made before or after -- and does only what is
 * async-signal-safe: it writes the signal's number, one byte, to a
 * non-blocking self-pipe (a full pipe drops it). One relay thread, a plain
 * pthread started with the first co_signal_notify, waits in poll(2) on the
 * pipe and, for each byte, makes a non-blocking co_chan_send of the number
 * to every channel registered for it: a full channel misses that signal,
 * as in Go. No signal mask is changed: a signal reaches the program unless
 * every thread blocks it (a signalfd program's way), and a plain thread
 * needs nothing done to it, whenever it was made.
 *
 * The relay thread has unblocked the signals colony has ever relayed
 * (relay_take) and no other: a program may block the signals it relays in
 * all of its own threads (set before it makes any, so that they inherit
 * it), and the relay thread still takes them when they are sent to the
 * process; a signal the program blocks everywhere to read itself
 * (signalfd, sigwait) and never gives colony stays blocked there too. The
 * handler takes no lock, so it may run on the relay thread while that
 * holds reg_lock.
 *
 * fork: the child has no relay thread. Its fork handler puts back the
 * program's actions, closes its copy of the pipe (whose far end is the
 * parent's relay) and forgets every registration; the child starts as if
 * it had never called co_signal_notify.
 */
#include <colony.h>

#include "chan/chan.h"
#include "chan/chan_impl.h" /* elem_size */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SIG_MAX 65 /* signal numbers 1..64 (NSIG on Linux) */
#define SIG_ELEM_MAX 64 /* the widest channel element a relay fills */

typedef struct sig_reg {
    co_chan_t *ch;
    uint64_t mask; /* bit s-1: relay signal s to ch */
} sig_reg_t;

/* reg_lock protects regs, nregs, capregs, installed[], old_act[] and
 * relay_started. The relay thread holds it across its sends, so that once
 * co_signal_stop returns (it takes the lock) no send to its channel is in
 * progress or to come. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static sig_reg_t *regs;
static int nregs, capregs;
static bool installed[SIG_MAX];
static struct sigaction old_act[SIG_MAX];
static bool relay_started;
static bool atfork_set; /* under reg_lock: the fork handlers are registered */

/* Signals the relay thread is to have unblocked: every one a handler was
 * ever installed for. Only grows. Stored (release) by sync_handlers, which
 * then writes a 0 byte to the pipe; loaded (acquire) by the relay thread
 * before each read of the pipe. */
static uint64_t relay_take;

/* The self-pipe: written by the handler, read by the relay thread. Set once
 * (under reg_lock) before any handler is installed; the handler reads it
 * relaxed: sigaction(2) is a system call, after which the handler can
 * only run, so the store is seen. -1: none yet. */
static int pipe_w = -1, pipe_r = -1;

static void sig_handler(int sig) {
    /* The interrupted code's errno: write(2) changes it only when it
     * fails (a full pipe), and only then is it put back. (A store on every
     * call would be seen by TSan racing with the next coroutine's read of
     * the same thread's errno: it takes coroutines for threads.) */
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    int fd = __atomic_load_n(&pipe_w, __ATOMIC_RELAXED);
    /* the system call itself: a preloaded write(2) (colony's hook) would
     * look the fd up, which is no business of a signal handler */
    if (fd >= 0 && syscall(SYS_write, fd, &b, 1) < 0) /* full pipe: dropped */
        errno = saved;
}

/* Signals the program cannot relay: SIGKILL and SIGSTOP cannot be caught;
 * SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGTRAP are synchronous faults (the
 * runtime's stack guard owns SIGSEGV); relaying one would loop on the
 * faulting instruction. Numbers between 31 and SIGRTMIN are the C
 * library's own (its threads' cancellation and set*id calls). */
static bool sig_relayable(int s) {
    if (s > 31 && s < SIGRTMIN)
        return false;
    switch (s) {
    case SIGKILL: case SIGSTOP: case SIGSEGV: case SIGBUS: case SIGFPE: case SIGILL:
    case SIGTRAP:
        return false;
    default:
        return s >= 1 && s < SIG_MAX;
    }
}

/* The relay thread: unblock what relay_take names beyond `had`. */
static uint64_t relay_unblock(uint64_t had) {
    uint64_t want = __atomic_load_n(&relay_take, __ATOMIC_ACQUIRE);
    if (want == had)
        return had;
    sigset_t take;
    sigemptyset(&take);
    for (int s = 1; s < SIG_MAX; s++)
        if (want & (1ull << (s - 1)))
            sigaddset(&take, s);
    pthread_sigmask(SIG_UNBLOCK, &take, NULL);
    return want;
}

static void *relay_main(void *arg) {
    (void)arg;
    /* Take the relayed signals: a program that blocks them in all its
     * own threads still gets the process-directed ones (kill, ^C) here,
     * and this thread waits in poll(2), after which a sanitizer's deferred
     * handler runs at once. */
    uint64_t had = 0;
    for (;;) {
        had = relay_unblock(had); /* a 0 byte in the pipe: relay_take grew */
        unsigned char buf[64];
        ssize_t n = read(pipe_r, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            /* poll(2), never restarted after a handler, returns to the
             * C library after every signal: a sanitizer that defers
             * handlers to such a return runs ours now */
            struct pollfd pf = {.fd = pipe_r, .events = POLLIN};
            (void)poll(&pf, 1, -1);
            continue;
        }
        if (n <= 0)
            return NULL; /* the pipe is never closed: not reached */
        pthread_mutex_lock(&reg_lock);
        for (ssize_t i = 0; i < n; i++) {
            int s = buf[i];
            if (s < 1 || s >= SIG_MAX)
                continue;
            /* the element: an int, then zeros, so that a channel made
             * with a wider element (a long) still reads the number */
            union {
                int sig;
                unsigned char pad[SIG_ELEM_MAX];
            } e;
            memset(&e, 0, sizeof e);
            e.sig = s;
            for (int r = 0; r < nregs; r++)
                if (regs[r].mask & (1ull << (s - 1)))
                    (void)co_chan_send(regs[r].ch, &e, 0); /* full or closed: dropped */
        }
        pthread_mutex_unlock(&reg_lock);
    }
}

/* fork: reg_lock held across it, so the child's copy is consistent */
static void fork_prepare(void) { pthread_mutex_lock(&reg_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&reg_lock); }
static void fork_child(void) {
    for (int s = 1; s < SIG_MAX; s++) {
        if (!installed[s])
            continue;
        struct sigaction cur;
        if (sigaction(s, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
            cur.sa_handler == sig_handler)
            sigaction(s, &old_act[s], NULL);
        installed[s] = false;
    }
    nregs = 0;
    relay_started = false;
    __atomic_store_n(&relay_take, 0, __ATOMIC_RELAXED);
    int w = __atomic_exchange_n(&pipe_w, -1, __ATOMIC_RELAXED);
    if (w >= 0)
        close(w);
    if (pipe_r >= 0)
        close(pipe_r);
    pipe_r = -1;
    pthread_mutex_init(&reg_lock, NULL);
}

/* Under reg_lock: the pipe and the relay thread, once. 0 or -errno. */
static int relay_start(void) {
    if (relay_started)
        return 0;
    if (!atfork_set) {
        if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0)
            return -ENOMEM;
        atfork_set = true;
    }
    if (pipe_r < 0) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
            return -errno;
        /* non-blocking: a handler never waits; the relay thread waits
         * in poll(2) */
        if (fcntl(p[1], F_SETFL, O_NONBLOCK) < 0 || fcntl(p[0], F_SETFL, O_NONBLOCK) < 0) {
            int e = errno;
            close(p[0]);
            close(p[1]);
            return -e;
        }
        pipe_r = p[0];
        __atomic_store_n(&pipe_w, p[1], __ATOMIC_RELAXED);
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited; relay_main opens its own */
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 64 * 1024);
    pthread_t t;
    int rc = pthread_create(&t, &at, relay_main, NULL);
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return -rc;
    relay_started = true;
    return 0;
}

/* Under reg_lock: the union of every registration's mask. */
static uint64_t wanted(void) {
    uint64_t m = 0;
    for (int r = 0; r < nregs; r++)
        m |= regs[r].mask;
    return m;
}

/* Under reg_lock: install the handler on signals now wanted, put back the
 * program's own action on those no longer wanted (unless the program has
 * set another since: that one stays). */
static int sync_handlers(void) {
    uint64_t m = wanted();
    int rc = 0;
    uint64_t take = __atomic_load_n(&relay_take, __ATOMIC_RELAXED);
    for (int s = 1; s < SIG_MAX; s++) {
        bool want = m & (1ull << (s - 1));
        if (want && !installed[s]) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = sig_handler;
            sigfillset(&sa.sa_mask);
            /* SA_RESTART: other threads' system calls go on as if no
             * signal came, as they would without the handler */
            /* on the interrupted stack, not an M's sigaltstack (the
             * stack guard's): a few bytes, and a coroutine's stack is
             * the one TSan knows the thread to be on */
            sa.sa_flags = SA_RESTART;
            if (sigaction(s, &sa, &old_act[s]) < 0) {
                rc = -errno;
                continue;
            }
            installed[s] = true;
            take |= 1ull << (s - 1);
        } else if (!want && installed[s]) {
            struct sigaction cur;
            if (sigaction(s, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
                cur.sa_handler == sig_handler)
                sigaction(s, &old_act[s], NULL);
            installed[s] = false;
        }
    }
    if (take != __atomic_load_n(&relay_take, __ATOMIC_RELAXED)) {
        __atomic_store_n(&relay_take, take, __ATOMIC_RELEASE);
        unsigned char zero = 0; /* wakes the relay thread to unblock them */
        int w = __atomic_load_n(&pipe_w, __ATOMIC_RELAXED);
        if (w >= 0)
            (void)!syscall(SYS_write, w, &zero, 1);
    }
    return rc;
}

int co_signal_notify(co_chan_t *ch, const int *sigs, int n) {
    if (!ch || n < 0 || (n > 0 && !sigs))
        return CO_EINVAL;
    co__chan_check(ch, "co_signal_notify");
    if (ch->elem_size > SIG_ELEM_MAX)
        return CO_EINVAL; /* the relay sends from an element of that size */
    uint64_t m = 0;
    if (n == 0) {
        for (int s = 1; s < SIG_MAX; s++)
            if (sig_relayable(s))
                m |= 1ull << (s - 1);
    }
    for (int i = 0; i < n; i++) {
        if (!sig_relayable(sigs[i]))
            return CO_EINVAL;
        m |= 1ull << (sigs[i] - 1);
    }
    pthread_mutex_lock(&reg_lock);
    int rc = relay_start();
    if (rc < 0)
        goto out;
    int r;
    for (r = 0; r < nregs && regs[r].ch != ch; r++)
        ;
    if (r == nregs) {
        if (nregs == capregs) {
            int nc = capregs ? 2 * capregs : 8;
            sig_reg_t *nr = realloc(regs, (size_t)nc * sizeof *nr);
            if (!nr) {
                rc = CO_ENOMEM;
                goto out;
            }
            regs = nr;
            capregs = nc;
        }
        regs[nregs++] = (sig_reg_t){.ch = ch, .mask = 0};
    }
    uint64_t before = regs[r].mask;
    regs[r].mask |= m;
    rc = sync_handlers();
    if (rc < 0) {
        regs[r].mask = before; /* as it was: no half-made registration */
        if (!before)
            regs[r] = regs[--nregs];
        (void)sync_handlers();
    }
out:
    pthread_mutex_unlock(&reg_lock);
    return rc;
}

int co_signal_stop(co_chan_t *ch) {
    if (!ch)
        return CO_EINVAL;
    co__chan_check(ch, "co_signal_stop");
    pthread_mutex_lock(&reg_lock);
    for (int r = 0; r < nregs; r++) {
        if (regs[r].ch == ch) {
            regs[r] = regs[--nregs];
            break;
        }
    }
    (void)sync_handlers(); /* restoring an action does not fail */
    pthread_mutex_unlock(&reg_lock);
    return 0;
}

int co_signal_ignore(const int *sigs, int n) {
    if (n < 0 || (n > 0 && !sigs))
        return CO_EINVAL;
    uint64_t m = 0;
    for (int i = 0; i < n; i++) {
        if (!sig_relayable(sigs[i]))
            return CO_EINVAL;
        m |= 1ull << (sigs[i] - 1);
    }
    pthread_mutex_lock(&reg_lock);
    /* no channel gets them any more (a registration left empty stays, and
     * costs nothing: co_signal_stop drops it) */
    for (int r = 0; r < nregs; r++)
        regs[r].mask &= ~m;
    int rc = 0;
    for (int s = 1; s < SIG_MAX; s++) {
        if (!(m & (1ull << (s - 1))))
            continue;
        /* ignored now, whoever's handler is there (colony's relay, or
         * one the program set since), and what a later stop puts back */
        memset(&old_act[s], 0, sizeof old_act[s]);
        old_act[s].sa_handler = SIG_IGN;
        if (sigaction(s, &old_act[s], NULL) < 0)
            rc = -errno;
        installed[s] = false;
    }
    (void)sync_handlers();
    pthread_mutex_unlock(&reg_lock);
    return rc;
}
