/* Tour, part 4: I/O on the netpoller. A socket pair ping-pong where each
 * side parks only its coroutine, a read that gives up at its deadline, a
 * close that wakes a waiting reader, and co_blocking for a call that has
 * no non-blocking form. */
#include "tour.h"

#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MS (1000 * 1000LL)

static co_waitgroup_t net_wg = CO_WAITGROUP_INIT;

/* Answers every number with number + 1 until the other side closes. */
static void pong(void *arg) {
    int fd = *(int *)arg;
    long v;
    while (co_read(fd, &v, sizeof v, CO_FOREVER) == (ssize_t)sizeof v) {
        v++;
        co_write(fd, &v, sizeof v, CO_FOREVER);
    }
    co_waitgroup_done(&net_wg);
}

static int parked_result;
static void parked_reader(void *arg) {
    int fd = *(int *)arg;
    char c;
    parked_result = (int)co_read(fd, &c, 1, CO_FOREVER); /* nobody will ever write */
    co_waitgroup_done(&net_wg);
}

static int ticks; /* atomic */
static int ticking; /* atomic */
static void ticker(void *arg) {
    (void)arg;
    while (__atomic_load_n(&ticking, __ATOMIC_ACQUIRE)) {
        co_sleep(5 * MS);
        __atomic_add_fetch(&ticks, 1, __ATOMIC_RELAXED);
    }
    co_waitgroup_done(&net_wg);
}

static void slow_syscall(void *arg) {
    (void)arg;
    struct timespec ts = {0, 50 * MS}; /* stands for a DNS lookup, a disk read... */
    nanosleep(&ts, NULL);
}

void tour_net(void) {
    printf("4. I/O on the netpoller\n");
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
        perror("  socketpair");
        return;
    }
    co_waitgroup_add(&net_wg, 1);
    co_go(pong, &sp[1]);
    printf("  ping-pong over a socket pair; co_read parks the coroutine, not the thread:\n ");
    long v = 0;
    for (int i = 0; i < 4; i++) {
        co_write(sp[0], &v, sizeof v, co_deadline_after(1000 * MS));
        co_read(sp[0], &v, sizeof v, co_deadline_after(1000 * MS));
        printf(" %ld", v);
        v *= 10;
    }
    printf("\n");

    char c;
    int64_t t0 = co_now();
    ssize_t rc = co_read(sp[0], &c, 1, co_deadline_after(20 * MS));
    printf("  a read with a 20 ms deadline and nothing to read: \"%s\" after %lld ms\n",
           co_strerror((int)rc), (long long)((co_now() - t0) / MS));
    rc = co_read(sp[0], &c, 1, 0);
    printf("  deadline 0 means try once: \"%s\" at once\n", co_strerror((int)rc));

    co_close(sp[0]); /* pong reads end-of-file and returns */
    co_waitgroup_wait(&net_wg);
    co_close(sp[1]);

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
        return;
    co_waitgroup_add(&net_wg, 1);
    co_go(parked_reader, &sp[0]);
    co_sleep(5 * MS);
    co_close(sp[0]); /* wakes the reader parked on it */
    co_waitgroup_wait(&net_wg);
    printf("  co_close while a coroutine waits on the fd wakes it with CO_ECLOSED (\"%s\")\n",
           co_strerror(parked_result));
    co_close(sp[1]);

    __atomic_store_n(&ticking, 1, __ATOMIC_RELEASE);
    co_waitgroup_add(&net_wg, 1);
    co_go(ticker, NULL);
    co_sleep(MS);
    int before = __atomic_load_n(&ticks, __ATOMIC_RELAXED);
    co_blocking(slow_syscall, NULL);
    int during = __atomic_load_n(&ticks, __ATOMIC_RELAXED) - before;
    __atomic_store_n(&ticking, 0, __ATOMIC_RELEASE);
    co_waitgroup_wait(&net_wg);
    printf("  co_blocking(a 50 ms blocking call): sysmon handed our P to another thread,\n"
           "  so a 5 ms ticker kept running: %d ticks during the call\n\n",
           during);
}
