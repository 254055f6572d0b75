/* libpq's blocking API from coroutines through libcolony_hook.so against
 * a PostgreSQL cluster this test creates (initdb into a temp dir, a
 * loopback port, pg_ctl start) and removes: 1,000 coroutines (300 in
 * sanitizer builds) each with its own connection and every result
 * checked; pg_sleep parked without a thread each; a reconnect storm; the
 * server stopped (immediate) mid-run gives every coroutine libpq's error,
 * none hangs; no fd left. Behaviour, not timing. */
// ctest-timeout: 300
// ctest-preload-hook
// ctest-uses: libpq
// ctest-no-chaos
#define _GNU_SOURCE 1
#include "t.h"
#include "test_hook_servers.h"

#include <colony.h>

#include <dirent.h>
#include <dlfcn.h>
#include <glob.h>
#include <pwd.h>
#include <stdint.h>

#if !COLONY_HAVE_LIBPQ
int main(void) {
    fprintf(stderr, "skip: built without libpq (libpq-dev)\n");
    return 77;
}
#else
#include <libpq-fe.h>

#define MS 1000000LL
/* The postmaster forks a backend per connection, one at a time: 1,000 of
 * them take 30-40 s on a host where fork costs tens of milliseconds (a
 * guest under shadow page tables), so the connects and the waits allow
 * minutes. */
#define GIVE_UP (150000 * MS)

static char bindir[256], dir[64], conninfo[160];
static int port;
static int as_nobody;

/* Runs argv (as nobody when we are root: initdb refuses root) and waits. */
static int run_cmd(char **argv) {
    char *full[32];
    int k = 0;
    if (as_nobody) {
        full[k++] = "/usr/sbin/runuser";
        full[k++] = "-u";
        full[k++] = "nobody";
        full[k++] = "--";
    }
    for (int i = 0; argv[i] && k < 31; i++) full[k++] = argv[i];
    full[k] = NULL;
    pid_t pid = hs_spawn(full);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int pg_ctl(const char *mode, const char *how) {
    char ctl[300], data[80], opts[200], log[80];
    snprintf(ctl, sizeof ctl, "%s/pg_ctl", bindir);
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(opts, sizeof opts,
             "-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=1100 "
             "-c fsync=off -c shared_buffers=16MB",
             port, dir);
    if (strcmp(mode, "start") == 0) {
        char *argv[] = {ctl, "-D", data, "-l", log, "-o", opts, "-w", "-t", "20", "start", NULL};
        return run_cmd(argv);
    }
    char *argv[] = {ctl, "-D", data, "-m", (char *)how, "-w", "stop", NULL};
    return run_cmd(argv);
}

static void rm_dir(void) {
    char *argv[] = {"/bin/rm", "-rf", dir, NULL};
    pid_t pid = hs_spawn(argv);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static void wait_count(int *n, int want) {
    int64_t t0 = co_now();
    while (__atomic_load_n(n, __ATOMIC_ACQUIRE) < want && co_now() - t0 < GIVE_UP) co_sleep(MS);
}

static int threads_now(void) {
    co_sched_stats_t st;
    co_sched_stats(&st);
    return st.threads;
}

/* ---- many clients ---------------------------------------------------------- */
static int clients_ok, clients_done;
static void client(void *arg) {
    int i = (int)(intptr_t)arg, ok = 0;
    PGconn *c = PQconnectdb(conninfo);
    if (c && PQstatus(c) == CONNECTION_OK) {
        ok = 1;
        for (int k = 0; k < 5 && ok; k++) {
            char v[16];
            snprintf(v, sizeof v, "%d", i * 10 + k);
            const char *params[1] = {v};
            PGresult *r = PQexecParams(c, "SELECT $1::int + 1", 1, NULL, params, NULL, NULL, 0);
            ok = r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
                 atoi(PQgetvalue(r, 0, 0)) == i * 10 + k + 1;
            PQclear(r);
        }
    }
    if (!ok) fprintf(stderr, "client %d: %s", i, c ? PQerrorMessage(c) : "no conn\n");
    PQfinish(c);
    if (ok) __atomic_add_fetch(&clients_ok, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&clients_done, 1, __ATOMIC_RELEASE);
}
static void test_many_clients(void) {
    int n = t_sanitized() ? 300 : 1000;
    clients_ok = clients_done = 0;
    for (int i = 0; i < n; i++) CHECK_EQ(co_go(client, (void *)(intptr_t)i), 0);
    wait_count(&clients_done, n);
    CHECK_EQ(clients_ok, n);
}

/* ---- pg_sleep: parked, the heartbeat goes on ------------------------------------ */
static int sleep_ok, sleep_done, beats, stop_beat;
static void sleeper(void *arg) {
    (void)arg;
    PGconn *c = PQconnectdb(conninfo);
    PGresult *r = PQstatus(c) == CONNECTION_OK ? PQexec(c, "SELECT pg_sleep(0.3)") : NULL;
    if (r && PQresultStatus(r) == PGRES_TUPLES_OK) __atomic_add_fetch(&sleep_ok, 1, __ATOMIC_RELAXED);
    PQclear(r);
    PQfinish(c);
    __atomic_add_fetch(&sleep_done, 1, __ATOMIC_RELEASE);
}
static void heartbeat(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&stop_beat, __ATOMIC_ACQUIRE)) {
        co_sleep(MS);
        __atomic_add_fetch(&beats, 1, __ATOMIC_RELAXED);
    }
}
static void test_pg_sleep(void) {
    sleep_ok = sleep_done = beats = stop_beat = 0;
    int t0 = threads_now();
    CHECK_EQ(co_go(heartbeat, NULL), 0);
    for (int i = 0; i < 10; i++) CHECK_EQ(co_go(sleeper, NULL), 0);
    co_sleep(150 * MS);
    int during = threads_now();
    int b0 = __atomic_load_n(&beats, __ATOMIC_RELAXED);
    wait_count(&sleep_done, 10);
    int b1 = __atomic_load_n(&beats, __ATOMIC_RELAXED);
    __atomic_store_n(&stop_beat, 1, __ATOMIC_RELEASE);
    CHECK_EQ(sleep_ok, 10);
    fprintf(stderr, "pg_sleep: threads %d -> %d, %d beats meanwhile\n", t0, during, b1 - b0);
    CHECK(during <= t0 + co_procs() + 4);
    CHECK(b1 > b0);
    co_sleep(5 * MS);
}

/* ---- reconnect storm -------------------------------------------------------------- */
static int storm_ok, storm_done;
static void reconnector(void *arg) {
    int n = (int)(intptr_t)arg;
    for (int i = 0; i < n; i++) {
        PGconn *c = PQconnectdb(conninfo);
        PGresult *r = PQstatus(c) == CONNECTION_OK ? PQexec(c, "SELECT 1") : NULL;
        if (r && PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "1") == 0)
            __atomic_add_fetch(&storm_ok, 1, __ATOMIC_RELAXED);
        PQclear(r);
        PQfinish(c);
    }
    __atomic_add_fetch(&storm_done, 1, __ATOMIC_RELEASE);
}
static void test_reconnect_storm(void) {
    storm_ok = storm_done = 0;
    for (int i = 0; i < 4; i++) CHECK_EQ(co_go(reconnector, (void *)(intptr_t)50), 0);
    wait_count(&storm_done, 4);
    CHECK_EQ(storm_ok, 200);
}

/* ---- the server stopped mid-run ---------------------------------------------------- */
static int killed_done, killed_err, killed_up;
static void quiet(void *arg, const char *msg) {
    (void)arg;
    (void)msg;
}
static void looper(void *arg) {
    (void)arg;
    PGconn *c = PQconnectdb(conninfo);
    __atomic_add_fetch(&killed_up, 1, __ATOMIC_RELEASE);
    if (PQstatus(c) == CONNECTION_OK) {
        PQsetNoticeProcessor(c, quiet, NULL); /* the shutdown's notices */
        for (;;) {
            PGresult *r = PQexec(c, "SELECT 1");
            int ok = r && PQresultStatus(r) == PGRES_TUPLES_OK;
            PQclear(r);
            if (!ok) break;
            co_yield();
        }
        __atomic_add_fetch(&killed_err, 1, __ATOMIC_RELAXED);
    }
    PQfinish(c);
    __atomic_add_fetch(&killed_done, 1, __ATOMIC_RELEASE);
}
static void stop_immediate(void *arg) {
    (void)arg;
    pg_ctl("stop", "immediate");
}
static void test_server_stopped(void) {
    killed_done = killed_err = killed_up = 0;
    for (int i = 0; i < 50; i++) CHECK_EQ(co_go(looper, NULL), 0);
    wait_count(&killed_up, 50); /* every one connected (or failed to) */
    co_sleep(50 * MS);
    co_blocking(stop_immediate, NULL);
    wait_count(&killed_done, 50);
    CHECK_EQ(killed_done, 50);
    CHECK_EQ(killed_err, 50); /* each was connected, each saw the error */
}

static int run(void *arg) {
    (void)arg;
    int fds0 = t_count_fds();
    T_RUN(test_many_clients);
    T_RUN(test_pg_sleep);
    T_RUN(test_reconnect_storm);
    T_RUN(test_server_stopped);
    CHECK_EQ(t_count_fds(), fds0);
    return 0;
}

int main(void) {
    if (!dlsym(RTLD_DEFAULT, "colony_hook_active")) {
        fprintf(stderr, "skip: libcolony_hook.so is not preloaded\n");
        return 77;
    }
    hs_preload_drop();
    glob_t g;
    if (glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        fprintf(stderr, "skip: no PostgreSQL server (apt-get install postgresql)\n");
        return 77;
    }
    snprintf(bindir, sizeof bindir, "%s", g.gl_pathv[g.gl_pathc - 1]);
    globfree(&g);
    *strrchr(bindir, '/') = 0;
    as_nobody = geteuid() == 0;
    if (as_nobody && (!hs_executable("/usr/sbin/runuser") || !getpwnam("nobody"))) {
        fprintf(stderr, "skip: root, and no runuser/nobody to run initdb as\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    if (hs_raise_nofile(4096) < 2600) {
        fprintf(stderr, "skip: fd limit below 2600\n");
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/colony_pg_XXXXXX");
    if (!mkdtemp(dir)) return 77;
    if (as_nobody) {
        struct passwd *pw = getpwnam("nobody");
        if (chown(dir, pw->pw_uid, pw->pw_gid) != 0) {
            fprintf(stderr, "skip: cannot hand %s to nobody\n", dir);
            rm_dir();
            return 77;
        }
    }
    char initdb[300], data[80];
    snprintf(initdb, sizeof initdb, "%s/initdb", bindir);
    snprintf(data, sizeof data, "%s/data", dir);
    char *iargv[] = {initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", NULL};
    port = hs_free_port();
    if (run_cmd(iargv) != 0 || pg_ctl("start", NULL) != 0) {
        fprintf(stderr, "skip: initdb or pg_ctl start failed (see %s)\n", dir);
        pg_ctl("stop", "immediate");
        return 77;
    }
    snprintf(conninfo, sizeof conninfo,
             "hostaddr=127.0.0.1 port=%d user=postgres dbname=postgres connect_timeout=120", port);
    t_begin(240);
    co_main(run, NULL);
    pg_ctl("stop", "immediate"); /* stopped already by the last test, unless it failed */
    rm_dir();
    return t_end();
}
#endif
