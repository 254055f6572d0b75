/* Fork-join and the fresh deque (sched_impl.h's "work-first"): a spawn
 * that finds runnext taken goes on a per-P Chase-Lev deque, run newest
 * first by its owner, taken oldest first by thieves.
 *  - the deque itself, its owner against thieves on plain threads: every
 *    entry taken exactly once;
 *  - deep fan-outs joined by waitgroups, on 1 P and on several: the right
 *    result, and live coroutines bounded by the tree's depth rather than
 *    its breadth (the ring's oldest-first order kept thousands alive);
 *  - a spawn parked on a busy P's deque is not stranded there;
 *  - fairness: a loop that forks and joins for ever on one P cannot keep
 *    an older spawn, or a coroutine that yields, from running. */
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <pthread.h>
#include <stdlib.h>

/* ---- the deque: one owner, two thieves, every entry taken once ---------- */

#define DQ_ITEMS 200000
#define DQ_THIEVES 2
static co_p_t *dq_p;
static unsigned char dq_taken[DQ_ITEMS]; /* atomic: how many times each was taken */
static int dq_done;                      /* atomic: the owner has pushed all */
static long dq_stolen;                   /* atomic */
static int dq_started;                   /* atomic: thieves running */
/* Entries are addresses into this array (8-byte aligned, as Gs are); only
 * their identity matters, nothing is read through them. */
static long long dq_slot[DQ_ITEMS];

static void dq_take(co_g_t *g) {
    long i = (long long *)(void *)g - dq_slot;
    if (i < 0 || i >= DQ_ITEMS) {
        CHECK(!"an entry that was never pushed");
        return;
    }
    __atomic_add_fetch(&dq_taken[i], 1, __ATOMIC_RELAXED);
}

static void *dq_thief(void *arg) {
    (void)arg;
    __atomic_add_fetch(&dq_started, 1, __ATOMIC_RELEASE);
    for (;;) {
        bool done = __atomic_load_n(&dq_done, __ATOMIC_ACQUIRE);
        co_g_t *g = co__flifo_steal(dq_p);
        if (g) {
            dq_take(g);
            __atomic_add_fetch(&dq_stolen, 1, __ATOMIC_RELAXED);
        } else if (done) {
            return NULL; /* empty after the owner finished: nothing comes */
        }
    }
}

static void test_deque_owner_and_thieves(void) {
    dq_p = calloc(1, sizeof *dq_p);
    CHECK(dq_p != NULL);
    if (!dq_p) return;
    pthread_t t[DQ_THIEVES];
    for (int i = 0; i < DQ_THIEVES; i++) CHECK_EQ(pthread_create(&t[i], NULL, dq_thief, NULL), 0);
    while (__atomic_load_n(&dq_started, __ATOMIC_ACQUIRE) < DQ_THIEVES) usleep(100);
    /* The owner pushes in bursts and pops some back, newest first: an
     * owner's pop checks it gets what it pushed last unless a thief took
     * that (then the deque was down to it). */
    int next = 0, full = 0;
    while (next < DQ_ITEMS) {
        int burst = 1 + next % 7;
        co_g_t *last = NULL;
        for (int k = 0; k < burst && next < DQ_ITEMS; k++) {
            co_g_t *g = (co_g_t *)(void *)&dq_slot[next];
            if (co__test_flifo_push(dq_p, g)) {
                last = g;
                next++;
            } else {
                full++;
                co_g_t *o = co__test_flifo_pop(dq_p); /* make room */
                if (o) dq_take(o);
                last = NULL;
            }
        }
        /* about as many pops as pushes: the thieves find it short */
        for (int k = burst - (next & 1); k > 0; k--) {
            co_g_t *o = co__test_flifo_pop(dq_p);
            if (!o) break;
            if (last) CHECK(o == last); /* newest first */
            last = NULL;
            dq_take(o);
        }
    }
    __atomic_store_n(&dq_done, 1, __ATOMIC_RELEASE);
    for (co_g_t *o; (o = co__test_flifo_pop(dq_p));) dq_take(o);
    for (int i = 0; i < DQ_THIEVES; i++) pthread_join(t[i], NULL);
    CHECK(co__flifo_steal(dq_p) == NULL);
    int bad = 0;
    for (int i = 0; i < DQ_ITEMS; i++)
        if (__atomic_load_n(&dq_taken[i], __ATOMIC_RELAXED) != 1) bad++;
    CHECK_EQ(bad, 0);
    fprintf(stderr, "   %d pushed, %ld stolen, %d pushes found it full\n", DQ_ITEMS,
            __atomic_load_n(&dq_stolen, __ATOMIC_RELAXED), full);
    free(dq_p);
}

/* ---- deep fan-outs joined by waitgroups -------------------------------- */

/* fib(n), a coroutine per call above the cut-off; the largest co_count()
 * seen from inside the tree. */
static int fj_cutoff;
static int fj_maxlive; /* atomic */

typedef struct {
    int n;
    long r;
    co_waitgroup_t *wg;
} fj_job_t;

static long fib_seq(int n) { return n < 2 ? n : fib_seq(n - 1) + fib_seq(n - 2); }

static void fj_co(void *arg);

static long fj_par(int n) {
    if (n <= fj_cutoff) return fib_seq(n);
    int live = co_count();
    int seen = __atomic_load_n(&fj_maxlive, __ATOMIC_RELAXED);
    while (live > seen &&
           !__atomic_compare_exchange_n(&fj_maxlive, &seen, live, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    fj_job_t a = {n - 1, 0, &wg}, b = {n - 2, 0, &wg};
    co_waitgroup_add(&wg, (a.n > fj_cutoff) + (b.n > fj_cutoff));
    fj_job_t *j[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        if (j[i]->n > fj_cutoff)
            CHECK_EQ(co_go(fj_co, j[i]), 0);
        else
            j[i]->r = fib_seq(j[i]->n);
    }
    co_waitgroup_wait(&wg);
    return a.r + b.r;
}

static void fj_co(void *arg) {
    fj_job_t *j = arg;
    j->r = fj_par(j->n);
    co_waitgroup_done(j->wg);
}

static long fj_want(int n) {
    long a = 0, b = 1;
    for (int i = 0; i < n; i++) {
        long t = a + b;
        a = b;
        b = t;
    }
    return a;
}

typedef struct {
    int n, cutoff;
    long r;
} fj_run_t;

static int fj_main(void *arg) {
    fj_run_t *r = arg;
    fj_cutoff = r->cutoff;
    __atomic_store_n(&fj_maxlive, 0, __ATOMIC_RELAXED);
    r->r = fj_par(r->n);
    return 0;
}

/* The tree of fib(24) above cut-off 4 is 20 calls deep and has 75,000
 * coroutines. Run newest first, a P holds about one chain of parents and
 * their pending second children, 2 x 20 on each P; sysmon lending a P
 * (under load) and the fairness moves open a few chains early. Opened
 * oldest first (the ring's order), 1,900 were alive at once on 1 P and
 * 4,200 on 2. The bound is loose: 25 times the chain on each P. */
static void fanout(int procs, int rounds) {
    t_start(procs);
    for (int i = 0; i < rounds; i++) {
        fj_run_t r = {24, 4, 0};
        CHECK_EQ(co_main(fj_main, &r), 0);
        CHECK_EQ(r.r, fj_want(24));
        int live = __atomic_load_n(&fj_maxlive, __ATOMIC_RELAXED);
        if (i == 0) fprintf(stderr, "   %d P: at most %d coroutines alive\n", procs, live);
        CHECK(live <= 500 * procs + 500);
    }
    t_stop();
}

static void test_fanout_1p(void) { fanout(1, 2); }
static void test_fanout_2p(void) { fanout(2, 3); }
static void test_fanout_4p(void) { fanout(4, 2); }

/* ---- a spawn on a busy P's deque is not stranded ----------------------- */

/* On 2 Ps, a coroutine spawns two children (the first takes runnext, the
 * second the deque) and computes until both have run, never entering the
 * scheduler: only another P can run them (a thief, or the spare P sysmon
 * lends in its place, which gets the deque). */
static int busy_flags[2]; /* atomic */

static void busy_child(void *arg) { __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE); }

static int busy_main(void *arg) {
    (void)arg;
    for (int round = 0; round < 20; round++) {
        busy_flags[0] = busy_flags[1] = 0;
        CHECK_EQ(co_go(busy_child, &busy_flags[0]), 0);
        CHECK_EQ(co_go(busy_child, &busy_flags[1]), 0);
        while (!__atomic_load_n(&busy_flags[0], __ATOMIC_ACQUIRE) ||
               !__atomic_load_n(&busy_flags[1], __ATOMIC_ACQUIRE)) {
        }
        co_yield(); /* the children exit */
    }
    return 0;
}

static void test_busy_owner_not_stranded(void) {
    t_start(2);
    CHECK_EQ(co_main(busy_main, NULL), 0);
    t_stop();
}

/* ---- fairness: a loop that forks and joins for ever -------------------- */

/* On 1 P: an older spawn sits at the bottom of the deque (runnext was
 * taken when it was made), a coroutine yields in a loop, and a spawner
 * forks two children and joins them, again and again, each round pushing
 * above the old one, until both the old spawn has run and the yielder has
 * finished. Run newest first with nothing else, the old one would wait
 * for ever, and the yielder behind the deque too: every 61st schedule
 * takes the ring first, and an oldest entry that stays the oldest moves
 * to the ring. */
static int fair_old_ran, fair_yields_done; /* atomic */
static long fair_rounds;

static void fair_leaf(void *arg) { co_waitgroup_done(arg); }
static void fair_old(void *arg) {
    (void)arg;
    __atomic_store_n(&fair_old_ran, 1, __ATOMIC_RELEASE);
}
static void fair_yielder(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) co_yield();
    __atomic_store_n(&fair_yields_done, 1, __ATOMIC_RELEASE);
}
static void fair_nop(void *arg) { (void)arg; }

static void fair_spawner(void *arg) {
    co_waitgroup_t *done = arg;
    CHECK_EQ(co_go(fair_nop, NULL), 0);     /* takes runnext */
    CHECK_EQ(co_go(fair_old, NULL), 0);     /* so this one goes on the deque */
    CHECK_EQ(co_go(fair_yielder, NULL), 0); /* and this one */
    while (!__atomic_load_n(&fair_old_ran, __ATOMIC_ACQUIRE) ||
           !__atomic_load_n(&fair_yields_done, __ATOMIC_ACQUIRE)) {
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        co_waitgroup_add(&wg, 2);
        CHECK_EQ(co_go(fair_leaf, &wg), 0);
        CHECK_EQ(co_go(fair_leaf, &wg), 0);
        co_waitgroup_wait(&wg);
        fair_rounds++;
    }
    co_waitgroup_done(done);
}

static int fair_main(void *arg) {
    (void)arg;
    co_waitgroup_t done = CO_WAITGROUP_INIT;
    co_waitgroup_add(&done, 1);
    CHECK_EQ(co_go(fair_spawner, &done), 0);
    co_waitgroup_wait(&done);
    return 0;
}

static void test_fork_loop_cannot_starve(void) {
    t_start(1);
    CHECK_EQ(co_main(fair_main, NULL), 0);
    CHECK(__atomic_load_n(&fair_old_ran, __ATOMIC_ACQUIRE));
    CHECK(__atomic_load_n(&fair_yields_done, __ATOMIC_ACQUIRE));
    fprintf(stderr, "   %ld fork-join rounds before both ran\n", fair_rounds);
    t_stop();
}

int main(void) {
    t_begin(100);
    T_RUN(test_deque_owner_and_thieves);
    T_RUN(test_fanout_1p);
    T_RUN(test_fanout_2p);
    T_RUN(test_fanout_4p);
    T_RUN(test_busy_owner_not_stranded);
    T_RUN(test_fork_loop_cannot_starve);
    return t_end();
}
