/* Mutex, RWMutex, Cond, Once and Spinlock: unit tests of every function,
 * from coroutines and plain threads, and the misuse that must abort. */
// ctest-timeout: 250
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


/* hidden test hook in src/sync.c */

#define MS (1000 * 1000LL)

/* ---- helpers: run fn in n coroutines and m threads, wait for all -------- */
typedef struct {
    void (*fn)(void *, int);
    void *arg;
    int idx;
    co_waitgroup_t *wg;
} job_t;
static void job_co(void *a) {
    job_t *j = a;
    j->fn(j->arg, j->idx);
    co_waitgroup_done(j->wg);
}
static void *job_th(void *a) {
    job_t *j = a;
    j->fn(j->arg, j->idx);
    return NULL;
}
static void run_mixed(int ncos, int nths, void (*fn)(void *, int), void *arg) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    job_t *jobs = calloc((size_t)(ncos + nths), sizeof *jobs);
    pthread_t *th = calloc((size_t)nths + 1, sizeof *th);
    co_waitgroup_add(&wg, ncos);
    for (int i = 0; i < ncos + nths; i++) jobs[i] = (job_t){fn, arg, i, &wg};
    for (int i = 0; i < ncos; i++) CHECK_EQ(co_go(job_co, &jobs[i]), 0);
    for (int i = 0; i < nths; i++) CHECK_EQ(pthread_create(&th[i], NULL, job_th, &jobs[ncos + i]), 0);
    for (int i = 0; i < nths; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&wg);
    free(jobs);
    free(th);
}

/* ---- misuse: run a case in a fresh process, expect SIGABRT + message ---- */
static void expect_abort(const char *name, const char *op) {
    t_expect_abort("test_sync", name, op);
}

static co_once_t rec_once = CO_ONCE_INIT;
static void rec_fn(void *a) { co_once(&rec_once, rec_fn, a); }

static void rw_pending_writer(void *rw) {
    co_rwmutex_lock(rw);
    co_rwmutex_unlock(rw);
}

static void rw_queued_reader(void *rw) {
    co_rwmutex_rlock(rw);
    co_rwmutex_runlock(rw);
}

static int run_misuse(const char *name) {
    static co_mutex_t m = CO_MUTEX_INIT;
    static co_rwmutex_t rw = CO_RWMUTEX_INIT;
    static co_cond_t c = CO_COND_INIT;
    static co_spinlock_t sl = CO_SPINLOCK_INIT;
    static co_once_t o = CO_ONCE_INIT;
    if (!strcmp(name, "mutex_unlock")) {
        fprintf(stderr, "obj=%p\n", (void *)&m);
        co_mutex_unlock(&m);
    } else if (!strcmp(name, "mutex_unlock_twice")) {
        fprintf(stderr, "obj=%p\n", (void *)&m);
        co_mutex_lock(&m);
        co_mutex_unlock(&m);
        co_mutex_unlock(&m);
    } else if (!strcmp(name, "rw_runlock")) {
        fprintf(stderr, "obj=%p\n", (void *)&rw);
        co_rwmutex_runlock(&rw);
    } else if (!strcmp(name, "rw_runlock_writer")) {
        fprintf(stderr, "obj=%p\n", (void *)&rw);
        co_rwmutex_lock(&rw);
        co_rwmutex_runlock(&rw);
    } else if (!strcmp(name, "rw_runlock_writer_queued")) {
        /* write-locked with a reader queued behind: the queued reader's add
         * hid the writer from the count, and the stray runlock went through
         * (the next writer then got in beside a reader) */
        fprintf(stderr, "obj=%p\n", (void *)&rw);
        co_rwmutex_lock(&rw);
        int32_t c0 = co__rwmutex_reader_count(&rw);
        co_go(rw_queued_reader, &rw);
        while (co__rwmutex_reader_count(&rw) == c0) co_sleep(1000000);
        co_rwmutex_runlock(&rw);
    } else if (!strcmp(name, "rw_unlock")) {
        fprintf(stderr, "obj=%p\n", (void *)&rw);
        co_rwmutex_unlock(&rw);
    } else if (!strcmp(name, "rw_unlock_reader")) {
        fprintf(stderr, "obj=%p\n", (void *)&rw);
        co_rwmutex_rlock(&rw);
        co_rwmutex_unlock(&rw);
    } else if (!strcmp(name, "rw_unlock_pending_writer")) {
        /* read-locked, a writer pending: the count alone looked like a
         * write-locked rwmutex with one reader queued, and the stray unlock
         * went through (the writer then waited for good) */
        fprintf(stderr, "obj=%p\n", (void *)&rw);
        co_rwmutex_rlock(&rw);
        co_go(rw_pending_writer, &rw);
        while (co__rwmutex_reader_count(&rw) >= 0) co_sleep(1000000);
        co_rwmutex_unlock(&rw);
    } else if (!strcmp(name, "cond_unlocked")) {
        fprintf(stderr, "obj=%p\n", (void *)&m);
        co_cond_wait(&c, &m);
    } else if (!strcmp(name, "spin_unlock")) {
        fprintf(stderr, "obj=%p\n", (void *)&sl);
        co_spinlock_unlock(&sl);
    } else if (!strcmp(name, "once_recursive")) {
        fprintf(stderr, "obj=%p\n", (void *)&rec_once);
        co_once(&rec_once, rec_fn, NULL);
    } else if (!strcmp(name, "once_null")) {
        fprintf(stderr, "obj=%p\n", (void *)&o);
        co_once(&o, NULL, NULL);
    } else {
        return 2;
    }
    return 0; /* not reached when the misuse is caught */
}

static void test_misuse(void) {
    expect_abort("mutex_unlock", "co_mutex_unlock");
    expect_abort("mutex_unlock_twice", "unlock of unlocked mutex");
    expect_abort("rw_runlock", "co_rwmutex_runlock");
    expect_abort("rw_runlock_writer", "co_rwmutex_runlock");
    expect_abort("rw_runlock_writer_queued", "runlock of unlocked rwmutex");
    expect_abort("rw_unlock", "co_rwmutex_unlock");
    expect_abort("rw_unlock_reader", "co_rwmutex_unlock");
    expect_abort("rw_unlock_pending_writer", "unlock of unlocked rwmutex");
    expect_abort("cond_unlocked", "co_cond_wait");
    expect_abort("spin_unlock", "co_spinlock_unlock");
    expect_abort("once_recursive", "co_once");
    expect_abort("once_null", "co_once");
}

/* ---- mutex ------------------------------------------------------------- */
static void test_mutex_init(void) {
    co_mutex_t a = CO_MUTEX_INIT, z;
    memset(&z, 0, sizeof z);
    CHECK(memcmp(&a, &z, sizeof a) == 0);
    co_rwmutex_t rw = CO_RWMUTEX_INIT, rz;
    memset(&rz, 0, sizeof rz);
    CHECK(memcmp(&rw, &rz, sizeof rw) == 0);
    co_cond_t c = CO_COND_INIT, cz;
    memset(&cz, 0, sizeof cz);
    CHECK(memcmp(&c, &cz, sizeof c) == 0);
    co_once_t o = CO_ONCE_INIT, oz;
    memset(&oz, 0, sizeof oz);
    CHECK(memcmp(&o, &oz, sizeof o) == 0);
    co_spinlock_t s = CO_SPINLOCK_INIT, sz;
    memset(&sz, 0, sizeof sz);
    CHECK(memcmp(&s, &sz, sizeof s) == 0);
    /* a zero-filled mutex works */
    co_mutex_lock(&z);
    CHECK(co_mutex_trylock(&z) < 0);
    co_mutex_unlock(&z);
}

static void test_mutex_trylock(void) {
    co_mutex_t m = CO_MUTEX_INIT;
    CHECK_EQ(co_mutex_trylock(&m), 0);
    CHECK_EQ(co_mutex_trylock(&m), CO_EBUSY);
    co_mutex_unlock(&m);
    co_mutex_lock(&m);
    CHECK_EQ(co_mutex_trylock(&m), CO_EBUSY);
    co_mutex_unlock(&m);
    CHECK_EQ(co_mutex_trylock(&m), 0);
    co_mutex_unlock(&m);
}

/* A thread holds the mutex; a coroutine blocks on it, then a thread
 * blocks behind the coroutine: each gets it after the holder lets go. */
static co_mutex_t hm = CO_MUTEX_INIT;
static int hm_stage; /* protected by hm (and atomics for polling) */
static void hm_co(void *a) {
    co_waitgroup_t *wg = a;
    co_mutex_lock(&hm);
    CHECK(__atomic_load_n(&hm_stage, __ATOMIC_RELAXED) >= 1);
    __atomic_add_fetch(&hm_stage, 10, __ATOMIC_RELAXED);
    co_mutex_unlock(&hm);
    co_waitgroup_done(wg);
}
static void *hm_th(void *a) {
    co_mutex_lock(&hm);
    CHECK(__atomic_load_n(&hm_stage, __ATOMIC_RELAXED) >= 1);
    __atomic_add_fetch(&hm_stage, 100, __ATOMIC_RELAXED);
    co_mutex_unlock(&hm);
    return NULL;
}
static void test_mutex_handoff(void) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_mutex_lock(&hm); /* main thread holds it */
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(hm_co, &wg), 0);
    pthread_t th;
    pthread_create(&th, NULL, hm_th, NULL);
    co_sleep(20 * MS); /* let both block (not required for correctness) */
    CHECK_EQ(__atomic_load_n(&hm_stage, __ATOMIC_RELAXED), 0);
    __atomic_store_n(&hm_stage, 1, __ATOMIC_RELAXED);
    co_mutex_unlock(&hm);
    pthread_join(th, NULL);
    co_waitgroup_wait(&wg);
    CHECK_EQ(hm_stage, 111);
    CHECK_EQ(co_mutex_trylock(&hm), 0);
    co_mutex_unlock(&hm);
}

/* ---- rwmutex ------------------------------------------------------------ */
/* n readers must all hold the read lock at once to pass the barrier. */
typedef struct {
    co_rwmutex_t rw;
    int n, inside;
} rdr_t;
static void readers_together(void *a, int idx) {
    rdr_t *r = a;
    co_rwmutex_rlock(&r->rw);
    __atomic_add_fetch(&r->inside, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&r->inside, __ATOMIC_ACQUIRE) < r->n) co_sleep(MS / 2);
    co_rwmutex_runlock(&r->rw);
}
static void test_rwmutex_shared(void) {
    rdr_t r = {CO_RWMUTEX_INIT, 6, 0};
    run_mixed(4, 2, readers_together, &r);
    CHECK_EQ(r.inside, 6);
    /* a writer can take it afterwards, exclusively */
    co_rwmutex_lock(&r.rw);
    co_rwmutex_unlock(&r.rw);
}

/* Readers and writers hammer a pair of counters that writers keep equal. */
typedef struct {
    co_rwmutex_t rw;
    long a, b;
    int iters;
    int readers_in, writers_in;
} rwx_t;
static void rw_worker(void *p, int idx) {
    rwx_t *x = p;
    for (int i = 0; i < x->iters; i++) {
        if ((i + idx) % 4 == 0) {
            co_rwmutex_lock(&x->rw);
            CHECK_EQ(__atomic_add_fetch(&x->writers_in, 1, __ATOMIC_RELAXED), 1);
            CHECK_EQ(__atomic_load_n(&x->readers_in, __ATOMIC_RELAXED), 0);
            x->a++;
            if (i % 8 == 0) co_yield();
            x->b++;
            __atomic_sub_fetch(&x->writers_in, 1, __ATOMIC_RELAXED);
            co_rwmutex_unlock(&x->rw);
        } else {
            co_rwmutex_rlock(&x->rw);
            __atomic_add_fetch(&x->readers_in, 1, __ATOMIC_RELAXED);
            CHECK_EQ(__atomic_load_n(&x->writers_in, __ATOMIC_RELAXED), 0);
            CHECK_EQ(x->a, x->b);
            __atomic_sub_fetch(&x->readers_in, 1, __ATOMIC_RELAXED);
            co_rwmutex_runlock(&x->rw);
        }
    }
}
static void test_rwmutex_stress(void) {
    rwx_t *x = calloc(1, sizeof *x);
    x->iters = t_small() ? 2000 : 20000;
    run_mixed(8, 2, rw_worker, x);
    CHECK_EQ(x->a, x->b);
    CHECK_EQ(x->a, (long)10 * x->iters / 4);
    CHECK_EQ(co__rwmutex_reader_count(&x->rw), 0);
    free(x);
}

/* A pending writer blocks new readers: R1 holds, W queues, R2 arrives
 * after W and must not get in before W is done. */
static co_rwmutex_t wp_rw = CO_RWMUTEX_INIT;
static int wp_w_done, wp_r2_got;
static void wp_writer(void *a) {
    co_rwmutex_lock(&wp_rw);
    co_sleep(10 * MS);
    CHECK_EQ(__atomic_load_n(&wp_r2_got, __ATOMIC_ACQUIRE), 0);
    __atomic_store_n(&wp_w_done, 1, __ATOMIC_RELEASE);
    co_rwmutex_unlock(&wp_rw);
    co_waitgroup_done(a);
}
static void *wp_reader2(void *a) {
    co_rwmutex_rlock(&wp_rw);
    CHECK_EQ(__atomic_load_n(&wp_w_done, __ATOMIC_ACQUIRE), 1);
    __atomic_store_n(&wp_r2_got, 1, __ATOMIC_RELEASE);
    co_rwmutex_runlock(&wp_rw);
    return NULL;
}
static void test_rwmutex_writer_preferred(void) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_rwmutex_rlock(&wp_rw); /* R1: this thread */
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(wp_writer, &wg), 0);
    while (co__rwmutex_reader_count(&wp_rw) >= 0) co_sleep(MS); /* W is pending */
    pthread_t r2;
    pthread_create(&r2, NULL, wp_reader2, NULL);
    co_sleep(10 * MS);
    CHECK_EQ(__atomic_load_n(&wp_r2_got, __ATOMIC_ACQUIRE), 0); /* R2 waits behind W */
    co_rwmutex_runlock(&wp_rw);
    pthread_join(r2, NULL);
    co_waitgroup_wait(&wg);
    CHECK_EQ(wp_r2_got, 1);
}

/* Writer not starved: readers overlap continuously, the writer still gets
 * in, repeatedly. */
typedef struct {
    co_rwmutex_t rw;
    int stop;
    int reads;
} ws_t;
static void ws_reader(void *p, int idx) {
    ws_t *w = p;
    while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
        co_rwmutex_rlock(&w->rw);
        __atomic_add_fetch(&w->reads, 1, __ATOMIC_RELAXED);
        co_sleep(MS / 4);
        co_rwmutex_runlock(&w->rw);
    }
}
static void ws_writer(void *p) {
    ws_t *w = p;
    /* Readers first: the writer must get in while they overlap (and a
     * writer that ran its 20 rounds before any reader started would leave
     * the test nothing to check). */
    for (int i = 0; i < 40000 && !__atomic_load_n(&w->reads, __ATOMIC_RELAXED); i++)
        co_sleep(MS / 4);
    for (int i = 0; i < 20; i++) {
        co_rwmutex_lock(&w->rw);
        co_rwmutex_unlock(&w->rw);
        co_sleep(MS / 4);
    }
    __atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
}
static void ws_all(void *p, int idx) {
    if (idx == 0)
        ws_writer(p);
    else
        ws_reader(p, idx);
}
static void test_rwmutex_writer_not_starved(void) {
    ws_t w = {CO_RWMUTEX_INIT, 0, 0};
    run_mixed(5, 1, ws_all, &w); /* writer is coroutine 0; 4 coroutine + 1 thread readers */
    CHECK_EQ(w.stop, 1);
    CHECK(w.reads > 0);
}

/* ---- cond --------------------------------------------------------------- */
typedef struct {
    co_mutex_t m;
    co_cond_t c;
    int waiting, woken, go;
} cw_t;
static void cond_waiter(void *p, int idx) {
    cw_t *w = p;
    co_mutex_lock(&w->m);
    w->waiting++;
    while (!w->go) co_cond_wait(&w->c, &w->m);
    w->go--;
    w->woken++;
    co_mutex_unlock(&w->m);
}
static int cw_get(cw_t *w, int *f) {
    co_mutex_lock(&w->m);
    int v = *f;
    co_mutex_unlock(&w->m);
    return v;
}
typedef struct {
    cw_t *w;
    int ncos, nths;
} cw_run_t;
static void *cw_runner(void *p) {
    cw_run_t *r = p;
    run_mixed(r->ncos, r->nths, cond_waiter, r->w);
    return NULL;
}
static void test_cond_signal_broadcast(void) {
    cw_t w = {CO_MUTEX_INIT, CO_COND_INIT, 0, 0, 0};
    cw_run_t r = {&w, 4, 2};
    pthread_t runner;
    pthread_create(&runner, NULL, cw_runner, &r);
    while (cw_get(&w, &w.waiting) < 6) co_sleep(MS);
    co_cond_signal(&w.c); /* spurious: go == 0, the woken one waits again */
    co_mutex_lock(&w.m);
    w.go = 1;
    co_cond_signal(&w.c);
    co_mutex_unlock(&w.m);
    while (cw_get(&w, &w.woken) < 1) co_sleep(MS);
    co_sleep(10 * MS);
    CHECK_EQ(cw_get(&w, &w.woken), 1);
    co_mutex_lock(&w.m);
    w.go = 5;
    co_cond_broadcast(&w.c);
    co_mutex_unlock(&w.m);
    pthread_join(runner, NULL);
    CHECK_EQ(w.woken, 6);
    co_cond_signal(&w.c);    /* no waiters: no-op */
    co_cond_broadcast(&w.c); /* no waiters: no-op */
}

static void cond_timeout_body(void *p, int idx) {
    co_mutex_t *m = p;
    co_cond_t c = CO_COND_INIT;
    co_mutex_lock(m);
    CHECK_EQ(co_cond_wait_until(&c, m, 0), CO_ETIMEDOUT); /* past: no wait */
    CHECK_EQ(co_mutex_trylock(m), CO_EBUSY);               /* re-acquired */
    CHECK_EQ(co_cond_wait_until(&c, m, co_now() - 1), CO_ETIMEDOUT);
    CHECK_EQ(co_cond_wait_until(&c, m, co_deadline_after(5 * MS)), CO_ETIMEDOUT);
    CHECK_EQ(co_mutex_trylock(m), CO_EBUSY);
    co_mutex_unlock(m);
}
static void test_cond_timeout(void) {
    co_mutex_t m1 = CO_MUTEX_INIT, m2 = CO_MUTEX_INIT;
    cond_timeout_body(&m1, 0); /* plain thread */
    run_mixed(1, 0, cond_timeout_body, &m2);
}

/* wait_until returns 0 when signalled before the deadline, with the mutex
 * held. */
static void test_cond_signal_before_deadline(void) {
    cw_t w = {CO_MUTEX_INIT, CO_COND_INIT, 0, 0, 0};
    pthread_t th;
    co_mutex_lock(&w.m);
    /* the signaller needs the mutex, so it runs after we wait */
    void *sigfn(void *a);
    pthread_create(&th, NULL, sigfn, &w);
    int rc;
    while ((rc = co_cond_wait_until(&w.c, &w.m, co_deadline_after(10 * 1000 * MS))) == 0 && !w.go) {
    }
    CHECK_EQ(rc, 0);
    CHECK_EQ(w.go, 1);
    CHECK_EQ(co_mutex_trylock(&w.m), CO_EBUSY);
    co_mutex_unlock(&w.m);
    pthread_join(th, NULL);
}
void *sigfn(void *a) {
    cw_t *w = a;
    co_mutex_lock(&w->m);
    w->go = 1;
    co_cond_signal(&w->c);
    co_mutex_unlock(&w->m);
    return NULL;
}

/* Tokens: producers add and signal, consumers wait with short random
 * deadlines. A signal that races with a timeout must not be lost: every
 * token is consumed. */
typedef struct {
    co_mutex_t m;
    co_cond_t c;
    long tokens, consumed, produced_total;
    int timeouts;
} tk_t;
static void tk_body(void *p, int idx) {
    tk_t *t = p;
    unsigned seed = (unsigned)idx * 7919u + 1;
    if (idx % 2 == 0) { /* producer */
        for (int i = 0; i < t->produced_total / 4; i++) {
            co_mutex_lock(&t->m);
            t->tokens++;
            if (i % 3 == 0)
                co_cond_broadcast(&t->c);
            else
                co_cond_signal(&t->c);
            co_mutex_unlock(&t->m);
            if (i % 16 == 0) co_yield();
        }
    } else { /* consumer */
        co_mutex_lock(&t->m);
        for (;;) {
            while (t->tokens == 0 && t->consumed < t->produced_total) {
                int64_t dl = co_deadline_after((int64_t)(rand_r(&seed) % 200) * 1000);
                if (co_cond_wait_until(&t->c, &t->m, dl) == CO_ETIMEDOUT) t->timeouts++;
            }
            if (t->consumed >= t->produced_total) break;
            t->tokens--;
            t->consumed++;
            if (t->consumed == t->produced_total) co_cond_broadcast(&t->c); /* release the others */
        }
        co_mutex_unlock(&t->m);
    }
}
static void test_cond_stress(void) {
    tk_t t = {CO_MUTEX_INIT, CO_COND_INIT, 0, 0, t_small() ? 4000 : 40000, 0};
    run_mixed(6, 2, tk_body, &t); /* 4 producers (even idx), 4 consumers */
    CHECK_EQ(t.consumed, t.produced_total);
    CHECK_EQ(t.tokens, 0);
}

/* ---- once --------------------------------------------------------------- */
typedef struct {
    co_once_t once;
    int calls, finished;
} on_t;
static void once_fn(void *p) {
    on_t *o = p;
    __atomic_add_fetch(&o->calls, 1, __ATOMIC_RELAXED);
    co_sleep(10 * MS); /* others arrive meanwhile and must wait */
    __atomic_store_n(&o->finished, 1, __ATOMIC_RELAXED);
}
static void once_caller(void *p, int idx) {
    on_t *o = p;
    co_once(&o->once, once_fn, o);
    CHECK_EQ(__atomic_load_n(&o->finished, __ATOMIC_RELAXED), 1);
}
static void test_once_concurrent(void) {
    on_t o = {CO_ONCE_INIT, 0, 0};
    run_mixed(30, 3, once_caller, &o);
    CHECK_EQ(o.calls, 1);
    co_once(&o.once, once_fn, &o); /* fast path afterwards */
    CHECK_EQ(o.calls, 1);
}

static co_once_t nest_a = CO_ONCE_INIT, nest_b = CO_ONCE_INIT;
static int nest_n;
static void nest_fb(void *p) { nest_n += 10; }
static void nest_fa(void *p) {
    nest_n += 1;
    co_once(&nest_b, nest_fb, NULL); /* a different once from inside fn: fine */
}
static void test_once_nested_other(void) {
    co_once(&nest_a, nest_fa, NULL);
    co_once(&nest_a, nest_fa, NULL);
    co_once(&nest_b, nest_fb, NULL);
    CHECK_EQ(nest_n, 11);
}

static void once_panics(void *p) {
    (*(int *)p)++;
    co_panic((void *)0x42);
}
static co_once_t pan_once = CO_ONCE_INIT;
static int pan_calls;
static void pan_call(void *p) { co_once(&pan_once, once_panics, &pan_calls); }
static void test_once_panic(void) {
    void *v = NULL;
    CHECK_EQ(co_recover(pan_call, NULL, &v), 1); /* the panic goes on */
    CHECK(v == (void *)0x42);
    CHECK_EQ(co_recover(pan_call, NULL, &v), 0); /* done: fn not called again */
    CHECK_EQ(pan_calls, 1);
}

/* ---- spinlock ----------------------------------------------------------- */
typedef struct {
    co_spinlock_t l;
    long count;
    int iters;
} sp_t;
static void spin_body(void *p, int idx) {
    sp_t *s = p;
    for (int i = 0; i < s->iters; i++) {
        co_spinlock_lock(&s->l);
        long v = s->count;
        if (i % 64 == 0) co_yield(); /* hold it across a yield sometimes */
        s->count = v + 1;
        co_spinlock_unlock(&s->l);
    }
}
static void test_spinlock(void) {
    sp_t s = {CO_SPINLOCK_INIT, 0, t_small() ? 2000 : 20000};
    run_mixed(8, 2, spin_body, &s);
    CHECK_EQ(s.count, 10L * s.iters);
    co_spinlock_lock(&s.l); /* before and without any coroutine involvement */
    co_spinlock_unlock(&s.l);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--misuse")) return run_misuse(argv[2]);
    t_begin(t_small() ? 240 : 120);
    T_RUN(test_mutex_init);
    T_RUN(test_mutex_trylock);
    T_RUN(test_mutex_handoff);
    T_RUN(test_rwmutex_shared);
    T_RUN(test_rwmutex_stress);
    T_RUN(test_rwmutex_writer_preferred);
    T_RUN(test_rwmutex_writer_not_starved);
    T_RUN(test_cond_signal_broadcast);
    T_RUN(test_cond_timeout);
    T_RUN(test_cond_signal_before_deadline);
    T_RUN(test_cond_stress);
    T_RUN(test_once_concurrent);
    T_RUN(test_once_nested_other);
    T_RUN(test_once_panic);
    T_RUN(test_spinlock);
    T_RUN(test_misuse);
    return t_end();
}
