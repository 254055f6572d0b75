/* Multipool (ants T15): constructor errors, stats sums and per-index,
 * release_timeout / reboot, both load-balancing strategies, the round-robin
 * retry on the least-loaded sub-pool, function multipools, every error. */
#include <limits.h>

#include "test_pool_util.h"

static gate_t gate;
static atomic_long ran;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static void gated_task(void *arg) {
    gate_wait(&gate);
    atomic_fetch_add(&ran, 1);
}
static void noop_task(void *arg) { atomic_fetch_add(&ran, 1); }
static atomic_long sum;
static void add_task(void *arg) {
    atomic_fetch_add(&sum, (long)(intptr_t)arg);
    co_waitgroup_done(&wg);
}

static void errors(void) {
    co_multipool_t *mp = (co_multipool_t *)1;
    CHECK_EQ(co_multipool_new(&mp, -1, 5, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL); /* size */
    CHECK(mp == NULL);
    CHECK_EQ(co_multipool_new(&mp, 0, 5, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_new(&mp, 10, 5, 8, NULL), CO_EINVAL); /* strategy */
    CHECK_EQ(co_multipool_new(&mp, 10, 5, 0, NULL), CO_EINVAL);
    co_pool_opts_t neg = {.expiry_ns = -1};
    CHECK_EQ(co_multipool_new(&mp, 10, 5, CO_LB_LEAST_TASKS, &neg), CO_EINVAL); /* propagated */
    CHECK_EQ(co_multipool_new(NULL, 10, 5, CO_LB_LEAST_TASKS, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_new_func(&mp, 10, 5, NULL, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_new_func(&mp, -1, 5, noop_task, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_new_func(&mp, 10, 5, noop_task, 3, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_new_func(&mp, 10, 5, noop_task, CO_LB_ROUND_ROBIN, &neg), CO_EINVAL);
    CHECK_EQ(co_multipool_new_func(NULL, 10, 5, noop_task, CO_LB_ROUND_ROBIN, NULL), CO_EINVAL);
    co_pool_opts_t pre = {.prealloc = true};
    CHECK_EQ(co_multipool_new(&mp, 2, -1, CO_LB_ROUND_ROBIN, &pre), CO_EINVAL);

    /* NULL handles */
    CHECK_EQ(co_multipool_submit(NULL, noop_task, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_invoke(NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_running(NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_available(NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_waiting(NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_cap(NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_running_by_index(NULL, 0), CO_EINVAL);
    CHECK_EQ(co_multipool_available_by_index(NULL, 0), CO_EINVAL);
    CHECK_EQ(co_multipool_waiting_by_index(NULL, 0), CO_EINVAL);
    CHECK(co_multipool_is_closed(NULL));
    CHECK_EQ(co_multipool_release_timeout(NULL, 0), CO_EINVAL);
    co_multipool_destroy(NULL); /* a no-op; tune/reboot abort (test_null) */

    /* wrong kind of task */
    co_multipool_t *fmp;
    CHECK_EQ(co_multipool_new(&mp, 2, 2, CO_LB_ROUND_ROBIN, NULL), 0);
    CHECK_EQ(co_multipool_new_func(&fmp, 2, 2, noop_task, CO_LB_ROUND_ROBIN, NULL), 0);
    CHECK_EQ(co_multipool_submit(mp, NULL, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_invoke(mp, NULL), CO_EINVAL);
    CHECK_EQ(co_multipool_submit(fmp, noop_task, NULL), CO_EINVAL);
    co_multipool_destroy(mp);
    co_multipool_destroy(fmp);
}

/* T15 proper, for both strategies and both kinds. */
static void t15_multipool(void) {
    for (int kind = 0; kind < 4; kind++) {
        int lb = (kind & 1) ? CO_LB_LEAST_TASKS : CO_LB_ROUND_ROBIN;
        bool func = kind >= 2;
        co_multipool_t *mp;
        gate_init(&gate);
        atomic_store(&ran, 0);
        CHECK_EQ(func ? co_multipool_new_func(&mp, 10, 5, gated_task, lb, NULL)
                      : co_multipool_new(&mp, 10, 5, lb, NULL),
                 0);
#define SUBMIT() (func ? co_multipool_invoke(mp, NULL) : co_multipool_submit(mp, gated_task, NULL))
        for (int round = 0; round < 2; round++) {
            for (int i = 0; i < 50; i++) CHECK_EQ(SUBMIT(), 0);
            CHECK_EQ(co_multipool_running(mp), 50);
            CHECK_EQ(co_multipool_available(mp), 0);
            CHECK_EQ(co_multipool_cap(mp), 50);
            CHECK_EQ(co_multipool_waiting(mp), 0);
            for (int i = 0; i < 10; i++) {
                CHECK_EQ(co_multipool_running_by_index(mp, i), 5);
                CHECK_EQ(co_multipool_available_by_index(mp, i), 0);
                CHECK_EQ(co_multipool_waiting_by_index(mp, i), 0);
            }
            CHECK_EQ(co_multipool_running_by_index(mp, -1), CO_EINVAL);
            CHECK_EQ(co_multipool_running_by_index(mp, 10), CO_EINVAL);
            CHECK_EQ(co_multipool_available_by_index(mp, 11), CO_EINVAL);
            CHECK_EQ(co_multipool_waiting_by_index(mp, -1), CO_EINVAL);
            gate_open(&gate);
            CHECK(!co_multipool_is_closed(mp));
            CHECK_EQ(co_multipool_release_timeout(mp, 2000 * MS), 0);
            CHECK(co_multipool_is_closed(mp));
            CHECK_EQ(co_multipool_running(mp), 0);
            CHECK_EQ(co_multipool_release_timeout(mp, 2000 * MS), CO_ECLOSED);
            CHECK_EQ(SUBMIT(), CO_ECLOSED);
            co_multipool_reboot(mp);
            CHECK(!co_multipool_is_closed(mp));
            co_multipool_reboot(mp); /* open: no-op */
            gate_init(&gate);
        }
        gate_open(&gate);
        CHECK_EQ(atomic_load(&ran), 100);
#undef SUBMIT
        co_multipool_destroy(mp);
    }
}

/* Round-robin: a full pick is retried once on the least-loaded sub-pool. */
static void rr_retry_on_overload(void) {
    co_pool_opts_t o = {.nonblocking = true, .expiry_ns = 20 * MS};
    co_multipool_t *mp;
    gate_init(&gate);
    CHECK_EQ(co_multipool_new(&mp, 2, 1, CO_LB_ROUND_ROBIN, &o), 0);
    CHECK_EQ(co_multipool_submit(mp, gated_task, NULL), 0); /* -> 0, stays busy */
    CHECK_EQ(co_multipool_submit(mp, noop_task, NULL), 0);  /* -> 1, finishes */
    CHECK(WAIT_FOR(co_multipool_running_by_index(mp, 1) == 0)); /* purged */
    CHECK_EQ(co_multipool_submit(mp, gated_task, NULL), 0); /* pick 0 is full: retried on 1 */
    CHECK_EQ(co_multipool_running_by_index(mp, 0), 1);
    CHECK_EQ(co_multipool_running_by_index(mp, 1), 1);
    CHECK_EQ(co_multipool_submit(mp, gated_task, NULL), CO_EOVERLOAD); /* both full */
    gate_open(&gate);
    CHECK_EQ(co_multipool_release_timeout(mp, 2000 * MS), 0);
    co_multipool_destroy(mp);
}

/* Least-tasks always picks the sub-pool with the fewest running workers. */
static void least_tasks(void) {
    co_multipool_t *mp;
    gate_init(&gate);
    CHECK_EQ(co_multipool_new(&mp, 3, -1, CO_LB_LEAST_TASKS, NULL), 0);
    CHECK_EQ(co_multipool_cap(mp), -1);
    CHECK_EQ(co_multipool_available(mp), -1);
    for (int i = 0; i < 7; i++) CHECK_EQ(co_multipool_submit(mp, gated_task, NULL), 0);
    CHECK_EQ(co_multipool_running_by_index(mp, 0), 3);
    CHECK_EQ(co_multipool_running_by_index(mp, 1), 2);
    CHECK_EQ(co_multipool_running_by_index(mp, 2), 2);
    gate_open(&gate);
    CHECK_EQ(co_multipool_release_timeout(mp, 2000 * MS), 0);
    co_multipool_destroy(mp);
}

/* Sub-pools of INT_MAX workers each (ants' default size): the sums are
 * clamped to INT_MAX. They used to overflow to -2 (UBSan: signed
 * overflow), which reads as neither a size nor "unlimited". */
static void huge_caps(void) {
    co_multipool_t *mp;
    gate_init(&gate);
    CHECK_EQ(co_multipool_new(&mp, 2, INT_MAX, CO_LB_ROUND_ROBIN, NULL), 0);
    CHECK_EQ(co_multipool_cap(mp), INT_MAX);
    CHECK_EQ(co_multipool_available(mp), INT_MAX);
    CHECK_EQ(co_multipool_submit(mp, gated_task, NULL), 0);
    CHECK_EQ(co_multipool_available(mp), INT_MAX); /* 2 * INT_MAX - 1 still does not fit */
    CHECK_EQ(co_multipool_running(mp), 1);
    gate_open(&gate);
    CHECK_EQ(co_multipool_release_timeout(mp, 10000 * MS), 0);
    co_multipool_destroy(mp);
}

/* Tune sets every sub-pool; release_timeout reports a timeout. */
static void tune_and_timeout(void) {
    co_multipool_t *mp;
    gate_init(&gate);
    CHECK_EQ(co_multipool_new(&mp, 4, 2, CO_LB_ROUND_ROBIN, NULL), 0);
    co_multipool_tune(mp, 3);
    CHECK_EQ(co_multipool_cap(mp), 12);
    CHECK_EQ(co_multipool_available_by_index(mp, 2), 3);
    CHECK_EQ(co_multipool_submit(mp, gated_task, NULL), 0);
    CHECK_EQ(co_multipool_release_timeout(mp, 20 * MS), CO_ETIMEDOUT);
    gate_open(&gate);
    co_multipool_destroy(mp);
}

/* T16 on a function multipool (the seed's demo): the sum of 0..999. */
static void sum_least_tasks(void) {
    co_multipool_t *mp;
    CHECK_EQ(co_multipool_new_func(&mp, 10, 100, add_task, CO_LB_LEAST_TASKS, NULL), 0);
    atomic_store(&sum, 0);
    co_waitgroup_add(&wg, 1000);
    for (int i = 0; i < 1000; i++) CHECK_EQ(co_multipool_invoke(mp, (void *)(intptr_t)i), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(atomic_load(&sum), 499500);
    CHECK_EQ(co_multipool_release_timeout(mp, 5000 * MS), 0);
    co_multipool_destroy(mp);
}

/* Release and reboot racing from two threads leave a consistent state. */
static co_multipool_t *race_mp;
static void *rebooter(void *arg) {
    for (int i = 0; i < 200; i++) co_multipool_reboot(race_mp);
    return NULL;
}
static void release_reboot_race(void) {
    CHECK_EQ(co_multipool_new(&race_mp, 3, 2, CO_LB_ROUND_ROBIN, NULL), 0);
    pthread_t th;
    pthread_create(&th, NULL, rebooter, NULL);
    for (int i = 0; i < 200; i++) {
        int rc = co_multipool_release_timeout(race_mp, 10000 * MS); /* not a timing test */
        CHECK(rc == 0 || rc == CO_ECLOSED);
        co_multipool_submit(race_mp, noop_task, NULL);
    }
    pthread_join(th, NULL);
    co_multipool_reboot(race_mp);
    CHECK_EQ(co_multipool_submit(race_mp, noop_task, NULL), 0);
    co_multipool_destroy(race_mp);
}

int main(void) {
    t_begin(110);
    T_RUN_SEL(errors);
    T_RUN_SEL(t15_multipool);
    T_RUN_SEL(rr_retry_on_overload);
    T_RUN_SEL(least_tasks);
    T_RUN_SEL(tune_and_timeout);
    T_RUN_SEL(huge_caps);
    T_RUN_SEL(sum_least_tasks);
    T_RUN_SEL(release_reboot_race);
    return t_end();
}
