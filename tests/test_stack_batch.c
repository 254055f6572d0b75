/* Default stacks mapped in batches of 64, every guard installed by one
 * process_madvise call and every top page written in by a second
 * (src/runtime/stack.c): each stack of such a batch is guarded, its top
 * page is resident and the rest is not, and an overflow on one of them is
 * still reported by name. Where the kernel cannot batch (older than 6.14,
 * an emulator, noguard), the batches stay at 8 and this says so. */
// ctest-no-chaos
// ctest-timeout: 60
#include <colony.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "t_internal.h"

/* Whether the kernel's own read of the byte at a fails (EFAULT): a guard. */
static bool kernel_cannot_read(const char *a) {
    int fd[2];
    if (pipe(fd) != 0) return false;
    bool fault = write(fd[1], a, 1) < 0 && errno == EFAULT;
    close(fd[0]);
    close(fd[1]);
    return fault;
}

static bool resident(const char *a) {
    unsigned char v = 0;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return mincore((void *)((uintptr_t)a & ~(uintptr_t)(pg - 1)), pg, &v) == 0 && (v & 1);
}

/* Map default-size batches until they come 64 at a time; false if they
 * never do (the kernel cannot batch guards). The stacks are freed. */
static bool reach_big_batches(void) {
    static co__stack_t st[CO_STACK_BATCH_MAX];
    for (int round = 0; round < 16; round++) {
        int want = co__stack_batch();
        if (want == CO_STACK_BATCH_MAX) return true;
        int n = co__stack_alloc_n(st, want, 256 * 1024);
        CHECK(n >= 1);
        for (int i = 0; i < n; i++) co__stack_free(&st[i]);
    }
    return false;
}

/* Whether a 64-batch's pages can be looked at here: says why not if not. */
static bool big_batches_testable(void) {
    if (t_sanitized()) {
        fprintf(stderr, "  skipped under a sanitizer (its shadow memory is resident)\n");
        return false;
    }
    if (!reach_big_batches()) {
        fprintf(stderr, "  skipped: no process_madvise guard batches here (Linux < 6.14, or an emulator)\n");
        return false;
    }
    return true;
}

static void test_batch_guarded(void) {
    if (!big_batches_testable()) return;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    static co__stack_t st[CO_STACK_BATCH_MAX];
    int n = co__stack_alloc_n(st, CO_STACK_BATCH_MAX, 256 * 1024);
    CHECK_EQ(n, CO_STACK_BATCH_MAX);
    int guarded = 0, top_in = 0, rest_out = 0;
    for (int i = 0; i < n; i++) {
        CHECK(st[i].guarded && st[i].light_guard);
        /* first: the kernel's read below maps the zero page there */
        rest_out += !resident(st[i].lo + st[i].size - 2 * pg) && !resident(st[i].lo);
        top_in += resident(st[i].lo + st[i].size - pg);
        guarded += kernel_cannot_read(st[i].lo - pg) && !kernel_cannot_read(st[i].lo);
    }
    CHECK_EQ(guarded, n);
    CHECK_EQ(top_in, n);
    CHECK_EQ(rest_out, n);
    for (int i = 0; i < n; i++) co__stack_free(&st[i]);
}

/* Several batches in one mapping (co__stack_alloc_runs): every run but
 * the bottom one goes to the callback, each stack guarded with its top
 * page resident, the runs side by side; and co__stack_runs asks for more
 * than one only once many stacks are mapped. */
static co__stack_t runs_got[CO_STACK_RUNS_MAX * CO_STACK_BATCH_MAX];
static int runs_n, runs_calls;
static void runs_put(co__stack_t *run, int n, void *arg) {
    CHECK(arg == &runs_n);
    runs_calls++;
    for (int i = 0; i < n && runs_n < (int)(sizeof runs_got / sizeof runs_got[0]); i++)
        runs_got[runs_n++] = run[i];
}
static void test_runs_in_one_mapping(void) {
    if (t_sanitized()) {
        fprintf(stderr, "  skipped under a sanitizer (its shadow memory is resident)\n");
        return;
    }
    if (!reach_big_batches()) {
        fprintf(stderr, "  skipped: no process_madvise guard batches here\n");
        return;
    }
    CHECK_EQ(co__stack_runs(), 1); /* few stacks mapped: one batch a mapping */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    static co__stack_t out[CO_STACK_BATCH_MAX];
    runs_n = runs_calls = 0;
    int n = co__stack_alloc_runs(out, CO_STACK_RUNS_MAX, 256 * 1024, INT_MAX, runs_put,
                                 &runs_n);
    CHECK_EQ(n, CO_STACK_BATCH_MAX);
    CHECK_EQ(runs_calls, CO_STACK_RUNS_MAX - 1);
    CHECK_EQ(runs_n, (CO_STACK_RUNS_MAX - 1) * CO_STACK_BATCH_MAX);
    for (int i = 0; i < n && runs_n < (int)(sizeof runs_got / sizeof runs_got[0]); i++)
        runs_got[runs_n++] = out[i];
    int total = runs_n, guarded = 0, top_in = 0;
    char *lo = runs_got[0].map, *hi = runs_got[0].map;
    for (int i = 0; i < total; i++) {
        co__stack_t *st = &runs_got[i];
        CHECK(st->guarded && st->light_guard);
        top_in += resident(st->lo + st->size - pg);
        guarded += kernel_cannot_read(st->lo - pg) && !kernel_cannot_read(st->lo);
        if (st->map < lo) lo = st->map;
        if (st->map > hi) hi = st->map;
    }
    CHECK_EQ(guarded, total);
    CHECK_EQ(top_in, total);
    /* one mapping: the stacks tile it without a gap */
    CHECK((size_t)(hi - lo) == (size_t)(total - 1) * runs_got[0].map_size);
    for (int i = 0; i < total; i++) co__stack_free(&runs_got[i]);

    /* with 2,048 stacks mapped, a mapping holds CO_STACK_RUNS_MAX batches */
    static co__stack_t held[32][CO_STACK_BATCH_MAX];
    int got = 0;
    for (int b = 0; b < 32; b++) got += co__stack_alloc_n(held[b], CO_STACK_BATCH_MAX, 16 * 1024);
    CHECK_EQ(got, 32 * CO_STACK_BATCH_MAX);
    CHECK_EQ(co__stack_runs(), CO_STACK_RUNS_MAX);
    for (int b = 0; b < 32; b++)
        for (int i = 0; i < CO_STACK_BATCH_MAX; i++) co__stack_free(&held[b][i]);
    CHECK_EQ(co__stack_runs(), 1);
}

/* An overflow on a stack of a 64-batch hits its guard and names it. */
static void overflow(void *arg) {
    (void)arg;
    t_recurse(1 << 20);
}
static co_waitgroup_t gate = CO_WAITGROUP_INIT, started = CO_WAITGROUP_INIT;
static void parker(void *arg) {
    (void)arg;
    co_waitgroup_done(&started);
    co_waitgroup_wait(&gate);
}

/* A batch mapped for fewer coroutines than it holds (the end of a burst):
 * every stack guarded, but only the top pages of those the caches hand
 * out first committed, the lowest and the highest; the others stay out
 * until a first run touches them. */
static void test_batch_partly_committed(void) {
    if (!big_batches_testable()) return;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    static co__stack_t st[CO_STACK_BATCH_MAX];
    int need = 5, n = co__stack_alloc_need(st, CO_STACK_BATCH_MAX, 256 * 1024, need);
    CHECK_EQ(n, CO_STACK_BATCH_MAX);
    int guarded = 0, wrong = 0;
    for (int i = 0; i < n; i++) {
        bool ahead = i == 0 || i >= n - (need - 1);
        wrong += resident(st[i].lo + st[i].size - pg) != ahead;
        guarded += kernel_cannot_read(st[i].lo - pg) && !kernel_cannot_read(st[i].lo);
    }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(guarded, n);
    /* a stack left out still works: its first touch commits the page */
    st[1].lo[st[1].size - 1] = 1;
    CHECK(resident(st[1].lo + st[1].size - pg));
    for (int i = 0; i < n; i++) co__stack_free(&st[i]);

    /* several runs for few: the upper runs, cached first, have none */
    static co__stack_t out[CO_STACK_BATCH_MAX];
    runs_n = runs_calls = 0;
    n = co__stack_alloc_runs(out, 2, 256 * 1024, need, runs_put, &runs_n);
    CHECK_EQ(n, CO_STACK_BATCH_MAX);
    CHECK_EQ(runs_n, CO_STACK_BATCH_MAX);
    int upper_in = 0, lower_in = 0;
    for (int i = 0; i < runs_n; i++) upper_in += resident(runs_got[i].lo + runs_got[i].size - pg);
    for (int i = 0; i < n; i++) lower_in += resident(out[i].lo + out[i].size - pg);
    CHECK_EQ(upper_in, 0);
    CHECK_EQ(lower_in, need);
    for (int i = 0; i < runs_n; i++) co__stack_free(&runs_got[i]);
    for (int i = 0; i < n; i++) co__stack_free(&out[i]);
}

static void test_batch_overflow_reported(void) {
    if (t_sanitized()) return; /* ASan reports overflows itself; TSan has no handler of ours */
    if (!reach_big_batches()) {
        fprintf(stderr, "  skipped: no process_madvise guard batches here\n");
        return;
    }
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        co__test_reset_after_fork();
        if (co_init(NULL) != 0) _exit(10);
        /* 300 parked: the next default stacks come from batches of 64 */
        co_waitgroup_add(&gate, 1);
        co_waitgroup_add(&started, 300);
        for (int i = 0; i < 300; i++)
            if (co_go(parker, NULL) != 0) _exit(11);
        co_waitgroup_wait(&started);
        if (co__stack_batch() != CO_STACK_BATCH_MAX) _exit(12);
        co_attr_t a = {.name = "deep"}; /* the default size: from a batch */
        co_go_with(&a, overflow, NULL);
        co_sleep(10LL * 1000000000);
        _exit(13);
    }
    char buf[4096] = {0};
    int st = t_child_wait(pid, fd, buf, sizeof buf, 60);
    CHECK(st != -1);
    CHECK(WIFSIGNALED(st));
    CHECK(strstr(buf, "stack overflow in coroutine") != NULL);
    CHECK(strstr(buf, "'deep'") != NULL);
    CHECK(strstr(buf, "hit the guard page") != NULL);
    if (!WIFSIGNALED(st)) fprintf(stderr, "child: %s (status %d)\n", buf, st);
}

int main(void) {
    t_begin(50);
    CHECK_EQ(co_init(NULL), 0);
    T_RUN(test_batch_guarded);
    T_RUN(test_runs_in_one_mapping);
    T_RUN(test_batch_partly_committed);
    T_RUN(test_batch_overflow_reported);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
