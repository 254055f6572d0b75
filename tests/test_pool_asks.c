/* What ants' users asked for (spec/ants.md §3) and colony adds: deadline
 * submits, wait_idle, exact stats, CO_EDEADLK for a task submitting to its
 * own full pool, idle workers that hold no coroutine, race-free
 * release/reboot, and the no-task-lost storm across release/reboot/tune. */
// ctest-timeout: 300
#include <signal.h>
#include <sys/wait.h>

#include "test_pool_util.h"
#include "t_internal.h"

static gate_t gate;
static atomic_long ran;
static void gated_task(void *arg) {
    gate_wait(&gate);
    atomic_fetch_add(&ran, 1);
}
static void noop_task(void *arg) { atomic_fetch_add(&ran, 1); }
static void panicking_task(void *arg) { co_panic(arg); }
static void quiet(void *v, void *ctx) {}

/* ---- co_pool_submit_until ---------------------------------------------- */

static void *thread_submit_until(void *arg) {
    co_pool_t *p = arg;
    return (void *)(intptr_t)co_pool_submit_until(p, noop_task, NULL, co_deadline_after(30 * MS));
}

static void submit_until(void) {
    co_pool_t *p;
    gate_init(&gate);
    atomic_store(&ran, 0);
    CHECK_EQ(co_pool_new(&p, 1, NULL), 0);
    CHECK_EQ(co_pool_submit_until(p, gated_task, NULL, 0), 0); /* room: a past deadline is fine */
    CHECK_EQ(co_pool_submit_until(p, noop_task, NULL, 0), CO_ETIMEDOUT); /* full: try once */
    /* from a coroutine: parks, gives up at the deadline */
    bg_submit_t b;
    bg_submit_start(&b, p, noop_task, NULL);
    CHECK(WAIT_FOR(co_pool_waiting(p) == 1));
    bg_submit_t c = {0};
    c.p = p;
    c.fn = noop_task;
    c.deadline = co_deadline_after(30 * MS);
    atomic_store(&c.rc, 1);
    CHECK_EQ(co_go(bg_submit_main, &c), 0);
    CHECK(WAIT_FOR(atomic_load(&c.done)));
    CHECK_EQ(atomic_load(&c.rc), CO_ETIMEDOUT);
    /* from a plain thread */
    pthread_t th;
    void *r;
    pthread_create(&th, NULL, thread_submit_until, p);
    pthread_join(th, &r);
    CHECK_EQ((int)(intptr_t)r, CO_ETIMEDOUT);
    CHECK_EQ(co_pool_waiting(p), 1); /* only b is left */
    gate_open(&gate);
    CHECK(WAIT_FOR(atomic_load(&b.done)));
    CHECK_EQ(atomic_load(&b.rc), 0);
    CHECK_EQ(co_pool_wait_idle(p, CO_FOREVER), 0);
    CHECK_EQ(atomic_load(&ran), 2); /* the gated task and b's; the timed-out ones never ran */
    co_pool_stats_t st;
    co_pool_stats(p, &st);
    CHECK_EQ(st.submitted, 2);
    CHECK_EQ(st.completed, 2);
    CHECK_EQ(st.rejected, 3);
    CHECK_EQ(st.waiting, 0);
    co_pool_destroy(p);
}

/* ---- co_pool_wait_idle --------------------------------------------------- */

static void sleepy(void *arg) {
    co_sleep(5 * MS);
    atomic_fetch_add(&ran, 1);
}

static void wait_idle(void) {
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, 8, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, 0), 0); /* nothing ever ran */
    atomic_store(&ran, 0);
    for (int i = 0; i < 40; i++) CHECK_EQ(co_pool_submit(p, sleepy, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, CO_FOREVER), 0);
    CHECK_EQ(atomic_load(&ran), 40);
    CHECK(!co_pool_is_closed(p)); /* stays open */
    CHECK_EQ(co_pool_submit(p, sleepy, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, CO_FOREVER), 0);
    CHECK_EQ(atomic_load(&ran), 41);
    /* deadlines */
    gate_init(&gate);
    CHECK_EQ(co_pool_submit(p, gated_task, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    gate_open(&gate);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
    co_pool_destroy(p);
}

/* Several waiters, coroutines and threads, are all released. */
static co_pool_t *wi_pool;
static atomic_int wi_ok;
static void wi_co(void *arg) {
    if (co_pool_wait_idle(wi_pool, CO_FOREVER) == 0) atomic_fetch_add(&wi_ok, 1);
}
static void *wi_thread(void *arg) {
    wi_co(arg);
    return NULL;
}
static void wait_idle_many(void) {
    CHECK_EQ(co_pool_new(&wi_pool, 4, NULL), 0);
    gate_init(&gate);
    atomic_store(&wi_ok, 0);
    for (int i = 0; i < 4; i++) CHECK_EQ(co_pool_submit(wi_pool, gated_task, NULL), 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, wi_thread, NULL);
    for (int i = 0; i < 3; i++) CHECK_EQ(co_go(wi_co, NULL), 0);
    co_sleep(10 * MS);
    CHECK_EQ(atomic_load(&wi_ok), 0);
    gate_open(&gate);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(WAIT_FOR(atomic_load(&wi_ok) == 5));
    co_pool_destroy(wi_pool);
}

/* ---- exact stats --------------------------------------------------------- */

static bool stats_settled(co_pool_t *p) {
    co_pool_stats_t st;
    co_pool_stats(p, &st);
    return st.busy == 2 && st.idle == 1 && st.completed == 1 && st.panicked == 1;
}
static void stats_exact(void) {
    co_pool_opts_t o = {.panic_handler = quiet, .nonblocking = true, .disable_purge = true};
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, 3, &o), 0);
    co_pool_stats_t st;
    co_pool_stats(p, &st);
    CHECK_EQ(st.running + st.idle + st.busy + st.waiting + st.submitted + st.completed +
                 st.rejected + st.panicked,
             0);
    gate_init(&gate);
    CHECK_EQ(co_pool_submit(p, gated_task, NULL), 0);
    CHECK_EQ(co_pool_submit(p, gated_task, NULL), 0);
    CHECK_EQ(co_pool_submit(p, panicking_task, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    CHECK(WAIT_FOR(co_pool_running(p) == 2)); /* the panicked worker is gone */
    CHECK_EQ(co_pool_submit(p, noop_task, NULL), 0); /* a new worker */
    CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    /* the noop ran and its worker went idle, and the panic's report is
     * done (a slow machine may take longer than the 20 ms above) */
    CHECK(WAIT_FOR(stats_settled(p)));
    co_pool_stats(p, &st);
    CHECK_EQ(st.busy, 2);
    CHECK_EQ(st.idle, 1);
    CHECK_EQ(st.running, 3);
    co_pool_submit(p, gated_task, NULL); /* takes the idle one */
    CHECK_EQ(co_pool_submit(p, gated_task, NULL), CO_EOVERLOAD);
    CHECK_EQ(co_pool_submit(p, NULL, NULL), CO_EINVAL);
    co_pool_stats(p, &st);
    CHECK_EQ(st.running, 3);
    CHECK_EQ(st.busy, 3);
    CHECK_EQ(st.idle, 0);
    CHECK_EQ(st.waiting, 0);
    CHECK_EQ(st.submitted, 5);
    CHECK_EQ(st.completed, 1);
    CHECK_EQ(st.panicked, 1);
    CHECK_EQ(st.rejected, 2);
    gate_open(&gate);
    CHECK_EQ(co_pool_wait_idle(p, CO_FOREVER), 0);
    co_pool_stats(p, &st);
    CHECK_EQ(st.busy, 0);
    CHECK_EQ(st.idle, 3);
    CHECK_EQ(st.completed, 4);
    CHECK_EQ(st.submitted, st.completed + st.panicked);
    co_pool_release(p);
    co_pool_stats(p, &st);
    CHECK_EQ(st.running, 0);
    CHECK_EQ(st.idle, 0);
    co_pool_destroy(p);
}

/* ---- CO_EDEADLK ------------------------------------------------------------ */

static co_pool_t *self_pool, *other_pool;
static atomic_int self_rc, self_rc2, self_rc3;
static void self_submitter(void *arg) {
    /* the pool (cap 1) is full: this very task holds its only worker */
    atomic_store(&self_rc, co_pool_submit(self_pool, noop_task, NULL));
    atomic_store(&self_rc2, co_pool_wait_idle(self_pool, CO_FOREVER));
    atomic_store(&self_rc3, co_pool_submit_until(self_pool, noop_task, NULL, co_deadline_after(1000 * MS)));
}
static void submit_to_other(void *arg) {
    /* a task of self_pool submitting to a full other_pool just blocks */
    atomic_store(&self_rc, co_pool_submit(other_pool, noop_task, NULL));
}
static void nested_ok(void *arg) {
    /* room left: a nested submit simply works */
    atomic_store(&self_rc, co_pool_submit(self_pool, noop_task, NULL));
}

static void deadlock_detect(void) {
    CHECK_EQ(co_pool_new(&self_pool, 1, NULL), 0);
    atomic_store(&self_rc, 1);
    CHECK_EQ(co_pool_submit(self_pool, self_submitter, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(self_pool, CO_FOREVER), 0);
    CHECK_EQ(atomic_load(&self_rc), CO_EDEADLK);
    CHECK_EQ(atomic_load(&self_rc2), CO_EDEADLK);
    CHECK_EQ(atomic_load(&self_rc3), CO_EDEADLK);
    co_pool_destroy(self_pool);

    /* not full: works */
    CHECK_EQ(co_pool_new(&self_pool, 2, NULL), 0);
    atomic_store(&ran, 0);
    CHECK_EQ(co_pool_submit(self_pool, nested_ok, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(self_pool, CO_FOREVER), 0);
    CHECK(WAIT_FOR(atomic_load(&ran) == 1));
    CHECK_EQ(atomic_load(&self_rc), 0);
    co_pool_destroy(self_pool);

    /* nonblocking: CO_EOVERLOAD comes first */
    co_pool_opts_t nb = {.nonblocking = true};
    CHECK_EQ(co_pool_new(&self_pool, 1, &nb), 0);
    CHECK_EQ(co_pool_submit(self_pool, self_submitter, NULL), 0);
    CHECK_EQ(co_pool_wait_idle(self_pool, CO_FOREVER), 0);
    CHECK_EQ(atomic_load(&self_rc), CO_EOVERLOAD);
    co_pool_destroy(self_pool);

    /* another full pool: not a self-deadlock, the submit waits its turn */
    CHECK_EQ(co_pool_new(&self_pool, 1, NULL), 0);
    CHECK_EQ(co_pool_new(&other_pool, 1, NULL), 0);
    gate_init(&gate);
    CHECK_EQ(co_pool_submit(other_pool, gated_task, NULL), 0);
    atomic_store(&self_rc, 1);
    CHECK_EQ(co_pool_submit(self_pool, submit_to_other, NULL), 0);
    CHECK(WAIT_FOR(co_pool_waiting(other_pool) == 1));
    gate_open(&gate);
    CHECK_EQ(co_pool_wait_idle(self_pool, CO_FOREVER), 0);
    CHECK_EQ(atomic_load(&self_rc), 0);
    CHECK_EQ(co_pool_wait_idle(other_pool, CO_FOREVER), 0);
    co_pool_destroy(self_pool);
    co_pool_destroy(other_pool);
}

/* release_timeout from one of the pool's own tasks waits for the others
 * only; destroy from one of them is a fatal misuse (child process). */
static atomic_int rt_rc = 1;
static void releasing_task(void *arg) {
    atomic_store(&rt_rc, co_pool_release_timeout(self_pool, 5000 * MS));
}
static void release_from_own_task(void) {
    CHECK_EQ(co_pool_new(&self_pool, 4, NULL), 0);
    gate_init(&gate);
    CHECK_EQ(co_pool_submit(self_pool, gated_task, NULL), 0);
    CHECK_EQ(co_pool_submit(self_pool, releasing_task, NULL), 0);
    co_sleep(10 * MS);
    CHECK_EQ(atomic_load(&rt_rc), 1); /* still waiting for the gated one */
    gate_open(&gate);
    CHECK(WAIT_FOR(atomic_load(&rt_rc) == 0));
    CHECK(WAIT_FOR(co_pool_running(self_pool) == 0));
    co_pool_destroy(self_pool);
}

static void destroying_task(void *arg) { co_pool_destroy(self_pool); }
static int child_destroy_self(void *arg) {
    co_pool_new(&self_pool, 2, NULL);
    co_pool_submit(self_pool, destroying_task, NULL);
    co_sleep(5000 * MS);
    return 0;
}
static void destroy_from_own_task(void) {
    int fd = -1;
    pid_t pid = t_fork_piped(2, &fd);
    CHECK(pid >= 0);
    if (pid < 0) return;
    if (pid == 0) {
        t_execl("/proc/self/exe", "test_pool_asks", "child-destroy-self", (char *)NULL);
        _exit(127);
    }
    char out[2048];
    int st = t_drain_and_wait(fd, out, sizeof out, pid);
    CHECK(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(out, "colony: fatal: co_pool_destroy") != NULL);
}

/* ---- idle workers hold no coroutine ------------------------------------- */

static void idle_holds_no_stack(void) {
    co_pool_opts_t o = {.disable_purge = true};
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, 100, &o), 0);
    gate_init(&gate);
    for (int i = 0; i < 100; i++) CHECK_EQ(co_pool_submit(p, gated_task, NULL), 0);
    CHECK(WAIT_FOR(co_count() >= 100));
    gate_open(&gate);
    CHECK_EQ(co_pool_wait_idle(p, CO_FOREVER), 0);
    CHECK_EQ(co_pool_running(p), 100); /* 100 idle workers ... */
    CHECK(WAIT_FOR(co_count() == 0));  /* ... and not one coroutine */
    co_pool_destroy(p);
}

/* ---- takeover of unstarted workers -------------------------------------
 * A worker whose task ended runs the record of the next worker of its P
 * if that one is of the same pool and never ran (co__take_unstarted); the
 * spawned coroutine is freed unrun. Tasks of two pools queued in blocks
 * on the same P: each runs exactly once, always inside its own pool's
 * worker frame (never another pool's), panics in taken-over tasks reach
 * their pool's handler, and the burst runs on fewer coroutines than
 * tasks (the takeover happened). */
#define TK_N 4000
static co_pool_t *tk_pool[2];
static atomic_int tk_ran[TK_N];
static atomic_int tk_wrong_frame, tk_panics[2];
static uint64_t tk_id[TK_N];
static void tk_task(void *arg) {
    int i = (int)(intptr_t)arg, mine = (i / 4) % 2;
    atomic_fetch_add(&tk_ran[i], 1);
    tk_id[i] = co_id();
    if (!co__recover_has_tag(tk_pool[mine]) || co__recover_has_tag(tk_pool[!mine]))
        atomic_fetch_add(&tk_wrong_frame, 1);
    if (i % 50 == 7) co_panic(arg);
}
static void tk_on_panic(void *value, void *ctx) {
    (void)value;
    atomic_fetch_add(&tk_panics[(intptr_t)ctx], 1);
}
static int tk_submitter(void *arg) {
    (void)arg;
    for (int i = 0; i < TK_N; i++)
        if (co_pool_submit(tk_pool[(i / 4) % 2], tk_task, (void *)(intptr_t)i) != 0) return 1;
    for (int k = 0; k < 2; k++)
        if (co_pool_wait_idle(tk_pool[k], CO_FOREVER) != 0) return 2;
    return 0;
}
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static void takeover(void) {
    for (int k = 0; k < 2; k++) {
        co_pool_opts_t o = {.disable_purge = true, .panic_handler = tk_on_panic,
                            .ctx = (void *)(intptr_t)k};
        CHECK_EQ(co_pool_new(&tk_pool[k], TK_N, &o), 0);
        atomic_store(&tk_panics[k], 0);
    }
    for (int i = 0; i < TK_N; i++) atomic_store(&tk_ran[i], 0);
    atomic_store(&tk_wrong_frame, 0);
    CHECK_EQ(co_main(tk_submitter, NULL), 0);
    int expect_panics[2] = {0, 0}, bad = 0;
    for (int i = 0; i < TK_N; i++) {
        if (atomic_load(&tk_ran[i]) != 1) bad++;
        if (i % 50 == 7) expect_panics[(i / 4) % 2]++;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(atomic_load(&tk_wrong_frame), 0);
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(atomic_load(&tk_panics[k]), expect_panics[k]);
        co_pool_stats_t st;
        co_pool_stats(tk_pool[k], &st);
        CHECK_EQ(st.completed + st.panicked, TK_N / 2);
        CHECK_EQ(st.panicked, expect_panics[k]);
        co_pool_destroy(tk_pool[k]);
    }
    qsort(tk_id, TK_N, sizeof tk_id[0], cmp_u64);
    int distinct = 1;
    for (int i = 1; i < TK_N; i++) distinct += tk_id[i] != tk_id[i - 1];
    fprintf(stderr, "   %d tasks ran on %d coroutines\n", TK_N, distinct);
    CHECK(distinct < TK_N);
}

/* A worker starts with its submitter's FP control words (rounding mode),
 * whether a coroutine is made for it or a finishing worker takes it over
 * (which then loads the task's control words). One coroutine
 * submits blocks of tasks under alternating rounding modes to a pool that
 * never fills (no hand-off to a blocked submitter, which runs the task in
 * the finishing worker's own mode); each task sees its block's mode. */
#include <fenv.h>
#define FP_N 2000
static atomic_int fp_bad, fp_ran;
static void fp_task(void *arg) {
    if (fegetround() != (int)(intptr_t)arg) atomic_fetch_add(&fp_bad, 1);
    atomic_fetch_add(&fp_ran, 1);
}
static int fp_submitter(void *arg) {
    co_pool_t *p = arg;
    int modes[2] = {FE_DOWNWARD, FE_UPWARD};
    int rc = 0;
    for (int i = 0; i < FP_N && rc == 0; i++) {
        int mode = modes[(i / 4) % 2];
        fesetround(mode);
        rc = co_pool_submit(p, fp_task, (void *)(intptr_t)mode);
    }
    fesetround(FE_TONEAREST);
    if (rc == 0) rc = co_pool_wait_idle(p, CO_FOREVER);
    return rc;
}
static void fp_inherited(void) {
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, FP_N, NULL), 0);
    atomic_store(&fp_bad, 0);
    atomic_store(&fp_ran, 0);
    CHECK_EQ(co_main(fp_submitter, p), 0);
    CHECK_EQ(atomic_load(&fp_ran), FP_N);
    CHECK_EQ(atomic_load(&fp_bad), 0);
    co_pool_destroy(p);
}

/* A pool task whose coroutine cannot be made (no memory for its record) is
 * neither lost nor left keeping an M busy: it waits, as a coroutine with no
 * stack does, for sysmon's retries, and starts once memory is back. The
 * library's test hook co__test_fail simulates the shortage: CO__FAIL_TOKEN_G
 * fails the G of every token, CO__FAIL_GLOBQ_CHUNK the global run queue's chunks (tokens
 * then queue on a list of their own). Tasks are submitted from this plain
 * thread (the global queue) and from a coroutine (its P's ring). Before
 * the fix, an M took the same token back over and over and never gave its
 * P up, so "every P idle" was never seen. */
#define OOM_N 50
static atomic_int oom_ran;
static void oom_task(void *arg) {
    (void)arg;
    atomic_fetch_add(&oom_ran, 1);
}
static int oom_submitter(void *arg) {
    for (int i = 0; i < OOM_N; i++)
        if (co_pool_submit(arg, oom_task, NULL) != 0) return -1;
    return 0;
}
static bool all_procs_idle(void) {
    co_sched_stats_t st;
    co_sched_stats(&st);
    return st.idle_procs == st.procs;
}
static void token_oom(void) {
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, 4 * OOM_N, NULL), 0);
    atomic_store(&oom_ran, 0);
    for (int phase = 0; phase < 2; phase++) {
        t_fail(phase == 0 ? CO__FAIL_TOKEN_G | CO__FAIL_GLOBQ_CHUNK : CO__FAIL_TOKEN_G, true);
        if (phase == 0) {
            for (int i = 0; i < OOM_N; i++) CHECK_EQ(co_pool_submit(p, oom_task, NULL), 0);
        } else {
            CHECK_EQ(co_main(oom_submitter, p), 0);
        }
        CHECK(WAIT_FOR(all_procs_idle()));
        CHECK_EQ(atomic_load(&oom_ran), phase * OOM_N); /* none of this phase ran */
        CHECK(co_count() >= OOM_N);                     /* they wait, counted */
        t_fail(CO__FAIL_TOKEN_G | CO__FAIL_GLOBQ_CHUNK, false);
        CHECK_EQ(co_pool_wait_idle(p, co_deadline_after(10000 * MS)), 0);
        CHECK_EQ(atomic_load(&oom_ran), (phase + 1) * OOM_N);
    }
    co_pool_destroy(p);
}

/* ---- the chute: lock-free task ends vs waits and the purge ------------ */

static atomic_long chute_done;
static void chute_task(void *arg) {
    if ((intptr_t)arg % 3 == 0) co_yield();
    atomic_fetch_add(&chute_done, 1);
}
static void *chute_waiter_thread(void *arg) {
    co_pool_t *p = arg;
    long sent = 0;
    int rounds = scaled(300, 60);
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 300; i++, sent++)
            if (co_pool_submit(p, chute_task, (void *)(intptr_t)i) != 0) return (void *)1;
        if (co_pool_wait_idle(p, CO_FOREVER) != 0) return (void *)2;
        /* every accepted task of this thread ran to its end */
        if (atomic_load(&chute_done) < sent) return (void *)3;
    }
    return NULL;
}
/* wait_idle must never return while a worker that finished through the
 * chute is still counted busy, or before a running task ends; and the
 * purge must still retire workers that went idle through the chute. */
static void chute_races(void) {
    co_pool_opts_t o = {.expiry_ns = 3 * MS};
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, 64, &o), 0);
    atomic_store(&chute_done, 0);
    pthread_t th;
    pthread_create(&th, NULL, chute_waiter_thread, p);
    void *r;
    pthread_join(th, &r);
    CHECK(r == NULL);
    co_pool_stats_t st;
    co_pool_stats(p, &st);
    CHECK_EQ(st.busy, 0);
    CHECK_EQ(st.completed, atomic_load(&chute_done));
    CHECK_EQ(st.submitted, st.completed);
    CHECK(WAIT_FOR(co_pool_running(p) == 0)); /* purged, chute included */
    co_pool_destroy(p);
}

/* ---- release / reboot from different threads ------------------------- */

static co_pool_t *race_pool;
static atomic_int race_stop;
static void *race_releaser(void *arg) {
    while (!atomic_load(&race_stop)) {
        co_pool_release(race_pool);
        (void)co_pool_release_timeout(race_pool, 1 * MS);
    }
    return NULL;
}
static void *race_rebooter(void *arg) {
    while (!atomic_load(&race_stop)) co_pool_reboot(race_pool);
    return NULL;
}
static void release_reboot_race(void) {
    CHECK_EQ(co_pool_new(&race_pool, 4, NULL), 0);
    atomic_store(&race_stop, 0);
    atomic_store(&ran, 0);
    pthread_t a, b;
    pthread_create(&a, NULL, race_releaser, NULL);
    pthread_create(&b, NULL, race_rebooter, NULL);
    long ok = 0;
    int n = scaled(20000, 3000);
    for (int i = 0; i < n; i++) {
        int rc = co_pool_submit(race_pool, noop_task, NULL);
        CHECK(rc == 0 || rc == CO_ECLOSED);
        if (rc == 0) ok++;
    }
    atomic_store(&race_stop, 1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    co_pool_reboot(race_pool);
    CHECK_EQ(co_pool_wait_idle(race_pool, CO_FOREVER), 0);
    CHECK_EQ(atomic_load(&ran), ok);
    co_pool_destroy(race_pool);
}

/* ---- churn: tiny tasks from threads and coroutines, both idle queues ---- */
/* Every task end goes through the chute, which worker threads drain every
 * 16 pushes and the submitters whenever the idle queue runs dry, in bulk
 * when nothing older is busy; a plain thread that finds the pool full
 * watches the chute before it parks. Afterwards the counts must be exact,
 * the pool within its capacity, and every accepted task run once. */
static co_pool_t *churn_pool;
static atomic_long churn_ran, churn_left;
static void churn_task(void *arg) { atomic_fetch_add(&churn_ran, 1); }
static void churn_submit(long n) {
    for (long i = 0; i < n; i++) CHECK_EQ(co_pool_submit(churn_pool, churn_task, NULL), 0);
    atomic_fetch_sub(&churn_left, 1);
}
static long churn_n;
static void churn_co(void *arg) { churn_submit(churn_n); }
static void *churn_thread(void *arg) {
    churn_submit(churn_n);
    return NULL;
}

static void churn(void) {
    for (int prealloc = 0; prealloc < 2; prealloc++) {
        co_pool_opts_t o = {.prealloc = prealloc != 0};
        CHECK_EQ(co_pool_new(&churn_pool, 64, &o), 0);
        churn_n = scaled(50000, 5000);
        atomic_store(&churn_ran, 0);
        atomic_store(&churn_left, 4);
        pthread_t th[2];
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, churn_thread, NULL);
        for (int i = 0; i < 2; i++) CHECK_EQ(co_go(churn_co, NULL), 0);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        CHECK(WAIT_FOR(atomic_load(&churn_left) == 0));
        CHECK_EQ(co_pool_wait_idle(churn_pool, CO_FOREVER), 0);
        long total = 4 * churn_n;
        CHECK_EQ(atomic_load(&churn_ran), total);
        co_pool_stats_t st;
        co_pool_stats(churn_pool, &st);
        CHECK_EQ(st.submitted, total);
        CHECK_EQ(st.completed, total);
        CHECK_EQ(st.rejected, 0);
        CHECK_EQ(st.busy, 0);
        CHECK(st.idle >= 1 && st.idle <= 64);
        CHECK(co_pool_running(churn_pool) <= 64);
        CHECK_EQ(co_pool_running(churn_pool) + co_pool_available(churn_pool), 64);
        co_pool_destroy(churn_pool);
    }
}

/* ---- no task is ever lost ------------------------------------------------ */

#define STORM_MAX 200000
static co_pool_t *storm_pool;
static atomic_uchar storm_runs[STORM_MAX];
static atomic_uchar storm_accepted[STORM_MAX];
static atomic_int storm_next, storm_total, storm_stop, storm_submitters;
static atomic_long storm_err[16];

static void storm_task(void *arg) {
    int id = (int)(intptr_t)arg;
    atomic_fetch_add(&storm_runs[id], 1);
    if (id % 7 == 0) co_yield();
    if (id % 11 == 0) co_sleep(100 * 1000);
    if (id % 97 == 0) co_panic(arg); /* a panicking task still ran once */
}
static void storm_submit_one(void) {
    int id = atomic_fetch_add(&storm_next, 1);
    if (id >= atomic_load(&storm_total)) return;
    int rc = (id % 3 == 0) ? co_pool_submit_until(storm_pool, storm_task, (void *)(intptr_t)id,
                                                  co_deadline_after(200 * 1000))
                           : co_pool_submit(storm_pool, storm_task, (void *)(intptr_t)id);
    if (rc == 0)
        atomic_store(&storm_accepted[id], 1);
    else
        atomic_fetch_add(&storm_err[-rc % 16], 1);
    if (rc == CO_ECLOSED) co_sleep(20 * 1000); /* let the chaos reopen it */
}
static void storm_co(void *arg) {
    while (atomic_load(&storm_next) < atomic_load(&storm_total)) storm_submit_one();
    atomic_fetch_sub(&storm_submitters, 1);
}
static void *storm_thread(void *arg) {
    storm_co(arg);
    return NULL;
}
static void *storm_chaos(void *arg) {
    unsigned seed = 12345;
    while (!atomic_load(&storm_stop)) {
        seed = seed * 1103515245u + 12345u;
        switch ((seed >> 16) % 4) {
        case 0: co_pool_release(storm_pool); break;
        case 1: (void)co_pool_release_timeout(storm_pool, 1 * MS); break;
        case 2: co_pool_tune(storm_pool, 1 + (int)((seed >> 8) % 16)); break;
        case 3: (void)co_pool_wait_idle(storm_pool, co_deadline_after(1 * MS)); break;
        }
        co_sleep(20 * 1000);
        co_pool_reboot(storm_pool); /* closed windows are short */
        co_sleep(200 * 1000);
    }
    return NULL;
}

static void no_task_lost_storm(void) {
    int total = scaled(STORM_MAX, 20000);
    co_pool_opts_t o = {.panic_handler = quiet, .expiry_ns = 2 * MS};
    CHECK_EQ(co_pool_new(&storm_pool, 8, &o), 0);
    memset(storm_runs, 0, sizeof storm_runs);
    memset(storm_accepted, 0, sizeof storm_accepted);
    atomic_store(&storm_next, 0);
    atomic_store(&storm_total, total);
    atomic_store(&storm_stop, 0);
    int ncos = 6, nthreads = 2;
    atomic_store(&storm_submitters, ncos + nthreads);
    pthread_t chaos[2], th[2];
    for (int i = 0; i < 2; i++) pthread_create(&chaos[i], NULL, storm_chaos, NULL);
    for (int i = 0; i < ncos; i++) CHECK_EQ(co_go(storm_co, NULL), 0);
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, storm_thread, NULL);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    CHECK(WAIT_FOR(atomic_load(&storm_submitters) == 0));
    atomic_store(&storm_stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(chaos[i], NULL);
    co_pool_reboot(storm_pool);
    CHECK_EQ(co_pool_wait_idle(storm_pool, CO_FOREVER), 0);
    long accepted = 0, lost = 0, extra = 0;
    for (int i = 0; i < total; i++) {
        int runs = atomic_load(&storm_runs[i]);
        int acc = atomic_load(&storm_accepted[i]);
        accepted += acc;
        if (acc && runs != 1) {
            lost++;
            fprintf(stderr, "task %d: accepted, ran %d times\n", i, runs);
        }
        if (!acc && runs != 0) extra++;
    }
    CHECK_EQ(lost, 0);  /* accepted: ran exactly once */
    CHECK_EQ(extra, 0); /* refused: never ran */
    co_pool_stats_t st;
    co_pool_stats(storm_pool, &st);
    CHECK_EQ(st.submitted, accepted);
    CHECK_EQ(st.completed + st.panicked, accepted);
    CHECK_EQ(st.rejected, total - accepted);
    CHECK_EQ(st.busy, 0);
    CHECK_EQ(st.waiting, 0);
    fprintf(stderr, "storm: %d submits, %ld accepted, closed %ld, timed out %ld, panicked %lld\n",
            total, accepted, atomic_load(&storm_err[-CO_ECLOSED % 16]),
            atomic_load(&storm_err[-CO_ETIMEDOUT % 16]), (long long)st.panicked);
    co_pool_destroy(storm_pool);
}

/* A submitter blocked on a full pool and sent round again by a resize
 * that makes room may drop the pool's lock to allocate a worker record
 * (CO__FAIL_SLOW_ALLOC holds it there 100 ms): co_pool_destroy waits for
 * it, as for any blocked submitter, and does not free the pool under it
 * (a use after free, which the ASan build reports). */
static atomic_int dr_gate, dr_b_ran, dr_rc = 1;
static void dr_task_a(void *arg) {
    (void)arg;
    while (!atomic_load(&dr_gate)) co_sleep(CO_MILLISECOND);
}
static void dr_task_b(void *arg) {
    (void)arg;
    atomic_store(&dr_b_ran, 1);
}
static void *dr_submitter(void *arg) {
    atomic_store(&dr_rc, co_pool_submit(arg, dr_task_b, NULL));
    return NULL;
}
static void destroy_waits_for_retry(void) {
    co_pool_t *p;
    CHECK_EQ(co_pool_new(&p, 1, NULL), 0);
    CHECK_EQ(co_pool_submit(p, dr_task_a, NULL), 0);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, dr_submitter, p), 0);
    int64_t end = co_now() + 10 * CO_SECOND;
    while (co_pool_waiting(p) != 1 && co_now() < end) usleep(1000);
    CHECK_EQ(co_pool_waiting(p), 1);
    t_fail(CO__FAIL_SLOW_ALLOC, true);
    co_pool_tune(p, 2); /* room: the submitter goes round again, and allocates */
    usleep(20000);
    atomic_store(&dr_gate, 1);
    co_pool_destroy(p);
    t_fail(CO__FAIL_SLOW_ALLOC, false);
    pthread_join(th, NULL);
    int rc = atomic_load(&dr_rc);
    CHECK(rc == 0 || rc == CO_ECLOSED);
    CHECK_EQ(atomic_load(&dr_b_ran), rc == 0); /* accepted: ran; refused: never */
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "child-destroy-self")) {
        signal(SIGABRT, SIG_DFL);
        return co_main(child_destroy_self, NULL);
    }
    t_begin(280);
    T_RUN_SEL(destroy_from_own_task); /* forks first */
    T_RUN_SEL(submit_until);
    T_RUN_SEL(wait_idle);
    T_RUN_SEL(wait_idle_many);
    T_RUN_SEL(stats_exact);
    T_RUN_SEL(deadlock_detect);
    T_RUN_SEL(release_from_own_task);
    T_RUN_SEL(idle_holds_no_stack);
    T_RUN_SEL(takeover);
    T_RUN_SEL(fp_inherited);
    T_RUN_SEL(token_oom);
    T_RUN_SEL(chute_races);
    T_RUN_SEL(release_reboot_race);
    T_RUN_SEL(destroy_waits_for_retry);
    T_RUN_SEL(churn);
    T_RUN_SEL(no_task_lost_storm);
    return t_end();
}
