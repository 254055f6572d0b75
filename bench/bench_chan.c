/*
 * bench_chan.c — channel and select benchmarks of issue 3, one measurement per run.
 *
 *   bench_chan pingpong       [procs=1] [round_trips=2000000]  unbuffered, ns per one-way message
 *   bench_chan buffered       [procs=2] [producers=1] [consumers=1] [items=4000000]
 *                             cap-1024 channel of int64, ns per item (wall / items)
 *   bench_chan select_default [procs=1] [selects=10000000]   2 empty channels + default
 *   bench_chan select_ready   [procs=1] [selects=5000000]    2 ready channels; the fired one
 *                             is refilled by a non-blocking send (counted in the time)
 *
 * The Go peer (bench/go/chan) implements the same names and arguments.
 */
#include "bench_util.h"

static long long n_ops;

/* ---- pingpong: A sends on c1, B answers on c2 -------------------------- */

static co_chan_t *pp_c1, *pp_c2;
static co_waitgroup_t pp_wg;

static void pp_echo(void *arg)
{
    int64_t v;
    for (long long i = 0; i < n_ops; i++) {
        BENCH_CHECK(co_chan_recv(pp_c1, &v, CO_FOREVER));
        v++;
        BENCH_CHECK(co_chan_send(pp_c2, &v, CO_FOREVER));
    }
    co_waitgroup_done(&pp_wg);
}

static void pp_serve(void *arg)
{
    int64_t v = 0;
    for (long long i = 0; i < n_ops; i++) {
        BENCH_CHECK(co_chan_send(pp_c1, &v, CO_FOREVER));
        BENCH_CHECK(co_chan_recv(pp_c2, &v, CO_FOREVER));
    }
    if (v != n_ops) {
        fprintf(stderr, "pingpong: got %lld, want %lld\n", (long long)v, n_ops);
        exit(1);
    }
    co_waitgroup_done(&pp_wg);
}

static int pingpong_main(void *arg)
{
    int procs = co_procs();
    BENCH_CHECK(co_chan_new(&pp_c1, sizeof(int64_t), 0));
    BENCH_CHECK(co_chan_new(&pp_c2, sizeof(int64_t), 0));
    co_waitgroup_add(&pp_wg, 2);
    int64_t t0 = bench_now();
    BENCH_CHECK(co_go(pp_echo, NULL));
    BENCH_CHECK(co_go(pp_serve, NULL));
    co_waitgroup_wait(&pp_wg);
    int64_t dt = bench_now() - t0;
    long long msgs = 2 * n_ops;
    bench_report("chan_pingpong", procs, (double)dt / (double)msgs, msgs, NULL);
    co_chan_free(pp_c1);
    co_chan_free(pp_c2);
    return 0;
}

static int cmd_pingpong(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 1);
    n_ops = bench_arg(argc, argv, 1, 2000000);
    bench_init(procs);
    return co_main(pingpong_main, NULL);
}

/* ---- buffered: P producers, C consumers, one cap-1024 channel ---------- */

static co_chan_t *buf_ch;
static int buf_producers, buf_consumers;
static co_waitgroup_t buf_prod_wg, buf_cons_wg;
static long long buf_received;   /* relaxed atomic add: checked after the join */
static long long buf_sum;        /* relaxed atomic add: checked after the join */

static void buf_producer(void *arg)
{
    long long idx = (long long)(intptr_t)arg;
    long long per = n_ops / buf_producers;
    for (long long i = 0; i < per; i++) {
        int64_t v = idx * per + i;
        BENCH_CHECK(co_chan_send(buf_ch, &v, CO_FOREVER));
    }
    co_waitgroup_done(&buf_prod_wg);
}

static void buf_consumer(void *arg)
{
    int64_t v;
    long long got = 0, sum = 0;
    int rc;
    while ((rc = co_chan_recv(buf_ch, &v, CO_FOREVER)) == 0) {
        got++;
        sum += v;
    }
    if (rc != CO_ECLOSED) {
        fprintf(stderr, "buffered: recv: %s\n", co_strerror(rc));
        exit(1);
    }
    __atomic_add_fetch(&buf_received, got, __ATOMIC_RELAXED);
    __atomic_add_fetch(&buf_sum, sum, __ATOMIC_RELAXED);
    co_waitgroup_done(&buf_cons_wg);
}

static int buffered_main(void *arg)
{
    int procs = co_procs();
    BENCH_CHECK(co_chan_new(&buf_ch, sizeof(int64_t), 1024));
    long long total = n_ops / buf_producers * buf_producers;
    co_waitgroup_add(&buf_prod_wg, buf_producers);
    co_waitgroup_add(&buf_cons_wg, buf_consumers);
    int64_t t0 = bench_now();
    for (int i = 0; i < buf_consumers; i++)
        BENCH_CHECK(co_go(buf_consumer, NULL));
    for (int i = 0; i < buf_producers; i++)
        BENCH_CHECK(co_go(buf_producer, (void *)(intptr_t)i));
    co_waitgroup_wait(&buf_prod_wg);
    BENCH_CHECK(co_chan_close(buf_ch));
    co_waitgroup_wait(&buf_cons_wg);
    int64_t dt = bench_now() - t0;
    long long want_sum = total * (total - 1) / 2;
    if (buf_received != total || buf_sum != want_sum) {
        fprintf(stderr, "buffered: received %lld (sum %lld), want %lld (sum %lld)\n",
                buf_received, buf_sum, total, want_sum);
        exit(1);
    }
    char name[64];
    snprintf(name, sizeof name, "chan_buffered_%dp%dc", buf_producers, buf_consumers);
    bench_report(name, procs, (double)dt / (double)total, total, NULL);
    co_chan_free(buf_ch);
    return 0;
}

static int cmd_buffered(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 2);
    buf_producers = (int)bench_arg(argc, argv, 1, 1);
    buf_consumers = (int)bench_arg(argc, argv, 2, 1);
    n_ops = bench_arg(argc, argv, 3, 4000000);
    bench_init(procs);
    return co_main(buffered_main, NULL);
}

/* ---- select with a default, nothing ready ------------------------------ */

static int select_default_main(void *arg)
{
    int procs = co_procs();
    co_chan_t *a, *b;
    BENCH_CHECK(co_chan_new(&a, sizeof(int64_t), 0));
    BENCH_CHECK(co_chan_new(&b, sizeof(int64_t), 0));
    int64_t va, vb;
    co_case_t cases[2] = {{.ch = a, .op = CO_RECV, .elem = &va}, {.ch = b, .op = CO_RECV, .elem = &vb}};
    long long fired = 0;
    int64_t t0 = bench_now();
    for (long long i = 0; i < n_ops; i++) {
        int rc = co_select(cases, 2, 0); /* a past deadline is Go's default: */
        if (rc != CO_ETIMEDOUT)
            fired++;
    }
    int64_t dt = bench_now() - t0;
    if (fired) {
        fprintf(stderr, "select_default: %lld selects did not take the default\n", fired);
        exit(1);
    }
    bench_report("select_default", procs, (double)dt / (double)n_ops, n_ops, NULL);
    co_chan_free(a);
    co_chan_free(b);
    return 0;
}

static int cmd_select_default(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 1);
    n_ops = bench_arg(argc, argv, 1, 10000000);
    bench_init(procs);
    return co_main(select_default_main, NULL);
}

/* ---- select over two ready channels ------------------------------------ */

static int select_ready_main(void *arg)
{
    int procs = co_procs();
    co_chan_t *ch[2];
    int64_t one = 1, v[2];
    for (int i = 0; i < 2; i++) {
        BENCH_CHECK(co_chan_new(&ch[i], sizeof(int64_t), 1));
        BENCH_CHECK(co_chan_send(ch[i], &one, 0));
    }
    co_case_t cases[2] = {{.ch = ch[0], .op = CO_RECV, .elem = &v[0]},
                          {.ch = ch[1], .op = CO_RECV, .elem = &v[1]}};
    long long count[2] = {0, 0};
    int64_t t0 = bench_now();
    for (long long i = 0; i < n_ops; i++) {
        int k = co_select(cases, 2, CO_FOREVER);
        if (k < 0 || k > 1) {
            fprintf(stderr, "select_ready: co_select returned %d\n", k);
            exit(1);
        }
        count[k]++;
        BENCH_CHECK(co_chan_send(ch[k], &one, 0)); /* refill: both stay ready */
    }
    int64_t dt = bench_now() - t0;
    bench_report("select_ready", procs, (double)dt / (double)n_ops, n_ops, " first_pct=%.1f",
                 100.0 * (double)count[0] / (double)n_ops);
    co_chan_free(ch[0]);
    co_chan_free(ch[1]);
    return 0;
}

static int cmd_select_ready(int argc, char **argv)
{
    int procs = (int)bench_arg(argc, argv, 0, 1);
    n_ops = bench_arg(argc, argv, 1, 5000000);
    bench_init(procs);
    return co_main(select_ready_main, NULL);
}

int main(int argc, char **argv)
{
    static const bench_cmd_t cmds[] = {
        {"pingpong", "[procs=1] [round_trips=2000000]", cmd_pingpong},
        {"buffered", "[procs=2] [producers=1] [consumers=1] [items=4000000]", cmd_buffered},
        {"select_default", "[procs=1] [selects=10000000]", cmd_select_default},
        {"select_ready", "[procs=1] [selects=5000000]", cmd_select_ready},
        {NULL, NULL, NULL},
    };
    return bench_dispatch(cmds, argc, argv);
}
