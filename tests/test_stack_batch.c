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

static void test_batch_guarded(void) {
    if (t_sanitized()) {
        fprintf(stderr, "  skipped under a sanitizer (its shadow memory is resident)\n");
        return;
    }
    if (!reach_big_batches()) {
        fprintf(stderr, "  skipped: no process_madvise guard batches here (Linux < 6.14, or an emulator)\n");
        return;
    }
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

/* An overflow on a stack of a 64-batch hits its guard and names it. */
static volatile int sink;
static int recurse(int n) {
    volatile char buf[512];
    buf[0] = (char)n;
    sink += buf[0];
    return n > 0 ? recurse(n - 1) + buf[0] : 0;
}
static void overflow(void *arg) {
    (void)arg;
    recurse(1 << 20);
}
static co_waitgroup_t gate = CO_WAITGROUP_INIT, started = CO_WAITGROUP_INIT;
static void parker(void *arg) {
    (void)arg;
    co_waitgroup_done(&started);
    co_waitgroup_wait(&gate);
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
    T_RUN(test_batch_overflow_reported);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
