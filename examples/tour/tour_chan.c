/* Tour, part 2: channels, select with a deadline, a ticker, a mutex, a
 * context that cancels a worker, and an errgroup. */
#include "tour.h"

#include <stdio.h>

#define MS (1000 * 1000LL) /* nanoseconds per millisecond */

/* ---- a producer and a consumer on an unbuffered channel ---------------- */

static void producer(void *arg) {
    co_chan_t *ch = arg;
    for (int i = 1; i <= 5; i++) co_chan_send(ch, &i, CO_FOREVER); /* waits for the reader */
    co_chan_close(ch);                                              /* "no more values" */
}

/* ---- select with a deadline ---------------------------------------------- */

static void slow_answer(void *arg) {
    co_chan_t *ch = arg;
    co_sleep(30 * MS);
    int answer = 42;
    co_chan_send(ch, &answer, CO_FOREVER);
}

/* ---- a mutex-protected counter ----------------------------------------- */

static co_mutex_t mu = CO_MUTEX_INIT;
static long counter;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static void add_many(void *arg) {
    for (int i = 0; i < 10000; i++) {
        co_mutex_lock(&mu);
        counter++;
        co_mutex_unlock(&mu);
    }
    co_waitgroup_done(&wg);
}

/* ---- a worker that stops when its context is canceled ------------------- */

static void worker(void *arg) {
    co_ctx_t *ctx = arg;
    co_ticker_t *t;
    co_ticker_new(&t, 5 * MS);
    int64_t tick;
    int beats = 0;
    co_case_t cases[2] = {
        {.ch = co_ticker_chan(t), .op = CO_RECV, .elem = &tick},
        {.ch = co_ctx_done(ctx), .op = CO_RECV, .elem = NULL},
    };
    while (co_select(cases, 2, CO_FOREVER) == 0) beats++; /* case 1: done was closed */
    printf("  worker: stopped after %d heartbeats (%s)\n", beats, co_strerror(co_ctx_err(ctx)));
    co_ticker_stop(t);
    co_waitgroup_done(&wg);
}

/* ---- an errgroup: the first error cancels the others -------------------- */

typedef struct {
    co_group_t *g;
    int id;
} task_t;

static int task(void *arg) {
    task_t *t = arg;
    if (t->id == 2) {
        co_sleep(10 * MS);
        return CO_EINVAL; /* task 2 fails ... */
    }
    /* ... and the others, waiting for 1 s, are canceled through the group's context */
    int rc = co_chan_recv(co_ctx_done(co_group_ctx(t->g)), NULL, co_deadline_after(1000 * MS));
    printf("  task %d: %s\n", t->id, rc == CO_ECLOSED ? "canceled" : "finished");
    return 0;
}

void tour_chan(void) {
    printf("2. Channels, select, tickers, sync, context\n");

    co_chan_t *ch;
    co_chan_new(&ch, sizeof(int), 0);
    co_go(producer, ch);
    printf("  received from an unbuffered channel:");
    int v;
    while (co_chan_recv(ch, &v, CO_FOREVER) == 0) printf(" %d", v); /* CO_ECLOSED ends it */
    printf(" (then closed)\n");
    co_chan_free(ch);

    co_chan_t *answer, *never;
    co_chan_new(&answer, sizeof(int), 1);
    co_chan_new(&never, sizeof(int), 0);
    co_go(slow_answer, answer);
    co_case_t cases[2] = {{.ch = answer, .op = CO_RECV, .elem = &v},
                          {.ch = never, .op = CO_RECV, .elem = &v}};
    int rc = co_select(cases, 2, co_deadline_after(10 * MS));
    printf("  select with a 10 ms deadline: %s\n", rc == CO_ETIMEDOUT ? "timed out" : "fired");
    rc = co_select(cases, 2, co_deadline_after(1000 * MS));
    printf("  select with a 1 s deadline: case %d fired, the answer is %d\n", rc, v);
    rc = co_select(cases, 2, 0);
    printf("  select with a past deadline is Go's default: %s\n",
           rc == CO_ETIMEDOUT ? "nothing ready, returns at once" : "fired");
    co_chan_free(answer);
    co_chan_free(never);

    co_ticker_t *t;
    co_ticker_new(&t, 10 * MS);
    int64_t start = co_now(), tick;
    printf("  a 10 ms ticker:");
    for (int i = 0; i < 3; i++) {
        co_chan_recv(co_ticker_chan(t), &tick, CO_FOREVER);
        printf(" +%lld ms", (long long)((tick - start) / MS));
    }
    printf("\n");
    co_ticker_stop(t);

    co_waitgroup_add(&wg, 4);
    for (int i = 0; i < 4; i++) co_go(add_many, NULL);
    co_waitgroup_wait(&wg);
    printf("  4 coroutines x 10000 increments under a mutex: %ld\n", counter);

    co_ctx_t *ctx;
    co_ctx_with_cancel(&ctx, co_ctx_background());
    co_waitgroup_add(&wg, 1);
    co_go(worker, ctx);
    co_sleep(30 * MS);
    co_ctx_cancel(ctx); /* closes ctx's done channel: the worker's select wakes */
    co_waitgroup_wait(&wg);
    co_ctx_free(ctx);

    co_group_t *g;
    co_group_new(&g, NULL);
    task_t tasks[3];
    for (int i = 0; i < 3; i++) {
        tasks[i] = (task_t){g, i + 1};
        co_group_go(g, task, &tasks[i]);
    }
    rc = co_group_wait(g);
    printf("  errgroup: wait returned the first error: %s\n\n", co_strerror(rc));
    co_group_free(g);
}
