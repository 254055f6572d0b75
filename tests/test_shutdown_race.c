/* Plain threads spawn (co_go, co_go_with, co_submit) while another thread
 * stops and starts the runtime over and over (co_shutdown, co_init). A
 * task the API accepted must run, and only once; one it refused must
 * never run and must have been answered with an error. Every task has its
 * own slot, so a task run twice or run after a refusal is caught, not
 * just a wrong total.
 * ctest-timeout: 300
 * ctest-no-chaos: it shuts the runtime down and starts it again; the
 * chaos settings (COLONY_PROCS) would apply to every start anyway. */
#include <colony.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "t.h"

#define MS 1000000LL

#define SPAWNERS 4
/* Each spawner makes at least MIN_PER_SPAWNER tasks, and goes on (up to
 * MAX_PER_SPAWNER, for at most LIMIT_NS) until co_shutdown has succeeded
 * TARGET_STOPS times: a sanitizer's slower runtime needs more spawns for
 * as many restarts. */
#define MIN_PER_SPAWNER 6000
#define MAX_PER_SPAWNER 50000
#define TARGET_STOPS 300
#define LIMIT_NS (30000 * MS)
#define NTASKS (SPAWNERS * MAX_PER_SPAWNER)

/* Per task: how many times it ran, and what its spawn answered (2: never
 * spawned, 1: no answer yet, else the spawn's return). */
static atomic_int runs[NTASKS];
static int answer[NTASKS];
static atomic_int spawners_done;
static atomic_long shutdowns_ok, shutdowns_busy, inits;

/* Accepted and not yet run. The spawners keep it under BACKLOG: a plain
 * thread's co_go never waits, and under TSan each queued coroutine costs
 * mappings of its own (its fiber's trace), so an unthrottled storm ran
 * into vm.max_map_count there. */
#define BACKLOG 2000
static atomic_long backlog;
static atomic_int throttle_off;

static void task(void *arg) {
    atomic_fetch_add(&runs[(intptr_t)arg], 1);
    atomic_fetch_sub(&backlog, 1);
}

static int go_named(void (*fn)(void *), void *arg) {
    co_attr_t a = {.name = "storm"};
    return co_go_with(&a, fn, arg);
}

static int64_t start_ns;
static bool enough(int i) {
    if (i >= MAX_PER_SPAWNER) return true;
    if (i < MIN_PER_SPAWNER) return false;
    return atomic_load(&shutdowns_ok) >= TARGET_STOPS || co_now() - start_ns > LIMIT_NS;
}

static void *spawner(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t seed = (uint64_t)id + 1;
    for (int i = 0; !enough(i); i++) {
        intptr_t k = (intptr_t)id * MAX_PER_SPAWNER + i;
        /* (a lost task would hold the backlog up for good: after 5 s the
         * spawners stop waiting for it, and the count below tells) */
        for (int w = 0; atomic_load(&backlog) > BACKLOG && !atomic_load(&throttle_off); w++) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
            if (w == 50000) atomic_store(&throttle_off, 1);
        }
        answer[k] = 1; /* spawned (not yet answered) */
        atomic_fetch_add(&backlog, 1);
        int rc;
        switch (i % 3) {
        case 0: rc = co_go(task, (void *)k); break;
        case 1: rc = co_submit(task, (void *)k); break;
        default: rc = go_named(task, (void *)k); break;
        }
        answer[k] = rc;
        if (rc != 0) atomic_fetch_sub(&backlog, 1);
        /* Bursts and pauses of up to 2 ms, so that the runtime goes quiet
         * now and then and co_shutdown gets past its checks while the next
         * burst lands. */
        if (i % 32 == 31) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            struct timespec ts = {0, (long)(seed >> 33) % 2000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    atomic_fetch_add(&spawners_done, 1);
    return NULL;
}

/* Stop the runtime, start it again, over and over, until the spawners are
 * done. */
static void *cycler(void *arg) {
    (void)arg;
    while (atomic_load(&spawners_done) < SPAWNERS) {
        int rc = co_shutdown();
        CHECK(rc == 0 || rc == CO_EBUSY);
        atomic_fetch_add(rc == 0 ? &shutdowns_ok : &shutdowns_busy, 1);
        rc = co_init(NULL);
        CHECK_EQ(rc, 0);
        atomic_fetch_add(&inits, 1);
    }
    return NULL;
}

static void storm(void) {
    pthread_t sp[SPAWNERS], cy;
    start_ns = co_now();
    for (int k = 0; k < NTASKS; k++) answer[k] = 2;
    CHECK_EQ(pthread_create(&cy, NULL, cycler, NULL), 0);
    for (int i = 0; i < SPAWNERS; i++)
        CHECK_EQ(pthread_create(&sp[i], NULL, spawner, (void *)(intptr_t)i), 0);
    for (int i = 0; i < SPAWNERS; i++) pthread_join(sp[i], NULL);
    pthread_join(cy, NULL);
    /* Every accepted task runs; then the last runtime stops. */
    CHECK_EQ(T_SHUTDOWN(), 0);
    long accepted = 0, refused = 0, lost = 0, twice = 0, ghost = 0, bad = 0, unused = 0;
    for (int k = 0; k < NTASKS; k++) {
        int n = atomic_load(&runs[k]);
        if (answer[k] == 2) { /* never spawned */
            unused++;
            ghost += n != 0;
        } else if (answer[k] == 0) {
            accepted++;
            lost += n == 0;
            twice += n > 1;
        } else {
            refused++;
            ghost += n != 0;
            /* only a lack of memory may refuse a spawn (1: no answer) */
            bad += answer[k] != CO_ENOMEM;
        }
    }
    fprintf(stderr,
            "   %ld accepted, %ld refused; co_shutdown: %ld ok, %ld busy; %ld co_init\n",
            accepted, refused, atomic_load(&shutdowns_ok), atomic_load(&shutdowns_busy),
            atomic_load(&inits));
    CHECK_EQ(lost, 0);
    CHECK_EQ(twice, 0);
    CHECK_EQ(ghost, 0);
    CHECK_EQ(bad, 0);
    CHECK(accepted + refused + unused == NTASKS);
    CHECK(atomic_load(&shutdowns_ok) > 0);
}

int main(void) {
    t_begin(280);
    T_RUN(storm);
    return t_end();
}
