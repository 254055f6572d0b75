/* SIGQUIT prints every coroutine's stack and exits with status 2 (Go's
 * default); COLONY_DEBUG=nosigquit leaves SIGQUIT's default action. */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <sys/resource.h>
#include <sys/wait.h>

#if defined(__SANITIZE_THREAD__)
#define T_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define T_TSAN 1
#endif
#endif

static co_chan_t *ch;

__attribute__((noinline)) void quit_waiter(void *a) {
    (void)a;
    int v;
    int r = co_chan_recv(ch, &v, CO_FOREVER);
    __asm__ volatile("" ::"r"(r) : "memory");
}

static int child_main(void *arg) {
    int fd = *(int *)arg;
    co_chan_new(&ch, sizeof(int), 0);
    co_attr_t at = {.name = "quitter"};
    co_go_with(&at, quit_waiter, NULL);
    co_sleep(20 * 1000000LL);
    (void)!write(fd, "r", 1); /* ready: the waiter is parked */
    co_sleep(20LL * 1000000000);
    return 0;
}

static int run_child(const char *env, char *out, size_t cap) {
    int p[2], ready[2];
    if (pipe(p) != 0 || pipe(ready) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {0, 0};
        setrlimit(RLIMIT_CORE, &rl);
        if (env) setenv("COLONY_DEBUG", env, 1);
        dup2(p[1], 2);
        close(p[0]);
        close(ready[0]);
        co_main(child_main, &ready[1]);
        _exit(0);
    }
    close(p[1]);
    close(ready[1]);
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    close(ready[0]);
    kill(pid, SIGQUIT);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void test_sigquit_dumps(void) {
    static char out[65536];
    int st = run_child(NULL, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    CHECK(strstr(out, "SIGQUIT: quit") != NULL);
    CHECK(strstr(out, "'quitter' [waiting, chan receive") != NULL);
#ifdef CO_HAVE_LIBUNWIND
    if (!strstr(out, "(no frames")) { /* a build that unwinds and names */
        CHECK(strstr(out, "entry: quit_waiter+") != NULL);
        CHECK(strstr(out, "\n  quit_waiter+") != NULL);
    }
#else
    CHECK(strstr(out, "entry: ") != NULL); /* no symbolizer in this build: addresses */
#endif
}

static void test_nosigquit(void) {
    static char out[65536];
    int st = run_child("nosigquit", out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGQUIT);
    CHECK(strstr(out, "SIGQUIT: quit") == NULL);
}

int main(void) {
#ifdef T_TSAN
    fprintf(stderr, "skip: TSan intercepts asynchronous signals and defers their handlers\n");
    return 77;
#endif
    t_begin(50);
    T_RUN(test_sigquit_dumps);
    T_RUN(test_nosigquit);
    return t_end();
}
