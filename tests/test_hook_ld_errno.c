/* errno and thread-locals of foreign code through libcolony_hook.so: a
 * function compiled apart at -O2 (tests/hook_errno_probe.c) takes &errno
 * and a thread-local's address before a hooked read that parks, and uses
 * them after. 200 coroutines on 4 Ps do so 20 times each, woken by their
 * timeouts on whichever thread fires them or by a partner's write from
 * another thread, while others churn the run queues in bursts. Every probe
 * must see the read's EAGAIN through the early address, and both early
 * addresses must still be its thread's: the coroutine came back to the
 * thread it parked on. Checked in the default mode, then again in a child
 * with $COLONY_HOOK_PIN=1 (a thread held per waiter); a child with
 * $COLONY_HOOK_MIGRATE=1 shows how often the waits moved. */
// ctest-timeout: 90
// ctest-preload-hook
#define _GNU_SOURCE 1
#include "t.h"
#include "test_hook_servers.h"

#include <colony.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>

int hook_errno_probe(int fd, int *same_thread);

#define MS 1000000LL
enum { N = 200, ROUNDS = 20 };

static int wrong, moved, probes, done_count, stop_churn;

/* even ones time out (SO_RCVTIMEO, 1 ms); odd ones get a byte from a
 * partner coroutine after a yield or a short sleep */
struct pair {
    int sv[2];
    int i;
};

static void partner(void *arg) {
    struct pair *pr = arg;
    for (int i = 0; i < ROUNDS; i++) {
        if (i % 2) co_sleep(MS / 4);
        else for (int k = 0; k < 3; k++) co_yield();
        if (write(pr->sv[1], "x", 1) != 1) abort();
    }
}

static void prober(void *arg) {
    struct pair *pr = arg;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pr->sv) < 0) abort();
    bool timed = pr->i % 2 == 0;
    if (timed) {
        struct timeval tv = {0, 1000};
        setsockopt(pr->sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    } else if (co_go(partner, pr) < 0) {
        abort();
    }
    for (int i = 0; i < ROUNDS; i++) {
        int same = 0;
        int e = hook_errno_probe(pr->sv[0], &same);
        __atomic_add_fetch(&probes, 1, __ATOMIC_RELAXED);
        if (timed ? e != EAGAIN : e != -1) __atomic_add_fetch(&wrong, 1, __ATOMIC_RELAXED);
        if (!same) __atomic_add_fetch(&moved, 1, __ATOMIC_RELAXED);
    }
    close(pr->sv[0]);
    close(pr->sv[1]);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}
/* Runs in bursts, so that the probes' threads have other work between
 * their waits, and Ps still come free now and then. */
static void churn(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&stop_churn, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < 100; i++) co_yield();
        co_sleep(MS);
    }
}

static struct pair pairs[N];

static void run_probes(void) {
    wrong = moved = probes = done_count = stop_churn = 0;
    for (int i = 0; i < 8; i++) CHECK_EQ(co_go(churn, NULL), 0);
    for (int i = 0; i < N; i++) {
        pairs[i].i = i;
        CHECK_EQ(co_go(prober, &pairs[i]), 0);
    }
    int64_t t0 = co_now();
    while (__atomic_load_n(&done_count, __ATOMIC_ACQUIRE) < N && co_now() - t0 < 60000 * MS)
        co_sleep(MS);
    __atomic_store_n(&stop_churn, 1, __ATOMIC_RELEASE);
    CHECK_EQ(done_count, N);
    CHECK_EQ(probes, N * ROUNDS);
    co_sleep(10 * MS);
}

/* this process's mode (the child's environment, or the default) */
static void test_errno_home(void) {
    run_probes();
    const char *mig = getenv("COLONY_HOOK_MIGRATE");
    if (mig && mig[0] == '1') {
        /* no assertion: how often a free wait moves depends on the load */
        fprintf(stderr, "migrate mode: %d of %d probes saw another thread's errno, "
                        "%d resumed on another thread\n", wrong, probes, moved);
        return;
    }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(moved, 0);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_errno_home);
    return 0;
}

/* this test again, as a child with one more variable set; its status.
 * Under an emulator (qemu-user without binfmt) the child may not run at
 * all (127: the exec failed) or run without the hook (77: the host's
 * loader refused the guest's library). */
static int child(const char *self, const char *var) {
    pid_t pid = fork();
    if (pid == 0) {
        setenv(var, "1", 1);
        setenv("HOOK_ERRNO_CHILD", "1", 1);
        execl(self, self, (char *)NULL);
        _exit(127);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv) {
    (void)argc;
    if (!dlsym(RTLD_DEFAULT, "colony_hook_active")) {
        fprintf(stderr, "skip: libcolony_hook.so is not preloaded\n");
        return 77;
    }
    if (!getenv("HOOK_ERRNO_CHILD")) {
        /* before this process starts any thread */
        static const char *const modes[] = {"COLONY_HOOK_PIN", "COLONY_HOOK_MIGRATE"};
        for (int i = 0; i < 2; i++) {
            int st = child(argv[0], modes[i]);
            if (st == 77 || st == 127) {
                fprintf(stderr, "note: the %s=1 child %s: that mode is not checked here\n",
                        modes[i], st == 77 ? "could not preload the hook" : "could not be run");
            } else if (st != 0) {
                fprintf(stderr, "FAIL: the %s=1 run (status %d)\n", modes[i], st);
                return 1;
            }
        }
    }
    co_config_t cfg = {.procs = 4};
    if (co_init(&cfg) < 0) return 1;
    t_begin(80);
    co_main(run, NULL);
    return t_end();
}
