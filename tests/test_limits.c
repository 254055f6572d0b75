/* Sizes that multiply into an allocation, at their edges: each is
 * answered with CO_EINVAL or CO_ENOMEM, never with an allocation that
 * grows until the OOM killer comes, nor an int that overflows.
 *  - co_multipool_new's n: at most 65,536 sub-pools (n = INT_MAX made
 *    sub-pools until the OOM killer);
 *  - a pool's capacity with prealloc (its ring of `capacity` slots) and
 *    the ring's arithmetic near INT_MAX (head + i overflowed an int);
 *  - an unlimited pool's worker count, which stops at INT32_MAX instead
 *    of wrapping;
 *  - a channel's capacity times its element size, and a select's cases. */
#include <colony.h>
#include <limits.h>
#include <stdint.h>

#include "t.h"
#include "t_internal.h"

#define MS 1000000LL

static void nop(void *arg) { (void)arg; }

static void multipool_size(void) {
    co_multipool_t *mp = (co_multipool_t *)1;
    CHECK_EQ(co_multipool_new(&mp, 0, 1, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    CHECK(mp == NULL);
    CHECK_EQ(co_multipool_new(&mp, -1, 1, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    int64_t t0 = co_now();
    mp = (co_multipool_t *)1;
    CHECK_EQ(co_multipool_new(&mp, INT_MAX, 1, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    CHECK(mp == NULL);
    CHECK_EQ(co_multipool_new(&mp, 65537, 1, CO_LB_LEAST_TASKS, NULL), CO_EINVAL);
    CHECK(mp == NULL);
    CHECK_EQ(co_multipool_new_func(&mp, INT_MAX, 1, nop, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_new_func(&mp, 65537, 1, nop, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    CHECK(mp == NULL);
    CHECK(co_now() - t0 < 1000 * MS); /* refused before anything is made */
    /* The largest: 65,536 sub-pools (about 50 ms to make here). */
    CHECK_EQ(co_multipool_new(&mp, 65536, 1, CO_LB_ROUND_ROBIN, NULL), 0);
    if (mp) {
        CHECK_EQ(co_multipool_cap(mp), 65536);
        CHECK_EQ(co_multipool_submit(mp, nop, NULL), 0);
        CHECK_EQ(co_multipool_release_timeout(mp, 10000 * MS), 0);
        co_multipool_destroy(mp);
    }
}

/* Prealloc rings of INT_MAX slots: 16 GiB of address space each, taken
 * lazily by calloc, or CO_ENOMEM where the system will not lend it. Not
 * under the sanitizers, whose allocators may abort on such sizes. */
static void prealloc_huge(void) {
    if (t_sanitized()) {
        fprintf(stderr, "   skipped under a sanitizer\n");
        return;
    }
    co_pool_opts_t o = {.prealloc = true};
    co_pool_t *p = NULL;
    int rc = co_pool_new(&p, INT_MAX, &o);
    CHECK(rc == 0 || rc == CO_ENOMEM);
    if (rc == 0) {
        CHECK_EQ(co_pool_cap(p), INT_MAX);
        for (int i = 0; i < 3; i++) CHECK_EQ(co_pool_submit(p, nop, NULL), 0);
        CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
        co_pool_destroy(p);
    } else {
        CHECK(p == NULL);
    }
    co_multipool_t *mp = NULL;
    rc = co_multipool_new(&mp, 4, INT_MAX, CO_LB_ROUND_ROBIN, &o);
    CHECK(rc == 0 || rc == CO_ENOMEM);
    if (rc == 0) {
        CHECK_EQ(co_multipool_cap(mp), INT_MAX); /* the sum, clamped */
        CHECK_EQ(co_multipool_submit(mp, nop, NULL), 0);
        CHECK_EQ(co_multipool_release_timeout(mp, 10000 * MS), 0);
        co_multipool_destroy(mp);
    }
}

/* The ring's index arithmetic with head near INT_MAX: (head + i) % cap
 * overflowed an int (undefined; in practice a negative index). */
static void ring_wraps_at_int_max(void) {
    if (t_sanitized()) {
        fprintf(stderr, "   skipped under a sanitizer\n");
        return;
    }
    co__wq_t q;
    if (co__wq_init(&q, true, INT_MAX) != 0) {
        fprintf(stderr, "   skipped: no 16 GiB of address space for the ring\n");
        return;
    }
    static co__pw_t recs[5];
    q.head = INT_MAX - 2; /* as after INT_MAX - 2 detaches */
    for (int i = 0; i < 5; i++) {
        recs[i].last_used = i;
        CHECK_EQ(co__wq_insert(&q, &recs[i]), 0);
    }
    CHECK_EQ(co__wq_len(&q), 5);
    for (int i = 0; i < 5; i++) CHECK(co__wq_at(&q, i) == &recs[i]);
    CHECK(co__wq_oldest(&q) == &recs[0]);
    CHECK(co__wq_newest(&q) == &recs[4]);
    CHECK_EQ(co__wq_search(&q, 2), 2);
    CHECK(co__wq_detach(&q) == &recs[0]); /* FIFO */
    CHECK_EQ(q.head, INT_MAX - 1);
    int n = 0;
    co__pw_t *old = co__wq_refresh(&q, 2, &n); /* recs 1 and 2, across the end */
    CHECK_EQ(n, 2);
    CHECK(old == &recs[1] && old->tok.pw_next == &recs[2]);
    CHECK_EQ(q.head, 1);
    CHECK(co__wq_peek(&q) == &recs[3]);
    co__wq_destroy(&q);
}

/* An unlimited pool is full at INT32_MAX workers: `running` used to wrap
 * to INT_MIN and the submit went on. The count is set by hand (that many
 * workers would take 128 GiB of records). */
static co_waitgroup_t gate = CO_WAITGROUP_INIT;
static void held(void *arg) {
    (void)arg;
    co_waitgroup_wait(&gate);
}
static void unlimited_worker_count(void) {
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, -1, NULL), 0);
    __atomic_store_n(&p->running, INT32_MAX - 1, __ATOMIC_RELAXED); /* no worker yet */
    co_waitgroup_add(&gate, 1);
    CHECK_EQ(co_pool_submit(p, held, NULL), 0); /* worker number INT32_MAX */
    CHECK_EQ(co_pool_running(p), INT32_MAX);
    CHECK_EQ(co_pool_submit_until(p, nop, NULL, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    CHECK_EQ(co_pool_running(p), INT32_MAX);
    co_waitgroup_done(&gate);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
    /* The worker went idle: it takes the next task. */
    CHECK_EQ(co_pool_submit_until(p, nop, NULL, co_deadline_after(10000 * MS)), 0);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
    __atomic_store_n(&p->running, 1, __ATOMIC_RELAXED); /* the one real worker */
    co_pool_destroy(p);
}

/* A channel's buffer is cap * elem_size bytes: a product past SIZE_MAX is
 * CO_ENOMEM; with no element there is no buffer, whatever the capacity
 * (Go's make(chan struct{}, maxInt)). */
static void chan_sizes(void) {
    co_chan_t *ch = (co_chan_t *)1;
    CHECK_EQ(co_chan_new(&ch, 2, SIZE_MAX / 2 + 1), CO_ENOMEM);
    CHECK(ch == NULL);
    CHECK_EQ(co_chan_new(&ch, SIZE_MAX, SIZE_MAX), CO_ENOMEM);
    CHECK_EQ(co_chan_new(&ch, 0, SIZE_MAX), 0);
    if (ch) {
        CHECK_EQ(co_chan_cap(ch), SIZE_MAX);
        for (int i = 0; i < 3; i++) CHECK_EQ(co_chan_send(ch, NULL, 0), 0);
        CHECK_EQ(co_chan_len(ch), 3);
        CHECK_EQ(co_chan_recv(ch, NULL, 0), 0);
        co_chan_free(ch);
    }
}

/* A select's scratch space is a few dozen bytes per case, allocated for
 * more than a handful: bounded by the caller's own array of cases. */
static void select_many_cases(void) {
    CHECK_EQ(co_select((co_case_t[1]){{0}}, 0, 0), CO_EINVAL);
    CHECK_EQ(co_select((co_case_t[1]){{0}}, INT_MIN, 0), CO_EINVAL);
    enum { N = 100000 };
    co_case_t *cs = calloc(N, sizeof *cs);
    co_chan_t *quiet, *ready;
    CHECK(cs != NULL);
    CHECK_EQ(co_chan_new(&quiet, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&ready, sizeof(int), 1), 0);
    int v = 42, got = 0;
    CHECK_EQ(co_chan_send(ready, &v, 0), 0);
    if (cs) {
        for (int i = 0; i < N; i++) cs[i] = (co_case_t){.ch = quiet, .op = CO_RECV, .elem = &got};
        cs[N - 1].ch = ready;
        CHECK_EQ(co_select(cs, N, co_deadline_after(10000 * MS)), N - 1);
        CHECK_EQ(got, 42);
        CHECK_EQ(co_select(cs, N, 0), CO_ETIMEDOUT); /* none ready: a try */
    }
    free(cs);
    co_chan_free(quiet);
    co_chan_free(ready);
}

int main(void) {
    t_begin(110);
    T_RUN(multipool_size);
    T_RUN(prealloc_huge);
    T_RUN(ring_wraps_at_int_max);
    T_RUN(unlimited_worker_count);
    T_RUN(chan_sizes);
    T_RUN(select_many_cases);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
