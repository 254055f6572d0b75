/* NULL arguments to the public calls of the runtime, sync, channels,
 * select, tickers, context and group, by colony.h's rule: a call that
 * returns int answers CO_EINVAL for a NULL object or required pointer; a
 * call that cannot answer (void, or co_sem_try_acquire's bool) prints
 * "colony: fatal: <call>(NULL...)" and aborts, as Go's nil-pointer
 * dereference panics; a free or destroy of NULL does nothing; a getter
 * gives the documented value. The aborting calls run in a child process
 * (this binary re-executed with --null <case>). */
// ctest-timeout: 250
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the calls that abort, one per child ---------------------------------- */
static co_mutex_t a_mutex = CO_MUTEX_INIT;
static co_cond_t a_cond = CO_COND_INIT;
static void once_fn(void *arg) { (void)arg; }

/* Runs in the child: makes the call `name` with a NULL object. Returns
 * only if the call did not abort (or the name is unknown: 2). */
static int run_null(const char *name) {
    /* a started runtime, as in real use (the checks must not need it) */
    if (strncmp(name, "pre_", 4) != 0 && co_init(NULL) != 0) return 3;
#define CASE(n, call)                                                                         \
    if (!strcmp(name, n)) {                                                                   \
        call;                                                                                 \
        return 0;                                                                             \
    }
    CASE("co_mutex_lock", co_mutex_lock(NULL))
    CASE("co_mutex_unlock", co_mutex_unlock(NULL))
    CASE("co_rwmutex_rlock", co_rwmutex_rlock(NULL))
    CASE("co_rwmutex_runlock", co_rwmutex_runlock(NULL))
    CASE("co_rwmutex_lock", co_rwmutex_lock(NULL))
    CASE("co_rwmutex_unlock", co_rwmutex_unlock(NULL))
    CASE("co_cond_wait_c", co_cond_wait(NULL, &a_mutex))
    CASE("co_cond_wait_m", co_cond_wait(&a_cond, NULL))
    CASE("co_cond_signal", co_cond_signal(NULL))
    CASE("co_cond_broadcast", co_cond_broadcast(NULL))
    CASE("co_waitgroup_add", co_waitgroup_add(NULL, 1))
    CASE("co_waitgroup_done", co_waitgroup_done(NULL))
    CASE("co_waitgroup_wait", co_waitgroup_wait(NULL))
    CASE("co_once", co_once(NULL, once_fn, NULL))
    CASE("co_sem_init", co_sem_init(NULL, 1))
    CASE("co_sem_try_acquire", (void)co_sem_try_acquire(NULL, 1))
    CASE("co_sem_release", co_sem_release(NULL, 1))
    CASE("co_spinlock_lock", co_spinlock_lock(NULL))
    CASE("co_spinlock_unlock", co_spinlock_unlock(NULL))
    /* the spinlock works before anything starts the runtime */
    CASE("pre_co_spinlock_lock", co_spinlock_lock(NULL))
    CASE("co_ctx_cancel", co_ctx_cancel(NULL))
    CASE("co_group_limit", co_group_limit(NULL, 2))
    CASE("co_sched_stats", co_sched_stats(NULL))
    CASE("co_pool_tune", co_pool_tune(NULL, 4))
    CASE("co_pool_reboot", co_pool_reboot(NULL))
    CASE("co_pool_release", co_pool_release(NULL))
    CASE("co_pool_stats_p", co_pool_stats(NULL, &(co_pool_stats_t){0}))
    CASE("co_pool_stats_out", co_pool_stats(co_default_pool(), NULL))
    CASE("co_multipool_tune", co_multipool_tune(NULL, 4))
    CASE("co_multipool_reboot", co_multipool_reboot(NULL))
#undef CASE
    return 2;
}

/* Runs `name` in a child; it must die of SIGABRT with a fatal line that
 * contains `want`. */
static void expect_null_abort(const char *name, const char *want) {
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        t_execl("/proc/self/exe", "test_null", "--null", name, (char *)NULL);
        _exit(127);
    }
    char buf[4096];
    int st = t_drain_and_wait(fd, buf, sizeof buf, pid);
    bool aborted = st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    const char *fatal = strstr(buf, "colony: fatal: ");
    bool named = fatal && strstr(fatal, want) != NULL;
    CHECK(aborted);
    CHECK(named);
    if (!aborted || !named)
        fprintf(stderr, "   %s: wanted SIGABRT and \"%s\"; status %#x, output: %s\n", name, want,
                (unsigned)st, buf);
}

static void test_sync_aborts(void) {
    expect_null_abort("co_mutex_lock", "co_mutex_lock(NULL)");
    expect_null_abort("co_mutex_unlock", "co_mutex_unlock(NULL)");
    expect_null_abort("co_rwmutex_rlock", "co_rwmutex_rlock(NULL)");
    expect_null_abort("co_rwmutex_runlock", "co_rwmutex_runlock(NULL)");
    expect_null_abort("co_rwmutex_lock", "co_rwmutex_lock(NULL)");
    expect_null_abort("co_rwmutex_unlock", "co_rwmutex_unlock(NULL)");
    expect_null_abort("co_cond_wait_c", "co_cond_wait(NULL, ");
    expect_null_abort("co_cond_wait_m", ", NULL): NULL mutex");
    expect_null_abort("co_cond_signal", "co_cond_signal(NULL)");
    expect_null_abort("co_cond_broadcast", "co_cond_broadcast(NULL)");
    expect_null_abort("co_once", "co_once(NULL)");
    expect_null_abort("co_sem_init", "co_sem_init(NULL)");
    expect_null_abort("co_sem_try_acquire", "co_sem_try_acquire(NULL)");
    expect_null_abort("co_sem_release", "co_sem_release(NULL)");
    expect_null_abort("co_spinlock_lock", "co_spinlock_lock(NULL)");
    expect_null_abort("co_spinlock_unlock", "co_spinlock_unlock(NULL)");
    expect_null_abort("pre_co_spinlock_lock", "co_spinlock_lock(NULL)");
}

static void test_waitgroup_aborts(void) {
    expect_null_abort("co_waitgroup_add", "co_waitgroup_add(NULL)");
    expect_null_abort("co_waitgroup_done", "co_waitgroup_done(NULL)");
    expect_null_abort("co_waitgroup_wait", "co_waitgroup_wait(NULL)");
}

static void test_context_aborts(void) {
    expect_null_abort("co_ctx_cancel", "co_ctx_cancel(NULL)");
    expect_null_abort("co_group_limit", "co_group_limit(NULL)");
}

static void test_runtime_aborts(void) {
    expect_null_abort("co_sched_stats", "co_sched_stats(NULL)");
}

static void test_pool_aborts(void) {
    expect_null_abort("co_pool_tune", "co_pool_tune(NULL)");
    expect_null_abort("co_pool_reboot", "co_pool_reboot(NULL)");
    expect_null_abort("co_pool_release", "co_pool_release(NULL)");
    expect_null_abort("co_pool_stats_p", "co_pool_stats(NULL, out)");
    expect_null_abort("co_pool_stats_out", "co_pool_stats(p, NULL)");
    expect_null_abort("co_multipool_tune", "co_multipool_tune(NULL)");
    expect_null_abort("co_multipool_reboot", "co_multipool_reboot(NULL)");
}

/* ---- the calls that answer ------------------------------------------------ */
static void test_sync_einval(void) {
    co_mutex_t m = CO_MUTEX_INIT;
    co_cond_t c = CO_COND_INIT;
    CHECK_EQ(co_mutex_trylock(NULL), CO_EINVAL);
    co_mutex_lock(&m);
    CHECK_EQ(co_cond_wait_until(NULL, &m, 0), CO_EINVAL);
    CHECK_EQ(co_cond_wait_until(&c, NULL, 0), CO_EINVAL);
    CHECK_EQ(co_cond_wait_until(NULL, NULL, CO_FOREVER), CO_EINVAL);
    co_mutex_unlock(&m); /* still held: the refused waits left it alone */
    CHECK_EQ(co_mutex_trylock(&m), 0);
    co_mutex_unlock(&m);
    CHECK_EQ(co_sem_acquire(NULL, 1, 0), CO_EINVAL);
    CHECK_EQ(co_sem_acquire(NULL, 1, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_waitgroup_wait_until(NULL, 0), CO_EINVAL);
    CHECK_EQ(co_waitgroup_wait_until(NULL, CO_FOREVER), CO_EINVAL);
}

static void test_chan_einval(void) {
    co_chan_t *ch = (co_chan_t *)0x1;
    char b = 0;
    CHECK_EQ(co_chan_new(NULL, 1, 0), CO_EINVAL);
    CHECK_EQ(co_chan_send(NULL, &b, 0), CO_EINVAL);
    CHECK_EQ(co_chan_send(NULL, &b, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_chan_recv(NULL, &b, 0), CO_EINVAL);
    CHECK_EQ(co_chan_recv(NULL, &b, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_chan_close(NULL), CO_EINVAL);
    CHECK_EQ(co_chan_len(NULL), 0);
    CHECK_EQ(co_chan_cap(NULL), 0);
    co_chan_free(NULL);
    /* a required elem */
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 1), 0);
    CHECK_EQ(co_chan_send(ch, NULL, 0), CO_EINVAL);
    CHECK_EQ(co_chan_recv(ch, NULL, 0), CO_ETIMEDOUT); /* NULL elem: drop the value */
    co_case_t bad[1] = {{ch, CO_SEND, NULL, 0}};
    CHECK_EQ(co_select(bad, 1, 0), CO_EINVAL);
    co_chan_free(ch);
    /* select: NULL cases; a NULL channel is a case never ready */
    CHECK_EQ(co_select(NULL, 1, 0), CO_EINVAL);
    CHECK_EQ(co_select(NULL, 1, CO_FOREVER), CO_EINVAL);
    co_case_t cs[1] = {{NULL, CO_RECV, &b, 0}};
    CHECK_EQ(co_select(cs, 1, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_select(cs, 1, co_deadline_after(1000 * 1000)), CO_ETIMEDOUT);
    /* tickers */
    CHECK_EQ(co_ticker_new(NULL, 1000), CO_EINVAL);
    CHECK(co_ticker_chan(NULL) == NULL);
    co_ticker_stop(NULL);
}

static int group_fn(void *arg) { (void)arg; return 0; }

static void test_context_einval(void) {
    co_ctx_t *c = (co_ctx_t *)0x1;
    CHECK_EQ(co_ctx_with_cancel(NULL, co_ctx_background()), CO_EINVAL);
    CHECK_EQ(co_ctx_with_cancel(&c, NULL), CO_EINVAL);
    CHECK(c == NULL);
    CHECK_EQ(co_ctx_with_deadline(NULL, co_ctx_background(), 0), CO_EINVAL);
    CHECK_EQ(co_ctx_with_deadline(&c, NULL, 0), CO_EINVAL);
    CHECK_EQ(co_ctx_with_timeout(NULL, co_ctx_background(), 1), CO_EINVAL);
    CHECK_EQ(co_ctx_with_timeout(&c, NULL, 1), CO_EINVAL);
    CHECK_EQ(co_ctx_with_value(NULL, co_ctx_background(), "k", NULL), CO_EINVAL);
    CHECK_EQ(co_ctx_with_value(&c, NULL, "k", NULL), CO_EINVAL);
    CHECK_EQ(co_ctx_with_value(&c, co_ctx_background(), NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_ctx_err(NULL), CO_EINVAL);
    CHECK(co_ctx_done(NULL) == NULL);
    CHECK(co_ctx_value(NULL, "k") == NULL);
    co_ctx_free(NULL);
    co_ctx_cancel(co_ctx_background()); /* background: no-op, not NULL */

    co_group_t *g = (co_group_t *)0x1;
    CHECK_EQ(co_group_new(NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_group_go(NULL, group_fn, NULL), CO_EINVAL);
    CHECK_EQ(co_group_wait(NULL), CO_EINVAL);
    CHECK(co_group_ctx(NULL) == NULL);
    co_group_free(NULL);
    CHECK_EQ(co_group_new(&g, NULL), 0); /* a NULL parent is the background */
    CHECK_EQ(co_group_go(g, NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_group_wait(g), 0);
    co_group_free(g);
}

static void co_fn(void *arg) { (void)arg; }
static int main_fn(void *arg) { (void)arg; return 7; }

static void test_runtime_einval(void) {
    CHECK_EQ(co_init(NULL), 0); /* NULL: the defaults (the runtime is up) */
    CHECK_EQ(co_go(NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_go_with(NULL, NULL, NULL), CO_EINVAL);
    co_attr_t attr = {0, NULL}; /* a NULL name: none */
    CHECK_EQ(co_go_with(&attr, NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_go_with(&attr, co_fn, NULL), 0);
    CHECK_EQ(co_go_with(NULL, co_fn, NULL), 0); /* a NULL attr: the defaults */
    CHECK_EQ(co_main(NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_main(main_fn, NULL), 7);
    CHECK_EQ(co_recover(NULL, NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_blocking(NULL, NULL), CO_EINVAL);
    int lens[4];
    CHECK_EQ(co_sched_runq_lens(NULL, 4), CO_EINVAL);
    CHECK_EQ(co_sched_runq_lens(NULL, 0), 0); /* nothing to write */
    CHECK(co_sched_runq_lens(lens, 4) >= 1);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--null")) return run_null(argv[2]);
    t_begin(t_small() ? 240 : 120);
    T_RUN(test_sync_aborts);
    T_RUN(test_waitgroup_aborts);
    T_RUN(test_context_aborts);
    T_RUN(test_runtime_aborts);
    T_RUN(test_pool_aborts);
    T_RUN(test_chan_einval);
    T_RUN(test_context_einval);
    T_RUN(test_runtime_einval);
    T_RUN(test_sync_einval);
    return t_end();
}
