#define _GNU_SOURCE /* pipe2 */
/*
 * bench_mem.c — what a live coroutine costs, one measurement per process,
 * printing the bench_util.h line. The Go peer is bench/go/mem.
 *
 *   bench_mem parked [procs=2] [n=1000000]
 *       n coroutines, each parked in a receive on one shared channel, all
 *       at once. start_ns: from the first co_go until the last of them has
 *       begun its receive, per coroutine. rss_b / pte_b: VmRSS and VmPTE
 *       (/proc/self/status) with all of them parked, less the same read
 *       just before the first spawn, per coroutine. Then the channel is
 *       closed and every one of them exits.
 *   bench_mem idle [procs=2] [n=10000] [port=0]
 *       an echo server (one coroutine per connection, parked in co_read),
 *       n connections from `bench_mem client` in a child process (plain
 *       blocking sockets, spread over source addresses 127.x.y.2 so
 *       ports do not run out), all
 *       held idle; rss_b is the server's VmRSS with all of them connected
 *       and their coroutines parked, less the same before the first
 *       connection, per connection. The child's memory is not counted.
 *       Raises its fd limit to the hard limit; if that is below n plus a
 *       margin, n is scaled down to fit (limited=1 in the line).
 * $BENCH_STACK_KB sets the default coroutine stack size. $BENCH_COMPACT=1:
 * every parked coroutine (or connection's coroutine) opts in to stack
 * compaction (co_stack_compactable) and the measurement waits until all of
 * them are compacted (the threshold is $COLONY_COMPACT_MS, 200 ms unless set);
 * compact_ms is that wait, from the last start. parked then also wakes
 * 1,000 of them one at a time (a send with the time, to a coroutine that
 * reads the clock as it runs): wake_us is the median, so a run with and
 * one without $BENCH_COMPACT give the wake-up's cost of a compacted stack.
 *   bench_mem scan [procs=2] [n=1000000] [offered=1000] [secs=3]
 *       the compactor's search for candidates: n coroutines parked in a
 *       receive without opting in, and `offered` more that opted in parked
 *       in another, below the threshold ($COLONY_COMPACT_MS, one hour
 *       unless set: none is compacted, all stay offered). Over secs
 *       seconds, sysmon's scan passes (each looks at every offered
 *       coroutine once): pass_us is their mean time, round_max_us the
 *       longest single round (one lock hold), passes how many completed.
 */
#include "bench_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void mem_init(int procs) {
    const char *e = getenv("BENCH_STACK_KB");
    size_t ss = e ? (size_t)atol(e) * 1024 : 0;
    int rc = co_init(&(co_config_t){.procs = procs, .stack_size = ss});
    if (rc != 0) {
        fprintf(stderr, "co_init(procs=%d, stack %zu): %s\n", procs, ss, co_strerror(rc));
        exit(1);
    }
}
static int compact_on(void) {
    const char *e = getenv("BENCH_COMPACT");
    if (!e || atoi(e) != 1) return 0;
    setenv("COLONY_COMPACT_MS", "200", 0); /* unless the caller chose one */
    return 1;
}
/* Until n coroutines are compacted (at most 10 minutes): the wait in ns. */
static int64_t wait_compacted(int64_t n) {
    int64_t t0 = bench_now();
    while (co_stack_compacted() < n) {
        if (bench_now() - t0 > 600 * (int64_t)1000000000) {
            fprintf(stderr, "only %lld of %lld coroutines compacted\n",
                    (long long)co_stack_compacted(), (long long)n);
            exit(1);
        }
        co_sleep(10 * 1000000);
    }
    return bench_now() - t0;
}
static size_t stack_kb(void) {
    const char *e = getenv("BENCH_STACK_KB");
    return e ? (size_t)atol(e) : 256;
}

/* A field of /proc/self/status in KiB ("VmRSS", "VmPTE"); -1 if absent. */
static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = atol(line + kl + 1);
            break;
        }
    fclose(f);
    return v;
}

/* ---- parked ---------------------------------------------------------------- */

static int64_t g_n;
static co_chan_t *g_park, *g_done, *g_lat;
static int64_t g_started;
static int64_t g_start_ns, g_compact_ns;
static long g_rss0, g_pte0, g_rss1, g_pte1;
static co_waitgroup_t g_wg = CO_WAITGROUP_INIT;
static int g_compact;
#define WAKES 1000
static double g_wake_us;

static void parked(void *arg) {
    (void)arg;
    if (g_compact) BENCH_CHECK(co_stack_compactable(1));
    int64_t x;
    /* the last to start tells main; the others only count */
    if (__atomic_add_fetch(&g_started, 1, __ATOMIC_ACQ_REL) == g_n) {
        char one = 1;
        BENCH_CHECK(co_chan_send(g_done, &one, CO_FOREVER));
    }
    int rc = co_chan_recv(g_park, &x, CO_FOREVER);
    if (rc == 0) { /* one of the timed wake-ups: x is when it was sent */
        int64_t lat = bench_now() - x;
        BENCH_CHECK(co_chan_send(g_lat, &lat, CO_FOREVER));
    } else if (rc != CO_ECLOSED) {
        fprintf(stderr, "parked: receive returned %d, not CO_ECLOSED\n", rc);
        exit(1);
    }
    co_waitgroup_done(&g_wg);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int parked_main(void *arg) {
    (void)arg;
    BENCH_CHECK(co_chan_new(&g_park, sizeof(int64_t), 0));
    BENCH_CHECK(co_chan_new(&g_done, 1, 1));
    BENCH_CHECK(co_chan_new(&g_lat, sizeof(int64_t), 1));
    g_rss0 = status_kb("VmRSS");
    g_pte0 = status_kb("VmPTE");
    co_waitgroup_add(&g_wg, (int)g_n);
    int64_t t0 = bench_now();
    for (int64_t i = 0; i < g_n; i++) BENCH_CHECK(co_go(parked, NULL));
    char one;
    BENCH_CHECK(co_chan_recv(g_done, &one, CO_FOREVER));
    g_start_ns = bench_now() - t0;
    /* the last one has counted itself but may not have parked yet: its
     * receive is a few instructions on; wait for the scheduler to run it */
    co_sleep(20 * 1000000);
    if (g_compact) g_compact_ns = wait_compacted(g_n);
    g_rss1 = status_kb("VmRSS");
    g_pte1 = status_kb("VmPTE");
    /* wake-ups one at a time, the oldest waiter first (FIFO) */
    int64_t lat[WAKES];
    int wakes = g_n < WAKES ? (int)g_n : WAKES;
    for (int i = 0; i < wakes; i++) {
        int64_t now = bench_now();
        BENCH_CHECK(co_chan_send(g_park, &now, CO_FOREVER));
        BENCH_CHECK(co_chan_recv(g_lat, &lat[i], CO_FOREVER));
    }
    qsort(lat, (size_t)wakes, sizeof lat[0], cmp_i64);
    g_wake_us = wakes ? (double)lat[wakes / 2] / 1000.0 : 0;
    BENCH_CHECK(co_chan_close(g_park));
    co_waitgroup_wait(&g_wg);
    co_chan_free(g_park);
    co_chan_free(g_done);
    co_chan_free(g_lat);
    return 0;
}

static int run_parked(int argc, char **argv) {
    int procs = (int)bench_arg(argc, argv, 0, 2);
    g_n = bench_arg(argc, argv, 1, 1000000);
    g_compact = compact_on();
    mem_init(procs);
    co_main(parked_main, NULL);
    double n = (double)g_n;
    bench_report("mem_parked", procs, (double)g_start_ns / n, g_n,
                 " stack_kb=%zu n=%lld compact=%d start_ns=%.0f start_ms=%.1f compact_ms=%.0f"
                 " rss_b=%.0f pte_b=%.0f total_b=%.0f wake_us=%.2f",
                 stack_kb(), (long long)g_n, g_compact, (double)g_start_ns / n,
                 (double)g_start_ns / 1e6, (double)g_compact_ns / 1e6,
                 (double)(g_rss1 - g_rss0) * 1024.0 / n, (double)(g_pte1 - g_pte0) * 1024.0 / n,
                 (double)(g_rss1 - g_rss0 + g_pte1 - g_pte0) * 1024.0 / n, g_wake_us);
    return 0;
}

/* ---- the compactor's scan ---------------------------------------------------- */

/* compact.c's counters (a hidden symbol of the static library). */
void co__test_compact_scan_stats(uint64_t *passes, uint64_t *pass_ns, uint64_t *round_max_ns);

static int64_t g_offered, g_secs;
static co_chan_t *g_plain_ch, *g_offer_ch;
static uint64_t g_passes, g_pass_ns, g_round_max_ns;

static void scan_parked(void *arg) {
    co_chan_t *ch = arg;
    if (ch == g_offer_ch) BENCH_CHECK(co_stack_compactable(1));
    char x;
    if (__atomic_add_fetch(&g_started, 1, __ATOMIC_ACQ_REL) == g_n + g_offered) {
        char one = 1;
        BENCH_CHECK(co_chan_send(g_done, &one, CO_FOREVER));
    }
    if (co_chan_recv(ch, &x, CO_FOREVER) != CO_ECLOSED) {
        fprintf(stderr, "scan: receive did not return CO_ECLOSED\n");
        exit(1);
    }
    co_waitgroup_done(&g_wg);
}

static int scan_main(void *arg) {
    (void)arg;
    BENCH_CHECK(co_chan_new(&g_plain_ch, 1, 0));
    BENCH_CHECK(co_chan_new(&g_offer_ch, 1, 0));
    BENCH_CHECK(co_chan_new(&g_done, 1, 1));
    co_waitgroup_add(&g_wg, (int)(g_n + g_offered));
    for (int64_t i = 0; i < g_n; i++) BENCH_CHECK(co_go(scan_parked, g_plain_ch));
    for (int64_t i = 0; i < g_offered; i++) BENCH_CHECK(co_go(scan_parked, g_offer_ch));
    char one;
    BENCH_CHECK(co_chan_recv(g_done, &one, CO_FOREVER));
    co_sleep(300 * 1000000); /* a pass or more under way */
    uint64_t p0, ns0, mx;
    co__test_compact_scan_stats(&p0, &ns0, &mx);
    co_sleep(g_secs * 1000000000);
    co__test_compact_scan_stats(&g_passes, &g_pass_ns, &g_round_max_ns);
    g_passes -= p0;
    g_pass_ns -= ns0;
    if (co_stack_compacted() != 0) {
        fprintf(stderr, "scan: %lld compacted: raise COLONY_COMPACT_MS\n",
                (long long)co_stack_compacted());
        exit(1);
    }
    BENCH_CHECK(co_chan_close(g_plain_ch));
    BENCH_CHECK(co_chan_close(g_offer_ch));
    co_waitgroup_wait(&g_wg);
    co_chan_free(g_plain_ch);
    co_chan_free(g_offer_ch);
    co_chan_free(g_done);
    return 0;
}

static int run_scan(int argc, char **argv) {
    int procs = (int)bench_arg(argc, argv, 0, 2);
    g_n = bench_arg(argc, argv, 1, 1000000);
    g_offered = bench_arg(argc, argv, 2, 1000);
    g_secs = bench_arg(argc, argv, 3, 3);
    setenv("COLONY_COMPACT_MS", "3600000", 0); /* unless the caller chose one */
    mem_init(procs);
    co_main(scan_main, NULL);
    double pass_us = g_passes ? (double)g_pass_ns / (double)g_passes / 1e3 : 0;
    bench_report("mem_scan", procs, pass_us * 1e3, (int64_t)g_passes,
                 " n=%lld offered=%lld secs=%lld passes=%llu pass_us=%.1f round_max_us=%.1f",
                 (long long)g_n, (long long)g_offered, (long long)g_secs,
                 (unsigned long long)g_passes, pass_us, (double)g_round_max_ns / 1e3);
    return 0;
}

/* ---- idle connections -------------------------------------------------------- */

static int g_lfd;
static int64_t g_conns, g_closed;
static co_chan_t *g_allin;

static void echo_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[512];
    if (g_compact) BENCH_CHECK(co_stack_compactable(1));
    if (__atomic_add_fetch(&g_conns, 1, __ATOMIC_ACQ_REL) == g_n) {
        char one = 1;
        BENCH_CHECK(co_chan_send(g_allin, &one, CO_FOREVER));
    }
    for (;;) {
        ssize_t r = co_read(fd, buf, sizeof buf, CO_FOREVER);
        if (r <= 0) break;
        if (co_write(fd, buf, (size_t)r, CO_FOREVER) != r) break;
    }
    co_close(fd);
    __atomic_add_fetch(&g_closed, 1, __ATOMIC_RELAXED);
}

static void acceptor(void *arg) {
    (void)arg;
    for (;;) {
        int fd = co_accept(g_lfd, NULL, NULL, CO_FOREVER);
        if (fd < 0) {
            if (fd == CO_ECLOSED || fd == -EBADF) return;
            fprintf(stderr, "accept: %s\n", co_strerror(fd));
            continue;
        }
        BENCH_CHECK(co_go(echo_conn, (void *)(intptr_t)fd));
    }
}

/* The client, `bench_mem client <port> <n>`, run by the server side (this
 * program's idle, or the Go peer): n blocking connects spread over source
 * addresses, one byte echoed on the first to check the server, then
 * "ready\n" on stdout, and it holds them until stdin closes. */
static int run_client(int argc, char **argv) {
    int port = (int)bench_arg(argc, argv, 0, 1);
    int64_t n = bench_arg(argc, argv, 1, 1);
    int *fds = malloc((size_t)n * sizeof *fds);
    if (!fds) return 3;
    for (int64_t i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) {
            fprintf(stderr, "client: socket %lld: %s\n", (long long)i, strerror(errno));
            return 3;
        }
        /* closed with a reset, not a TIME_WAIT that holds its port after
         * the run */
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        struct sockaddr_in src = {.sin_family = AF_INET};
        /* 127.<run>.<i/10000>.2: a run's own addresses, whatever the
         * sockets of runs before hold for a while */
        src.sin_addr.s_addr = htonl(0x7f000002u | ((uint32_t)(getpid() % 250 + 1) << 16) |
                                    ((uint32_t)(i / 10000) << 8));
        if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) {
            fprintf(stderr, "client: bind: %s\n", strerror(errno));
            return 3;
        }
        struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        dst.sin_addr.s_addr = htonl(0x7f000001u);
        if (connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0) {
            fprintf(stderr, "client: connect %lld: %s\n", (long long)i, strerror(errno));
            return 3;
        }
        fds[i] = fd;
    }
    char c = 'x';
    if (write(fds[0], &c, 1) != 1 || read(fds[0], &c, 1) != 1 || c != 'x') {
        fprintf(stderr, "client: no echo\n");
        return 3;
    }
    if (write(1, "ready\n", 6) != 6) return 3;
    while (read(0, &c, 1) > 0) {} /* until the server side closes it */
    return 0;
}

static int64_t g_idle_ns;
static int g_port, g_limited;

static int idle_main(void *arg) {
    (void)arg;
    BENCH_CHECK(co_chan_new(&g_allin, 1, 1));
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", g_port);
    g_lfd = co_listen("tcp", addr, &(struct co_listen_opts){.backlog = 4096, .keepalive_ns = -1});
    BENCH_CHECK(g_lfd);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(g_lfd, (struct sockaddr *)&sa, &sl);
    int port = ntohs(sa.sin_port);
    BENCH_CHECK(co_go(acceptor, NULL));
    co_sleep(10 * 1000000);
    g_rss0 = status_kb("VmRSS");
    g_pte0 = status_kb("VmPTE");
    int ready[2], hold[2];
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(hold, O_CLOEXEC) != 0) return 1;
    char sport[16], sn[24];
    snprintf(sport, sizeof sport, "%d", port);
    snprintf(sn, sizeof sn, "%lld", (long long)g_n);
    char *args[] = {"bench_mem", "client", sport, sn, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, hold[0], 0);
    posix_spawn_file_actions_adddup2(&fa, ready[1], 1);
    int64_t t0 = bench_now();
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ) != 0) {
        fprintf(stderr, "idle: cannot start the client\n");
        exit(1);
    }
    posix_spawn_file_actions_destroy(&fa);
    close(ready[1]);
    close(hold[0]);
    char c[8];
    if (co_read(ready[0], c, 6, CO_FOREVER) != 6) {
        fprintf(stderr, "idle: the client failed\n");
        exit(1);
    }
    BENCH_CHECK(co_chan_recv(g_allin, c, CO_FOREVER));
    g_idle_ns = bench_now() - t0;
    co_sleep(50 * 1000000);
    if (g_compact) g_compact_ns = wait_compacted(g_n);
    g_rss1 = status_kb("VmRSS");
    g_pte1 = status_kb("VmPTE");
    close(hold[1]); /* the client exits: every connection closes */
    int st;
    waitpid(pid, &st, 0);
    while (__atomic_load_n(&g_closed, __ATOMIC_RELAXED) < g_n) co_sleep(1000000);
    co_close(g_lfd);
    close(ready[0]);
    co_chan_free(g_allin);
    return 0;
}

static int run_idle(int argc, char **argv) {
    int procs = (int)bench_arg(argc, argv, 0, 2);
    g_n = bench_arg(argc, argv, 1, 10000);
    g_port = argc > 2 ? atoi(argv[2]) : 0;
    /* the fd limit: n connections here (and n in the child), plus a margin */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t want = (rlim_t)g_n + 256;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
        fprintf(stderr, "idle: fd hard limit %llu < %lld + 256: %lld connections\n",
                (unsigned long long)rl.rlim_max, (long long)g_n,
                (long long)rl.rlim_max - 256);
        g_n = (int64_t)rl.rlim_max - 256;
        g_limited = 1;
    }
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    signal(SIGPIPE, SIG_IGN);
    g_compact = compact_on();
    mem_init(procs);
    co_main(idle_main, NULL);
    double n = (double)g_n;
    bench_report("mem_idle", procs, (double)g_idle_ns / n, g_n,
                 " stack_kb=%zu n=%lld compact=%d limited=%d connect_ms=%.1f compact_ms=%.0f"
                 " rss_b=%.0f pte_b=%.0f total_b=%.0f",
                 stack_kb(), (long long)g_n, g_compact, g_limited, (double)g_idle_ns / 1e6,
                 (double)g_compact_ns / 1e6,
                 (double)(g_rss1 - g_rss0) * 1024.0 / n, (double)(g_pte1 - g_pte0) * 1024.0 / n,
                 (double)(g_rss1 - g_rss0 + g_pte1 - g_pte0) * 1024.0 / n);
    return 0;
}

static const bench_cmd_t cmds[] = {
    {"parked", "[procs=2] [n=1000000]: n coroutines parked in a receive", run_parked},
    {"idle", "[procs=2] [n=10000] [port=0]: n idle echo connections", run_idle},
    {"scan", "[procs=2] [n=1000000] [offered=1000] [secs=3]: the compactor's scan per pass",
     run_scan},
    {"client", "<port> <n>: the idle benchmark's client (run by the server side)", run_client},
    {NULL, NULL, NULL},
};

int main(int argc, char **argv) { return bench_dispatch(cmds, argc, argv); }
