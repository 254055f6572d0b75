/* errno and foreign code through libcolony_hook.so with COLONY_HOOK_PIN=1:
 * a function compiled apart at -O2 (tests/hook_errno_probe.c) takes
 * &errno before a hooked read that parks and reads errno through it after;
 * 200 coroutines on 4 Ps do so 20 times each, woken by their timeouts on
 * whichever thread fires them, while others churn the run queues in
 * bursts. Every
 * probe must see the read's EAGAIN: the coroutine resumed on its thread. */
// ctest-timeout: 60
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

int hook_errno_probe(int fd);

#define MS 1000000LL
enum { N = 200, ROUNDS = 20 };

static int wrong, probes, done_count, stop_churn;

static void prober(void *arg) {
    (void)arg;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) abort();
    struct timeval tv = {0, 1000};
    setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < ROUNDS; i++) {
        int e = hook_errno_probe(sv[0]);
        __atomic_add_fetch(&probes, 1, __ATOMIC_RELAXED);
        if (e != EAGAIN) __atomic_add_fetch(&wrong, 1, __ATOMIC_RELAXED);
    }
    close(sv[0]);
    close(sv[1]);
    __atomic_add_fetch(&done_count, 1, __ATOMIC_RELEASE);
}
/* Runs in bursts, so that the probes' threads have other work between
 * their waits, and Ps still come free now and then (a pinned coroutine's
 * thread waits for one on its way back). */
static void churn(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&stop_churn, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < 100; i++) co_yield();
        co_sleep(MS);
    }
}

static void test_errno_pinned(void) {
    wrong = probes = done_count = stop_churn = 0;
    for (int i = 0; i < 8; i++) CHECK_EQ(co_go(churn, NULL), 0);
    for (int i = 0; i < N; i++) CHECK_EQ(co_go(prober, NULL), 0);
    int64_t t0 = co_now();
    while (__atomic_load_n(&done_count, __ATOMIC_ACQUIRE) < N && co_now() - t0 < 40000 * MS)
        co_sleep(MS);
    __atomic_store_n(&stop_churn, 1, __ATOMIC_RELEASE);
    CHECK_EQ(done_count, N);
    CHECK_EQ(probes, N * ROUNDS);
    CHECK_EQ(wrong, 0);
    co_sleep(10 * MS);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_errno_pinned);
    return 0;
}

int main(void) {
    if (!dlsym(RTLD_DEFAULT, "colony_hook_active")) {
        fprintf(stderr, "skip: libcolony_hook.so is not preloaded\n");
        return 77;
    }
    if (!getenv("COLONY_HOOK_PIN")) setenv("COLONY_HOOK_PIN", "1", 1);
    co_config_t cfg = {.procs = 4};
    if (co_init(&cfg) < 0) return 1;
    t_begin(55);
    co_main(run, NULL);
    return t_end();
}
