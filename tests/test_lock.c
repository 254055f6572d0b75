/* The runtime's internal lock (co__lock_t, src/lock.c), which channels,
 * the scheduler and the sync primitives stand on. Its unlock is a plain
 * store followed by a look at the sleepers count, so a sleeper can be
 * missed in a StoreLoad race and must recover by itself (a re-check, then
 * bounded sleeps). Here plain threads, more than there are CPUs, fight
 * over one lock, some holding it across a sleep so that the others go to
 * the kernel: every critical section runs alone (a plain counter and an
 * "inside" flag check that), nothing is lost, nobody hangs (the test
 * timeout), and the sleepers count is back to 0 at the end. Then the same
 * with coroutines on several Ms, through a channel, whose lock it is.
 * ctest-no-chaos: the first half uses no runtime; the second sets its own
 * Ps. */
#include <colony.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "t_internal.h"
#include "t.h"

#define THREADS 8
#define ROUNDS 20000

static co__lock_t lk;
static long counter;          /* guarded by lk: plain accesses */
static int inside;            /* guarded by lk: 1 while someone holds it */
static atomic_int overlaps;   /* critical sections that found another inside */

static void *fighter(void *arg) {
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        co__lock(&lk);
        if (inside) atomic_fetch_add(&overlaps, 1);
        inside = 1;
        counter++;
        /* Now and then hold it across a real sleep: the others spin out
         * and sleep on the futex. */
        if (i % 997 == (id * 131) % 997) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        inside = 0;
        co__unlock(&lk);
        if (i % 64 == 0) sched_yield();
    }
    return NULL;
}

static void threads_fight(void) {
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, fighter, (void *)(intptr_t)i), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    CHECK_EQ(counter, (long)THREADS * ROUNDS);
    CHECK_EQ(atomic_load(&overlaps), 0);
    CHECK_EQ(__atomic_load_n(&lk.sleepers, __ATOMIC_RELAXED), 0);
    CHECK_EQ(__atomic_load_n(&lk.locked, __ATOMIC_RELAXED), 0);
    CHECK(co__trylock(&lk));
    CHECK(!co__trylock(&lk));
    co__unlock(&lk);
}

/* Coroutines on 4 Ps (more than the CPUs, so Ms lose their CPU while
 * holding the channel's lock and the others sleep on it) and plain threads
 * send through one buffered channel to coroutine receivers: every value
 * arrives once. */
#define CO_SENDERS 8
#define T_SENDERS 2
#define PER_SENDER 20000
#define RECEIVERS 4
static co_chan_t *ch;
static atomic_llong sum;
static atomic_long received;
static co_waitgroup_t senders_wg, receivers_wg;

static void co_sender(void *arg) {
    long base = (long)(intptr_t)arg * PER_SENDER;
    for (long i = 0; i < PER_SENDER; i++) {
        long v = base + i;
        CHECK_EQ(co_chan_send(ch, &v, CO_FOREVER), 0);
    }
    co_waitgroup_done(&senders_wg);
}
static void *t_sender(void *arg) {
    co_sender(arg);
    return NULL;
}
static void receiver(void *arg) {
    (void)arg;
    long v;
    while (co_chan_recv(ch, &v, CO_FOREVER) == 0) {
        atomic_fetch_add(&sum, v);
        atomic_fetch_add(&received, 1);
    }
    co_waitgroup_done(&receivers_wg);
}

static void channel_fight(void) {
    co_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.procs = 4;
    CHECK_EQ(co_init(&cfg), 0);
    CHECK_EQ(co_chan_new(&ch, sizeof(long), 16), 0);
    co_waitgroup_add(&receivers_wg, RECEIVERS);
    for (int i = 0; i < RECEIVERS; i++) CHECK_EQ(co_go(receiver, NULL), 0);
    co_waitgroup_add(&senders_wg, CO_SENDERS + T_SENDERS);
    for (int i = 0; i < CO_SENDERS; i++) CHECK_EQ(co_go(co_sender, (void *)(intptr_t)i), 0);
    pthread_t th[T_SENDERS];
    for (int i = 0; i < T_SENDERS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, t_sender, (void *)(intptr_t)(CO_SENDERS + i)), 0);
    co_waitgroup_wait(&senders_wg);
    for (int i = 0; i < T_SENDERS; i++) pthread_join(th[i], NULL);
    CHECK_EQ(co_chan_close(ch), 0);
    co_waitgroup_wait(&receivers_wg);
    long n = (long)(CO_SENDERS + T_SENDERS) * PER_SENDER;
    CHECK_EQ(atomic_load(&received), n);
    CHECK_EQ(atomic_load(&sum), (long long)n * (n - 1) / 2);
    co_chan_free(ch);
    CHECK_EQ(T_SHUTDOWN(), 0);
}

int main(void) {
    t_begin(110);
    T_RUN(threads_fight);
    T_RUN(channel_fight);
    return t_end();
}
