/* COLONY_DEBUG=leaks=1: when co_main's function returns, the coroutines
 * still alive are listed with their entry functions and stacks. */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <sys/wait.h>

static co_chan_t *ch;

__attribute__((noinline)) void leaked_waiter(void *a) {
    (void)a;
    int v;
    int r = co_chan_recv(ch, &v, CO_FOREVER);
    __asm__ volatile("" ::"r"(r) : "memory");
}

static int leaky_main(void *arg) {
    int leak = *(int *)arg;
    co_chan_new(&ch, sizeof(int), 0);
    if (leak) {
        co_attr_t at = {.name = "leaked"};
        co_go_with(&at, leaked_waiter, NULL);
        co_sleep(20 * 1000000LL); /* parked by now (or listed runnable) */
    }
    return 0;
}

static int run_child(int leak, char *out, size_t cap) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        setenv("COLONY_DEBUG", "leaks=1", 1);
        dup2(p[1], 2);
        close(p[0]);
        /* exit without co_shutdown: the leaked coroutine stays parked */
        _exit(co_main(leaky_main, &leak));
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

static void test_leak_listed(void) {
    static char out[65536];
    int st = run_child(1, out, sizeof out);
    fputs(out, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "colony: leaks: 1 coroutine still alive") != NULL);
    CHECK(strstr(out, "'leaked' [") != NULL);
    if (!strstr(out, "(no frames")) CHECK(strstr(out, "entry: leaked_waiter+") != NULL);
}

static void test_no_leak_silent(void) {
    static char out[65536];
    int st = run_child(0, out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "colony: leaks") == NULL);
}

int main(void) {
    t_begin(50);
    T_RUN(test_leak_listed);
    T_RUN(test_no_leak_silent);
    return t_end();
}
