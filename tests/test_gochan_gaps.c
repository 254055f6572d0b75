/* Go's sync.RWMutex TryLock/TryRLock and Context.Deadline, as colony has
 * them: states, bad input, and a stress of try-lockers against lockers
 * checking mutual exclusion. */
#include "t.h"

#include <colony.h>
#include <pthread.h>

/* ---- RWMutex TryLock / TryRLock ------------------------------------------ */

static void test_rw_try_states(void) {
    co_rwmutex_t rw = CO_RWMUTEX_INIT;
    CHECK_EQ(co_rwmutex_trylock(NULL), CO_EINVAL);
    CHECK_EQ(co_rwmutex_tryrlock(NULL), CO_EINVAL);
    /* free: both succeed */
    CHECK_EQ(co_rwmutex_trylock(&rw), 0);
    CHECK_EQ(co_rwmutex_trylock(&rw), CO_EBUSY);  /* writer held */
    CHECK_EQ(co_rwmutex_tryrlock(&rw), CO_EBUSY); /* writer held */
    co_rwmutex_unlock(&rw);
    CHECK_EQ(co_rwmutex_tryrlock(&rw), 0);
    CHECK_EQ(co_rwmutex_tryrlock(&rw), 0);        /* readers share */
    CHECK_EQ(co_rwmutex_trylock(&rw), CO_EBUSY);  /* readers hold it */
    co_rwmutex_runlock(&rw);
    CHECK_EQ(co_rwmutex_trylock(&rw), CO_EBUSY);  /* one reader left */
    co_rwmutex_runlock(&rw);
    /* a failed trylock left nothing behind: lock and rlock still work */
    co_rwmutex_lock(&rw);
    co_rwmutex_unlock(&rw);
    co_rwmutex_rlock(&rw);
    co_rwmutex_runlock(&rw);
    CHECK_EQ(co_rwmutex_trylock(&rw), 0);
    co_rwmutex_unlock(&rw);
}

/* A writer waiting for a reader keeps new try-readers out, as Go's. */
static co_rwmutex_t pend_rw;
static int pend_locked;
static void pend_writer(void *arg) {
    co_waitgroup_t *wg = arg;
    co_rwmutex_lock(&pend_rw);
    __atomic_store_n(&pend_locked, 1, __ATOMIC_SEQ_CST);
    co_rwmutex_unlock(&pend_rw);
    co_waitgroup_done(wg);
}
static void test_rw_try_pending_writer(void) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_rwmutex_rlock(&pend_rw);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(pend_writer, &wg), 0);
    /* wait until the writer announced itself (a read lock is then refused) */
    int tries = 0;
    while (co_rwmutex_tryrlock(&pend_rw) == 0) {
        co_rwmutex_runlock(&pend_rw);
        co_sleep(100 * 1000);
        tries++;
    }
    CHECK_EQ(__atomic_load_n(&pend_locked, __ATOMIC_SEQ_CST), 0);
    CHECK_EQ(co_rwmutex_trylock(&pend_rw), CO_EBUSY);
    co_rwmutex_runlock(&pend_rw);
    co_waitgroup_wait(&wg);
    CHECK_EQ(__atomic_load_n(&pend_locked, __ATOMIC_SEQ_CST), 1);
    CHECK_EQ(co_rwmutex_trylock(&pend_rw), 0);
    co_rwmutex_unlock(&pend_rw);
}

/* Stress: coroutines and threads mixing lock/rlock/trylock/tryrlock; a
 * writer must be alone, readers only with readers. */
static co_rwmutex_t st_rw;
static int st_readers, st_writers, st_violations;
static long st_try_ok[2];
#define ST_ITERS 20000

static void st_read_section(void) {
    __atomic_add_fetch(&st_readers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&st_writers, __ATOMIC_SEQ_CST) != 0)
        __atomic_add_fetch(&st_violations, 1, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&st_readers, 1, __ATOMIC_SEQ_CST);
}
static void st_write_section(void) {
    if (__atomic_add_fetch(&st_writers, 1, __ATOMIC_SEQ_CST) != 1 ||
        __atomic_load_n(&st_readers, __ATOMIC_SEQ_CST) != 0)
        __atomic_add_fetch(&st_violations, 1, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&st_writers, 1, __ATOMIC_SEQ_CST);
}
static void st_body(int seed) {
    for (int i = 0; i < ST_ITERS; i++) {
        switch ((i + seed) % 4) {
        case 0:
            co_rwmutex_rlock(&st_rw);
            st_read_section();
            co_rwmutex_runlock(&st_rw);
            break;
        case 1:
            if (co_rwmutex_tryrlock(&st_rw) == 0) {
                st_read_section();
                co_rwmutex_runlock(&st_rw);
                __atomic_add_fetch(&st_try_ok[0], 1, __ATOMIC_RELAXED);
            }
            break;
        case 2:
            if (co_rwmutex_trylock(&st_rw) == 0) {
                st_write_section();
                co_rwmutex_unlock(&st_rw);
                __atomic_add_fetch(&st_try_ok[1], 1, __ATOMIC_RELAXED);
            }
            break;
        default:
            if (i % 16 == 3) {
                co_rwmutex_lock(&st_rw);
                st_write_section();
                co_rwmutex_unlock(&st_rw);
            }
        }
        if (i % 64 == 0) co_gosched();
    }
}
static co_waitgroup_t st_wg;
static void st_co(void *arg) {
    st_body((int)(intptr_t)arg);
    co_waitgroup_done(&st_wg);
}
static void *st_thread(void *arg) {
    st_body((int)(intptr_t)arg);
    co_waitgroup_done(&st_wg);
    return NULL;
}
static void test_rw_try_stress(void) {
    pthread_t th[2];
    co_waitgroup_add(&st_wg, 6);
    for (int k = 0; k < 4; k++) CHECK_EQ(co_go(st_co, (void *)(intptr_t)k), 0);
    for (int k = 0; k < 2; k++)
        CHECK_EQ(pthread_create(&th[k], NULL, st_thread, (void *)(intptr_t)(k + 1)), 0);
    co_waitgroup_wait(&st_wg);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    CHECK_EQ(st_violations, 0);
    CHECK(st_try_ok[0] > 0); /* the tries do succeed, not only fail */
    CHECK(st_try_ok[1] > 0);
    CHECK_EQ(co_rwmutex_trylock(&st_rw), 0); /* all released */
    co_rwmutex_unlock(&st_rw);
}

/* ---- Context.Deadline ------------------------------------------------------ */

static void test_ctx_deadline(void) {
    int64_t d = 123;
    CHECK(!co_ctx_deadline(NULL, &d));
    CHECK_EQ(d, CO_FOREVER);
    d = 123;
    CHECK(!co_ctx_deadline(co_ctx_background(), &d));
    CHECK_EQ(d, CO_FOREVER);
    CHECK(!co_ctx_deadline(co_ctx_background(), NULL));

    co_ctx_t *cancel = NULL, *dl = NULL, *later = NULL, *earlier = NULL, *val = NULL, *to = NULL;
    CHECK_EQ(co_ctx_with_cancel(&cancel, co_ctx_background()), 0);
    CHECK(!co_ctx_deadline(cancel, &d));
    CHECK_EQ(d, CO_FOREVER);

    int64_t at = co_now() + CO_HOUR;
    CHECK_EQ(co_ctx_with_deadline(&dl, cancel, at), 0);
    CHECK(co_ctx_deadline(dl, &d));
    CHECK_EQ(d, at);
    CHECK(co_ctx_deadline(dl, NULL));
    /* a child's later deadline: the parent's, the earlier, is the one */
    CHECK_EQ(co_ctx_with_deadline(&later, dl, at + CO_HOUR), 0);
    CHECK(co_ctx_deadline(later, &d));
    CHECK_EQ(d, at);
    /* an earlier one is the child's own */
    CHECK_EQ(co_ctx_with_deadline(&earlier, dl, at - CO_MINUTE), 0);
    CHECK(co_ctx_deadline(earlier, &d));
    CHECK_EQ(d, at - CO_MINUTE);
    /* a value node inherits it */
    static int key;
    CHECK_EQ(co_ctx_with_value(&val, earlier, &key, NULL), 0);
    CHECK(co_ctx_deadline(val, &d));
    CHECK_EQ(d, at - CO_MINUTE);
    /* with_timeout: now + ns */
    int64_t t0 = co_now();
    CHECK_EQ(co_ctx_with_timeout(&to, co_ctx_background(), CO_MINUTE), 0);
    int64_t t1 = co_now();
    CHECK(co_ctx_deadline(to, &d));
    CHECK(d >= t0 + CO_MINUTE && d <= t1 + CO_MINUTE);
    /* cancelling does not change the deadline */
    co_ctx_cancel(dl);
    CHECK(co_ctx_deadline(later, &d));
    CHECK_EQ(d, at);
    co_ctx_free(to);
    co_ctx_free(val);
    co_ctx_free(earlier);
    co_ctx_free(later);
    co_ctx_free(dl);
    co_ctx_free(cancel);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_rw_try_states);
    T_RUN(test_rw_try_pending_writer);
    T_RUN(test_rw_try_stress);
    T_RUN(test_ctx_deadline);
    return 0;
}

int main(void) {
    t_begin(60);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
