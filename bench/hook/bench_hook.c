/*
 * bench_hook: foreign blocking libraries on coroutines (bench/run_hook.sh).
 *
 *   bench_hook MODE [clients] [ops] [extra]
 *
 * MODE
 *   redis-co   hiredis's blocking API from `clients` coroutines (run with
 *              libcolony_hook.so preloaded), `ops` INCR/GET in all, plus
 *              `extra` (default 10) BLPOPs of 300 ms
 *   redis-pt   the same from `clients` pthreads
 *   redis-nb   non-blocking hiredis driven with co_wait_fd, coroutines
 *   pg-co      libpq, `ops` SELECT 1 in all from `clients` coroutines (hook)
 *   pg-pt      the same from pthreads
 *   pgprep-co, pgprep-pt  a prepared point query (SELECT v FROM bench_t
 *              WHERE id = $1, 100k rows) instead of SELECT 1
 *   blocking   `clients` concurrent co_blocking(usleep(`ops` ms))
 * Environment: BENCH_REDIS_PORT, BENCH_PG_CONNINFO.
 * Prints one line: key=value pairs (ops_s, q_ops_s and q_cpu_us: pg modes,
 * the queries alone once every client is connected, and the process's CPU
 * per query meanwhile, hb_worst_ms, hb_floor_ms: a plain
 * thread's worst lateness sleeping 1 ms at a time beside it, threads_max:
 * the process's peak less the bench's own measuring threads,
 * rss_kb, errors, secs).
 */
#define _GNU_SOURCE 1
#include <colony.h>

#include <errno.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MS 1000000LL

static int clients, ops, extra;
static atomic_int next_op, errors, done_clients, stop_all;
static atomic_llong hb_worst;
static int port;
static const char *conninfo;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static long proc_status(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0) v = atol(line + kl + 1);
    if (f) fclose(f);
    return v;
}
static atomic_long threads_max;
static atomic_llong floor_worst;
/* The bench's own measuring threads alive (this sampler; the pthread
 * modes' heartbeat): not counted in threads_max, which is every other
 * thread of the process (main, and whatever colony or the libraries
 * made). Raised before such a thread starts, lowered after it is joined. */
static atomic_long own_threads;
/* Samples the thread count every 2 ms and is the heartbeat's floor: a plain
 * thread of the same process sleeping 1 ms at a time, whose worst lateness
 * is what the kernel alone adds on this machine at this moment. */
static void *sampler(void *arg) {
    (void)arg;
    for (int i = 0; !atomic_load(&stop_all); i++) {
        if (i % 2 == 0) {
            long t = proc_status("Threads") - atomic_load(&own_threads);
            if (t > atomic_load(&threads_max)) atomic_store(&threads_max, t);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t want = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + MS;
        ts.tv_sec = want / 1000000000;
        ts.tv_nsec = want % 1000000000;
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long long late = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec - want;
        if (late > atomic_load(&floor_worst)) atomic_store(&floor_worst, late);
    }
    return NULL;
}

static void note_late(int64_t late) {
    long long w = atomic_load(&hb_worst);
    while (late > w && !atomic_compare_exchange_weak(&hb_worst, &w, late)) {
    }
}
static void hb_co(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_all)) {
        int64_t want = co_now() + MS;
        co_sleep_until(want);
        note_late(co_now() - want);
    }
}
static void *hb_thread(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_all)) {
        int64_t want = now_ns() + MS;
        struct timespec ts = {want / 1000000000, want % 1000000000};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        note_late(now_ns() - want);
    }
    return NULL;
}

/* ---- redis ------------------------------------------------------------------ */
static redisContext *rdial(void) {
    struct timeval tv = {30, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && !c->err) redisSetTimeout(c, tv);
    return c;
}
static void redis_work(int id) {
    redisContext *c = rdial();
    if (!c || c->err) {
        atomic_fetch_add(&errors, 1);
        if (c) redisFree(c);
        return;
    }
    if (id < extra) { /* a long call */
        redisReply *r = redisCommand(c, "BLPOP bench:never 0.3");
        if (!r) atomic_fetch_add(&errors, 1);
        else freeReplyObject(r);
    }
    for (;;) {
        int k = atomic_fetch_add(&next_op, 1);
        if (k >= ops) break;
        redisReply *r = (k & 1) ? redisCommand(c, "GET bench:%d", id) : redisCommand(c, "INCR bench:%d", id);
        if (!r || r->type == REDIS_REPLY_ERROR) atomic_fetch_add(&errors, 1);
        if (r) freeReplyObject(r);
    }
    redisFree(c);
}
/* non-blocking hiredis + co_wait_fd */
static void redis_nb_work(int id) {
    redisContext *c = redisConnectNonBlock("127.0.0.1", port);
    if (!c || c->err) {
        atomic_fetch_add(&errors, 1);
        if (c) redisFree(c);
        return;
    }
    if (co_wait_fd(c->fd, CO_WRITABLE, co_deadline_after(30000 * MS)) < 0) {
        atomic_fetch_add(&errors, 1);
        redisFree(c);
        return;
    }
    int n = id < extra ? -1 : 0; /* -1: the BLPOP first */
    for (;;) {
        int k;
        if (n < 0) {
            redisAppendCommand(c, "BLPOP bench:never 0.3");
            k = -1;
        } else {
            k = atomic_fetch_add(&next_op, 1);
            if (k >= ops) break;
            if (k & 1) redisAppendCommand(c, "GET bench:%d", id);
            else redisAppendCommand(c, "INCR bench:%d", id);
        }
        n = 0;
        int wdone = 0;
        while (!wdone) {
            if (redisBufferWrite(c, &wdone) != REDIS_OK) goto fail;
            if (!wdone && co_wait_fd(c->fd, CO_WRITABLE, co_deadline_after(30000 * MS)) < 0) goto fail;
        }
        void *reply = NULL;
        for (;;) {
            if (redisGetReplyFromReader(c, &reply) != REDIS_OK) goto fail;
            if (reply) break;
            if (co_wait_fd(c->fd, CO_READABLE, co_deadline_after(30000 * MS)) < 0) goto fail;
            if (redisBufferRead(c) != REDIS_OK) goto fail;
        }
        freeReplyObject(reply);
    }
    co_fd_forget(c->fd);
    redisFree(c);
    return;
fail:
    atomic_fetch_add(&errors, 1);
    co_fd_forget(c->fd);
    redisFree(c);
}

/* ---- postgres ----------------------------------------------------------------- */
/* The query phase: every client waits at the gate after its connect (made
 * or failed), so that q_ops_s times the queries alone, from the moment all
 * clients are connected to the last reply (the connects are the server's
 * forks, ~4 s of a 1,000-client run here). */
static bool pt_mode;
static co_waitgroup_t gate_wg = CO_WAITGROUP_INIT;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_in;
static atomic_llong q_t0, q_t1;
static atomic_int q_left = -1;        /* clients still in the query phase */
static atomic_llong q_cpu0, q_cpu1;   /* the process's CPU (user+sys, us) at its ends */
static long long cpu_us(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 + ru.ru_utime.tv_usec +
           ru.ru_stime.tv_usec;
}
/* Every client waits here until all have come: wg in coroutines, the
 * mutex and *in on threads. */
static void barrier(co_waitgroup_t *wg, int *in) {
    if (pt_mode) {
        pthread_mutex_lock(&gate_mu);
        if (++*in == clients) pthread_cond_broadcast(&gate_cv);
        while (*in < clients) pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    } else {
        co_waitgroup_done(wg);
        co_waitgroup_wait(wg);
    }
}
static void gate(void) {
    barrier(&gate_wg, &gate_in);
    long long z = 0, cpu = cpu_us();
    if (atomic_compare_exchange_strong(&q_t0, &z, now_ns())) /* the first one through */
        atomic_store(&q_cpu0, cpu);
}
/* After its queries a client keeps its connection until every client is
 * done, as the Go peer's pool keeps its connections until db.Close after
 * the timed span: a backend's exit (~1 ms of server CPU each here) would
 * otherwise fall inside the others' query phase. */
static co_waitgroup_t close_wg = CO_WAITGROUP_INIT;
static int close_in;
static void close_gate(void) { barrier(&close_wg, &close_in); }
/* a client's last query is done (or it never connected): the last one
 * ends the query phase */
static void query_done(void) {
    if (atomic_fetch_sub(&q_left, 1) == 1) {
        atomic_store(&q_t1, now_ns());
        atomic_store(&q_cpu1, cpu_us());
    }
}
static void pg_work(int id) {
    (void)id;
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        atomic_fetch_add(&errors, 1);
        gate();
        query_done();
        close_gate();
        PQfinish(c);
        return;
    }
    gate();
    for (;;) {
        int k = atomic_fetch_add(&next_op, 1);
        if (k >= ops) break;
        PGresult *r = PQexec(c, "SELECT 1");
        if (PQresultStatus(r) != PGRES_TUPLES_OK) atomic_fetch_add(&errors, 1);
        PQclear(r);
    }
    query_done();
    close_gate();
    PQfinish(c);
}

/* a prepared point query on bench_t (100k rows, run_hook.sh creates it) */
static void pg_prep_work(int id) {
    (void)id;
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        atomic_fetch_add(&errors, 1);
        gate();
        query_done();
        close_gate();
        PQfinish(c);
        return;
    }
    gate(); /* the prepare is in the query phase, as database/sql's is */
    PGresult *pr = PQprepare(c, "pt", "SELECT v FROM bench_t WHERE id = $1", 1, NULL);
    if (PQresultStatus(pr) != PGRES_COMMAND_OK) atomic_fetch_add(&errors, 1);
    PQclear(pr);
    for (;;) {
        int k = atomic_fetch_add(&next_op, 1);
        if (k >= ops) break;
        int key = (int)((k * 7919L) % 100000) + 1;
        char v[16];
        snprintf(v, sizeof v, "%d", key);
        const char *params[1] = {v};
        PGresult *r = PQexecPrepared(c, "pt", 1, params, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 ||
            atoi(PQgetvalue(r, 0, 0)) != 2 * key)
            atomic_fetch_add(&errors, 1);
        PQclear(r);
    }
    query_done();
    close_gate();
    PQfinish(c);
}

/* ---- co_blocking --------------------------------------------------------------- */
static void sleep_fn(void *arg) {
    (void)arg;
    usleep((useconds_t)ops * 1000);
}
static void blocking_work(int id) {
    (void)id;
    co_blocking(sleep_fn, NULL);
}

static void (*work)(int);
static co_waitgroup_t clients_wg = CO_WAITGROUP_INIT;
static void co_client(void *arg) {
    work((int)(intptr_t)arg);
    atomic_fetch_add(&done_clients, 1);
    co_waitgroup_done(&clients_wg);
}
static void *pt_client(void *arg) {
    work((int)(intptr_t)arg);
    atomic_fetch_add(&done_clients, 1);
    return NULL;
}

static int co_run(void *arg) {
    (void)arg;
    co_go(hb_co, NULL);
    co_sleep(20 * MS);
    /* the clients' end waited for without a sleeping loop of its own,
     * which would be a second 1 ms timer beside the heartbeat's */
    co_waitgroup_add(&clients_wg, clients);
    for (int i = 0; i < clients; i++) co_go(co_client, (void *)(intptr_t)i);
    co_waitgroup_wait(&clients_wg);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_hook MODE [clients] [ops] [extra]\n");
        return 2;
    }
    const char *mode = argv[1];
    clients = argc > 2 ? atoi(argv[2]) : 1000;
    ops = argc > 3 ? atoi(argv[3]) : 100000;
    extra = argc > 4 ? atoi(argv[4]) : 10;
    port = getenv("BENCH_REDIS_PORT") ? atoi(getenv("BENCH_REDIS_PORT")) : 6379;
    conninfo = getenv("BENCH_PG_CONNINFO") ? getenv("BENCH_PG_CONNINFO") : "";
    bool threads = strstr(mode, "-pt") != NULL;
    pt_mode = threads;
    if (!strncmp(mode, "redis-nb", 8)) work = redis_nb_work;
    else if (!strncmp(mode, "redis", 5)) work = redis_work;
    else if (!strncmp(mode, "pgprep", 6)) work = pg_prep_work;
    else if (!strncmp(mode, "pg", 2)) work = pg_work;
    else if (!strcmp(mode, "blocking")) work = blocking_work;
    else {
        fprintf(stderr, "bench_hook: unknown mode %s\n", mode);
        return 2;
    }
    if (work == pg_work || work == pg_prep_work) {
        co_waitgroup_add(&gate_wg, clients);
        co_waitgroup_add(&close_wg, clients);
        atomic_store(&q_left, clients);
    }
    pthread_t smp;
    atomic_store(&own_threads, 1);
    pthread_create(&smp, NULL, sampler, NULL);
    struct rusage;
    int64_t t0 = now_ns();
    if (threads) {
        pthread_t hb;
        atomic_fetch_add(&own_threads, 1);
        pthread_create(&hb, NULL, hb_thread, NULL);
        pthread_t *ts = calloc((size_t)clients, sizeof *ts);
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setstacksize(&a, 256 * 1024);
        for (int i = 0; i < clients; i++) pthread_create(&ts[i], &a, pt_client, (void *)(intptr_t)i);
        for (int i = 0; i < clients; i++) pthread_join(ts[i], NULL);
        atomic_store(&stop_all, 1);
        pthread_join(hb, NULL);
        atomic_fetch_sub(&own_threads, 1);
    } else {
        co_main(co_run, NULL);
        atomic_store(&stop_all, 1);
    }
    /* pg modes: up to the last reply, before the closes (as the Go peer
     * stops its clock before db.Close) */
    int64_t t_end = now_ns();
    if ((work == pg_work || work == pg_prep_work) && atomic_load(&q_t1) > t0)
        t_end = atomic_load(&q_t1);
    double secs = (double)(t_end - t0) / 1e9;
    atomic_store(&stop_all, 1);
    pthread_join(smp, NULL);
    int total = !strcmp(mode, "blocking") ? clients : ops;
    char qops[32] = "-", qcpu[32] = "-";
    long long qt0 = atomic_load(&q_t0), qt1 = atomic_load(&q_t1);
    if (qt0 && qt1 > qt0 && ops > 0) {
        snprintf(qops, sizeof qops, "%.0f", ops / ((double)(qt1 - qt0) / 1e9));
        snprintf(qcpu, sizeof qcpu, "%.1f",
                 (double)(atomic_load(&q_cpu1) - atomic_load(&q_cpu0)) / ops);
    }
    printf("mode=%s ops_s=%.0f q_ops_s=%s q_cpu_us=%s hb_worst_ms=%.2f hb_floor_ms=%.2f "
           "threads_max=%ld rss_kb=%ld errors=%d secs=%.2f\n",
           mode, total / secs, qops, qcpu, (double)atomic_load(&hb_worst) / 1e6,
           (double)atomic_load(&floor_worst) / 1e6, atomic_load(&threads_max),
           proc_status("VmHWM"), atomic_load(&errors), secs);
    return atomic_load(&errors) ? 1 : 0;
}
