/* The runtime's lifetime against what depends on it. co_shutdown fails
 * with CO_EBUSY, changing nothing, while a pool (not the default one), a
 * ticker or a pending deadline still needs it; once they are gone it
 * succeeds. A pool used to survive a successful co_shutdown: its next
 * submit returned 0 and the task never ran, and destroying it read the
 * freed runtime. And plain threads that spawn while another thread shuts
 * the runtime down lose nothing: every co_go that returns 0 runs its
 * coroutine exactly once, on the runtime that was up or on the next one.
 * ctest-no-chaos: it shuts the runtime down and starts it again; the
 * chaos settings (COLONY_PROCS) would apply to every start anyway. */
#include <colony.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "t.h"

#define MS 1000000LL

static atomic_long ran;
static void count(void *arg) {
    (void)arg;
    atomic_fetch_add(&ran, 1);
}

static void nap(void) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}


/* A pool holds the runtime up until it is destroyed; meanwhile it keeps
 * working, and so does the default pool, which the failed shutdown must
 * not have touched. */
static void pool_holds_runtime(void) {
    atomic_store(&ran, 0);
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, 4, NULL), 0);
    co_pool_t *dflt = co_default_pool();
    CHECK(dflt != NULL);
    CHECK_EQ(co_pool_submit(p, count, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
    CHECK_EQ(co_shutdown(), CO_EBUSY);
    CHECK(co_default_pool() == dflt);
    CHECK(!co_pool_is_closed(p));
    CHECK_EQ(co_pool_submit(p, count, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
    CHECK_EQ(atomic_load(&ran), 2);
    /* Released but not destroyed: still held. */
    co_pool_release(p);
    CHECK_EQ(co_shutdown(), CO_EBUSY);
    co_pool_destroy(p);
    CHECK_EQ(T_SHUTDOWN(), 0);
    /* A pool made after the shutdown starts a fresh runtime and works. */
    CHECK_EQ(co_pool_new(&p, 2, NULL), 0);
    CHECK_EQ(co_pool_submit(p, count, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
    CHECK_EQ(atomic_load(&ran), 3);
    co_pool_destroy(p);
    CHECK_EQ(T_SHUTDOWN(), 0);
}

/* The same for a multipool (its pools hold the runtime) and a function
 * pool. */
static void multipool_holds_runtime(void) {
    atomic_store(&ran, 0);
    co_multipool_t *mp;
    CHECK_EQ(co_multipool_new(&mp, 2, 2, CO_LB_ROUND_ROBIN, NULL), 0);
    CHECK_EQ(co_multipool_submit(mp, count, NULL), 0);
    co_pool_t *fp;
    CHECK_EQ(co_pool_new_func(&fp, 2, count, NULL), 0);
    CHECK_EQ(co_pool_invoke(fp, NULL), 0);
    CHECK_EQ(co_shutdown(), CO_EBUSY);
    co_multipool_destroy(mp);
    CHECK_EQ(co_shutdown(), CO_EBUSY); /* the function pool still */
    CHECK_EQ(co_pool_wait_idle(fp, co_deadline_after(10000 * MS)), 0);
    co_pool_destroy(fp);
    CHECK_EQ(atomic_load(&ran), 2);
    CHECK_EQ(T_SHUTDOWN(), 0);
}

/* A ticker's timer and a context's deadline timer would outlive the heap
 * they are on. */
static void timers_hold_runtime(void) {
    co_ticker_t *t;
    CHECK_EQ(co_ticker_new(&t, 50 * MS), 0);
    CHECK_EQ(co_shutdown(), CO_EBUSY);
    int64_t when;
    CHECK_EQ(co_chan_recv(co_ticker_chan(t), &when, co_deadline_after(10000 * MS)), 0);
    co_ticker_stop(t);
    CHECK_EQ(T_SHUTDOWN(), 0);

    co_ctx_t *c;
    CHECK_EQ(co_ctx_with_timeout(&c, co_ctx_background(), 60000 * MS), 0);
    CHECK_EQ(co_shutdown(), CO_EBUSY);
    CHECK_EQ(co_ctx_err(c), 0);
    co_ctx_cancel(c);
    co_ctx_free(c);
    CHECK_EQ(T_SHUTDOWN(), 0);

    /* A deadline that already fired holds nothing. */
    CHECK_EQ(co_ctx_with_timeout(&c, co_ctx_background(), 1 * MS), 0);
    char v;
    CHECK_EQ(co_chan_recv(co_ctx_done(c), &v, co_deadline_after(10000 * MS)), CO_ECLOSED);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    CHECK_EQ(T_SHUTDOWN(), 0);
    co_ctx_free(c);
}

/* Plain threads spawn while the main thread shuts the runtime down over
 * and over: nothing that co_go accepted is lost or run twice. */
#define SPAWNERS 3
#define PER_SPAWNER 3000
static atomic_long accepted;
static atomic_int spawners_done;
/* n calls of start(count, NULL) (co_go or co_submit), each expected to
 * succeed, counted in `accepted`; then `done` goes up by one. */
static void start_many(int (*start)(void (*)(void *), void *), int n, atomic_int *done) {
    for (int i = 0; i < n; i++) {
        int rc = start(count, NULL);
        CHECK_EQ(rc, 0);
        if (rc == 0) atomic_fetch_add(&accepted, 1);
        if (i % 64 == 0) sched_yield();
    }
    atomic_fetch_add(done, 1);
}
static void *spawner(void *arg) {
    (void)arg;
    start_many(co_go, PER_SPAWNER, &spawners_done);
    return NULL;
}
static void spawn_races_shutdown(void) {
    atomic_store(&ran, 0);
    atomic_store(&accepted, 0);
    atomic_store(&spawners_done, 0);
    pthread_t th[SPAWNERS];
    for (int i = 0; i < SPAWNERS; i++) CHECK_EQ(pthread_create(&th[i], NULL, spawner, NULL), 0);
    int stopped = 0;
    while (atomic_load(&spawners_done) < SPAWNERS) {
        int rc = co_shutdown();
        CHECK(rc == 0 || rc == CO_EBUSY);
        if (rc == 0) stopped++;
    }
    for (int i = 0; i < SPAWNERS; i++) pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&accepted), SPAWNERS * PER_SPAWNER);
    /* Every accepted coroutine runs; the last runtime then stops. */
    CHECK_EQ(T_SHUTDOWN(), 0);
    CHECK_EQ(atomic_load(&ran), SPAWNERS * PER_SPAWNER);
    fprintf(stderr, "   (co_shutdown returned 0 %d times meanwhile)\n", stopped);
}

/* The default pool against co_shutdown. Plain threads submit to it (and
 * one keeps asking for it) while the main thread shuts the runtime down
 * over and over: each successful shutdown destroys the pool, the next use
 * makes a new one. Every co_submit that returned 0 runs its task exactly
 * once, and none touches a destroyed pool (ASan). A pool made after the
 * shutdown hook had run used to survive the shutdown unheld, and tasks
 * submitted to it then waited forever on the stopped runtime; a co_submit
 * racing the hook could submit to the pool the hook was destroying. */
#define DSUBMITTERS 2
#define PER_DSUBMITTER 3000
static atomic_int dsub_done;
static atomic_long dmade;
static void *default_submitter(void *arg) {
    (void)arg;
    start_many(co_submit, PER_DSUBMITTER, &dsub_done);
    return NULL;
}
static void *default_maker(void *arg) {
    (void)arg;
    while (atomic_load(&dsub_done) < DSUBMITTERS) {
        CHECK(co_default_pool() != NULL);
        atomic_fetch_add(&dmade, 1);
        sched_yield();
    }
    return NULL;
}
static void default_pool_races_shutdown(void) {
    atomic_store(&ran, 0);
    atomic_store(&accepted, 0);
    atomic_store(&dsub_done, 0);
    atomic_store(&dmade, 0);
    pthread_t th[DSUBMITTERS + 1];
    for (int i = 0; i < DSUBMITTERS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, default_submitter, NULL), 0);
    CHECK_EQ(pthread_create(&th[DSUBMITTERS], NULL, default_maker, NULL), 0);
    int stopped = 0;
    while (atomic_load(&dsub_done) < DSUBMITTERS) {
        int rc = co_shutdown();
        CHECK(rc == 0 || rc == CO_EBUSY);
        if (rc == 0) stopped++;
    }
    for (int i = 0; i <= DSUBMITTERS; i++) pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&accepted), DSUBMITTERS * PER_DSUBMITTER);
    /* Every accepted task runs (the pool made last among them); then the
     * runtime stops, destroying that pool. */
    for (int i = 0; i < 10000 && atomic_load(&ran) < DSUBMITTERS * PER_DSUBMITTER; i++) nap();
    CHECK_EQ(atomic_load(&ran), DSUBMITTERS * PER_DSUBMITTER);
    CHECK_EQ(T_SHUTDOWN(), 0);
    CHECK_EQ(atomic_load(&ran), DSUBMITTERS * PER_DSUBMITTER);
    fprintf(stderr, "   (co_shutdown returned 0 %d times meanwhile)\n", stopped);
}

/* co_pool_destroy(co_default_pool()): the default pool stops being the
 * default one; its tasks finish (the destroy waits for them, as for any
 * pool), and the next use makes a fresh pool. It used to stay published:
 * co_submit then read the freed pool (ASan: heap-use-after-free in
 * co_pool_submit_until), co_default_pool() returned it, and co_shutdown
 * returned CO_EBUSY for ever (the freed pool's hold, given back, was
 * still expected from the shutdown hook). */
static void slow_count(void *arg) {
    (void)arg;
    co_sleep(20 * MS);
    atomic_fetch_add(&ran, 1);
}
static void destroy_default_pool(void) {
    atomic_store(&ran, 0);
    CHECK_EQ(co_submit(count, NULL), 0);
    CHECK_EQ(co_submit(slow_count, NULL), 0);
    co_pool_t *p = co_default_pool();
    CHECK(p != NULL);
    co_pool_destroy(p); /* waits for both tasks */
    CHECK_EQ(atomic_load(&ran), 2);
    /* A fresh pool: open, unlimited, with nothing submitted yet. */
    co_pool_t *q = co_default_pool();
    CHECK(q != NULL);
    CHECK(!co_pool_is_closed(q));
    CHECK_EQ(co_pool_cap(q), -1);
    co_pool_stats_t st;
    co_pool_stats(q, &st);
    CHECK_EQ(st.submitted, 0);
    CHECK_EQ(co_submit(count, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(co_default_pool(), co_deadline_after(10000 * MS)), 0);
    CHECK_EQ(atomic_load(&ran), 3);
    co_pool_stats(co_default_pool(), &st);
    CHECK_EQ(st.submitted, 1);
    CHECK_EQ(co_shutdown(), 0);
    /* Destroyed with no use after it: the shutdown has nothing to wait
     * for; and co_submit made the first pool itself. */
    CHECK_EQ(co_submit(count, NULL), 0);
    co_pool_destroy(co_default_pool());
    CHECK_EQ(atomic_load(&ran), 4);
    CHECK_EQ(co_shutdown(), 0);
}

/* The same while plain threads co_submit: every submit that returned 0
 * runs its task exactly once, on the pool being destroyed (which waits for
 * it) or on the next one, and none touches a freed pool (ASan). */
#define DD_SUBMITTERS 3
#define DD_PER_SUBMITTER 4000
static atomic_int dd_done;
static void *dd_submitter(void *arg) {
    (void)arg;
    start_many(co_submit, DD_PER_SUBMITTER, &dd_done);
    return NULL;
}
static void destroy_default_pool_races_submit(void) {
    atomic_store(&ran, 0);
    atomic_store(&accepted, 0);
    atomic_store(&dd_done, 0);
    pthread_t th[DD_SUBMITTERS];
    for (int i = 0; i < DD_SUBMITTERS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, dd_submitter, NULL), 0);
    int destroyed = 0;
    while (atomic_load(&dd_done) < DD_SUBMITTERS) {
        co_pool_destroy(co_default_pool());
        destroyed++;
    }
    for (int i = 0; i < DD_SUBMITTERS; i++) pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&accepted), DD_SUBMITTERS * DD_PER_SUBMITTER);
    co_pool_destroy(co_default_pool()); /* the last one: waits for its tasks */
    CHECK_EQ(atomic_load(&ran), DD_SUBMITTERS * DD_PER_SUBMITTER);
    CHECK_EQ(co_shutdown(), 0);
    fprintf(stderr, "   (%d default pools destroyed meanwhile)\n", destroyed);
}

/* Coroutine ids go on across a restart, as they would in Go's one
 * runtime: an id names one coroutine over the process's life (a trace or
 * a log spanning co_shutdown and a new co_init keeps the two apart). */
static uint64_t seen_id;
static int record_id(void *a) {
    (void)a;
    seen_id = co_id();
    return 0;
}
static void ids_go_on_after_restart(void) {
    CHECK_EQ(co_main(record_id, NULL), 0);
    uint64_t first = seen_id;
    CHECK(first > 0);
    CHECK_EQ(co_shutdown(), 0);
    CHECK_EQ(co_main(record_id, NULL), 0);
    CHECK(seen_id > first);
    CHECK_EQ(co_shutdown(), 0);
}

int main(void) {
    t_begin(110);
    T_RUN(ids_go_on_after_restart);
    T_RUN(pool_holds_runtime);
    T_RUN(multipool_holds_runtime);
    T_RUN(timers_hold_runtime);
    T_RUN(spawn_races_shutdown);
    T_RUN(default_pool_races_shutdown);
    T_RUN(destroy_default_pool);
    T_RUN(destroy_default_pool_races_submit);
    return t_end();
}
