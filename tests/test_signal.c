// Signals as channel messages: co_signal_notify, co_signal_stop,
// co_signal_ignore. Signals come from raise() in coroutines, from kill()
// in plain threads made before and after the first notify, to one or
// several channels; a full channel drops; a stopped channel gets nothing;
// SIGPIPE on a socket and on a pipe.
// ctest-timeout: 60
#include "t.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define SEC (1000LL * 1000 * 1000)

static co_chan_t *mkchan(size_t cap) {
    co_chan_t *ch = NULL;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), cap), 0);
    return ch;
}

static int recv_sig(co_chan_t *ch) {
    int s = 0;
    int rc = co_chan_recv(ch, &s, co_deadline_after(20 * SEC));
    return rc < 0 ? rc : s;
}

/* the program's own handler, which a stop must give back */
static atomic_int own_hits;
static void own_handler(int s) {
    (void)s;
    atomic_fetch_add(&own_hits, 1);
}
static void set_own(int s) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = own_handler;
    sigaction(s, &sa, NULL);
}

static void test_bad_input(void) {
    co_chan_t *ch = mkchan(1);
    int s = SIGUSR1;
    CHECK_EQ(co_signal_notify(NULL, &s, 1), CO_EINVAL);
    CHECK_EQ(co_signal_notify(ch, NULL, 1), CO_EINVAL);
    CHECK_EQ(co_signal_notify(ch, &s, -1), CO_EINVAL);
    int bad[] = {0, -3, 65, 1000, SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ(co_signal_notify(ch, &bad[i], 1), CO_EINVAL);
        CHECK_EQ(co_signal_ignore(&bad[i], 1), CO_EINVAL);
    }
    int mixed[] = {SIGUSR1, SIGKILL};
    CHECK_EQ(co_signal_notify(ch, mixed, 2), CO_EINVAL); /* nothing registered */
    CHECK_EQ(co_signal_stop(NULL), CO_EINVAL);
    CHECK_EQ(co_signal_stop(ch), 0); /* never registered: fine */
    CHECK_EQ(co_signal_ignore(NULL, 1), CO_EINVAL);
    co_chan_free(ch);
    /* an element wider than the relay fills */
    co_chan_t *wide;
    CHECK_EQ(co_chan_new(&wide, 65, 1), 0);
    CHECK_EQ(co_signal_notify(wide, &s, 1), CO_EINVAL);
    co_chan_free(wide);
    CHECK_EQ(co_chan_new(&wide, 64, 1), 0);
    CHECK_EQ(co_signal_notify(wide, &s, 1), 0);
    CHECK_EQ(co_signal_stop(wide), 0);
    co_chan_free(wide);
}

/* the signal by value: the raiser's read of a stack variable would not
 * be ordered (for TSan) before the test's later use of that slot, the
 * pipe and the relay being outside what it sees */
static void raise_co(void *arg) { raise((int)(intptr_t)arg); }

static void test_raise_from_coroutine(void) {
    set_own(SIGUSR1);
    co_chan_t *ch = mkchan(4);
    int s = SIGUSR1;
    CHECK_EQ(co_signal_notify(ch, &s, 1), 0);
    CHECK_EQ(co_go(raise_co, (void *)(intptr_t)SIGUSR1), 0);
    CHECK_EQ(recv_sig(ch), SIGUSR1);
    raise(SIGUSR1); /* from this coroutine too */
    CHECK_EQ(recv_sig(ch), SIGUSR1);
    CHECK_EQ(atomic_load(&own_hits), 0); /* relayed, not handled */
    CHECK_EQ(co_signal_stop(ch), 0);
    /* stopped: the program's own handler is back, the channel gets nothing */
    raise(SIGUSR1);
    CHECK_EQ(atomic_load(&own_hits), 1);
    CHECK_EQ(co_chan_len(ch), 0);
    co_chan_free(ch);
}

/* a plain thread that waits for a go, then kills the process */
typedef struct {
    atomic_int go;
    int sig;
} killer_t;
static void *killer_main(void *arg) {
    killer_t *k = arg;
    while (!atomic_load(&k->go))
        sched_yield();
    kill(getpid(), k->sig);
    return NULL;
}

/* SIGUSR2 here is unblocked everywhere: the kernel hands it to any thread
 * (not under TSan, which runs a handler only when the thread that took
 * the signal next enters the C library: an M asleep on a futex may never).
 * SIG_ALLBLOCKED is blocked in every thread (main blocks it before any
 * thread exists) but colony's relay thread, which takes it. */
#define SIG_ALLBLOCKED (SIGRTMIN + 1)
#define SIG_ALLBLOCKED2 (SIGRTMIN + 2)
/* blocked in every thread too, never given to colony: the program reads
 * it from a signalfd */
#define SIG_OWN_FD (SIGRTMIN + 3)

static void plain_threads_with(int sig) {
    killer_t before = {.sig = sig}, after = {.sig = sig};
    pthread_t tb, ta;
    CHECK_EQ(pthread_create(&tb, NULL, killer_main, &before), 0); /* made before */
    co_chan_t *ch = mkchan(4);
    CHECK_EQ(co_signal_notify(ch, &sig, 1), 0);
    CHECK_EQ(pthread_create(&ta, NULL, killer_main, &after), 0); /* made after */
    atomic_store(&before.go, 1);
    CHECK_EQ(recv_sig(ch), sig);
    pthread_join(tb, NULL);
    atomic_store(&after.go, 1);
    CHECK_EQ(recv_sig(ch), sig);
    pthread_join(ta, NULL);
    CHECK_EQ(co_signal_stop(ch), 0);
    co_chan_free(ch);
}

static void test_plain_threads(void) {
    set_own(SIGUSR2);
    if (!t_tsan())
        plain_threads_with(SIGUSR2);
    plain_threads_with(SIG_ALLBLOCKED);
    CHECK_EQ(atomic_load(&own_hits), 1); /* only test_raise's, earlier */
}

/* a plain thread that receives a signal from its channel itself */
static void *receiver_main(void *arg) {
    co_chan_t *ch = arg;
    int s = 0;
    if (co_chan_recv(ch, &s, co_deadline_after(20 * SEC)) < 0)
        s = -1;
    return (void *)(intptr_t)s;
}

static void test_receive_on_plain_thread(void) {
    co_chan_t *ch = mkchan(1);
    int s = SIGHUP;
    CHECK_EQ(co_signal_notify(ch, &s, 1), 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, receiver_main, ch), 0);
    raise(SIGHUP);
    void *r;
    pthread_join(t, &r);
    CHECK_EQ((intptr_t)r, SIGHUP);
    CHECK_EQ(co_signal_stop(ch), 0);
    co_chan_free(ch);
}

static void test_several_channels(void) {
    co_chan_t *a = mkchan(4), *b = mkchan(4);
    int s1 = SIGUSR1, both[] = {SIGUSR1, SIGUSR2};
    CHECK_EQ(co_signal_notify(a, &s1, 1), 0);
    CHECK_EQ(co_signal_notify(b, both, 2), 0);
    raise(SIGUSR1);
    CHECK_EQ(recv_sig(a), SIGUSR1);
    CHECK_EQ(recv_sig(b), SIGUSR1);
    raise(SIGUSR2);
    CHECK_EQ(recv_sig(b), SIGUSR2);
    /* one pass of the relay serves every channel: b has it, a had no right */
    CHECK_EQ(co_chan_len(a), 0);
    /* notify adds to what a channel has */
    int s2 = SIGUSR2;
    CHECK_EQ(co_signal_notify(a, &s2, 1), 0);
    raise(SIGUSR2);
    CHECK_EQ(recv_sig(a), SIGUSR2);
    CHECK_EQ(recv_sig(b), SIGUSR2);
    /* stopping one leaves the other */
    CHECK_EQ(co_signal_stop(a), 0);
    raise(SIGUSR1);
    CHECK_EQ(recv_sig(b), SIGUSR1);
    CHECK_EQ(co_chan_len(a), 0);
    CHECK_EQ(co_signal_stop(b), 0);
    co_chan_free(a);
    co_chan_free(b);
}

static void test_full_channel_drops(void) {
    co_chan_t *small = mkchan(1), *witness = mkchan(16);
    int s = SIGUSR1;
    CHECK_EQ(co_signal_notify(small, &s, 1), 0);
    CHECK_EQ(co_signal_notify(witness, &s, 1), 0);
    for (int i = 0; i < 3; i++) {
        raise(SIGUSR1);
        CHECK_EQ(recv_sig(witness), SIGUSR1); /* the relay is past this one */
    }
    CHECK_EQ(co_chan_len(small), 1); /* two were dropped, never blocked on */
    CHECK_EQ(recv_sig(small), SIGUSR1);
    /* an unbuffered channel nobody waits on gets nothing */
    co_chan_t *unbuf = mkchan(0);
    CHECK_EQ(co_signal_notify(unbuf, &s, 1), 0);
    raise(SIGUSR1);
    CHECK_EQ(recv_sig(witness), SIGUSR1);
    int v;
    CHECK_EQ(co_chan_recv(unbuf, &v, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_signal_stop(unbuf), 0);
    CHECK_EQ(co_signal_stop(small), 0);
    CHECK_EQ(co_signal_stop(witness), 0);
    co_chan_free(unbuf);
    co_chan_free(small);
    co_chan_free(witness);
}

/* A signal the program blocks everywhere and reads from a signalfd, never
 * given to colony, stays blocked on the relay thread too: the relay once
 * unblocked every relayable signal, and this one then took its default
 * action there (a real-time signal's: the process ended). Runs before
 * test_all_signals, which relays every signal. */
static void test_signalfd_beside(void) {
    sigset_t own;
    sigemptyset(&own);
    sigaddset(&own, SIG_OWN_FD);
    int sfd = signalfd(-1, &own, SFD_CLOEXEC | SFD_NONBLOCK);
    CHECK(sfd >= 0);
    co_chan_t *ch = mkchan(4);
    int s = SIGUSR1;
    CHECK_EQ(co_signal_notify(ch, &s, 1), 0);
    raise(SIGUSR1); /* the relay thread is up and has taken its signals */
    CHECK_EQ(recv_sig(ch), SIGUSR1);
    kill(getpid(), SIG_OWN_FD); /* to the process */
    struct pollfd pf = {.fd = sfd, .events = POLLIN};
    CHECK_EQ(poll(&pf, 1, 20000), 1);
    struct signalfd_siginfo si;
    CHECK_EQ(read(sfd, &si, sizeof si), (ssize_t)sizeof si);
    CHECK_EQ((int)si.ssi_signo, SIG_OWN_FD);
    close(sfd);
    CHECK_EQ(co_signal_stop(ch), 0);
    co_chan_free(ch);
}

static void other_handler(int s) { (void)s; }

/* An action the program set while colony relayed the signal is kept by
 * co_signal_stop (it used to put back the one from before the notify). */
static void test_stop_keeps_newer_action(void) {
    set_own(SIGUSR1);
    co_chan_t *ch = mkchan(1);
    int s = SIGUSR1;
    CHECK_EQ(co_signal_notify(ch, &s, 1), 0);
    struct sigaction sa, cur;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = other_handler;
    CHECK_EQ(sigaction(SIGUSR1, &sa, NULL), 0);
    CHECK_EQ(co_signal_stop(ch), 0);
    CHECK_EQ(sigaction(SIGUSR1, NULL, &cur), 0);
    CHECK(cur.sa_handler == other_handler);
    co_chan_free(ch);
    set_own(SIGUSR1);
}

/* A fork's child relays nothing: its signals take the program's own
 * actions. They used to go down the pipe to the parent's relay thread,
 * reaching the parent's channels, and the child never saw them. */
static void test_fork_child(void) {
    set_own(SIGUSR2);
    co_chan_t *ch = mkchan(4);
    int sigs[] = {SIGUSR1, SIGUSR2};
    CHECK_EQ(co_signal_notify(ch, sigs, 2), 0);
    int fd = -1;
    pid_t pid = t_fork_piped(1, &fd);
    CHECK(pid >= 0);
    if (pid == 0) {
        atomic_store(&own_hits, 0);
        raise(SIGUSR2); /* the program's handler, in the child */
        char b[32];
        int n = snprintf(b, sizeof b, "own=%d\n", atomic_load(&own_hits));
        (void)!write(1, b, (size_t)n);
        _exit(0);
    }
    if (pid < 0) return;
    char out[256];
    int st = t_drain_and_wait(fd, out, sizeof out, pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "own=1") != NULL);
    /* the parent's channel: SIGUSR1 raised here after the child is gone
     * is the first thing in it (the relay keeps the pipe's order) */
    raise(SIGUSR1);
    CHECK_EQ(recv_sig(ch), SIGUSR1);
    CHECK_EQ(co_chan_len(ch), 0);
    CHECK_EQ(co_signal_stop(ch), 0);
    co_chan_free(ch);
}

/* co_signal_ignore ignores the signal even when the program set its own
 * handler after colony's (it used to leave that handler in place). */
static void test_ignore_after_own(void) {
    co_chan_t *ch = mkchan(1);
    int s = SIGWINCH;
    CHECK_EQ(co_signal_notify(ch, &s, 1), 0);
    struct sigaction sa, cur;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = other_handler;
    CHECK_EQ(sigaction(SIGWINCH, &sa, NULL), 0);
    CHECK_EQ(co_signal_ignore(&s, 1), 0);
    CHECK_EQ(sigaction(SIGWINCH, NULL, &cur), 0);
    CHECK(cur.sa_handler == SIG_IGN);
    CHECK_EQ(co_signal_stop(ch), 0);
    CHECK_EQ(sigaction(SIGWINCH, NULL, &cur), 0);
    CHECK(cur.sa_handler == SIG_IGN);
    co_chan_free(ch);
    signal(SIGWINCH, SIG_DFL);
}

static void test_all_signals(void) {
    co_chan_t *ch = mkchan(4);
    CHECK_EQ(co_signal_notify(ch, NULL, 0), 0);
    raise(SIGWINCH);
    CHECK_EQ(recv_sig(ch), SIGWINCH);
    raise(SIGTERM); /* would end the program if not relayed */
    CHECK_EQ(recv_sig(ch), SIGTERM);
    CHECK_EQ(co_signal_stop(ch), 0);
    co_chan_free(ch);
}

static void test_ignore(void) {
    co_chan_t *ch = mkchan(4);
    int s = SIGUSR2;
    CHECK_EQ(co_signal_notify(ch, &s, 1), 0);
    CHECK_EQ(co_signal_ignore(&s, 1), 0);
    raise(SIGUSR2); /* ignored: neither relayed nor the program's handler */
    int s1 = SIGUSR1;
    CHECK_EQ(co_signal_notify(ch, &s1, 1), 0);
    raise(SIGUSR1); /* a marker behind it: the relay keeps order */
    CHECK_EQ(recv_sig(ch), SIGUSR1);
    CHECK_EQ(co_chan_len(ch), 0);
    CHECK_EQ(co_signal_stop(ch), 0);
    co_chan_free(ch);
    set_own(SIGUSR1);
    set_own(SIGUSR2);
}

static void test_sigpipe(void) {
    /* a socket: colony's writes never raise SIGPIPE, the write says EPIPE */
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    CHECK_EQ(co_write(sv[0], "x", 1, co_deadline_after(5 * SEC)), -EPIPE);
    co_close(sv[0]);
    /* a pipe: SIGPIPE is raised; relayed, it comes to the channel */
    co_chan_t *ch = mkchan(2);
    int s = SIGPIPE;
    CHECK_EQ(co_signal_notify(ch, &s, 1), 0);
    int p[2];
    CHECK_EQ(pipe(p), 0);
    close(p[0]);
    CHECK_EQ(co_write(p[1], "x", 1, co_deadline_after(5 * SEC)), -EPIPE);
    CHECK_EQ(recv_sig(ch), SIGPIPE);
    co_close(p[1]);
    CHECK_EQ(co_signal_stop(ch), 0);
    co_chan_free(ch);
}

/* stress: coroutines and plain threads raise while others notify and stop
 * their own channels; every value received is one that was sent */
static atomic_int stress_bad;
static atomic_int stress_stop;
static void stress_churn_co(void *arg) {
    co_waitgroup_t *wg = arg;
    int sigs[] = {SIGUSR1, SIGUSR2, SIG_ALLBLOCKED2};
    for (int i = 0; i < 200; i++) {
        co_chan_t *ch = NULL;
        if (co_chan_new(&ch, sizeof(int), 2) < 0)
            break;
        if (co_signal_notify(ch, sigs, 3) < 0)
            atomic_fetch_add(&stress_bad, 1);
        int v;
        while (co_chan_recv(ch, &v, 0) == 0)
            if (v != SIGUSR1 && v != SIGUSR2 && v != SIG_ALLBLOCKED2)
                atomic_fetch_add(&stress_bad, 1);
        co_yield();
        co_signal_stop(ch);
        co_chan_free(ch); /* after stop: nothing sends to it any more */
    }
    co_waitgroup_done(wg);
}
static void stress_raise_co(void *arg) {
    co_waitgroup_t *wg = arg;
    for (int i = 0; i < 200; i++) {
        raise(i & 1 ? SIGUSR1 : SIGUSR2);
        co_yield();
    }
    co_waitgroup_done(wg);
}
static void *stress_kill_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < 200 && !atomic_load(&stress_stop); i++)
        kill(getpid(), SIG_ALLBLOCKED2);
    return NULL;
}

static void test_stress(void) {
    co_chan_t *keep = mkchan(8);
    int sigs[] = {SIGUSR1, SIGUSR2, SIG_ALLBLOCKED2};
    CHECK_EQ(co_signal_notify(keep, sigs, 3), 0); /* so no signal ever kills */
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, stress_kill_thread, NULL), 0);
    co_waitgroup_add(&wg, 6);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(co_go(stress_churn_co, &wg), 0);
        CHECK_EQ(co_go(stress_raise_co, &wg), 0);
    }
    co_waitgroup_wait(&wg);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    /* a marker through the relay: every signal before it has been passed
     * on, and the first of them found room in keep */
    co_chan_t *marker = mkchan(1);
    int w = SIGWINCH;
    CHECK_EQ(co_signal_notify(marker, &w, 1), 0);
    raise(SIGWINCH);
    CHECK_EQ(recv_sig(marker), SIGWINCH);
    CHECK_EQ(co_signal_stop(marker), 0);
    co_chan_free(marker);
    int v;
    int got = 0;
    while (co_chan_recv(keep, &v, 0) == 0) {
        got++;
        CHECK(v == SIGUSR1 || v == SIGUSR2 || v == SIG_ALLBLOCKED2);
    }
    CHECK(got >= 1);
    CHECK_EQ(atomic_load(&stress_bad), 0);
    CHECK_EQ(co_signal_stop(keep), 0);
    co_chan_free(keep);
    set_own(SIGUSR1);
    set_own(SIGUSR2);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_bad_input);
    T_RUN(test_signalfd_beside);
    T_RUN(test_raise_from_coroutine);
    T_RUN(test_stop_keeps_newer_action);
    T_RUN(test_fork_child);
    T_RUN(test_ignore_after_own);
    T_RUN(test_plain_threads);
    T_RUN(test_receive_on_plain_thread);
    T_RUN(test_several_channels);
    T_RUN(test_full_channel_drops);
    T_RUN(test_all_signals);
    T_RUN(test_ignore);
    T_RUN(test_sigpipe);
    T_RUN(test_stress);
    return 0;
}

int main(void) {
    t_begin(50);
    /* before any thread: every thread inherits it, the relay unblocks it */
    sigset_t blk;
    sigemptyset(&blk);
    sigaddset(&blk, SIG_ALLBLOCKED);
    sigaddset(&blk, SIG_ALLBLOCKED2);
    sigaddset(&blk, SIG_OWN_FD);
    pthread_sigmask(SIG_BLOCK, &blk, NULL);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
