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

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define T_SANITIZED 1
#endif
#endif

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
    char *d = t_dump();
    int ok = d && strstr(d, "'receiver' [waiting, chan receive") &&
             strstr(d, "'timed' [waiting, chan receive") &&
             strstr(d, "'wgwaiter' [waiting, sync.WaitGroup.Wait") &&
             strstr(d, "'handed' [waiting, sync.WaitGroup.Wait");
    free(d);
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

/* Run gdb in batch mode with tools/colony-gdb.py loaded and then the
 * commands cmds[0..n-1], on this binary's child (core NULL: `run` starts
 * it) or on a core file; its output (stdout and stderr) into `out`. The
 * child's environment gets COLONY_PROCS=2 and, if noguard, canaries
 * instead of guard pages. Returns gdb's wait status (-1: it hung). */
static int run_gdb(const char *core, int noguard, int n, const char *const *cmds) {
    static char script[4096], self[4096];
    snprintf(script, sizeof script, "source %s/tools/colony-gdb.py", CO_SOURCE_DIR);
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return -1;
    self[len] = 0;
    const char *argv[64];
    int a = 0;
    argv[a++] = "gdb";
    argv[a++] = "-nx";
    argv[a++] = "-batch";
    argv[a++] = "-q";
    const char *pre[] = {"set pagination off", "set confirm off", script};
    for (int i = 0; i < 3; i++) {
        argv[a++] = "-ex";
        argv[a++] = pre[i];
    }
    for (int i = 0; i < n && a < 56; i++) {
        argv[a++] = "-ex";
        argv[a++] = cmds[i];
    }
    if (core) {
        argv[a++] = self;
        argv[a++] = core;
    } else {
        argv[a++] = "--args";
        argv[a++] = self;
        argv[a++] = "child";
    }
    argv[a] = NULL;
    int rfd;
    pid_t pid = t_fork_piped(1, &rfd);
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(1, 2);
        /* The child runs under ptrace: LeakSanitizer's exit check, which
         * needs ptrace itself, cannot (ASan builds). */
        setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1", 1);
        setenv("COLONY_PROCS", "2", 1);
        if (noguard)
            setenv("COLONY_DEBUG", "noguard", 1);
        else
            unsetenv("COLONY_DEBUG");
        execvp("gdb", (char *const *)argv);
        _exit(127);
    }
    int st = t_drain_and_wait(rfd, out, sizeof out, pid);
    fputs(out, stderr); /* the whole session, for a failure's log */
    return st;
}

/* The three frames of wgwaiter's chain, innermost first, in its section. */
static void check_wgwaiter_chain(void) {
    const char *s = section("'wgwaiter' [waiting, sync.WaitGroup.Wait]:");
    const char *d2 = strstr(s, "gdbt_wait_deep2"), *d1 = strstr(s, "gdbt_wait_deep1");
    const char *w = strstr(s, "gdbt_wgwaiter (");
    CHECK(d2 && d1 && w && d2 < d1 && d1 < w);
    CHECK(strstr(s, "co_waitgroup_wait") != NULL);
}

static void test_gdb_sees_coroutines(void) {
    const char *cmds[] = {"run",
                          "info colony",
                          "info coroutines",
                          "info coroutines 2",
                          "coroutine receiver bt",
                          "coroutine wgwaiter bt",
                          "coroutine main bt",
                          "coroutine 999999 bt",
                          "coroutine all bt",
                          "echo --restored--\\n",
                          "bt 6",
                          /* (not `continue`: gdb 13 may lose the race with
                           * the exiting threads, "Couldn't get registers") */
                          "detach"};
    int st = run_gdb(NULL, 0, (int)(sizeof cmds / sizeof *cmds), cmds);
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
    /* the count by state; with a limit, what was left out */
    CHECK_EQ(t_count(out, "5 live coroutines: 1 running, 4 waiting"), 2);
    CHECK(strstr(out, "  ... 3 more\n") != NULL);
    /* the main coroutine runs on the thread that stopped: marked '*' */
    const char *mainl = line_with("'main' [running] on M");
    CHECK(mainl[0] == '*');
    CHECK(strstr(mainl, "fn=main_tramp") != NULL);

    /* coroutine NAME bt: unwound from the saved registers */
    const char *s = section("'receiver' [waiting, chan receive]:");
    /* (co_chan_recv's call of chan_block may be a tail call: either shows) */
    CHECK(strstr(s, "co_chan_recv") != NULL || strstr(s, "chan_block") != NULL);
    CHECK(strstr(s, "gdbt_receiver") != NULL);
    check_wgwaiter_chain();
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
    CHECK(strstr(out, "child ok") != NULL); /* printed once all its checks passed */
}

/* A core file: gdb writes one of the stopped child (its stacks with
 * canaries: gdb's gcore cannot read a mapping with guard-page markers, and
 * leaves the stacks out), then a second gdb reads it, where no register
 * can be set: the coroutines' frames are grafted on (frames from #1). */
static void test_gdb_core_file(void) {
#ifdef T_SANITIZED
    fprintf(stderr, "   (skipped in sanitizer builds: their shadow maps make cores huge)\n");
    return;
#else
    char dir[] = "/tmp/colony-gdb-XXXXXX", core[64], gen[96];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(core, sizeof core, "%s/core", dir);
    snprintf(gen, sizeof gen, "generate-core-file %s", core);
    const char *mk[] = {"run", gen, "kill"};
    int st = run_gdb(NULL, 1, 3, mk);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK(access(core, R_OK) == 0);
    /* (and from every thread: the grafted frames must unwind whether the
     * coroutine's stack lies above or below the thread's) */
    const char *rd[] = {"info coroutines", "coroutine wgwaiter bt", "coroutine receiver bt",
                        "coroutine handed bt", "thread apply all coroutine timed bt"};
    st = run_gdb(core, 0, 5, rd);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK(strstr(line_with("'receiver' [waiting, chan receive]"), "fn=gdbt_receiver") != NULL);
    CHECK(strstr(line_with("'main' [running] on M"), "fn=main_tramp") != NULL);
    check_wgwaiter_chain();
    CHECK(strstr(section("'receiver' [waiting, chan receive]:"), "gdbt_receiver") != NULL);
    CHECK(strstr(section("'handed' [waiting, sync.WaitGroup.Wait]:"), "gdbt_handed") != NULL);
    CHECK(strstr(out, "Backtrace stopped") == NULL);
    int heads = t_count(out, "'timed' [waiting, chan receive]:");
    CHECK(heads >= 3); /* the Ms' threads and the process's first */
    CHECK_EQ(t_count(out, " in gdbt_timed ("), heads);
    unlink(core);
    rmdir(dir);
#endif
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "child")) {
        alarm(120); /* detached by gdb, nobody else would stop it if it hung */
        return co_main(gdbt_main, NULL);
    }
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
    T_RUN(test_gdb_core_file);
    return t_end();
}
