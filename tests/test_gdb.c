/* tools/colony-gdb.py on a live program: gdb runs this binary as a child
 * whose coroutines wait in known places, stops it, lists the coroutines,
 * prints their backtraces from their saved registers, and lets it go on.
 * The child must then finish normally: the registers gdb borrowed are put
 * back. Skipped (77) where gdb cannot be used: no gdb, or an emulator.
 * ctest-no-chaos (gdb drives the child; the chaos run adds nothing)
 * ctest-timeout: 240 */
#include "t.h"

#include <colony.h>
#include <errno.h>
#include <stdint.h>

/* ---- the child --------------------------------------------------------- */

static co_chan_t *ch_fwd, *ch_timed;
static co_waitgroup_t gate, done;
static int64_t got_fwd;
static int rc_fwd = -1, rc_timed = -1;
static int deep_calls; /* atomic; its increments keep the calls below from being tail calls */

__attribute__((noinline)) static void gdbt_wait_deep2(void) {
    co_waitgroup_wait(&gate);
    __atomic_add_fetch(&deep_calls, 1, __ATOMIC_RELAXED);
}
__attribute__((noinline)) static void gdbt_wait_deep1(void) {
    gdbt_wait_deep2();
    __atomic_add_fetch(&deep_calls, 1, __ATOMIC_RELAXED);
}
static void gdbt_wgwaiter(void *arg) {
    (void)arg;
    gdbt_wait_deep1();
    co_waitgroup_done(&done);
}
static void gdbt_receiver(void *arg) {
    (void)arg;
    rc_fwd = co_chan_recv(ch_fwd, &got_fwd, CO_FOREVER);
    co_waitgroup_done(&done);
}
static void gdbt_starter(void *arg) { (void)arg; }
/* Spawned right after gdbt_starter, which exits at once: it may start on
 * the stack gdbt_starter leaves (co__fresh_start), a different outermost
 * frame from co__trampoline's. */
static void gdbt_handed(void *arg) {
    (void)arg;
    co_waitgroup_wait(&gate);
    __atomic_add_fetch(&deep_calls, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&done);
}
static void gdbt_timed(void *arg) {
    (void)arg;
    int64_t v;
    rc_timed = co_chan_recv(ch_timed, &v, co_deadline_after(INT64_C(120000000000)));
    co_waitgroup_done(&done);
}

/* Whether co_dump shows all three waiting where they should. */
static int all_parked(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return 0;
    co_dump(f);
    fclose(f);
    int ok = strstr(buf, "'receiver' [waiting, chan receive]") &&
             strstr(buf, "'timed' [waiting, chan receive]") &&
             strstr(buf, "'wgwaiter' [waiting, sync.WaitGroup.Wait]") &&
             strstr(buf, "'handed' [waiting, sync.WaitGroup.Wait]");
    free(buf);
    return ok;
}

static int gdbt_main(void *arg) {
    (void)arg;
    if (co_chan_new(&ch_fwd, sizeof(int64_t), 0) || co_chan_new(&ch_timed, sizeof(int64_t), 0))
        return 10;
    co_waitgroup_add(&gate, 1);
    co_waitgroup_add(&done, 4);
    co_attr_t a0 = {0, "handed"}, a1 = {0, "receiver"}, a2 = {0, "timed"},
              a3 = {0, "wgwaiter"};
    if (co_go(gdbt_starter, NULL) || co_go_with(&a0, gdbt_handed, NULL) ||
        co_go_with(&a1, gdbt_receiver, NULL) || co_go_with(&a2, gdbt_timed, NULL) ||
        co_go_with(&a3, gdbt_wgwaiter, NULL))
        return 11;
    int tries = 0;
    while (!all_parked()) {
        if (++tries > 20000) return 12; /* 20 s */
        co_sleep(1000000);
    }
    raise(SIGTRAP); /* gdb stops here, looks, and continues */
    int64_t v = 42;
    if (co_chan_send(ch_fwd, &v, CO_FOREVER)) return 13;
    co_chan_close(ch_timed);
    co_waitgroup_done(&gate);
    co_waitgroup_wait(&done);
    if (rc_fwd != 0 || got_fwd != 42 || rc_timed != CO_ECLOSED ||
        __atomic_load_n(&deep_calls, __ATOMIC_RELAXED) != 3)
        return 14;
    co_chan_free(ch_fwd);
    co_chan_free(ch_timed);
    printf("child ok\n");
    return 0;
}

/* ---- the test ---------------------------------------------------------- */

static char out[1 << 16];

/* The text of the section that starts at the first line containing `head`
 * and ends before the next line starting with "coroutine " (a header of
 * `coroutine all`) or "-- " (none here), NUL-terminated in a static copy. */
static const char *section(const char *head) {
    static char sec[1 << 14];
    const char *s = strstr(out, head);
    if (!s) return "";
    const char *e = strchr(s, '\n');
    while (e && strncmp(e + 1, "coroutine ", 10) != 0) e = strchr(e + 1, '\n');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n >= sizeof sec) n = sizeof sec - 1;
    memcpy(sec, s, n);
    sec[n] = 0;
    return sec;
}

/* The line of `out` containing `needle` (copied), or "". */
static const char *line_with(const char *needle) {
    static char ln[512];
    const char *s = strstr(out, needle);
    if (!s) return "";
    while (s > out && s[-1] != '\n') s--;
    const char *e = strchr(s, '\n');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n >= sizeof ln) n = sizeof ln - 1;
    memcpy(ln, s, n);
    ln[n] = 0;
    return ln;
}

static int have_gdb(void) {
    return system("gdb --version >/dev/null 2>&1") == 0;
}

static void test_gdb_sees_coroutines(void) {
    char script[4096], self[4096];
    snprintf(script, sizeof script, "source %s/tools/colony-gdb.py", CO_SOURCE_DIR);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0) return;
    self[n] = 0;
    int rfd;
    pid_t pid = t_fork_piped(1, &rfd);
    CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        dup2(1, 2);
        /* The child runs under ptrace: LeakSanitizer's exit check, which
         * needs ptrace itself, cannot (ASan builds). */
        setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1", 1);
        setenv("COLONY_PROCS", "2", 1);
        unsetenv("COLONY_DEBUG");
        execlp("gdb", "gdb", "-nx", "-batch", "-q", "-ex", "set pagination off", "-ex",
               "set confirm off", "-ex", script, "-ex", "run", "-ex", "info colony", "-ex",
               "info coroutines", "-ex", "coroutine receiver bt", "-ex",
               "coroutine wgwaiter bt", "-ex", "coroutine main bt", "-ex",
               "coroutine 999999 bt", "-ex", "coroutine all bt", "-ex", "echo --restored--\\n", "-ex", "bt 6", "-ex",
               "continue", "--args", self, "child", (char *)NULL);
        _exit(127);
    }
    int st = t_drain_and_wait(rfd, out, sizeof out, pid);
    fputs(out, stderr); /* the whole session, for a failure's log */
    CHECK(st != -1 && WIFEXITED(st));

    /* info colony: the Ps and the Ms */
    CHECK(strstr(out, "procs=2 ") != NULL);
    CHECK(strstr(out, "  P0 ") != NULL && strstr(out, "  P1 ") != NULL);
    CHECK(strstr(out, "  M0") != NULL || strstr(out, "  M1") != NULL);

    /* info coroutines: each one, its state, its entry function */
    CHECK(strstr(line_with("'receiver' [waiting, chan receive]"), "fn=gdbt_receiver") != NULL);
    CHECK(strstr(line_with("'timed' [waiting, chan receive]"), "fn=gdbt_timed") != NULL);
    CHECK(strstr(line_with("'wgwaiter' [waiting, sync.WaitGroup.Wait]"), "fn=gdbt_wgwaiter") !=
          NULL);
    /* the main coroutine runs on the thread that stopped: marked '*' */
    const char *mainl = line_with("'main' [running] on M");
    CHECK(mainl[0] == '*');
    CHECK(strstr(mainl, "fn=main_tramp") != NULL);

    /* coroutine NAME bt: unwound from the saved registers */
    const char *s = section("'receiver' [waiting, chan receive]:");
    /* (co_chan_recv's call of chan_block may be a tail call: either shows) */
    CHECK(strstr(s, "co_chan_recv") != NULL || strstr(s, "chan_block") != NULL);
    CHECK(strstr(s, "gdbt_receiver") != NULL);
    s = section("'wgwaiter' [waiting, sync.WaitGroup.Wait]:");
    const char *d2 = strstr(s, "gdbt_wait_deep2"), *d1 = strstr(s, "gdbt_wait_deep1");
    const char *w = strstr(s, "gdbt_wgwaiter (");
    CHECK(d2 && d1 && w && d2 < d1 && d1 < w); /* innermost first, three frames deep */
    CHECK(strstr(s, "co_waitgroup_wait") != NULL);
    s = section("'main' [running]:");
    CHECK(strstr(s, "gdbt_main") != NULL);
    CHECK(strstr(out, "no live coroutine 999999") != NULL);
    /* coroutine all bt: a header for each, the timed one unwound too */
    s = section("'timed' [waiting, chan receive]:");
    CHECK(strstr(s, "gdbt_timed") != NULL);
    s = section("'handed' [waiting, sync.WaitGroup.Wait]:");
    CHECK(strstr(s, "gdbt_handed") != NULL);
    /* every backtrace ends at the coroutine's first frame, cleanly */
    CHECK(strstr(out, "Backtrace stopped") == NULL);

    /* registers back: the stopped thread's own backtrace (it stopped in
     * raise), then the run goes on and every coroutine finishes as it
     * should */
    const char *r = strstr(out, "--restored--");
    CHECK(r != NULL);
    if (r) {
        const char *f0 = strstr(r, "#0 ");
        CHECK(f0 && (strstr(f0, "raise") || strstr(f0, "pthread_kill")));
        CHECK(f0 && strstr(f0, "gdbt_main") != NULL);
    }
    CHECK(strstr(out, "child ok") != NULL);
    CHECK(strstr(out, "exited normally") != NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "child")) return co_main(gdbt_main, NULL);
    if (t_emulator()) {
        printf("skipped: gdb cannot follow a program run under an emulator\n");
        return 77;
    }
    if (!have_gdb()) {
        printf("skipped: no gdb on the PATH (scripts/deps.sh installs it)\n");
        return 77;
    }
    t_begin(200);
    T_RUN(test_gdb_sees_coroutines);
    return t_end();
}
