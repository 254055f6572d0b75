/* Crash reports: a fault inside a coroutine names the signal, the address,
 * the coroutine and its function, then dies by the signal's default
 * action; a SIGSEGV handler the program installed first still runs. */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <sys/resource.h>
#include <sys/wait.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SAN 1
#endif
#endif

static int *volatile nullp;

__attribute__((noinline)) void crash_fn(void *arg) {
    (void)arg;
    *nullp = 42; /* NULL dereference */
    __asm__ volatile("" ::: "memory");
}

static co_chan_t *never;

__attribute__((noinline)) void bystander_fn(void *arg) {
    (void)arg;
    int v;
    (void)co_chan_recv(never, &v, CO_FOREVER);
}

static int spawn_crasher(void *arg) {
    (void)arg;
    /* a bystander, parked, for COLONY_DEBUG=crashall to list */
    if (co_chan_new(&never, sizeof(int), 0) == 0)
        co_go_with(&(co_attr_t){.name = "bystander"}, bystander_fn, NULL);
    co_sleep(20 * 1000000LL);
    co_attr_t at = {.name = "crasher"};
    co_go_with(&at, crash_fn, NULL);
    co_sleep(10LL * 1000000000);
    return 0;
}

static void user_handler(int sig) {
    (void)sig;
    static const char m[] = "user handler ran\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(42);
}

/* A child: fn(), its stderr in out; the wait status. No core file. */
static int in_child(void (*fn)(void), char *out, size_t cap) {
    int fd;
    pid_t pid = t_fork_piped(2, &fd);
    if (pid < 0) return -1;
    if (pid == 0) {
        struct rlimit rl = {0, 0};
        setrlimit(RLIMIT_CORE, &rl);
        unsetenv("COLONY_DEBUG");
        alarm(20); /* a hung child fails its case well before the test's own timeout */
        fn();
        _exit(0);
    }
    return t_drain_and_wait(fd, out, cap, pid);
}

/* The crasher in a child, with the program's own SIGSEGV handler first
 * when child_user is set and COLONY_DEBUG=child_debug (or none). */
static int child_user;
static const char *child_debug;
static void crasher_child(void) {
    if (child_user) signal(SIGSEGV, user_handler);
    if (child_debug) setenv("COLONY_DEBUG", child_debug, 1);
    co_main(spawn_crasher, NULL);
}
static int run_child(int user, char *out, size_t cap, const char *debug) {
    child_user = user;
    child_debug = debug;
    return in_child(crasher_child, out, cap);
}

static void test_null_deref(void) {
    static char out[65536];
    int st = run_child(0, out, sizeof out, NULL);
    fputs(out, stderr);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    CHECK(strstr(out, "colony: fatal: SIGSEGV") != NULL);
    CHECK(strstr(out, "at address 0x0") != NULL);
    CHECK(strstr(out, "'crasher' [running]:") != NULL);
    CHECK(strstr(out, "bystander") == NULL); /* others only with crashall */
#ifdef CO_HAVE_LIBUNWIND
    CHECK(strstr(out, "entry: crash_fn+") != NULL);
    if (!strstr(out, "(no frames"))
        CHECK(strstr(out, "\n  crash_fn+") != NULL); /* the faulting frame */
#else
    CHECK(strstr(out, "entry: ") != NULL); /* no symbolizer in this build: an address */
#endif
}

static void test_user_handler(void) {
    static char out[65536];
    int st = run_child(1, out, sizeof out, NULL);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42);
    CHECK(strstr(out, "user handler ran") != NULL);
    /* colony's report first, not called fatal: the handler may go on */
    const char *rep = strstr(out, "colony: SIGSEGV: segmentation violation at address 0x0 "
                                  "(the program's own handler runs next)");
    CHECK(rep != NULL);
    CHECK(strstr(out, "colony: fatal:") == NULL);
    CHECK(strstr(out, "'crasher' [running]:") != NULL);
    CHECK(rep && strstr(rep, "user handler ran") != NULL); /* in that order */
}

/* COLONY_DEBUG=crashall: the report, then the other coroutines */
static void test_crash_all(void) {
    static char out[65536];
    int st = run_child(0, out, sizeof out, "crashall");
    fputs(out, stderr);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    const char *rep = strstr(out, "'crasher' [running]:");
    CHECK(rep != NULL);
    const char *others = rep ? strstr(rep, "other coroutines:\n") : NULL;
    CHECK(others != NULL);
    CHECK(others && strstr(others, "'bystander' [waiting, chan receive") != NULL);
#ifdef CO_HAVE_LIBUNWIND
    CHECK(others && strstr(others, "entry: bystander_fn+") != NULL);
#endif
}

/* A handler installed with SA_RESETHAND that returns: the kernel would
 * call it once and let the fault, run again, kill the process. */
static void once_handler(int sig) {
    (void)sig;
    static const char m[] = "once handler ran\n";
    (void)!write(2, m, sizeof m - 1);
}
static void resethand_child(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = once_handler;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    co_main(spawn_crasher, NULL);
}
static void test_user_handler_resethand(void) {
    static char out[65536];
    int st = in_child(resethand_child, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    const char *first = strstr(out, "once handler ran");
    CHECK(first != NULL);
    CHECK(first && strstr(first + 1, "once handler ran") == NULL); /* once only */
}

/* A crash signal the program ignores, sent by kill: still ignored. */
static int send_fpe(void *arg) {
    (void)arg;
    kill(getpid(), SIGFPE);
    return 0;
}
static void ignored_child(void) {
    signal(SIGFPE, SIG_IGN);
    if (co_main(send_fpe, NULL) == 0) (void)!write(2, "survived\n", 9);
}
static void test_ignored_stays_ignored(void) {
    static char out[4096];
    int st = in_child(ignored_child, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "survived") != NULL);
}

/* SIGQUIT once the runtime is down: no sysmon dumps, so it quits as by
 * default rather than being swallowed. */
static int nothing(void *arg) {
    (void)arg;
    return 0;
}
static void quit_after_shutdown_child(void) {
    co_main(nothing, NULL);
    if (co_shutdown() != 0) _exit(3);
    raise(SIGQUIT);
    (void)!write(2, "swallowed\n", 10);
    _exit(4);
}
static void test_sigquit_after_shutdown(void) {
    static char out[4096];
    int st = in_child(quit_after_shutdown_child, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGQUIT);
}

int main(void) {
#ifdef SAN
    fprintf(stderr, "skip: the sanitizer runtime owns the crash signals in this build\n");
    return 77;
#endif
    t_begin(50);
    T_RUN(test_null_deref);
    T_RUN(test_user_handler);
    T_RUN(test_crash_all);
    T_RUN(test_user_handler_resethand);
    T_RUN(test_ignored_stays_ignored);
    T_RUN(test_sigquit_after_shutdown);
    return t_end();
}
