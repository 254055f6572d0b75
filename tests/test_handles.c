// ctest-no-chaos
// ctest-timeout: 120
/* Checked handles: every public call on a channel, timer, ticker, context,
 * group, pool or multipool given a handle that was freed, or that points
 * at memory no make call made, stops with
 *   colony: fatal: <call>: <handle> is not a <kind> (freed)
 * ("(freed or never made)" when the memory does not hold the freed tag)
 * and dies of SIGABRT, instead of hanging or writing into the memory.
 *
 * Each case runs in a child (this binary re-executed): `--one` makes one
 * call and must die of SIGABRT; `--sweep` makes every call of a kind in
 * turn, catching each SIGABRT and jumping back (glibc's abort raises
 * SIGABRT with its lock released, so a handler that leaves it may call
 * abort again), and the parent checks one fatal line per call.
 *
 * Under ASan a freed handle's tag read is itself a heap-use-after-free,
 * which ASan reports and dies of before colony's check can: there the
 * freed cases check that ASan's report comes instead (and no sweep, which
 * stops at the first). TSan reports the read too; its children run with
 * halt_on_error=0, so its report and then colony's line are both checked.
 * The never-made cases point into a static buffer and run everywhere, as
 * does the context case whose freed handle's memory lives on for a child
 * context. */
#include "colony.h"
#include "t.h"

#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the calls, per kind --------------------------------------------------- */
static void task(void *arg) { (void)arg; }
static int gtask(void *arg) { (void)arg; return 0; }

#define CALL(fn, ...)                                                                         \
    static void x_##fn(void *h) {                                                             \
        int64_t v = 0;                                                                        \
        (void)v;                                                                              \
        __VA_ARGS__;                                                                          \
    }
/* channels */
CALL(co_chan_send, co_chan_send(h, &v, CO_FOREVER))
CALL(co_chan_recv, co_chan_recv(h, &v, CO_FOREVER))
CALL(co_chan_close, co_chan_close(h))
CALL(co_chan_len, (void)co_chan_len(h))
CALL(co_chan_cap, (void)co_chan_cap(h))
CALL(co_chan_free, co_chan_free(h))
CALL(co_select, co_select(&(co_case_t){h, CO_RECV, &v, 0}, 1, CO_FOREVER))
CALL(co_signal_notify, co_signal_notify(h, (const int[]){SIGUSR2}, 1))
CALL(co_signal_stop, co_signal_stop(h))
/* timers */
CALL(co_timer_chan, (void)co_timer_chan(h))
CALL(co_timer_stop, (void)co_timer_stop(h))
CALL(co_timer_reset, co_timer_reset(h, CO_SECOND))
CALL(co_timer_free, co_timer_free(h))
/* tickers */
CALL(co_ticker_chan, (void)co_ticker_chan(h))
CALL(co_ticker_stop, co_ticker_stop(h))
/* contexts */
CALL(co_ctx_with_cancel, co_ctx_t *o; co_ctx_with_cancel(&o, h))
CALL(co_ctx_with_deadline, co_ctx_t *o; co_ctx_with_deadline(&o, h, CO_FOREVER))
CALL(co_ctx_with_timeout, co_ctx_t *o; co_ctx_with_timeout(&o, h, CO_SECOND))
CALL(co_ctx_with_value, co_ctx_t *o; co_ctx_with_value(&o, h, "k", NULL))
CALL(co_ctx_cancel, co_ctx_cancel(h))
CALL(co_ctx_done, (void)co_ctx_done(h))
CALL(co_ctx_err, co_ctx_err(h))
CALL(co_ctx_value, (void)co_ctx_value(h, "k"))
CALL(co_ctx_deadline, (void)co_ctx_deadline(h, NULL))
CALL(co_ctx_free, co_ctx_free(h))
CALL(co_group_new, co_group_t *o; co_group_new(&o, h))
/* groups */
CALL(co_group_limit, co_group_limit(h, 2))
CALL(co_group_go, co_group_go(h, gtask, NULL))
CALL(co_group_wait, co_group_wait(h))
CALL(co_group_ctx, (void)co_group_ctx(h))
CALL(co_group_free, co_group_free(h))
/* pools */
CALL(co_pool_submit, co_pool_submit(h, task, NULL))
CALL(co_pool_submit_until, co_pool_submit_until(h, task, NULL, CO_FOREVER))
CALL(co_pool_invoke, co_pool_invoke(h, NULL))
CALL(co_pool_running, co_pool_running(h))
CALL(co_pool_available, co_pool_available(h))
CALL(co_pool_waiting, co_pool_waiting(h))
CALL(co_pool_cap, co_pool_cap(h))
CALL(co_pool_tune, co_pool_tune(h, 2))
CALL(co_pool_is_closed, (void)co_pool_is_closed(h))
CALL(co_pool_release, co_pool_release(h))
CALL(co_pool_release_timeout, co_pool_release_timeout(h, CO_SECOND))
CALL(co_pool_reboot, co_pool_reboot(h))
CALL(co_pool_wait_idle, co_pool_wait_idle(h, CO_FOREVER))
CALL(co_pool_destroy, co_pool_destroy(h))
CALL(co_pool_stats, co_pool_stats(h, &(co_pool_stats_t){0}))
/* multipools */
CALL(co_multipool_submit, co_multipool_submit(h, task, NULL))
CALL(co_multipool_invoke, co_multipool_invoke(h, NULL))
CALL(co_multipool_running, co_multipool_running(h))
CALL(co_multipool_available, co_multipool_available(h))
CALL(co_multipool_waiting, co_multipool_waiting(h))
CALL(co_multipool_cap, co_multipool_cap(h))
CALL(co_multipool_running_by_index, co_multipool_running_by_index(h, 0))
CALL(co_multipool_available_by_index, co_multipool_available_by_index(h, 0))
CALL(co_multipool_waiting_by_index, co_multipool_waiting_by_index(h, 0))
CALL(co_multipool_tune, co_multipool_tune(h, 2))
CALL(co_multipool_is_closed, (void)co_multipool_is_closed(h))
CALL(co_multipool_release_timeout, co_multipool_release_timeout(h, CO_SECOND))
CALL(co_multipool_reboot, co_multipool_reboot(h))
CALL(co_multipool_destroy, co_multipool_destroy(h))
#undef CALL

typedef struct {
    const char *name;
    void (*fn)(void *h);
} call_t;
#define C(fn) {#fn, x_##fn}

enum { K_CHAN, K_TIMER, K_TICKER, K_CTX, K_GROUP, K_POOL, K_MPOOL, NKINDS };
static const struct {
    const char *tag;  /* on the command line */
    const char *kind; /* in the fatal line */
    call_t calls[16];
    int ncalls;
} kinds[NKINDS] = {
    [K_CHAN] = {"chan", "channel",
                {C(co_chan_send), C(co_chan_recv), C(co_chan_close), C(co_chan_len), C(co_chan_cap),
                 C(co_chan_free), C(co_select), C(co_signal_notify), C(co_signal_stop)},
                9},
    [K_TIMER] = {"timer", "timer",
                 {C(co_timer_chan), C(co_timer_stop), C(co_timer_reset), C(co_timer_free)},
                 4},
    [K_TICKER] = {"ticker", "ticker", {C(co_ticker_chan), C(co_ticker_stop)}, 2},
    [K_CTX] = {"ctx", "context",
               {C(co_ctx_with_cancel), C(co_ctx_with_deadline), C(co_ctx_with_timeout),
                C(co_ctx_with_value), C(co_ctx_cancel), C(co_ctx_done), C(co_ctx_err),
                C(co_ctx_value), C(co_ctx_deadline), C(co_ctx_free), C(co_group_new)},
               11},
    [K_GROUP] = {"group", "group",
                 {C(co_group_limit), C(co_group_go), C(co_group_wait), C(co_group_ctx),
                  C(co_group_free)},
                 5},
    [K_POOL] = {"pool", "pool",
                {C(co_pool_submit), C(co_pool_submit_until), C(co_pool_invoke), C(co_pool_running),
                 C(co_pool_available), C(co_pool_waiting), C(co_pool_cap), C(co_pool_tune),
                 C(co_pool_is_closed), C(co_pool_release), C(co_pool_release_timeout),
                 C(co_pool_reboot), C(co_pool_wait_idle), C(co_pool_destroy), C(co_pool_stats)},
                15},
    [K_MPOOL] = {"mpool", "multipool",
                 {C(co_multipool_submit), C(co_multipool_invoke), C(co_multipool_running),
                  C(co_multipool_available), C(co_multipool_waiting), C(co_multipool_cap),
                  C(co_multipool_running_by_index), C(co_multipool_available_by_index),
                  C(co_multipool_waiting_by_index), C(co_multipool_tune), C(co_multipool_is_closed),
                  C(co_multipool_release_timeout), C(co_multipool_reboot), C(co_multipool_destroy)},
                 14},
};
#undef C

/* The first call of each kind that, on a freed object, would otherwise
 * wait for ever or write into the memory: the `--one` cases. */
static const char *const one_call[NKINDS] = {
    [K_CHAN] = "co_chan_recv",    [K_TIMER] = "co_timer_stop",  [K_TICKER] = "co_ticker_stop",
    [K_CTX] = "co_ctx_cancel",    [K_GROUP] = "co_group_wait",  [K_POOL] = "co_pool_submit",
    [K_MPOOL] = "co_multipool_submit",
};

/* Memory no make call made: not a handle of any kind. */
static _Alignas(64) unsigned char junk[4096];

/* A handle of kind k that was made and freed (freed), or junk. */
static void *dead_handle(int k, bool freed) {
    if (!freed) {
        memset(junk, 0x5a, sizeof junk);
        return junk;
    }
    void *h = NULL;
    int rc = -1;
    switch (k) {
    case K_CHAN:
        if ((rc = co_chan_new((co_chan_t **)&h, sizeof(int64_t), 1)) == 0) co_chan_free(h);
        break;
    case K_TIMER:
        if ((rc = co_timer_new((co_timer_t **)&h, CO_HOUR)) == 0) co_timer_free(h);
        break;
    case K_TICKER:
        if ((rc = co_ticker_new((co_ticker_t **)&h, CO_SECOND)) == 0) co_ticker_stop(h);
        break;
    case K_CTX:
        if ((rc = co_ctx_with_cancel((co_ctx_t **)&h, co_ctx_background())) == 0) co_ctx_free(h);
        break;
    case K_GROUP:
        if ((rc = co_group_new((co_group_t **)&h, NULL)) == 0) co_group_free(h);
        break;
    case K_POOL:
        if ((rc = co_pool_new((co_pool_t **)&h, 4, NULL)) == 0) co_pool_destroy(h);
        break;
    case K_MPOOL:
        if ((rc = co_multipool_new((co_multipool_t **)&h, 2, 4, CO_LB_ROUND_ROBIN, NULL)) == 0)
            co_multipool_destroy(h);
        break;
    }
    if (rc != 0) {
        fprintf(stderr, "could not make a %s: %d\n", kinds[k].kind, rc);
        exit(3);
    }
    return h;
}

/* ---- the children ---------------------------------------------------------- */
static sigjmp_buf jump;
static volatile sig_atomic_t aborts;
static void on_abort(int sig) {
    (void)sig;
    aborts++;
    siglongjmp(jump, 1);
}

static int kind_of(const char *tag) {
    for (int k = 0; k < NKINDS; k++)
        if (!strcmp(kinds[k].tag, tag)) return k;
    return -1;
}

/* argv: --one|--sweep <kind> freed|junk [<call>] */
static int child(int argc, char **argv) {
    int k = argc >= 4 ? kind_of(argv[2]) : -1;
    if (k < 0) return 2;
    if (co_init(NULL) != 0) return 3; /* a started runtime, as in real use */
    void *h = dead_handle(k, !strcmp(argv[3], "freed"));
    fprintf(stderr, "obj=%p\n", h);
    if (!strcmp(argv[1], "--one")) {
        for (int i = 0; argc >= 5 && i < kinds[k].ncalls; i++)
            if (!strcmp(kinds[k].calls[i].name, argv[4])) {
                kinds[k].calls[i].fn(h);
                fprintf(stderr, "returned: %s\n", argv[4]);
                return 0; /* it should not have */
            }
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_abort;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGABRT, &sa, NULL);
    for (volatile int i = 0; i < kinds[k].ncalls; i++) {
        if (sigsetjmp(jump, 1) == 0) {
            kinds[k].calls[i].fn(h);
            fprintf(stderr, "returned: %s\n", kinds[k].calls[i].name);
        }
    }
    fprintf(stderr, "sweep done: %d aborts\n", (int)aborts);
    return 0;
}

/* ---- the parent ------------------------------------------------------------ */
static bool asan(void) { return t_sanitized() && !t_tsan(); }

/* Run this binary with args (NULL-terminated, at most 4); its stderr into
 * buf; its wait status (-1 if it hung: killed). */
static int run_child(char *buf, size_t size, const char *a1, const char *a2, const char *a3,
                     const char *a4) {
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    if (pid < 0) return -1;
    if (pid == 0) {
        t_execl("/proc/self/exe", "test_handles", a1, a2, a3, a4, (char *)NULL);
        _exit(127);
    }
    /* a call the check misses may wait for ever: 20 s is far beyond any
     * run of one call, even under an emulator */
    return t_child_wait(pid, fd, buf, size, 20);
}

/* The fatal line "colony: fatal: <call>: <obj> is not a <kind> (<why>)" is in buf. */
static bool has_line(const char *buf, const char *call, const char *kind, const char *why) {
    const char *obj = strstr(buf, "obj=");
    char addr[64] = {0};
    if (!obj || sscanf(obj + 4, "%63s", addr) != 1) return false;
    char want[256];
    snprintf(want, sizeof want, "colony: fatal: %s: %s is not a %s (%s)\n", call, addr, kind, why);
    return strstr(buf, want) != NULL;
}

/* One call on a dead handle: it dies of SIGABRT with its fatal line. */
static void expect_one(int k, bool freed, const char *call) {
    static char buf[16384];
    int st = run_child(buf, sizeof buf, "--one", kinds[k].tag, freed ? "freed" : "junk", call);
    if (freed && asan()) {
        /* ASan sees the read of freed memory first */
        bool ok = st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) &&
                  strstr(buf, "heap-use-after-free") != NULL;
        CHECK(ok);
        if (!ok) fprintf(stderr, "   %s (freed %s): status %#x, output:\n%s\n", call, kinds[k].kind, (unsigned)st, buf);
        return;
    }
    bool aborted = st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    bool named = has_line(buf, call, kinds[k].kind, freed ? "freed" : "freed or never made");
    CHECK(aborted);
    CHECK(named);
    if (freed && t_tsan()) CHECK(strstr(buf, "ThreadSanitizer: heap-use-after-free") != NULL);
    if (!aborted || !named)
        fprintf(stderr, "   %s (%s %s): status %#x, output:\n%s\n", call, freed ? "freed" : "junk",
                kinds[k].kind, (unsigned)st, buf);
}

/* Every call of kind k on a dead handle: each prints its fatal line and
 * aborts, none returns. */
static void expect_sweep(int k, bool freed) {
    static char buf[65536];
    int st = run_child(buf, sizeof buf, "--sweep", kinds[k].tag, freed ? "freed" : "junk", NULL);
    /* under TSan a freed sweep exits with 66 after its reports */
    int want_status = freed && t_tsan() ? 66 : 0;
    bool exited = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == want_status;
    CHECK(exited);
    if (freed && t_tsan()) CHECK(strstr(buf, "ThreadSanitizer: heap-use-after-free") != NULL);
    char done[64];
    snprintf(done, sizeof done, "sweep done: %d aborts\n", kinds[k].ncalls);
    bool all = strstr(buf, done) != NULL && strstr(buf, "returned: ") == NULL;
    CHECK(all);
    int missing = 0;
    for (int i = 0; i < kinds[k].ncalls; i++) {
        if (has_line(buf, kinds[k].calls[i].name, kinds[k].kind, freed ? "freed" : "freed or never made"))
            continue;
        missing++;
        fprintf(stderr, "   no fatal line for %s on a %s %s\n", kinds[k].calls[i].name,
                freed ? "freed" : "never made", kinds[k].kind);
    }
    CHECK_EQ(missing, 0);
    if (!exited || !all || missing) fprintf(stderr, "   status %#x, output:\n%s\n", (unsigned)st, buf);
}

static void test_freed_one_call_per_kind(void) {
    for (int k = 0; k < NKINDS; k++) expect_one(k, true, one_call[k]);
}

static void test_never_made_one_call_per_kind(void) {
    for (int k = 0; k < NKINDS; k++) expect_one(k, false, one_call[k]);
}

static void test_freed_every_call(void) {
    if (asan()) {
        fprintf(stderr, "   (skipped under ASan: it reports the first read of freed memory)\n");
        return;
    }
    for (int k = 0; k < NKINDS; k++) expect_sweep(k, true);
}

static void test_never_made_every_call(void) {
    for (int k = 0; k < NKINDS; k++) expect_sweep(k, false);
}

/* A freed context whose child keeps its memory: the handle is dead (its
 * calls stop, checked in a child), while the child still reads values
 * through it. No freed memory is read, so this runs under ASan too. */
static int kept_parent(void) {
    co_ctx_t *p = NULL, *c = NULL;
    if (co_ctx_with_value(&p, co_ctx_background(), "k", "v") != 0) return 3;
    if (co_ctx_with_cancel(&c, p) != 0) return 3;
    co_ctx_free(p);
    if (co_ctx_value(c, "k") == NULL || strcmp(co_ctx_value(c, "k"), "v") != 0) return 4;
    if (co_ctx_err(c) != CO_ECANCELED) return 5; /* freeing p canceled it and its child */
    fprintf(stderr, "obj=%p\n", (void *)p);
    (void)co_ctx_err(p);
    fprintf(stderr, "returned: co_ctx_err\n");
    return 0;
}

static void test_context_kept_by_child(void) {
    static char buf[16384];
    int st = run_child(buf, sizeof buf, "--kept", NULL, NULL, NULL);
    bool aborted = st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    bool named = has_line(buf, "co_ctx_err", "context", "freed");
    CHECK(aborted);
    CHECK(named);
    if (!aborted || !named) fprintf(stderr, "   status %#x, output:\n%s\n", (unsigned)st, buf);
}

/* Live handles still work, NULL keeps colony.h's rule (a sample; the
 * suites of each kind cover the rest). */
static void test_live_and_null(void) {
    co_chan_t *ch = NULL;
    int64_t v = 7, w = 0;
    CHECK_EQ(co_chan_new(&ch, sizeof v, 1), 0);
    CHECK_EQ(co_chan_send(ch, &v, 0), 0);
    CHECK_EQ(co_chan_len(ch), 1);
    CHECK_EQ(co_chan_recv(ch, &w, 0), 0);
    CHECK_EQ(w, 7);
    co_chan_free(ch);
    CHECK_EQ(co_chan_send(NULL, &v, 0), CO_EINVAL);
    CHECK_EQ(co_chan_len(NULL), 0);
    CHECK(co_ctx_done(NULL) == NULL);
    CHECK(co_ticker_chan(NULL) == NULL);
    CHECK(co_timer_chan(NULL) == NULL);
    CHECK(co_group_ctx(NULL) == NULL);
    CHECK(co_pool_is_closed(NULL));
    CHECK(co_multipool_is_closed(NULL));
    CHECK_EQ(co_pool_running(NULL), CO_EINVAL);
    co_ctx_free(NULL);
    co_group_free(NULL);
    co_pool_destroy(NULL);
    co_multipool_destroy(NULL);
    co_timer_free(NULL);
    co_ticker_stop(NULL);
    /* the background context is a live context */
    CHECK_EQ(co_ctx_err(co_ctx_background()), 0);
    co_ctx_free(co_ctx_background());
    CHECK_EQ(co_ctx_err(co_ctx_background()), 0);
}

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--one") || !strcmp(argv[1], "--sweep")))
        return child(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "--kept")) return kept_parent();
    /* the children under TSan: report a read of freed memory and go on to
     * colony's check (66: the exit status after a report). Read at their
     * start; this process keeps the options it started with. */
    if (t_tsan()) setenv("TSAN_OPTIONS", "halt_on_error=0:exitcode=66", 1);
    t_begin(100);
    T_RUN(test_live_and_null);
    T_RUN(test_freed_one_call_per_kind);
    T_RUN(test_never_made_one_call_per_kind);
    T_RUN(test_freed_every_call);
    T_RUN(test_never_made_every_call);
    T_RUN(test_context_kept_by_child);
    T_SHUTDOWN();
    return t_end();
}
