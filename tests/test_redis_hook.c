/* hiredis's blocking API from coroutines through libcolony_hook.so
 * against a redis-server this test starts and stops: 1,000 coroutines
 * (300 in sanitizer builds) each with its own connection, every reply
 * checked, every connection closed, no fd left; BLPOPs parked without a
 * thread each; a reconnect storm; the server killed mid-run gives every
 * coroutine hiredis's error, none hangs. Behaviour, not timing. */
// ctest-timeout: 60
// ctest-preload-hook
// ctest-uses: hiredis
// ctest-no-chaos
#define _GNU_SOURCE 1
#include "t.h"
#include "test_hook_servers.h"

#include <colony.h>

#include <dlfcn.h>
#include <stdint.h>

#if !COLONY_HAVE_HIREDIS
int main(void) {
    fprintf(stderr, "skip: built without hiredis (libhiredis-dev)\n");
    return 77;
}
#else
#include <hiredis/hiredis.h>

#define MS 1000000LL
#define GIVE_UP (20000 * MS)

static int port;
static pid_t server;

static redisContext *dial(void) {
    struct timeval tv = {10, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && !c->err) redisSetTimeout(c, tv);
    return c;
}

static int threads_now(void) {
    co_sched_stats_t st;
    co_sched_stats(&st);
    return st.threads;
}

static void wait_count(int *n, int want) {
    int64_t t0 = co_now();
    while (__atomic_load_n(n, __ATOMIC_ACQUIRE) < want && co_now() - t0 < GIVE_UP) co_sleep(MS);
}

/* ---- many clients ---------------------------------------------------------- */
static int clients_ok, clients_done;
static void client(void *arg) {
    int i = (int)(intptr_t)arg, ok = 0;
    redisContext *c = dial();
    if (c && !c->err) {
        ok = 1;
        for (int k = 1; k <= 10 && ok; k++) {
            redisReply *r = redisCommand(c, "INCR co:k:%d", i);
            ok = r && r->type == REDIS_REPLY_INTEGER && r->integer == k;
            if (r) freeReplyObject(r);
        }
        redisReply *r = ok ? redisCommand(c, "GET co:k:%d", i) : NULL;
        ok = r && r->type == REDIS_REPLY_STRING && strcmp(r->str, "10") == 0;
        if (r) freeReplyObject(r);
        r = redisCommand(c, "DEL co:k:%d", i);
        ok = ok && r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        if (r) freeReplyObject(r);
    }
    if (!ok) fprintf(stderr, "client %d: %s\n", i, c ? c->errstr : "no context");
    if (c) redisFree(c);
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

/* ---- BLPOP: parked, not a thread each ---------------------------------------- */
static int blpop_ok, blpop_done, beats;
static void blpop(void *arg) {
    (void)arg;
    redisContext *c = dial();
    redisReply *r = c && !c->err ? redisCommand(c, "BLPOP co:never 0.3") : NULL;
    if (r && (r->type == REDIS_REPLY_NIL ||
              (r->type == REDIS_REPLY_ARRAY && r->elements == 0)))
        __atomic_add_fetch(&blpop_ok, 1, __ATOMIC_RELAXED);
    if (r) freeReplyObject(r);
    if (c) redisFree(c);
    __atomic_add_fetch(&blpop_done, 1, __ATOMIC_RELEASE);
}
static int stop_beat;
static void heartbeat(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&stop_beat, __ATOMIC_ACQUIRE)) {
        co_sleep(MS);
        __atomic_add_fetch(&beats, 1, __ATOMIC_RELAXED);
    }
}
static void test_blpop(void) {
    blpop_ok = blpop_done = beats = stop_beat = 0;
    int t0 = threads_now();
    CHECK_EQ(co_go(heartbeat, NULL), 0);
    for (int i = 0; i < 10; i++) CHECK_EQ(co_go(blpop, NULL), 0);
    co_sleep(100 * MS);
    int during = threads_now();
    int b0 = __atomic_load_n(&beats, __ATOMIC_RELAXED);
    wait_count(&blpop_done, 10);
    int b1 = __atomic_load_n(&beats, __ATOMIC_RELAXED);
    __atomic_store_n(&stop_beat, 1, __ATOMIC_RELEASE);
    CHECK_EQ(blpop_ok, 10);
    fprintf(stderr, "blpop: threads %d -> %d, heartbeat %d beats while blocked\n", t0, during,
            b1 - b0);
    CHECK(during <= t0 + co_procs() + 4); /* parked, not a thread each */
    CHECK(b1 > b0);                        /* the heartbeat went on */
    co_sleep(5 * MS);
}

/* ---- reconnect storm --------------------------------------------------------- */
static int storm_ok, storm_done;
static void reconnector(void *arg) {
    int n = (int)(intptr_t)arg;
    for (int i = 0; i < n; i++) {
        redisContext *c = dial();
        redisReply *r = c && !c->err ? redisCommand(c, "PING") : NULL;
        if (r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0)
            __atomic_add_fetch(&storm_ok, 1, __ATOMIC_RELAXED);
        if (r) freeReplyObject(r);
        if (c) redisFree(c);
    }
    __atomic_add_fetch(&storm_done, 1, __ATOMIC_RELEASE);
}
static void test_reconnect_storm(void) {
    storm_ok = storm_done = 0;
    for (int i = 0; i < 4; i++) CHECK_EQ(co_go(reconnector, (void *)(intptr_t)50), 0);
    wait_count(&storm_done, 4);
    CHECK_EQ(storm_ok, 200);
}

/* ---- the server killed mid-run ------------------------------------------------- */
static int killed_done, killed_err, killed_up;
static void looper(void *arg) {
    (void)arg;
    redisContext *c = dial();
    __atomic_add_fetch(&killed_up, 1, __ATOMIC_RELEASE);
    if (c && !c->err) {
        for (;;) {
            redisReply *r = redisCommand(c, "INCR co:loop");
            if (!r) break;
            freeReplyObject(r);
            co_yield();
        }
        if (c->err) __atomic_add_fetch(&killed_err, 1, __ATOMIC_RELAXED);
    }
    if (c) redisFree(c);
    __atomic_add_fetch(&killed_done, 1, __ATOMIC_RELEASE);
}
static void test_server_killed(void) {
    killed_done = killed_err = killed_up = 0;
    for (int i = 0; i < 50; i++) CHECK_EQ(co_go(looper, NULL), 0);
    wait_count(&killed_up, 50); /* every one connected (or failed to) */
    co_sleep(50 * MS);
    hs_stop(server, SIGKILL);
    server = -1;
    wait_count(&killed_done, 50);
    CHECK_EQ(killed_done, 50);
    CHECK_EQ(killed_err, 50);
}

static int run(void *arg) {
    (void)arg;
    int fds0 = t_count_fds();
    T_RUN(test_many_clients);
    T_RUN(test_blpop);
    T_RUN(test_reconnect_storm);
    T_RUN(test_server_killed);
    CHECK_EQ(t_count_fds(), fds0);
    return 0;
}

int main(void) {
    if (!dlsym(RTLD_DEFAULT, "colony_hook_active")) {
        fprintf(stderr, "skip: libcolony_hook.so is not preloaded\n");
        return 77;
    }
    hs_preload_drop();
    const char *bin = "/usr/bin/redis-server";
    if (!hs_executable(bin)) {
        fprintf(stderr, "skip: no %s (apt-get install redis-server)\n", bin);
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    if (hs_raise_nofile(4096) < 2600) {
        fprintf(stderr, "skip: fd limit below 2600\n");
        return 77;
    }
    port = hs_free_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    char *argv[] = {(char *)bin, "--port", ps, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--maxclients", "3000", "--dir", "/tmp", NULL};
    server = hs_spawn(argv);
    if (server < 0 || !hs_wait_port(port, server, 5000)) {
        fprintf(stderr, "skip: redis-server did not start\n");
        hs_stop(server, SIGKILL);
        return 77;
    }
    t_begin(50);
    co_main(run, NULL);
    hs_stop(server, SIGTERM);
    return t_end();
}
#endif
