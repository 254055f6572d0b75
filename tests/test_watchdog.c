/* The tests' own watchdog (t.h's t_begin) on a test that hangs: it says
 * the test timed out, shows where it hangs (every thread's stack and each
 * coroutine's wait, through gdb, where gdb can attach), and kills it. In
 * the sanitizer builds too: under TSan the signal-based watchdog it
 * replaced never fired (docs/hacking.md).
 * ctest-no-chaos (the child runs without it: its hang is the point) */
#include "t.h"

static int hang_main(void *arg) {
    (void)arg;
    co_chan_t *ch;
    if (co_chan_new(&ch, 1, 0) != 0) return 1;
    char c;
    (void)co_chan_recv(ch, &c, CO_FOREVER); /* nobody ever sends */
    return 0;
}

static void test_hung_test_reported_and_killed(void) {
    int rfd;
    pid_t pid = t_fork_piped(2, &rfd);
    CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        /* the hang itself, not the deadlock report that would end it first */
        setenv("COLONY_DEBUG", "nodeadlock", 1);
        t_execl("/proc/self/exe", "test_watchdog", "--hang", (char *)NULL);
        _exit(127);
    }
    static char out[1 << 17];
    int st = t_drain_and_wait(rfd, out, sizeof out, pid);
    CHECK(st != -1);
    CHECK(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    CHECK(strstr(out, "watchdog: test ") != NULL);
    char after[64]; /* the child's t_begin(2), scaled as t_begin scales it */
    snprintf(after, sizeof after, "timed out after %u s", 2 * T_TIME_SCALE);
    CHECK(strstr(out, after) != NULL);
    CHECK(strstr(out, "watchdog: killing the test") != NULL);
    if (t_emulator()) {
        CHECK(strstr(out, "stacks follow") == NULL); /* gdb would show the emulator's */
    } else if (strstr(out, "no gdb") || strstr(out, "ptrace:")) {
        fprintf(stderr, "  (gdb missing or not allowed to attach: stacks not checked)\n");
    } else {
        CHECK(strstr(out, "in co_main") != NULL);            /* the main thread's stack */
        CHECK(strstr(out, "[waiting, chan receive]") != NULL); /* colony's view: main's wait */
    }
    if (t_cur_failed) fprintf(stderr, "--- the hung test's output:\n%s\n---\n", out);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--hang")) {
        t_begin(2);
        return co_main(hang_main, NULL);
    }
    t_begin(50);
    T_RUN(test_hung_test_reported_and_killed);
    return t_end();
}
