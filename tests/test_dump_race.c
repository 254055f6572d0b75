/* co_dump while a coroutine it lists wakes and exits: the dump writes to a
 * slow stream (here a cookie stream that, on the victim's header, wakes
 * it and waits for its exit), so the victim's stack (not of the default
 * size: unmapped at exit) is gone by the time a dump that unwound after
 * printing would read it. The dump unwinds each coroutine before printing
 * any of it, so it completes; the victim shows its frames or a note.
 * Then the walk itself: dumps in a loop while such coroutines park, wake
 * and exit by the hundred; a stack unmapped during its walk faulted in
 * the unwinder (an exit's munmap now waits for the walk). */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <stdio.h>

static co_chan_t *ch;
static int exited; /* atomic */

static void victim(void *arg) {
    (void)arg;
    int v;
    co_chan_recv(ch, &v, CO_FOREVER);
    __atomic_store_n(&exited, 1, __ATOMIC_SEQ_CST);
}

static void *waker(void *arg) {
    (void)arg;
    int v = 1;
    co_chan_send(ch, &v, CO_FOREVER);
    return NULL;
}

static char seen[65536];
static size_t nseen;
static int woke; /* the victim was woken while its entry was being written */

static ssize_t slow_write(void *cookie, const char *buf, size_t n) {
    (void)cookie;
    size_t k = n < sizeof seen - 1 - nseen ? n : sizeof seen - 1 - nseen;
    memcpy(seen + nseen, buf, k);
    nseen += k;
    seen[nseen] = 0;
    if (!woke && strstr(seen, "'victim' [waiting")) {
        woke = 1;
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, waker, NULL), 0);
        pthread_join(t, NULL);
        while (!__atomic_load_n(&exited, __ATOMIC_SEQ_CST)) usleep(1000);
        usleep(50 * 1000); /* its exit has unmapped its stack */
    }
    return (ssize_t)n;
}

static void test_victim_exits_mid_dump(void) {
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    co_attr_t a = {64 * 1024, "victim"}; /* not the default size: unmapped at exit */
    CHECK_EQ(co_go_with(&a, victim, NULL), 0);
    while (co_count() < 1) usleep(1000);
    usleep(50 * 1000); /* parked */
    FILE *f = fopencookie(NULL, "w", (cookie_io_functions_t){.write = slow_write});
    CHECK(f != NULL);
    setvbuf(f, NULL, _IONBF, 0);
    co_dump(f); /* from a plain thread */
    fclose(f);
    CHECK_EQ(woke, 1);
    CHECK(strstr(seen, "'victim' [waiting") != NULL);
    CHECK_EQ(__atomic_load_n(&exited, __ATOMIC_SEQ_CST), 1);
    co_chan_free(ch);
}

/* ---- dumps in a loop over coroutines that come and go ------------------- */
static int churn_stop; /* atomic */
static co_chan_t *churn_ch;

static __attribute__((noinline)) void churn_deep(int d) {
    volatile char pad[512];
    pad[0] = (char)d;
    if (d > 0) {
        churn_deep(d - 1);
        return;
    }
    int v;
    (void)co_chan_recv(churn_ch, &v, co_deadline_after(100 * 1000 * 1000));
    (void)pad[0];
}
static void churn_victim(void *arg) {
    (void)arg;
    churn_deep(6);
}
static void churn_feeder(void *arg) {
    (void)arg;
    int v = 1;
    while (!__atomic_load_n(&churn_stop, __ATOMIC_ACQUIRE))
        (void)co_chan_send(churn_ch, &v, co_deadline_after(1000 * 1000));
}
static void churn_spawner(void *arg) {
    (void)arg;
    co_attr_t a = {64 * 1024, "victim"}; /* unmapped at exit */
    while (!__atomic_load_n(&churn_stop, __ATOMIC_ACQUIRE)) {
        if (co_count() < 200)
            (void)co_go_with(&a, churn_victim, NULL);
        else
            co_yield();
    }
}

static void test_walk_while_exiting(void) {
    CHECK_EQ(co_chan_new(&churn_ch, sizeof(int), 0), 0);
    CHECK_EQ(co_go(churn_feeder, NULL), 0);
    CHECK_EQ(co_go(churn_spawner, NULL), 0);
    FILE *f = fopen("/dev/null", "w");
    CHECK(f != NULL);
    int64_t t0 = co_now();
    long dumps = 0;
    while (co_now() - t0 < 1500LL * 1000 * 1000) { /* a second and a half of dumps */
        co_dump(f);
        dumps++;
    }
    fclose(f);
    __atomic_store_n(&churn_stop, 1, __ATOMIC_RELEASE);
    t0 = co_now();
    while (co_count() > 0 && co_now() - t0 < 20LL * 1000 * 1000 * 1000) usleep(1000);
    CHECK_EQ(co_count(), 0);
    CHECK(dumps > 0);
    fprintf(stderr, "   %ld dumps\n", dumps);
    co_chan_free(churn_ch);
}

/* ---- a dump blocked on its reader holds no stack's unmap ---------------- */
static co_chan_t *held_ch;
static void held(void *arg) {
    (void)arg;
    int v;
    (void)co_chan_recv(held_ch, &v, CO_FOREVER);
}
static void custom_exit(void *arg) { (void)arg; }
static int dump_pipe[2];
static void *blocked_dumper(void *arg) {
    (void)arg;
    FILE *f = fdopen(dump_pipe[1], "w");
    co_dump(f);
    fclose(f);
    return NULL;
}

/* A dump writing to a reader that does not read holds the all-coroutines
 * lock; a coroutine with a stack not of the default size exits by
 * unmapping it, which must not wait for that dump (it used to, freezing
 * its thread and P until the reader read). */
static void test_exit_while_dump_blocked(void) {
    enum { HELD = 3000 };
    CHECK_EQ(co_chan_new(&held_ch, sizeof(int), 0), 0);
    for (int i = 0; i < HELD; i++) CHECK_EQ(co_go(held, NULL), 0);
    while (co_count() < HELD) usleep(1000);
    CHECK_EQ(pipe(dump_pipe), 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, blocked_dumper, NULL), 0);
    /* until the pipe is full: the dump is blocked in a write */
    int64_t t0 = co_now();
    for (;;) {
        struct pollfd pf = {.fd = dump_pipe[1], .events = POLLOUT};
        int avail = 0;
        if (poll(&pf, 1, 0) == 0 && ioctl(dump_pipe[0], FIONREAD, &avail) == 0 && avail > 0) break;
        if (co_now() - t0 > 20LL * 1000 * 1000 * 1000) break;
        usleep(1000);
    }
    co_attr_t a = {128 * 1024, "custom"}; /* unmapped at exit */
    int before = co_count();
    for (int i = 0; i < 50; i++) CHECK_EQ(co_go_with(&a, custom_exit, NULL), 0);
    t0 = co_now();
    while (co_count() > before && co_now() - t0 < 10LL * 1000 * 1000 * 1000) usleep(1000);
    CHECK_EQ(co_count(), before); /* all 50 gone, the dump still blocked */
    char buf[65536];
    while (read(dump_pipe[0], buf, sizeof buf) > 0) {
    }
    pthread_join(t, NULL);
    close(dump_pipe[0]);
    co_chan_close(held_ch);
    t0 = co_now();
    while (co_count() > 0 && co_now() - t0 < 20LL * 1000 * 1000 * 1000) usleep(1000);
    CHECK_EQ(co_count(), 0);
    co_chan_free(held_ch);
}

int main(void) {
    t_begin(50);
    co_config_t c = {2, 0};
    CHECK_EQ(co_init(&c), 0);
    T_RUN(test_victim_exits_mid_dump);
    T_RUN(test_walk_while_exiting);
    T_RUN(test_exit_while_dump_blocked);
    CHECK_EQ(co_shutdown(), 0);
    return t_end();
}
