/* co_select: errors, ready cases, blocking, deadlines, close, NULL
 * channels, no waiter left behind, large selects, threads. */
#include "t.h"

#include "t_internal.h" /* count waiters in the queues */

#include <colony.h>
#include <pthread.h>

static int qlen(co__waitq_t *q) {
    int n = 0;
    for (co__waiter_t *w = q->head; w; w = w->next) n++;
    return n;
}
static int waiters(co_chan_t *ch, int op) {
    chan_lock(ch);
    int n = qlen(op == CO_RECV ? &ch->recvq : &ch->sendq);
    chan_unlock(ch);
    return n;
}
static void await_waiters(co_chan_t *ch, int op, int n) {
    while (waiters(ch, op) != n) co_sleep(50 * 1000);
}
static int all_waiters(co_chan_t *ch) { return waiters(ch, CO_RECV) + waiters(ch, CO_SEND); }

static co_chan_t *mk(size_t cap) {
    co_chan_t *ch = NULL;
    CHECK_EQ(co_chan_new(&ch, sizeof(int), cap), 0);
    return ch;
}

/* ---- errors --------------------------------------------------------------- */

static void test_errors(void) {
    co_chan_t *a = mk(1);
    int v = 0;
    co_case_t c[2] = {{.ch = a, .op = CO_RECV, .elem = &v}, {.ch = a, .op = 0, .elem = &v}};
    CHECK_EQ(co_select(NULL, 1, 0), CO_EINVAL);
    CHECK_EQ(co_select(c, 0, 0), CO_EINVAL);
    CHECK_EQ(co_select(c, 0, CO_FOREVER), CO_EINVAL); /* not Go's `select {}` */
    CHECK_EQ(co_select(c, -3, 0), CO_EINVAL);
    CHECK_EQ(co_select(c, 2, 0), CO_EINVAL); /* bad op */
    c[1].op = 7;
    c[1].ch = NULL;
    CHECK_EQ(co_select(c, 2, 0), CO_EINVAL); /* bad op even with a NULL channel */
    c[1] = (co_case_t){.ch = a, .op = CO_SEND, .elem = NULL};
    CHECK_EQ(co_select(c, 2, 0), CO_EINVAL); /* send needs a value */
    co_chan_free(a);
}

/* ---- non-blocking --------------------------------------------------------- */

static void test_nothing_ready(void) {
    co_chan_t *u = mk(0), *b = mk(1), *full = mk(1);
    CHECK_EQ(co_chan_send(full, &(int){1}, 0), 0);
    int v = 0;
    co_case_t c[3] = {{.ch = u, .op = CO_RECV, .elem = &v},
                      {.ch = b, .op = CO_RECV, .elem = &v},
                      {.ch = full, .op = CO_SEND, .elem = &v}};
    CHECK_EQ(co_select(c, 3, 0), CO_ETIMEDOUT);            /* lock-free snapshot */
    CHECK_EQ(co_select(c, 3, co_now() - 1), CO_ETIMEDOUT); /* locked pass 1 */
    CHECK_EQ(co_select(c, 3, -5), CO_ETIMEDOUT);
    int64_t dl = co_deadline_after(3 * 1000000);
    CHECK_EQ(co_select(c, 3, dl), CO_ETIMEDOUT); /* blocks, then times out */
    CHECK(co_now() >= dl);
    CHECK_EQ(all_waiters(u) + all_waiters(b) + all_waiters(full), 0);
    co_chan_free(u);
    co_chan_free(b);
    co_chan_free(full);
}

static void test_ready_cases(void) {
    co_chan_t *a = mk(2), *b = mk(2);
    int out = 5, in = -1;
    co_case_t c[2] = {{.ch = a, .op = CO_SEND, .elem = &out}, {.ch = b, .op = CO_RECV, .elem = &in}};
    c[0].result = c[1].result = 123;
    CHECK_EQ(co_select(c, 2, 0), 0); /* only the send is ready */
    CHECK_EQ(c[0].result, 0);
    CHECK_EQ(c[1].result, 123); /* untouched */
    CHECK_EQ(co_chan_len(a), 1);
    CHECK_EQ(co_chan_send(b, &(int){9}, 0), 0);
    CHECK_EQ(co_chan_send(a, &(int){6}, 0), 0); /* a full: only the recv is ready */
    CHECK_EQ(co_select(c, 2, CO_FOREVER), 1);
    CHECK_EQ(c[1].result, 0);
    CHECK_EQ(in, 9);
    int x;
    CHECK_EQ(co_chan_recv(a, &x, 0), 0);
    CHECK_EQ(x, 5);
    /* receive into NULL drops the value */
    CHECK_EQ(co_chan_send(b, &(int){1}, 0), 0);
    co_case_t d = {.ch = b, .op = CO_RECV, .elem = NULL};
    CHECK_EQ(co_select(&d, 1, 0), 0);
    CHECK_EQ(co_chan_len(b), 0);
    co_chan_free(a);
    co_chan_free(b);
}

/* NULL channels are never ready; with only NULL channels select waits for
 * its deadline. */
static void test_null_channels(void) {
    co_chan_t *a = mk(1);
    CHECK_EQ(co_chan_send(a, &(int){4}, 0), 0);
    int v = 0;
    co_case_t c[3] = {{.ch = NULL, .op = CO_RECV, .elem = &v},
                      {.ch = a, .op = CO_RECV, .elem = &v},
                      {.ch = NULL, .op = CO_SEND, .elem = NULL}};
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(co_select(c, 3, 0), 1);
        CHECK_EQ(v, 4);
        CHECK_EQ(co_chan_send(a, &(int){4}, 0), 0);
    }
    co_case_t n[2] = {{.ch = NULL, .op = CO_RECV, .elem = &v}, {.ch = NULL, .op = CO_SEND, .elem = &v}};
    CHECK_EQ(co_select(n, 2, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_select(n, 2, co_now()), CO_ETIMEDOUT);
    int64_t dl = co_deadline_after(2 * 1000000);
    CHECK_EQ(co_select(n, 2, dl), CO_ETIMEDOUT);
    CHECK(co_now() >= dl);
    co_chan_free(a);
}

/* A closed channel: receive fires with CO_ECLOSED once drained; send fires
 * with CO_ECLOSED. */
static void test_closed(void) {
    co_chan_t *a = mk(1), *u = mk(0);
    CHECK_EQ(co_chan_send(a, &(int){8}, 0), 0);
    CHECK_EQ(co_chan_close(a), 0);
    int v = -1;
    co_case_t c[2] = {{.ch = u, .op = CO_RECV, .elem = &v}, {.ch = a, .op = CO_RECV, .elem = &v}};
    CHECK_EQ(co_select(c, 2, 0), 1);
    CHECK_EQ(c[1].result, 0);
    CHECK_EQ(v, 8);
    v = -1;
    CHECK_EQ(co_select(c, 2, 0), 1);
    CHECK_EQ(c[1].result, CO_ECLOSED);
    CHECK_EQ(v, 0); /* Go's zero value */
    c[1].result = 0;
    CHECK_EQ(co_select(c, 2, CO_FOREVER), 1);
    CHECK_EQ(c[1].result, CO_ECLOSED);
    co_case_t s = {.ch = a, .op = CO_SEND, .elem = &v};
    CHECK_EQ(co_select(&s, 1, 0), 0);
    CHECK_EQ(s.result, CO_ECLOSED);
    co_chan_free(a);
    co_chan_free(u);
}

/* ---- blocking --------------------------------------------------------------- */

typedef struct {
    co_case_t c[4];
    int n;
    int64_t deadline;
    int rc;
    co_waitgroup_t *wg;
} sel_job_t;

static void sel_job(void *arg) {
    sel_job_t *j = arg;
    j->rc = co_select(j->c, j->n, j->deadline);
    co_waitgroup_done(j->wg);
}

/* A blocked select is woken by a send on one case; the others leave no
 * waiter behind. */
static void test_block_then_send(void) {
    co_chan_t *a = mk(0), *b = mk(0), *c = mk(3);
    CHECK_EQ(co_chan_send(c, &(int){0}, 0), 0);
    CHECK_EQ(co_chan_send(c, &(int){0}, 0), 0);
    CHECK_EQ(co_chan_send(c, &(int){0}, 0), 0); /* full: the send case blocks */
    int va = -1, vb = -1, vc = 3;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    sel_job_t j = {.c = {{.ch = a, .op = CO_RECV, .elem = &va},
                         {.ch = b, .op = CO_RECV, .elem = &vb},
                         {.ch = c, .op = CO_SEND, .elem = &vc}},
                   .n = 3, .deadline = CO_FOREVER, .rc = -1, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(sel_job, &j), 0);
    await_waiters(a, CO_RECV, 1);
    await_waiters(b, CO_RECV, 1);
    await_waiters(c, CO_SEND, 1);
    CHECK_EQ(co_chan_send(b, &(int){11}, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 1);
    CHECK_EQ(j.c[1].result, 0);
    CHECK_EQ(vb, 11);
    CHECK_EQ(va, -1);
    CHECK_EQ(all_waiters(a) + all_waiters(b) + all_waiters(c), 0);
    CHECK_EQ(co_chan_len(c), 3);

    /* the send case: a receiver drains c, the select's value moves in */
    co_waitgroup_add(&wg, 1);
    j.rc = -1;
    CHECK_EQ(co_go(sel_job, &j), 0);
    await_waiters(c, CO_SEND, 1);
    int x;
    CHECK_EQ(co_chan_recv(c, &x, 0), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 2);
    CHECK_EQ(all_waiters(a) + all_waiters(b) + all_waiters(c), 0);
    for (int i = 0; i < 2; i++) CHECK_EQ(co_chan_recv(c, &x, 0), 0);
    CHECK_EQ(co_chan_recv(c, &x, 0), 0);
    CHECK_EQ(x, 3);
    co_chan_free(a);
    co_chan_free(b);
    co_chan_free(c);
}

/* A blocked select times out and leaves no waiter; one woken by close gets
 * CO_ECLOSED on that case. */
static void test_block_timeout_and_close(void) {
    co_chan_t *a = mk(0), *b = mk(1);
    int v = -1;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    sel_job_t j = {.c = {{.ch = a, .op = CO_RECV, .elem = &v}, {.ch = b, .op = CO_RECV, .elem = &v}},
                   .n = 2, .deadline = co_deadline_after(3 * 1000000), .rc = -1, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(sel_job, &j), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, CO_ETIMEDOUT);
    CHECK_EQ(all_waiters(a) + all_waiters(b), 0);

    j.deadline = CO_FOREVER;
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(sel_job, &j), 0);
    await_waiters(a, CO_RECV, 1);
    CHECK_EQ(co_chan_close(a), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 0);
    CHECK_EQ(j.c[0].result, CO_ECLOSED);
    CHECK_EQ(v, 0); /* Go's zero value */
    CHECK_EQ(all_waiters(a) + all_waiters(b), 0);
    co_chan_free(a);
    co_chan_free(b);
}

/* Send and receive cases on the same channel: another party can take
 * either; the select never matches itself. */
static void test_same_channel_both_ways(void) {
    co_chan_t *a = mk(0);
    int out = 21, in = -1;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    sel_job_t j = {.c = {{.ch = a, .op = CO_SEND, .elem = &out}, {.ch = a, .op = CO_RECV, .elem = &in}},
                   .n = 2, .deadline = CO_FOREVER, .rc = -1, .wg = &wg};
    CHECK_EQ(co_select(j.c, 2, co_deadline_after(1000000)), CO_ETIMEDOUT); /* alone: never */
    CHECK_EQ(all_waiters(a), 0);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(sel_job, &j), 0);
    await_waiters(a, CO_SEND, 1);
    await_waiters(a, CO_RECV, 1);
    int x = -1;
    CHECK_EQ(co_chan_recv(a, &x, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 0);
    CHECK_EQ(x, 21);
    CHECK_EQ(all_waiters(a), 0);

    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(sel_job, &j), 0);
    await_waiters(a, CO_RECV, 1);
    CHECK_EQ(co_chan_send(a, &(int){34}, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(j.rc, 1);
    CHECK_EQ(in, 34);
    CHECK_EQ(all_waiters(a), 0);

    /* two such selects serve each other */
    sel_job_t k = j;
    int out2 = 55, in2 = -1;
    k.c[0].elem = &out2;
    k.c[1].elem = &in2;
    in = -1;
    co_waitgroup_add(&wg, 2);
    CHECK_EQ(co_go(sel_job, &j), 0);
    CHECK_EQ(co_go(sel_job, &k), 0);
    co_waitgroup_wait(&wg);
    CHECK((j.rc == 0 && k.rc == 1 && in2 == 21) || (j.rc == 1 && k.rc == 0 && in == 55));
    CHECK_EQ(all_waiters(a), 0);
    co_chan_free(a);
}

/* The same channel in two receive cases: one fires, no waiter remains. */
static void test_duplicate_channel(void) {
    co_chan_t *a = mk(0);
    int v1 = -1, v2 = -1;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    sel_job_t j = {.c = {{.ch = a, .op = CO_RECV, .elem = &v1}, {.ch = a, .op = CO_RECV, .elem = &v2}},
                   .n = 2, .deadline = CO_FOREVER, .rc = -1, .wg = &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(sel_job, &j), 0);
    await_waiters(a, CO_RECV, 2);
    CHECK_EQ(co_chan_send(a, &(int){3}, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK(j.rc == 0 || j.rc == 1);
    CHECK_EQ(j.rc == 0 ? v1 : v2, 3);
    CHECK_EQ(all_waiters(a), 0);
    CHECK_EQ(co_chan_send(a, &(int){3}, 0), CO_ETIMEDOUT); /* the stale one is gone */
    co_chan_free(a);
}

/* Two senders race to wake one select: one wins, the loser's send sees the
 * select's other waiter already claimed, drops it and blocks on its own;
 * nothing is lost. */
typedef struct {
    co_chan_t *ch;
    int v;
    int rc;
    co_waitgroup_t *wg;
} snd_t;
static void snd(void *arg) {
    snd_t *s = arg;
    s->rc = co_chan_send(s->ch, &s->v, CO_FOREVER);
    co_waitgroup_done(s->wg);
}

static void test_wakers_race(void) {
    for (int round = 0; round < 200; round++) {
        co_chan_t *a = mk(0), *b = mk(0);
        int va = -1, vb = -1;
        co_waitgroup_t wg = CO_WAITGROUP_INIT, swg = CO_WAITGROUP_INIT;
        sel_job_t j = {.c = {{.ch = a, .op = CO_RECV, .elem = &va}, {.ch = b, .op = CO_RECV, .elem = &vb}},
                       .n = 2, .deadline = CO_FOREVER, .rc = -1, .wg = &wg};
        co_waitgroup_add(&wg, 1);
        CHECK_EQ(co_go(sel_job, &j), 0);
        await_waiters(a, CO_RECV, 1);
        snd_t sa = {a, 1, -1, &swg}, sb = {b, 2, -1, &swg};
        co_waitgroup_add(&swg, 2);
        CHECK_EQ(co_go(snd, &sa), 0);
        CHECK_EQ(co_go(snd, &sb), 0);
        co_waitgroup_wait(&wg);
        CHECK(j.rc == 0 || j.rc == 1);
        co_chan_t *other = j.rc == 0 ? b : a;
        CHECK_EQ(j.rc == 0 ? va : vb, j.rc + 1);
        int x = -1;
        CHECK_EQ(co_chan_recv(other, &x, CO_FOREVER), 0);
        CHECK_EQ(x, j.rc == 0 ? 2 : 1);
        co_waitgroup_wait(&swg);
        CHECK_EQ(sa.rc, 0);
        CHECK_EQ(sb.rc, 0);
        CHECK_EQ(all_waiters(a) + all_waiters(b), 0);
        co_chan_free(a);
        co_chan_free(b);
    }
}

/* More cases than fit on the stack: heap arrays, heapsorted lock order. */
#define BIG 40
typedef struct {
    co_case_t *c;
    int rc;
    co_waitgroup_t *wg;
} big_job_t;
static void blocker(void *p) {
    big_job_t *a = p;
    a->rc = co_select(a->c, BIG + 1, CO_FOREVER);
    co_waitgroup_done(a->wg);
}

static void test_many_cases(void) {
    co_chan_t *ch[BIG];
    int vals[BIG];
    co_case_t c[BIG + 1];
    for (int i = 0; i < BIG; i++) {
        ch[i] = mk(i % 2);
        vals[i] = -1;
        c[i] = (co_case_t){.ch = ch[i], .op = CO_RECV, .elem = &vals[i]};
    }
    c[BIG] = (co_case_t){.ch = ch[7], .op = CO_RECV, .elem = &vals[7]}; /* a duplicate */
    CHECK_EQ(co_select(c, BIG + 1, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_chan_send(ch[17], &(int){17}, 0), 0);
    CHECK_EQ(co_select(c, BIG + 1, 0), 17);
    CHECK_EQ(vals[17], 17);

    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    big_job_t arg = {c, -1, &wg};
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(blocker, &arg), 0);
    await_waiters(ch[7], CO_RECV, 2);
    await_waiters(ch[BIG - 1], CO_RECV, 1);
    CHECK_EQ(co_chan_send(ch[30], &(int){30}, CO_FOREVER), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(arg.rc, 30);
    CHECK_EQ(vals[30], 30);
    for (int i = 0; i < BIG; i++) {
        CHECK_EQ(all_waiters(ch[i]), 0);
        co_chan_free(ch[i]);
    }
}
/* A select of more than 16 cases that finds no memory for its scratch
 * arrays (test hook): a case that can go still goes, a try with nothing
 * ready times out as any try does, and only a select that would have to
 * wait fails with CO_ENOMEM (the try used to fail with it too). */
static void test_many_cases_nomem(void) {
    co_chan_t *ch[BIG];
    int vals[BIG];
    co_case_t c[BIG];
    for (int i = 0; i < BIG; i++) {
        ch[i] = mk(i % 2);
        vals[i] = -1;
        c[i] = (co_case_t){.ch = ch[i], .op = CO_RECV, .elem = &vals[i]};
    }
    t_fail(CO__FAIL_SELECT_MEM, true);
    CHECK_EQ(co_select(c, BIG, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_select(c, BIG, co_deadline_after(1000000)), CO_ENOMEM);
    CHECK_EQ(co_select(c, BIG, CO_FOREVER), CO_ENOMEM);
    for (int round = 0; round < 20; round++) {
        int k = ((round * 7 + 3) % BIG) | 1; /* odd: a buffered one */
        CHECK_EQ(co_chan_send(ch[k], &k, 0), 0);
        CHECK_EQ(co_select(c, BIG, CO_FOREVER), k);
        CHECK_EQ(vals[k], k);
    }
    t_fail(CO__FAIL_SELECT_MEM, false);
    for (int i = 0; i < BIG; i++) co_chan_free(ch[i]);
}

/* A plain thread blocks in select; a coroutine wakes it. */
static void *thread_select(void *arg) {
    co_chan_t **ch = arg;
    int v = -1;
    co_case_t none = {.ch = ch[2], .op = CO_RECV, .elem = NULL};
    co_case_t c[2] = {{.ch = ch[0], .op = CO_RECV, .elem = &v}, {.ch = ch[1], .op = CO_RECV, .elem = &v}};
    int64_t dl = co_deadline_after(2 * 1000000);
    CHECK_EQ(co_select(c, 2, dl), CO_ETIMEDOUT);
    CHECK(co_now() >= dl);
    CHECK_EQ(co_select(&none, 1, CO_FOREVER), 0); /* the coroutine's "go ahead" */
    CHECK_EQ(co_select(c, 2, CO_FOREVER), 1);
    CHECK_EQ(v, 12);
    return NULL;
}

static void test_thread_select(void) {
    co_chan_t *ch[3] = {mk(0), mk(0), mk(0)};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, thread_select, ch), 0);
    CHECK_EQ(co_chan_send(ch[2], &(int){0}, CO_FOREVER), 0);
    CHECK_EQ(co_chan_send(ch[1], &(int){12}, CO_FOREVER), 0);
    pthread_join(th, NULL);
    CHECK_EQ(all_waiters(ch[0]) + all_waiters(ch[1]), 0);
    co_chan_free(ch[0]);
    co_chan_free(ch[1]);
    co_chan_free(ch[2]);
}

static int run(void *arg) {
    T_RUN(test_errors);
    T_RUN(test_nothing_ready);
    T_RUN(test_ready_cases);
    T_RUN(test_null_channels);
    T_RUN(test_closed);
    T_RUN(test_block_then_send);
    T_RUN(test_block_timeout_and_close);
    T_RUN(test_same_channel_both_ways);
    T_RUN(test_duplicate_channel);
    T_RUN(test_wakers_race);
    T_RUN(test_many_cases);
    T_RUN(test_many_cases_nomem);
    T_RUN(test_thread_select);
    return 0;
}

int main(void) {
    t_begin(60);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
