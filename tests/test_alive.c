/* co_alive and co_dump_alive: what keeps co_shutdown answering CO_EBUSY,
 * counted by kind, and gone once it is released. */
// ctest-timeout: 60
#include "t.h"

#include <stdlib.h>
#include <string.h>

#define NRECV 7
#define NSLEEP 3

static co_chan_t *ch;
static co_chan_t *sleepers_go;
static int parked; /* atomic: coroutines on their way to park */

static void receiver(void *a) {
    (void)a;
    __atomic_add_fetch(&parked, 1, __ATOMIC_RELAXED);
    int v;
    (void)co_chan_recv(ch, &v, CO_FOREVER);
}

static void sleeper(void *a) {
    (void)a;
    __atomic_add_fetch(&parked, 1, __ATOMIC_RELAXED);
    /* a long sleep, cut short by the close of sleepers_go */
    int v;
    (void)co_chan_recv(sleepers_go, &v, co_deadline_after(3600 * CO_SECOND));
}

static void task(void *a) { (void)a; }

static char *dump_alive(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    co_dump_alive(f);
    fclose(f);
    return buf;
}

/* Every count is zero with the runtime down (before the first start). */
static void test_down_is_empty(void) {
    co_alive_t a;
    memset(&a, 0x55, sizeof a);
    CHECK_EQ(co_alive(&a), 0);
    CHECK_EQ(a.coroutines, 0);
    CHECK_EQ(a.pools, 0);
    CHECK_EQ(a.timers, 0);
    CHECK_EQ(co_alive(NULL), CO_EINVAL);
}

static void test_busy_says_what(void) {
    CHECK_EQ(co_init(NULL), 0);
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&sleepers_go, sizeof(int), 0), 0);
    for (int i = 0; i < NRECV; i++) CHECK_EQ(co_go(receiver, NULL), 0);
    for (int i = 0; i < NSLEEP; i++) CHECK_EQ(co_go(sleeper, NULL), 0);
    co_pool_t *p1, *p2;
    CHECK_EQ(co_pool_new(&p1, 4, NULL), 0);
    CHECK_EQ(co_pool_new(&p2, 8, NULL), 0);
    CHECK_EQ(co_pool_submit(p1, task, NULL), 0);
    co_ticker_t *tk;
    CHECK_EQ(co_ticker_new(&tk, CO_HOUR), 0);
    co_timer_t *tm;
    CHECK_EQ(co_timer_new(&tm, CO_HOUR), 0);
    while (__atomic_load_n(&parked, __ATOMIC_RELAXED) < NRECV + NSLEEP) usleep(1000);

    CHECK_EQ(co_shutdown(), CO_EBUSY);

    /* the coroutines settle into their waits: at most a few tries */
    co_alive_t a = {0};
    for (int i = 0; i < 2000; i++) {
        CHECK_EQ(co_alive(&a), 0);
        if (a.waiting == NRECV + NSLEEP && a.coroutines == NRECV + NSLEEP) break;
        usleep(1000);
    }
    CHECK_EQ(a.coroutines, NRECV + NSLEEP);
    CHECK_EQ(a.waiting, NRECV + NSLEEP);
    CHECK_EQ(a.runnable + a.running, 0);
    CHECK_EQ(a.pools, 2);
    CHECK_EQ(a.tickers, 1);
    CHECK_EQ(a.timers, 1);
    CHECK_EQ(a.plain_parked, 0);
    CHECK_EQ(a.blocking, 0);

    char *d = dump_alive();
    CHECK(d != NULL);
    if (d) {
        if (!strstr(d, "colony: alive: 10 coroutines (0 runnable, 0 running, 10 waiting), 2 pools, "
                       "1 timer, 1 ticker,"))
            fprintf(stderr, "dump_alive: %s", d);
        CHECK(strstr(d, "colony: alive: 10 coroutines (0 runnable, 0 running, 10 waiting), 2 pools, "
                        "1 timer, 1 ticker,") != NULL);
        /* 7 in a channel receive and 3 whose receive has a deadline: Go's
         * names for both are "chan receive" */
        CHECK(strstr(d, "  10 waiting: chan receive\n") != NULL);
    }
    free(d);

    /* give everything back: the runtime then stops */
    co_chan_close(ch);
    co_chan_close(sleepers_go);
    co_pool_release(p1);
    co_pool_release(p2);
    CHECK_EQ(co_alive(&a), 0);
    CHECK_EQ(a.pools, 2); /* released, not yet destroyed: they hold on */
    co_pool_destroy(p1);
    co_pool_destroy(p2);
    co_ticker_stop(tk);
    co_timer_free(tm);
    int rc = T_SHUTDOWN();
    CHECK_EQ(rc, 0);
    if (rc != 0) co_dump_alive(stderr);
    CHECK_EQ(co_alive(&a), 0);
    CHECK_EQ(a.coroutines + a.pools + a.timers + a.tickers + a.caches + a.plain_io, 0);
    co_chan_free(ch);
    co_chan_free(sleepers_go);
}

int main(void) {
    t_begin(50);
    T_RUN(test_down_is_empty);
    T_RUN(test_busy_says_what);
    return t_end();
}
