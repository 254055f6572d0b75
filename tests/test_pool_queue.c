/* The pool's idle-worker queues (ants' worker_stack_test.go and
 * worker_loop_queue_test.go, T17): a LIFO stack and a fixed FIFO ring, both
 * sorted by last_used; insert into a full ring fails; refresh removes exactly
 * the expired prefix (across the ring's wrap-around too); the binary search
 * finds the last expired index. */
#include "t_internal.h"

#include "t.h"

static co__pw_t recs[64];

static co__pw_t *rec(int i, int64_t t) {
    recs[i].last_used = t;
    recs[i].tok.pw_next = NULL;
    return &recs[i];
}

static int list_len(co__pw_t *w) {
    int n = 0;
    for (; w; w = w->tok.pw_next) n++;
    return n;
}

static void test_stack_basics(void) {
    co__wq_t q;
    CHECK_EQ(co__wq_init(&q, false, 0), 0);
    CHECK(co__wq_empty(&q));
    CHECK(co__wq_detach(&q) == NULL);
    for (int i = 0; i < 10; i++) CHECK_EQ(co__wq_insert(&q, rec(i, i)), 0);
    CHECK_EQ(co__wq_len(&q), 10);
    /* LIFO: the newest comes back first */
    CHECK(co__wq_detach(&q) == &recs[9]);
    CHECK(co__wq_detach(&q) == &recs[8]);
    CHECK_EQ(co__wq_len(&q), 8);
    CHECK(co__wq_oldest(&q) == &recs[0]);
    CHECK(co__wq_newest(&q) == &recs[7]);
    /* grows past its initial allocation */
    for (int i = 8; i < 64; i++) CHECK_EQ(co__wq_insert(&q, rec(i, i)), 0);
    CHECK_EQ(co__wq_len(&q), 64);
    co__wq_destroy(&q);
}

static void test_stack_refresh(void) {
    co__wq_t q;
    CHECK_EQ(co__wq_init(&q, false, 0), 0);
    for (int i = 0; i < 20; i++) CHECK_EQ(co__wq_insert(&q, rec(i, 100 + i)), 0);
    int n = -1;
    CHECK(co__wq_refresh(&q, 50, &n) == NULL); /* nothing that old */
    CHECK_EQ(n, 0);
    co__pw_t *dead = co__wq_refresh(&q, 104, &n); /* 100..104 expire */
    CHECK_EQ(n, 5);
    CHECK_EQ(list_len(dead), 5);
    CHECK(dead == &recs[0]);
    CHECK_EQ(co__wq_len(&q), 15);
    /* the newest are kept, in order */
    CHECK(co__wq_oldest(&q) == &recs[5]);
    CHECK(co__wq_newest(&q) == &recs[19]);
    CHECK(co__wq_detach(&q) == &recs[19]);
    dead = co__wq_refresh(&q, 1000, &n); /* everything */
    CHECK_EQ(n, 14);
    CHECK(co__wq_empty(&q));
    co__wq_destroy(&q);
}

static void test_search(void) {
    co__wq_t q;
    CHECK_EQ(co__wq_init(&q, false, 0), 0);
    CHECK_EQ(co__wq_search(&q, 5), -1); /* empty */
    int64_t ts[] = {1, 3, 3, 5, 8, 13};
    for (int i = 0; i < 6; i++) co__wq_insert(&q, rec(i, ts[i]));
    CHECK_EQ(co__wq_search(&q, 0), -1);
    CHECK_EQ(co__wq_search(&q, 1), 0);
    CHECK_EQ(co__wq_search(&q, 2), 0);
    CHECK_EQ(co__wq_search(&q, 3), 2); /* the last of equal timestamps */
    CHECK_EQ(co__wq_search(&q, 12), 4);
    CHECK_EQ(co__wq_search(&q, 13), 5);
    CHECK_EQ(co__wq_search(&q, 99), 5);
    co__wq_destroy(&q);
}

static void test_ring_basics(void) {
    co__wq_t q;
    CHECK_EQ(co__wq_init(&q, true, 0), CO_EINVAL); /* a ring needs a size */
    CHECK_EQ(co__wq_init(&q, true, 5), 0);
    CHECK(co__wq_empty(&q));
    CHECK(co__wq_detach(&q) == NULL);
    for (int i = 0; i < 5; i++) CHECK_EQ(co__wq_insert(&q, rec(i, i)), 0);
    CHECK_EQ(co__wq_len(&q), 5);
    CHECK_EQ(co__wq_insert(&q, rec(5, 5)), CO_EOVERLOAD); /* full */
    /* FIFO: the oldest comes back first */
    CHECK(co__wq_detach(&q) == &recs[0]);
    CHECK(co__wq_detach(&q) == &recs[1]);
    CHECK_EQ(co__wq_len(&q), 3);
    co__wq_destroy(&q);
}

static void test_ring_refresh_wrap(void) {
    co__wq_t q;
    CHECK_EQ(co__wq_init(&q, true, 8), 0);
    for (int i = 0; i < 8; i++) co__wq_insert(&q, rec(i, i));
    for (int i = 0; i < 6; i++) co__wq_detach(&q); /* head moves to slot 6 */
    for (int i = 8; i < 14; i++) CHECK_EQ(co__wq_insert(&q, rec(i, i)), 0); /* wraps */
    CHECK_EQ(co__wq_len(&q), 8);
    CHECK_EQ(co__wq_insert(&q, rec(14, 14)), CO_EOVERLOAD);
    CHECK_EQ(co__wq_search(&q, 9), 3); /* 6,7,8,9 */
    int n;
    co__pw_t *dead = co__wq_refresh(&q, 9, &n); /* crosses the wrap */
    CHECK_EQ(n, 4);
    CHECK_EQ(list_len(dead), 4);
    CHECK(dead == &recs[6]);
    CHECK(dead->tok.pw_next == &recs[7]);
    CHECK(dead->tok.pw_next->tok.pw_next == &recs[8]);
    CHECK_EQ(co__wq_len(&q), 4);
    CHECK(co__wq_oldest(&q) == &recs[10]);
    CHECK(co__wq_newest(&q) == &recs[13]);
    /* refilling after a refresh works and keeps the order */
    for (int i = 14; i < 18; i++) CHECK_EQ(co__wq_insert(&q, rec(i, i)), 0);
    CHECK_EQ(co__wq_insert(&q, rec(18, 18)), CO_EOVERLOAD);
    dead = co__wq_reset(&q, &n);
    CHECK_EQ(n, 8);
    CHECK(dead == &recs[10]);
    CHECK(co__wq_empty(&q));
    co__wq_destroy(&q);
}

static void test_take_oldest(void) {
    co__wq_t q;
    CHECK_EQ(co__wq_init(&q, false, 0), 0);
    for (int i = 0; i < 6; i++) co__wq_insert(&q, rec(i, 0)); /* equal timestamps */
    co__pw_t *d = co__wq_take_oldest(&q, 2);
    CHECK_EQ(list_len(d), 2);
    CHECK(d == &recs[0]);
    CHECK_EQ(co__wq_len(&q), 4);
    CHECK(co__wq_take_oldest(&q, 0) == NULL);
    co__wq_destroy(&q);
}

int main(void) {
    t_begin(30);
    T_RUN(test_stack_basics);
    T_RUN(test_stack_refresh);
    T_RUN(test_search);
    T_RUN(test_ring_basics);
    T_RUN(test_ring_refresh_wrap);
    T_RUN(test_take_oldest);
    return t_end();
}
