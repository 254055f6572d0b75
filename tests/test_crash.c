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

static int spawn_crasher(void *arg) {
    (void)arg;
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

/* Runs the crasher in a child, with the program's own SIGSEGV handler
 * first when user is set; returns its wait status, stderr in out. */
static int run_child(int user, char *out, size_t cap) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {0, 0};
        setrlimit(RLIMIT_CORE, &rl); /* no core file from the test */
        dup2(p[1], 2);
        close(p[0]);
        if (user) signal(SIGSEGV, user_handler);
        co_main(spawn_crasher, NULL);
        _exit(0);
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

static void test_null_deref(void) {
    static char out[65536];
    int st = run_child(0, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    CHECK(strstr(out, "colony: fatal: SIGSEGV") != NULL);
    CHECK(strstr(out, "at address 0x0") != NULL);
    CHECK(strstr(out, "'crasher' [running]:") != NULL);
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
    int st = run_child(1, out, sizeof out);
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

int main(void) {
#ifdef SAN
    fprintf(stderr, "skip: the sanitizer runtime owns the crash signals in this build\n");
    return 77;
#endif
    t_begin(50);
    T_RUN(test_null_deref);
    T_RUN(test_user_handler);
    return t_end();
}
