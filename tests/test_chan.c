/* Channels: every function and every error, FIFO order, close, deadlines,
 * threads and coroutines mixed. */
#include "t.h"

#include "t_internal.h" /* count waiters in the queues */

#include <colony.h>
#include <pthread.h>
#include <sys/wait.h>


/* ---- helpers ------------------------------------------------------------ */

static int qlen(co__waitq_t *q) {
    int n = 0;
    for (co__waiter_t *w = q->head; w; w = w->next) n++;
    return n;
}
/* Waiters on ch's queue (op CO_RECV: receivers, CO_SEND: senders). */
static int waiters(co_chan_t *ch, int op) {
    chan_lock(ch);
    int n = qlen(op == CO_RECV ? &ch->recvq : &ch->sendq);
    chan_unlock(ch);
    return n;
}
/* Wait (yielding) until exactly n waiters block on ch's side op. */
static void await_waiters(co_chan_t *ch, int op, int n) {
    while (waiters(ch, op) != n) co_sleep(50 * 1000);
}

/* ---- creation, len, cap, free -------------------------------------------- */

static void test_new_errors(void) {
    co_chan_t *ch = (co_chan_t *)1;
    CHECK_EQ(co_chan_new(NULL, 8, 0), CO_EINVAL);
    CHECK_EQ(co_chan_new(&ch, SIZE_MAX / 2, 4), CO_ENOMEM);
    CHECK(ch == NULL);
    CHECK_EQ(co_chan_new(&ch, 1, SIZE_MAX), CO_ENOMEM);
    if (!t_sanitized()) { /* sanitizer allocators abort on absurd sizes instead of failing */
        CHECK_EQ(co_chan_new(&ch, 1, SIZE_MAX / 4), CO_ENOMEM); /* fits size_t, not memory */
        CHECK(ch == NULL);
    }
    CHECK_EQ(co_chan_new(&ch, 8, 3), 0);
    CHECK_EQ(co_chan_cap(ch), 3);
    CHECK_EQ(co_chan_len(ch), 0);
    co_chan_free(ch);
    co_chan_free(NULL); /* no-op */
    CHECK_EQ(co_chan_len(NULL), 0);
    CHECK_EQ(co_chan_cap(NULL), 0);
}

static void test_null_args(void) {
    int64_t v = 1;
    CHECK_EQ(co_chan_send(NULL, &v, 0), CO_EINVAL);
    CHECK_EQ(co_chan_send(NULL, &v, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_chan_recv(NULL, &v, 0), CO_EINVAL);
    CHECK_EQ(co_chan_recv(NULL, &v, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_chan_close(NULL), CO_EINVAL);
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof v, 1), 0);
    CHECK_EQ(co_chan_send(ch, NULL, 0), CO_EINVAL); /* elem_size > 0 needs a value */
    CHECK_EQ(co_chan_len(ch), 0);
    CHECK_EQ(co_chan_send(ch, &v, 0), 0);
    CHECK_EQ(co_chan_recv(ch, NULL, 0), 0); /* NULL: receive and drop */
    CHECK_EQ(co_chan_len(ch), 0);
    co_chan_free(ch);
}

/* ---- buffered ------------------------------------------------------------ */

static void test_buffered_fifo(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 4), 0);
    for (int round = 0; round < 3; round++) { /* wrap the ring a few times */
        for (int i = 0; i < 4; i++) CHECK_EQ(co_chan_send(ch, &(int){round * 10 + i}, 0), 0);
        CHECK_EQ(co_chan_len(ch), 4);
        CHECK_EQ(co_chan_send(ch, &(int){99}, 0), CO_ETIMEDOUT);                 /* fast path */
        CHECK_EQ(co_chan_send(ch, &(int){99}, co_now() - 1), CO_ETIMEDOUT);      /* locked */
        CHECK_EQ(co_chan_send(ch, &(int){99}, -7), CO_ETIMEDOUT); /* negative but not FOREVER */
        for (int i = 0; i < 3; i++) {
            int v = -1;
            CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), 0);
            CHECK_EQ(v, round * 10 + i);
        }
        CHECK_EQ(co_chan_send(ch, &(int){round * 10 + 4}, co_deadline_after(1000000)), 0);
        for (int i = 3; i < 5; i++) {
            int v = -1;
            CHECK_EQ(co_chan_recv(ch, &v, 0), 0);
            CHECK_EQ(v, round * 10 + i);
        }
        CHECK_EQ(co_chan_len(ch), 0);
        int v;
        CHECK_EQ(co_chan_recv(ch, &v, 0), CO_ETIMEDOUT);
        CHECK_EQ(co_chan_recv(ch, &v, co_now() - 1), CO_ETIMEDOUT);
    }
    co_chan_free(ch);
}

/* Timed waits return CO_ETIMEDOUT, not before the deadline. */
static void test_timeouts(void) {
    co_chan_t *u, *b;
    CHECK_EQ(co_chan_new(&u, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&b, sizeof(int), 1), 0);
    CHECK_EQ(co_chan_send(b, &(int){1}, 0), 0);
    int v;
    int64_t dl = co_deadline_after(5 * 1000000);
    CHECK_EQ(co_chan_recv(u, &v, dl), CO_ETIMEDOUT);
    CHECK(co_now() >= dl);
    dl = co_deadline_after(5 * 1000000);
    CHECK_EQ(co_chan_send(u, &v, dl), CO_ETIMEDOUT);
    CHECK(co_now() >= dl);
    dl = co_deadline_after(5 * 1000000);
    CHECK_EQ(co_chan_send(b, &v, dl), CO_ETIMEDOUT);
    CHECK(co_now() >= dl);
    CHECK_EQ(waiters(u, CO_RECV), 0); /* timed-out waiters are gone */
    CHECK_EQ(waiters(u, CO_SEND), 0);
    CHECK_EQ(waiters(b, CO_SEND), 0);
    CHECK_EQ(co_chan_send(u, &v, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_chan_recv(u, &v, 0), CO_ETIMEDOUT);
    co_chan_free(u);
    co_chan_free(b);
}

/* ---- unbuffered hand-off, FIFO waiters ----------------------------------- */

typedef struct {
    co_chan_t *ch;
    int id;
    int got;
    int rc;
    co_waitgroup_t *wg;
} job_t;

static void recv_job(void *arg) {
    job_t *j = arg;
    j->rc = co_chan_recv(j->ch, &j->got, CO_FOREVER);
    co_waitgroup_done(j->wg);
}
static void send_job(void *arg) {
    job_t *j = arg;
    j->rc = co_chan_send(j->ch, &j->id, CO_FOREVER);
    co_waitgroup_done(j->wg);
}

#define NW 8

static void test_recv_fifo(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t jobs[NW];
    for (int i = 0; i < NW; i++) { /* receiver i queues i-th */
        jobs[i] = (job_t){.ch = ch, .id = i, .got = -1, .rc = 1, .wg = &wg};
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(recv_job, &jobs[i]), 0);
        await_waiters(ch, CO_RECV, i + 1);
    }
    for (int i = 0; i < NW; i++) CHECK_EQ(co_chan_send(ch, &(int){100 + i}, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    for (int i = 0; i < NW; i++) {
        CHECK_EQ(jobs[i].rc, 0);
        CHECK_EQ(jobs[i].got, 100 + i);
    }
    co_chan_free(ch);
}

/* cap 0 and cap 2: senders queue in order; the receiver sees buffered values
 * first, then the senders' in queue order (the full-buffer rotation). */
static void send_fifo(size_t cap) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), cap), 0);
    for (size_t i = 0; i < cap; i++) CHECK_EQ(co_chan_send(ch, &(int){(int)i}, 0), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t jobs[NW];
    for (int i = 0; i < NW; i++) {
        jobs[i] = (job_t){.ch = ch, .id = (int)cap + i, .rc = 1, .wg = &wg};
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(send_job, &jobs[i]), 0);
        await_waiters(ch, CO_SEND, i + 1);
    }
    CHECK_EQ(co_chan_len(ch), cap);
    for (int i = 0; i < (int)cap + NW; i++) {
        int v = -1;
        CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), 0);
        CHECK_EQ(v, i);
    }
    co_waitgroup_wait(&wg);
    for (int i = 0; i < NW; i++) CHECK_EQ(jobs[i].rc, 0);
    CHECK_EQ(co_chan_len(ch), 0);
    co_chan_free(ch);
}
static void test_send_fifo(void) {
    send_fifo(0);
    send_fifo(2);
}

/* A waiting receiver of a buffered channel gets the value directly. */
static void test_buffered_direct(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 3), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t j = {.ch = ch, .got = -1, .rc = 1, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(recv_job, &j), 0);
    await_waiters(ch, CO_RECV, 1);
    CHECK_EQ(co_chan_send(ch, &(int){42}, 0), 0); /* non-blocking: a receiver waits */
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 0);
    CHECK_EQ(j.got, 42);
    CHECK_EQ(co_chan_len(ch), 0);
    co_chan_free(ch);
}

/* A non-blocking send succeeds on an unbuffered channel only with a waiting
 * receiver; a non-blocking receive only with a waiting sender. */
static void test_unbuffered_nonblocking(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t j = {.ch = ch, .id = 7, .rc = 1, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(send_job, &j), 0);
    await_waiters(ch, CO_SEND, 1);
    int v = 0;
    CHECK_EQ(co_chan_recv(ch, &v, 0), 0);
    CHECK_EQ(v, 7);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 0);
    CHECK_EQ(co_chan_recv(ch, &v, 0), CO_ETIMEDOUT);
    co_chan_free(ch);
}

/* ---- element sizes -------------------------------------------------------- */

static void test_elem_size_zero(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, 0, 3), 0);
    CHECK_EQ(co_chan_send(ch, NULL, 0), 0);
    CHECK_EQ(co_chan_send(ch, NULL, 0), 0);
    CHECK_EQ(co_chan_len(ch), 2);
    char junk = 'x';
    CHECK_EQ(co_chan_recv(ch, &junk, 0), 0);
    CHECK_EQ(junk, 'x'); /* nothing is copied */
    CHECK_EQ(co_chan_recv(ch, NULL, 0), 0);
    CHECK_EQ(co_chan_recv(ch, NULL, 0), CO_ETIMEDOUT);
    co_chan_free(ch);

    CHECK_EQ(co_chan_new(&ch, 0, 0), 0); /* a pure signal channel */
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t j = {.ch = ch, .rc = 1, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(recv_job, &j), 0);
    CHECK_EQ(co_chan_send(ch, NULL, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 0);
    CHECK_EQ(co_chan_close(ch), 0);
    CHECK_EQ(co_chan_recv(ch, NULL, CO_FOREVER), CO_ECLOSED);
    co_chan_free(ch);
}

typedef struct {
    char bytes[1000];
} big_t;

static void big_sender(void *arg) {
    co_chan_t *ch = arg;
    for (int i = 0; i < 20; i++) {
        big_t b;
        memset(b.bytes, i, sizeof b.bytes);
        CHECK_EQ(co_chan_send(ch, &b, CO_FOREVER), 0);
    }
    co_chan_close(ch);
}

static void test_big_elements(void) {
    for (size_t cap = 0; cap <= 3; cap += 3) {
        co_chan_t *ch;
        CHECK_EQ(co_chan_new(&ch, sizeof(big_t), cap), 0);
        CHECK_EQ(co_go(big_sender, ch), 0);
        big_t b;
        int i = 0;
        while (co_chan_recv(ch, &b, CO_FOREVER) == 0) {
            int ok = 1;
            for (size_t k = 0; k < sizeof b.bytes; k++) ok &= b.bytes[k] == (char)i;
            CHECK(ok);
            i++;
        }
        CHECK_EQ(i, 20);
        co_chan_free(ch);
    }
}

/* ---- close ---------------------------------------------------------------- */

static void test_close_basics(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 3), 0);
    CHECK_EQ(co_chan_send(ch, &(int){1}, 0), 0);
    CHECK_EQ(co_chan_send(ch, &(int){2}, 0), 0);
    CHECK_EQ(co_chan_close(ch), 0);
    CHECK_EQ(co_chan_close(ch), CO_ECLOSED);
    CHECK_EQ(co_chan_send(ch, &(int){3}, 0), CO_ECLOSED);
    CHECK_EQ(co_chan_send(ch, &(int){3}, CO_FOREVER), CO_ECLOSED);
    CHECK_EQ(co_chan_len(ch), 2);
    int v = 0;
    CHECK_EQ(co_chan_recv(ch, &v, 0), 0); /* drain first */
    CHECK_EQ(v, 1);
    CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), 0);
    CHECK_EQ(v, 2);
    /* each path writes Go's zero value */
    v = 77;
    CHECK_EQ(co_chan_recv(ch, &v, 0), CO_ECLOSED); /* lock-free path */
    CHECK_EQ(v, 0);
    v = 77;
    CHECK_EQ(co_chan_recv(ch, &v, co_now() - 1), CO_ECLOSED);
    CHECK_EQ(v, 0);
    v = 77;
    CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), CO_ECLOSED);
    CHECK_EQ(v, 0);
    co_chan_free(ch);

    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_close(ch), 0);
    CHECK_EQ(co_chan_send(ch, &v, 0), CO_ECLOSED);
    CHECK_EQ(co_chan_recv(ch, &v, 0), CO_ECLOSED);
    CHECK_EQ(co_chan_recv(ch, &v, co_deadline_after(1000000)), CO_ECLOSED);
    co_chan_free(ch);
}

/* close wakes every blocked receiver and every blocked sender. */
static void test_close_wakes_all(void) {
    co_chan_t *r, *s;
    CHECK_EQ(co_chan_new(&r, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&s, sizeof(int), 1), 0);
    CHECK_EQ(co_chan_send(s, &(int){0}, 0), 0); /* full: senders block */
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t rj[NW], sj[NW];
    for (int i = 0; i < NW; i++) {
        rj[i] = (job_t){.ch = r, .got = -1, .rc = 1, .wg = &wg};
        sj[i] = (job_t){.ch = s, .id = i, .rc = 1, .wg = &wg};
        co_waitgroup_add(&wg, 2);
        CHECK_EQ(co_go(recv_job, &rj[i]), 0);
        CHECK_EQ(co_go(send_job, &sj[i]), 0);
    }
    await_waiters(r, CO_RECV, NW);
    await_waiters(s, CO_SEND, NW);
    CHECK_EQ(co_chan_close(r), 0);
    CHECK_EQ(co_chan_close(s), 0);
    co_waitgroup_wait(&wg);
    for (int i = 0; i < NW; i++) {
        CHECK_EQ(rj[i].rc, CO_ECLOSED);
        CHECK_EQ(rj[i].got, 0); /* Go's zero value */
        CHECK_EQ(sj[i].rc, CO_ECLOSED);
    }
    int v = -1;
    CHECK_EQ(co_chan_recv(s, &v, 0), 0); /* the buffered value survives */
    CHECK_EQ(v, 0);
    CHECK_EQ(co_chan_recv(s, &v, 0), CO_ECLOSED);
    CHECK_EQ(waiters(r, CO_RECV), 0);
    CHECK_EQ(waiters(s, CO_SEND), 0);
    co_chan_free(r);
    co_chan_free(s);
}

/* ---- threads and coroutines ----------------------------------------------- */

#define XN 2000

static void *thread_recv(void *arg) {
    co_chan_t *ch = arg;
    long sum = 0;
    int v, n = 0;
    while (co_chan_recv(ch, &v, CO_FOREVER) == 0) {
        sum += v;
        n++;
    }
    CHECK_EQ(n, XN);
    return (void *)sum;
}
static void *thread_send(void *arg) {
    co_chan_t *ch = arg;
    for (int i = 0; i < XN; i++) CHECK_EQ(co_chan_send(ch, &i, CO_FOREVER), 0);
    CHECK_EQ(co_chan_close(ch), 0);
    return NULL;
}

static void test_thread_and_coroutine(void) {
    for (size_t cap = 0; cap <= 4; cap += 4) {
        co_chan_t *ch;
        CHECK_EQ(co_chan_new(&ch, sizeof(int), cap), 0);
        pthread_t th; /* a thread receives what a coroutine sends */
        CHECK_EQ(pthread_create(&th, NULL, thread_recv, ch), 0);
        for (int i = 0; i < XN; i++) CHECK_EQ(co_chan_send(ch, &i, CO_FOREVER), 0);
        CHECK_EQ(co_chan_close(ch), 0);
        void *sum;
        pthread_join(th, &sum);
        CHECK_EQ((long)sum, (long)XN * (XN - 1) / 2);
        co_chan_free(ch);

        CHECK_EQ(co_chan_new(&ch, sizeof(int), cap), 0); /* and vice versa */
        CHECK_EQ(pthread_create(&th, NULL, thread_send, ch), 0);
        long s = 0;
        int v, n = 0;
        while (co_chan_recv(ch, &v, CO_FOREVER) == 0) {
            s += v;
            n++;
        }
        pthread_join(th, NULL);
        CHECK_EQ(n, XN);
        CHECK_EQ(s, (long)XN * (XN - 1) / 2);
        co_chan_free(ch);
    }
}

/* A plain thread times out on a channel, and is woken by close. */
static co_chan_t *tt_ready;
static void *thread_timeout(void *arg) {
    co_chan_t *ch = arg;
    int v;
    int64_t dl = co_deadline_after(3 * 1000000);
    CHECK_EQ(co_chan_recv(ch, &v, dl), CO_ETIMEDOUT);
    CHECK(co_now() >= dl);
    CHECK_EQ(co_chan_recv(ch, &v, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_chan_send(tt_ready, NULL, CO_FOREVER), 0);
    CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), CO_ECLOSED);
    return NULL;
}

static void test_thread_timeout_and_close(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&tt_ready, 0, 0), 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, thread_timeout, ch), 0);
    CHECK_EQ(co_chan_recv(tt_ready, NULL, CO_FOREVER), 0);
    await_waiters(ch, CO_RECV, 1);
    CHECK_EQ(co_chan_close(ch), 0);
    pthread_join(th, NULL);
    co_chan_free(ch);
    co_chan_free(tt_ready);
}

/* ---- misuse: freeing a channel with blocked waiters is fatal ------------- */

static void test_free_with_waiters_is_fatal(void) {
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t j = {.ch = ch, .got = -1, .rc = 1, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(recv_job, &j), 0);
    await_waiters(ch, CO_RECV, 1);
    fflush(NULL);
    pid_t pid = t_fork();
    if (pid == 0) { /* the child has a copy of the channel with its waiter */
        co_chan_free(ch);
        _exit(0);
    }
    CHECK(pid > 0);
    int st = t_child_wait(pid, -1, NULL, 0, 100);
    CHECK(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK_EQ(co_chan_send(ch, &(int){5}, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.got, 5);
    co_chan_free(ch);
}

static int run(void *arg) {
    T_RUN(test_new_errors);
    T_RUN(test_null_args);
    T_RUN(test_buffered_fifo);
    T_RUN(test_timeouts);
    T_RUN(test_recv_fifo);
    T_RUN(test_send_fifo);
    T_RUN(test_buffered_direct);
    T_RUN(test_unbuffered_nonblocking);
    T_RUN(test_elem_size_zero);
    T_RUN(test_big_elements);
    T_RUN(test_close_basics);
    T_RUN(test_close_wakes_all);
    T_RUN(test_thread_and_coroutine);
    T_RUN(test_thread_timeout_and_close);
    T_RUN(test_free_with_waiters_is_fatal);
    return 0;
}

int main(void) {
    t_begin(60);
    /* A few operations from the plain main thread, before any coroutine. */
    co_chan_t *ch;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 1), 0);
    CHECK_EQ(co_chan_send(ch, &(int){3}, CO_FOREVER), 0);
    int v = 0;
    CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), 0);
    CHECK_EQ(v, 3);
    CHECK_EQ(co_chan_recv(ch, &v, co_deadline_after(1000000)), CO_ETIMEDOUT);
    co_chan_free(ch);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
