/* Stack compaction (docs/stacks.md): a coroutine that opted in
 * (co_stack_compactable) and parked in a channel operation with no deadline
 * or in I/O with no deadline has its stack's live part moved to the heap
 * by sysmon and copied back before it runs again. Here: what it received
 * or read, what it sent and its locals survive; every other wait is left
 * alone; wakes racing the compactor in a stress run. The threshold is 0
 * (the next sysmon round). No timing is asserted: waits for the compactor
 * are bounded only so a broken build fails instead of hanging. */
// ctest-timeout: 120
#include <colony.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "t.h"
#include "t_compact.h"
#include "t_internal.h"


/* A frame of locals with a known pattern, live across the wait. */
#define PAT 96

typedef struct {
    uint64_t a, b, c, d, e; /* 40 bytes: not a register-sized element */
} elem_t;

static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static int failures; /* atomic */

/* ---- receive: one channel, many compacted receivers queued on it ------- */

enum { NRECV = 300 };
static co_chan_t *shared_ch;
static uint8_t seen[NRECV];

static void receiver(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    volatile uint64_t pat[PAT];
    t_pattern_fill(pat, PAT, seed);
    CHECK_EQ(co_stack_compactable(1), 0);
    elem_t e;
    memset(&e, 0, sizeof e);
    int rc = co_chan_recv(shared_ch, &e, CO_FOREVER);
    CHECK_EQ(rc, 0);
    if (rc == 0) {
        CHECK(e.a < NRECV && e.b == e.a * 3 && e.c == ~e.a && e.d == 7 && e.e == e.a + 11);
        if (e.a < NRECV) __atomic_add_fetch(&seen[e.a], 1, __ATOMIC_RELAXED);
    }
    if (t_pattern_bad(pat, PAT, seed)) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

static void test_recv_values(void) {
    CHECK_EQ(co_chan_new(&shared_ch, sizeof(elem_t), 0), 0);
    uint64_t c0 = t_compactions(), r0 = t_restores();
    co_waitgroup_add(&wg, NRECV);
    for (int i = 0; i < NRECV; i++) CHECK_EQ(co_go(receiver, (void *)(uintptr_t)(i + 1)), 0);
    CHECK(wait_compacted(NRECV));
    CHECK_EQ(co__test_chan_receivers(shared_ch), NRECV); /* the copies, relinked */
    {   /* a dump says a compacted coroutine's frames are not shown, and why */
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        CHECK(f != NULL);
        if (f) {
            co_dump(f);
            fclose(f);
            CHECK(buf && strstr(buf, "(stack compacted while parked: frames not shown)"));
            free(buf);
        }
    }
    for (uint64_t i = 0; i < NRECV; i++) {
        elem_t e = {i, i * 3, ~i, 7, i + 11};
        CHECK_EQ(co_chan_send(shared_ch, &e, CO_FOREVER), 0);
    }
    co_waitgroup_wait(&wg);
    for (int i = 0; i < NRECV; i++) CHECK_EQ(seen[i], 1);
    CHECK_EQ(__atomic_load_n(&failures, __ATOMIC_RELAXED), 0);
    CHECK(t_compactions() - c0 >= NRECV);
    CHECK_EQ(co_stack_compacted(), 0);
    CHECK_EQ(t_restores() - r0, t_compactions() - c0);
    co_chan_free(shared_ch);
}

/* ---- send: the element's source is a local of the compacted stack ------ */

enum { NSEND = 100 };
static void sender(void *arg) {
    uint64_t i = (uint64_t)(uintptr_t)arg;
    volatile uint64_t pat[PAT];
    t_pattern_fill(pat, PAT, i + 1000);
    CHECK_EQ(co_stack_compactable(1), 0);
    elem_t e = {i, i * 3, ~i, 7, i + 11};
    CHECK_EQ(co_chan_send(shared_ch, &e, CO_FOREVER), 0);
    if (t_pattern_bad(pat, PAT, i + 1000)) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

static void test_send_values(void) {
    CHECK_EQ(co_chan_new(&shared_ch, sizeof(elem_t), 0), 0);
    co_waitgroup_add(&wg, NSEND);
    for (int i = 0; i < NSEND; i++) CHECK_EQ(co_go(sender, (void *)(uintptr_t)i), 0);
    CHECK(wait_compacted(NSEND));
    uint8_t got[NSEND] = {0};
    for (int k = 0; k < NSEND; k++) {
        elem_t e;
        CHECK_EQ(co_chan_recv(shared_ch, &e, CO_FOREVER), 0);
        CHECK(e.a < NSEND && e.b == e.a * 3 && e.c == ~e.a && e.d == 7 && e.e == e.a + 11);
        if (e.a < NSEND) got[e.a]++;
    }
    co_waitgroup_wait(&wg);
    for (int i = 0; i < NSEND; i++) CHECK_EQ(got[i], 1);
    CHECK_EQ(__atomic_load_n(&failures, __ATOMIC_RELAXED), 0);
    co_chan_free(shared_ch);
}

/* ---- close wakes compacted receivers ------------------------------------ */

static void closed_receiver(void *arg) {
    (void)arg;
    CHECK_EQ(co_stack_compactable(1), 0);
    int v = 5;
    CHECK_EQ(co_chan_recv(shared_ch, &v, CO_FOREVER), CO_ECLOSED);
    co_waitgroup_done(&wg);
}

static void test_close_wakes(void) {
    CHECK_EQ(co_chan_new(&shared_ch, sizeof(int), 0), 0);
    co_waitgroup_add(&wg, 20);
    for (int i = 0; i < 20; i++) CHECK_EQ(co_go(closed_receiver, NULL), 0);
    CHECK(wait_compacted(20));
    CHECK_EQ(co_chan_close(shared_ch), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(co_stack_compacted(), 0);
    co_chan_free(shared_ch);
}

/* ---- read: a connection handler parked in co_read ----------------------- */

enum { NREAD = 64 };
static int socks[NREAD][2];

static void reader(void *arg) {
    int i = (int)(intptr_t)arg;
    volatile uint64_t pat[PAT];
    t_pattern_fill(pat, PAT, (uint64_t)i + 77);
    CHECK_EQ(co_stack_compactable(1), 0);
    char buf[64];
    memset(buf, 0, sizeof buf);
    ssize_t n = co_read(socks[i][0], buf, sizeof buf, CO_FOREVER);
    char want[64];
    int wn = snprintf(want, sizeof want, "message %d for reader %d", i * 7, i);
    CHECK_EQ(n, wn);
    CHECK(n == wn && memcmp(buf, want, (size_t)wn) == 0);
    if (t_pattern_bad(pat, PAT, (uint64_t)i + 77)) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

static void test_read_values(void) {
    for (int i = 0; i < NREAD; i++) CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, socks[i]), 0);
    co_waitgroup_add(&wg, NREAD);
    for (int i = 0; i < NREAD; i++) CHECK_EQ(co_go(reader, (void *)(intptr_t)i), 0);
    CHECK(wait_compacted(NREAD));
    for (int i = 0; i < NREAD; i++) {
        char msg[64];
        int n = snprintf(msg, sizeof msg, "message %d for reader %d", i * 7, i);
        CHECK_EQ(write(socks[i][1], msg, (size_t)n), n);
    }
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&failures, __ATOMIC_RELAXED), 0);
    CHECK_EQ(co_stack_compacted(), 0);
    for (int i = 0; i < NREAD; i++) {
        co_close(socks[i][0]);
        close(socks[i][1]);
    }
}

/* ---- every other wait is left alone -------------------------------------- */

static co_mutex_t mu = CO_MUTEX_INIT, mu2 = CO_MUTEX_INIT;
static co_cond_t cv = CO_COND_INIT;
static bool cv_go;
static co_waitgroup_t gate = CO_WAITGROUP_INIT;
static co_sem_t sem;
static co_chan_t *kind_ch, *kind_ch2, *kind_s1, *kind_s2;
static int kind_sock[2];

enum {
    K_SLEEP, K_MUTEX, K_COND, K_WAITGROUP, K_SEM, K_SELECT, K_RECV_DEADLINE, K_SEND_DEADLINE,
    K_READ_DEADLINE, K_NOT_OPTED, K_COUNT
};

static void refuser(void *arg) {
    int k = (int)(intptr_t)arg;
    if (k != K_NOT_OPTED) CHECK_EQ(co_stack_compactable(1), 0);
    int v = 0;
    switch (k) {
    case K_SLEEP: co_sleep(300 * CO_MILLISECOND); break;
    case K_MUTEX:
        co_mutex_lock(&mu);
        co_mutex_unlock(&mu);
        break;
    case K_COND:
        co_mutex_lock(&mu2);
        while (!cv_go) co_cond_wait(&cv, &mu2);
        co_mutex_unlock(&mu2);
        break;
    case K_WAITGROUP: co_waitgroup_wait(&gate); break;
    case K_SEM:
        CHECK_EQ(co_sem_acquire(&sem, 1, CO_FOREVER), 0);
        co_sem_release(&sem, 1);
        break;
    case K_SELECT: {
        co_case_t cs[2] = {
            {.op = CO_RECV, .ch = kind_s1, .elem = &v},
            {.op = CO_RECV, .ch = kind_s2, .elem = &v},
        };
        CHECK_EQ(co_select(cs, 2, CO_FOREVER), 0);
        break;
    }
    case K_RECV_DEADLINE:
        CHECK_EQ(co_chan_recv(kind_ch2, &v, co_now() + 60 * CO_SECOND), 0);
        break;
    case K_SEND_DEADLINE:
        v = 1;
        CHECK_EQ(co_chan_send(kind_ch, &v, co_now() + 60 * CO_SECOND), 0);
        break;
    case K_READ_DEADLINE: {
        char b[8];
        CHECK_EQ(co_read(kind_sock[0], b, sizeof b, co_now() + 60 * CO_SECOND), 1);
        break;
    }
    case K_NOT_OPTED: CHECK_EQ(co_chan_recv(kind_ch2, &v, CO_FOREVER), 0); break;
    }
    co_waitgroup_done(&wg);
}

static void control(void *arg) {
    (void)arg;
    CHECK_EQ(co_stack_compactable(1), 0);
    int v = 0;
    CHECK_EQ(co_chan_recv(shared_ch, &v, CO_FOREVER), 0);
    CHECK_EQ(v, 42);
    co_waitgroup_done(&wg);
}

static void test_other_waits_refused(void) {
    co_sem_init(&sem, 1);
    CHECK_EQ(co_sem_acquire(&sem, 1, CO_FOREVER), 0); /* K_SEM waits for it */
    CHECK_EQ(co_chan_new(&kind_s1, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&kind_s2, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&kind_ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&kind_ch2, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&shared_ch, sizeof(int), 0), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, kind_sock), 0);
    co_waitgroup_add(&gate, 1);
    co_mutex_lock(&mu); /* K_MUTEX waits for it */
    uint64_t c0 = t_compactions();
    co_waitgroup_add(&wg, K_COUNT);
    for (int k = 0; k < K_COUNT; k++) CHECK_EQ(co_go(refuser, (void *)(intptr_t)k), 0);
    /* all of them parked before the control: its compaction comes after
     * sysmon rounds that saw them parked too */
    co_sleep(20 * CO_MILLISECOND);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(control, NULL), 0);
    CHECK(wait_compacted(1));
    co_sleep(50 * CO_MILLISECOND); /* more rounds */
    CHECK_EQ(co_stack_compacted(), 1);
    CHECK_EQ(t_compactions() - c0, 1);
    /* release them all */
    co_mutex_unlock(&mu);
    co_mutex_lock(&mu2);
    cv_go = true;
    co_cond_broadcast(&cv);
    co_mutex_unlock(&mu2);
    co_waitgroup_done(&gate);
    co_sem_release(&sem, 1);
    int v = 1;
    CHECK_EQ(co_chan_send(kind_s1, &v, CO_FOREVER), 0);  /* the select */
    CHECK_EQ(co_chan_recv(kind_ch, &v, CO_FOREVER), 0);  /* the timed send */
    CHECK_EQ(co_chan_send(kind_ch2, &v, CO_FOREVER), 0); /* the timed receive and the */
    CHECK_EQ(co_chan_send(kind_ch2, &v, CO_FOREVER), 0); /* coroutine that did not opt in */
    CHECK_EQ(write(kind_sock[1], "x", 1), 1);
    v = 42;
    CHECK_EQ(co_chan_send(shared_ch, &v, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(t_compactions() - c0, 1);
    CHECK_EQ(co_stack_compacted(), 0);
    co_chan_free(kind_ch);
    co_chan_free(kind_ch2);
    co_chan_free(kind_s1);
    co_chan_free(kind_s2);
    co_chan_free(shared_ch);
    co_close(kind_sock[0]);
    close(kind_sock[1]);
}

/* ---- wakes racing the compactor ------------------------------------------ */

enum { SR = 1500, ROUNDS = 12, SWAKERS = 4 };
static co_chan_t *sch[SR];
static int stress_bad; /* atomic */

/* Receives ROUNDS values in order from its own channel; every third one
 * sends its answer back on the channel too, parked as a sender (it is
 * collected by its waker). */
static void stress_rx(void *arg) {
    int i = (int)(intptr_t)arg;
    volatile uint64_t pat[PAT];
    t_pattern_fill(pat, PAT, (uint64_t)i);
    CHECK_EQ(co_stack_compactable(1), 0);
    for (uint64_t r = 0; r < ROUNDS; r++) {
        elem_t e = {0};
        if (co_chan_recv(sch[i], &e, CO_FOREVER) != 0 || e.a != r || e.b != (uint64_t)i ||
            e.c != ~r || e.e != r + (uint64_t)i)
            __atomic_add_fetch(&stress_bad, 1, __ATOMIC_RELAXED);
        if (r % 3 == 2) {
            elem_t back = {r, (uint64_t)i, 1, 2, 3};
            if (co_chan_send(sch[i], &back, CO_FOREVER) != 0)
                __atomic_add_fetch(&stress_bad, 1, __ATOMIC_RELAXED);
        }
    }
    if (t_pattern_bad(pat, PAT, (uint64_t)i)) __atomic_add_fetch(&stress_bad, 1, __ATOMIC_RELAXED);
    co_waitgroup_done(&wg);
}

/* Waker w serves the receivers i with i % SWAKERS == w, round by round,
 * with pauses so that the receivers park long enough to be compacted. */
static void stress_waker(void *arg) {
    int w = (int)(intptr_t)arg;
    for (uint64_t r = 0; r < ROUNDS; r++) {
        for (int i = w; i < SR; i += SWAKERS) {
            elem_t e = {r, (uint64_t)i, ~r, 0, r + (uint64_t)i};
            if (co_chan_send(sch[i], &e, CO_FOREVER) != 0)
                __atomic_add_fetch(&stress_bad, 1, __ATOMIC_RELAXED);
            if (r % 3 == 2) {
                elem_t back;
                if (co_chan_recv(sch[i], &back, CO_FOREVER) != 0 || back.a != r ||
                    back.b != (uint64_t)i || back.e != 3)
                    __atomic_add_fetch(&stress_bad, 1, __ATOMIC_RELAXED);
            }
            if ((i / SWAKERS) % 64 == 0) co_yield();
        }
        co_sleep((r % 4) * CO_MILLISECOND);
    }
    co_waitgroup_done(&wg);
}

static void test_stress_wakes_race_compaction(void) {
    uint64_t c0 = t_compactions();
    for (int i = 0; i < SR; i++) CHECK_EQ(co_chan_new(&sch[i], sizeof(elem_t), 0), 0);
    co_waitgroup_add(&wg, SR + SWAKERS);
    for (int i = 0; i < SR; i++) CHECK_EQ(co_go(stress_rx, (void *)(intptr_t)i), 0);
    CHECK(wait_compacted(1)); /* the compactor is at work before the wakers start */
    for (int w = 0; w < SWAKERS; w++) CHECK_EQ(co_go(stress_waker, (void *)(intptr_t)w), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&stress_bad, __ATOMIC_RELAXED), 0);
    CHECK_EQ(co_stack_compacted(), 0);
    fprintf(stderr, "  %llu compactions during the stress\n",
            (unsigned long long)(t_compactions() - c0));
    CHECK(t_compactions() - c0 >= 1);
    for (int i = 0; i < SR; i++) co_chan_free(sch[i]);
}

/* ---- a pool task cannot promise for the tasks after it ---------------------------- */

static co_chan_t *pool_ch;
static void task_opts_in(void *arg) {
    (void)arg;
    CHECK_EQ(co_stack_compactable(1), CO_EPERM); /* the worker runs others' tasks next */
    CHECK_EQ(co_stack_compactable(0), 0);
    co_waitgroup_done(&wg);
}
static void task_parks(void *arg) {
    (void)arg;
    int v = 0;
    CHECK_EQ(co_chan_recv(pool_ch, &v, CO_FOREVER), 0); /* not opted in: never compacted */
    CHECK_EQ(v, 9);
    co_waitgroup_done(&wg);
}

static void test_pool_task_refused(void) {
    co_pool_t *pool;
    CHECK_EQ(co_pool_new(&pool, 1, NULL), 0);
    CHECK_EQ(co_chan_new(&pool_ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&shared_ch, sizeof(int), 0), 0);
    uint64_t c0 = t_compactions();
    co_waitgroup_add(&wg, 2);
    CHECK_EQ(co_pool_submit(pool, task_opts_in, NULL), 0);
    CHECK_EQ(co_pool_submit(pool, task_parks, NULL), 0); /* the same worker (capacity 1) */
    co_sleep(20 * CO_MILLISECOND);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(control, NULL), 0); /* compacted: sysmon rounds ran */
    CHECK(wait_compacted(1));
    co_sleep(50 * CO_MILLISECOND);
    CHECK_EQ(co_stack_compacted(), 1);
    int v = 9;
    CHECK_EQ(co_chan_send(pool_ch, &v, CO_FOREVER), 0);
    v = 42;
    CHECK_EQ(co_chan_send(shared_ch, &v, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(t_compactions() - c0, 1);
    co_pool_destroy(pool);
    co_chan_free(pool_ch);
    co_chan_free(shared_ch);
}

/* ---- the call's own errors ----------------------------------------------- */

static void *plain_thread(void *arg) {
    (void)arg;
    CHECK_EQ(co_stack_compactable(1), CO_EPERM);
    return NULL;
}

static void test_api_errors(void) {
    CHECK_EQ(co_stack_compactable(2), CO_EINVAL);
    CHECK_EQ(co_stack_compactable(-1), CO_EINVAL);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, plain_thread, NULL), 0);
    pthread_join(t, NULL);
    CHECK_EQ(co_stack_compactable(1), 0);
    CHECK_EQ(co_stack_compactable(0), 0);
}

static int run(void *arg) {
    (void)arg;
    co__test_compact_set_ms(0);
    T_RUN(test_api_errors);
    T_RUN(test_recv_values);
    T_RUN(test_send_values);
    T_RUN(test_close_wakes);
    T_RUN(test_read_values);
    T_RUN(test_other_waits_refused);
    T_RUN(test_pool_task_refused);
    T_RUN(test_stress_wakes_race_compaction);
    return 0;
}

int main(void) {
    t_begin(110);
    CHECK_EQ(co_main(run, NULL), 0);
    /* every coroutine and pool gone before the process ends */
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
