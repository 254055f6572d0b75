/* Work queued by plain threads is never stranded, even while the running
 * Ms are stuck in coroutines that do not yield beside an idle P: a fresh
 * thread's spawn or pool submit still runs (an M is woken for the idle P).
 * And plain threads feeding pools and spawning, many at once, lose
 * nothing. */
#include <colony.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "t.h"

static atomic_int hog_spinning, hog_released, hog_done;
static atomic_long ran;

/* Holds its P without ever entering the scheduler until released (or
 * 60 s, which fails the test rather than hanging it). */
static void hog(void *arg) {
    (void)arg;
    atomic_store(&hog_spinning, 1);
    int64_t end = co_deadline_after(60LL * 1000000000);
    int released;
    while (!(released = atomic_load(&hog_released)) && co_now() < end) {
    }
    CHECK(released); /* (the flag is reset for the next round once hog_done is set) */
    atomic_store(&hog_done, 1);
}

static void release_hog(void *arg) {
    (void)arg;
    atomic_fetch_add(&ran, 1);
    atomic_store(&hog_released, 1);
}

static void count(void *arg) {
    (void)arg;
    atomic_fetch_add(&ran, 1);
}

struct thread_job {
    co_pool_t *pool; /* NULL: co_go */
    int n;
    void (*fn)(void *);
};

static void *submitter(void *arg) {
    struct thread_job *j = arg;
    for (int i = 0; i < j->n; i++) {
        int rc = j->pool ? co_pool_submit(j->pool, j->fn, NULL) : co_go(j->fn, NULL);
        CHECK_EQ(rc, 0);
    }
    return NULL;
}

static void nap(void) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

/* Every task done, the pool gone, the runtime shut down. */
static void teardown(co_pool_t *pool) {
    CHECK_EQ(co_pool_wait_idle(pool, CO_FOREVER), 0);
    co_pool_release(pool);
    co_pool_destroy(pool);
    CHECK_EQ(T_SHUTDOWN(), 0);
}

/* One hog per P but one: the task a fresh plain thread queues must still
 * run while the hogs spin (on the idle P). */
static void hog_round(co_pool_t *pool, int warmup) {
    atomic_store(&hog_spinning, 0);
    atomic_store(&hog_released, 0);
    atomic_store(&hog_done, 0);
    atomic_store(&ran, 0);
    CHECK_EQ(co_go(hog, NULL), 0);
    while (!atomic_load(&hog_spinning)) {
    }
    /* warmup: some tasks first, so that the Ms have taken from the global
     * queue before the task that releases the hogs */
    struct thread_job w = {pool, warmup, count};
    pthread_t th;
    if (warmup) {
        CHECK_EQ(pthread_create(&th, NULL, submitter, &w), 0);
        pthread_join(th, NULL);
    }
    struct thread_job one = {pool, 1, release_hog};
    CHECK_EQ(pthread_create(&th, NULL, submitter, &one), 0);
    pthread_join(th, NULL);
    while (!atomic_load(&hog_released)) {
        nap();
    }
    while (atomic_load(&ran) < warmup + 1) {
        nap();
    }
    while (!atomic_load(&hog_done)) nap(); /* before the next round resets the flags */
}

static void test_stuck_ms(void) {
    co_config_t cfg = {.procs = 2};
    CHECK_EQ(co_init(&cfg), 0);
    co_pool_t *pool;
    CHECK_EQ(co_pool_new(&pool, 4, NULL), 0);
    for (int r = 0; r < 8; r++) hog_round(r % 2 ? pool : NULL, (r / 2) % 2 ? 100 : 0);
    teardown(pool);
}

/* Four threads, each 20,000 pool submits or spawns: every task runs once. */
static void test_many_threads(void) {
    co_config_t cfg = {.procs = 2};
    CHECK_EQ(co_init(&cfg), 0);
    co_pool_t *pool;
    CHECK_EQ(co_pool_new(&pool, 100, NULL), 0);
    atomic_store(&ran, 0);
    enum { T = 4, N = 20000 };
    struct thread_job jobs[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = (struct thread_job){i % 2 ? pool : NULL, N, count};
        CHECK_EQ(pthread_create(&th[i], NULL, submitter, &jobs[i]), 0);
    }
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    teardown(pool);
    CHECK_EQ(atomic_load(&ran), (long)T * N);
}

int main(void) {
    t_begin(110);
    T_RUN(test_stuck_ms);
    T_RUN(test_many_threads);
    return t_end();
}
