/* The race detector with stack compaction (TSan builds only; skipped
 * elsewhere). Compaction copies a parked coroutine's stack out and back on
 * other threads, unrecorded, and must add no happens-before edge: a race
 * between a compacted coroutine and another is still reported, and what a
 * channel orders (a value handed to a compacted receiver) stays clean. Each
 * scenario runs on one P in a child process (as tests/test_race.c does),
 * its stderr checked. */
// ctest-timeout: 120
// ctest-no-chaos (the scenarios pin one P)
#include <colony.h>
#include <stdlib.h>
#include <string.h>

#include "t.h"
#include "t_internal.h"

#define RACE_REPORT "WARNING: ThreadSanitizer: data race"

static int shared;
static co_waitgroup_t done = CO_WAITGROUP_INIT;
static co_chan_t *ch;
static int bad; /* the child's own failures */

static __attribute__((noinline)) void put(int v) { *(volatile int *)&shared = v; }

/* Until one coroutine is compacted (bounded: a broken build fails). The
 * poll reads an atomic of the runtime's and sleeps on a timer: neither
 * orders anything between coroutines. */
static void until_compacted(void) {
    for (int i = 0; i < 20000 && co_stack_compacted() < 1; i++) co_sleep(CO_MILLISECOND);
    if (co_stack_compacted() < 1) bad = 1;
}

/* race: the first writes, then parks (compacted) in a receive; the second,
 * not ordered after that write, writes too, then wakes it. */
static void racy_parker(void *arg) {
    (void)arg;
    co_stack_compactable(1);
    put(1);
    int v = 0;
    if (co_chan_recv(ch, &v, CO_FOREVER) != 0 || v != 7) bad = 1;
    co_waitgroup_done(&done);
}
static void racy_other(void *arg) {
    (void)arg;
    until_compacted();
    put(2);
    int v = 7;
    if (co_chan_send(ch, &v, CO_FOREVER) != 0) bad = 1;
    co_waitgroup_done(&done);
}

/* chan: the receiver is compacted; the sender writes, then sends; the
 * receiver writes after its receive: ordered by the channel. */
static void clean_parker(void *arg) {
    (void)arg;
    co_stack_compactable(1);
    int v = 0;
    if (co_chan_recv(ch, &v, CO_FOREVER) != 0 || v != 1) bad = 1;
    put(v + 1);
    co_waitgroup_done(&done);
}
static void clean_sender(void *arg) {
    (void)arg;
    until_compacted();
    put(1);
    int v = 1;
    if (co_chan_send(ch, &v, CO_FOREVER) != 0) bad = 1;
    co_waitgroup_done(&done);
}

static int run_child(const char *name) {
    co_config_t cfg = {.procs = 1};
    if (co_init(&cfg) != 0) return 2;
    co__test_compact_set_ms(0);
    if (co_chan_new(&ch, sizeof(int), 0) != 0) return 2;
    co_waitgroup_add(&done, 2);
    if (!strcmp(name, "race")) {
        co_go(racy_parker, NULL);
        co_go(racy_other, NULL);
    } else if (!strcmp(name, "chan")) {
        co_go(clean_parker, NULL);
        co_go(clean_sender, NULL);
    } else {
        return 2;
    }
    co_waitgroup_wait(&done);
    co_chan_free(ch);
    uint64_t c, r;
    co__test_compact_counts(&c, &r);
    if (c < 1 || r != c) bad = 1; /* it was compacted, and copied back */
    fprintf(stderr, "child: compactions=%llu restores=%llu ok=%d\n", (unsigned long long)c,
            (unsigned long long)r, !bad);
    return T_SHUTDOWN() == 0 && !bad ? 0 : 3;
}

/* Run scenario `name` in a child: its wait status, its stderr in buf. */
static int child(const char *name, char *buf, size_t size) {
    return t_race_child("test_compact_race", name, buf, size);
}

static char out[1 << 16];

static void test_race_with_compacted_reported(void) {
    int st = child("race", out, sizeof out);
    /* 66: TSan's exit code for a report (the child's own checks passed,
     * or it would have exited 3 before TSan's exit) */
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 66);
    CHECK_EQ(t_count(out, RACE_REPORT), 1);
    CHECK(strstr(out, "ok=1") != NULL); /* compacted, woken, values right */
    CHECK(strstr(out, "racy_parker") != NULL && strstr(out, "racy_other") != NULL);
    if (t_count(out, RACE_REPORT) != 1) fprintf(stderr, "%s", out);
}

static void test_chan_to_compacted_clean(void) {
    int st = child("chan", out, sizeof out);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strstr(out, "ThreadSanitizer") == NULL);
    CHECK(strstr(out, "ok=1") != NULL);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || strstr(out, "ThreadSanitizer"))
        fprintf(stderr, "  chan (status %#x):\n%s", st, out);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return run_child(argv[2]);
    if (!t_tsan()) {
        fprintf(stderr, "test_compact_race: not a TSan build: skipped\n");
        return 77;
    }
    t_begin(110);
    T_RUN(test_race_with_compacted_reported);
    T_RUN(test_chan_to_compacted_clean);
    return t_end();
}
