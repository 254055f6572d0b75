/* Deadlock detection: when no coroutine can ever run again, colony prints
 * Go's line, every coroutine with its wait reason and stack, and exits 2.
 * Each case runs as a child whose stderr and status are checked. */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <sys/wait.h>

#if defined(__SANITIZE_THREAD__)
#define T_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define T_TSAN 1
#endif
#endif

static co_chan_t *c1, *c2;
static co_mutex_t mu = CO_MUTEX_INIT;
static co_waitgroup_t wg;

__attribute__((noinline)) void dl_receiver(void *a) {
    (void)a;
    int v;
    int r = co_chan_recv(c2, &v, CO_FOREVER);
    __asm__ volatile("" ::"r"(r) : "memory");
}
static int chan_main(void *a) {
    (void)a;
    co_chan_new(&c1, sizeof(int), 0);
    co_chan_new(&c2, sizeof(int), 0);
    co_go(dl_receiver, NULL);
    int v;
    co_chan_recv(c1, &v, CO_FOREVER); /* nobody sends on c1: deadlock */
    return 0;
}

__attribute__((noinline)) void dl_locker(void *a) {
    (void)a;
    co_mutex_lock(&mu); /* held by main, which waits for us */
    co_mutex_unlock(&mu);
    co_waitgroup_done(&wg);
}
static int mutex_main(void *a) {
    (void)a;
    co_mutex_lock(&mu);
    co_waitgroup_add(&wg, 1);
    co_go(dl_locker, NULL);
    co_waitgroup_wait(&wg);
    co_mutex_unlock(&mu);
    return 0;
}

static int wg_main(void *a) {
    (void)a;
    co_waitgroup_add(&wg, 1);
    co_waitgroup_wait(&wg); /* never done */
    return 0;
}

static int run_child(int (*fn)(void *), const char *env, char *out, size_t cap) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        if (env) setenv("COLONY_DEBUG", env, 1);
        /* undetected: SIGALRM, which the checks below tell apart */
        signal(SIGALRM, SIG_DFL); /* not the parent's watchdog */
        alarm(env ? 3 : 15);
        dup2(p[1], 2);
        close(p[0]);
        _exit(co_main(fn, NULL) == 0 ? 0 : 1);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static const char fatal_line[] = "colony: fatal: all coroutines are asleep - deadlock!";

static void test_chan_deadlock(void) {
    static char out[65536];
    int st = run_child(chan_main, NULL, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    CHECK(strstr(out, fatal_line) != NULL);
    CHECK_EQ(t_count(out, "[waiting, chan receive]:"), 2);
    if (!strstr(out, "(no frames")) CHECK(strstr(out, "\n  dl_receiver+") != NULL);
}

static void test_mutex_deadlock(void) {
    static char out[65536];
    int st = run_child(mutex_main, NULL, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    CHECK(strstr(out, fatal_line) != NULL);
    CHECK(strstr(out, "[waiting, sync.Mutex.Lock]:") != NULL);
    CHECK(strstr(out, "[waiting, sync.WaitGroup.Wait]:") != NULL);
}

static void test_waitgroup_never_done(void) {
    static char out[65536];
    int st = run_child(wg_main, NULL, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    CHECK(strstr(out, fatal_line) != NULL);
    CHECK(strstr(out, "'main' [waiting, sync.WaitGroup.Wait]:") != NULL);
}

static void test_opt_out(void) {
    static char out[65536];
    int st = run_child(wg_main, "nodeadlock", out, sizeof out);
    if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)) fprintf(stderr, "status %#x\n%s", st, out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM); /* hangs, as asked */
    CHECK(strstr(out, fatal_line) == NULL);
}

/* Threads: in /proc/self/status, -1 if unknown. */
static int threads_now(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Threads:", 8) == 0) n = atoi(line + 8);
    fclose(f);
    return n;
}

int main(void) {
    /* Detection needs every thread of the process to be colony's: an
     * emulator's (qemu-user) or a sanitizer runtime's own thread is one
     * colony cannot account for, so it rightly never reports there. */
#ifdef T_TSAN
    fprintf(stderr, "skip: the TSan runtime runs a thread of its own, so the deadlock rule cannot hold\n");
    return 77;
#endif
    int th = threads_now();
    if (th != 1) {
        fprintf(stderr, "skip: the process has %d threads before colony starts (emulator or "
                        "sanitizer runtime), so the deadlock rule cannot hold\n", th);
        return 77;
    }
    t_begin(55);
    T_RUN(test_chan_deadlock);
    T_RUN(test_mutex_deadlock);
    T_RUN(test_waitgroup_never_done);
    T_RUN(test_opt_out);
    return t_end();
}
