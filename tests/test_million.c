/* One million coroutines alive at once, each parked, with the default
 * kernel limits (vm.max_map_count 65530): every stack has a lightweight
 * guard region (Linux 6.13+), or, on older kernels, stacks past the
 * mprotect guard budget are canary-checked; either way mappings merge and
 * the map count stays under the limit. */
// ctest-timeout: 300
// ctest-no-chaos (a million coroutines take long enough once)
#include <colony.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "t.h"

static co_waitgroup_t started = CO_WAITGROUP_INIT;
static co_waitgroup_t gate = CO_WAITGROUP_INIT;
static co_waitgroup_t done = CO_WAITGROUP_INIT;
static atomic_long ran;

static void parked(void *arg) {
    (void)arg;
    co_waitgroup_done(&started);
    co_waitgroup_wait(&gate); /* parked until the gate opens */
    atomic_fetch_add(&ran, 1);
    co_waitgroup_done(&done);
}

static int count_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static void test_million(void) {
    long n = 1000000;
    bool ci = getenv("COLONY_TEST_SMALL") != NULL || t_sanitized();
    if (ci) n = 2000; /* TSan keeps a heavy fiber per live coroutine */
    co_waitgroup_add(&gate, 1);
    co_waitgroup_add(&started, (int)n);
    co_waitgroup_add(&done, (int)n);
    for (long i = 0; i < n; i++) {
        int rc = co_go(parked, NULL);
        CHECK_EQ(rc, 0);
        if (rc) break;
    }
    co_waitgroup_wait(&started);
    CHECK(co_count() >= n);
    int maps = count_maps();
    fprintf(stderr, "  %ld coroutines parked, %d mappings\n", n, maps);
    CHECK(maps > 0 && maps < 65530);
    co_waitgroup_done(&gate);
    co_waitgroup_wait(&done);
    CHECK_EQ(atomic_load(&ran), n);
}

/* Dead coroutines keep their stacks for reuse, but not forever: sysmon
 * frees, once a second, those nobody reused (beyond a reserve of 1,024
 * plus the per-P caches). Each coroutine here dirties 32 KiB of stack; after
 * they all exit, the resident set must shrink by at least half of what the
 * non-reserved stacks hold, within 10 s. */
#define DIRTY (32 * 1024)
static co_waitgroup_t d_started = CO_WAITGROUP_INIT, d_gate = CO_WAITGROUP_INIT,
                      d_done = CO_WAITGROUP_INIT;

static void dirty_and_park(void *arg) {
    (void)arg;
    volatile char buf[DIRTY];
    for (int i = 0; i < DIRTY; i += 1024) buf[i] = 1; /* volatile: every page is touched */
    (void)buf[0];
    co_waitgroup_done(&d_started);
    co_waitgroup_wait(&d_gate);
    co_waitgroup_done(&d_done);
}

static long rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = -1;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = -1;
        fclose(f);
    }
    return rss < 0 ? -1 : rss * sysconf(_SC_PAGESIZE);
}

static void test_dead_stacks_given_back(void) {
    if (t_tsan()) {
        /* TSan keeps shadow memory for unmapped stacks: the resident set
         * says nothing about them there. The other suites check this. */
        fprintf(stderr, "  skipped under TSan (RSS includes its shadow memory)\n");
        return;
    }
    int n = t_sanitized() ? 2000 : 4000;
    co_waitgroup_add(&d_gate, 1);
    co_waitgroup_add(&d_started, n);
    co_waitgroup_add(&d_done, n);
    for (int i = 0; i < n; i++) CHECK_EQ(co_go(dirty_and_park, NULL), 0);
    co_waitgroup_wait(&d_started);
    long peak = rss_bytes();
    co_waitgroup_done(&d_gate);
    co_waitgroup_wait(&d_done);
    long kept = (1024L + 64L * co_procs()) * (DIRTY + 8192);
    long want_drop = ((long)n * DIRTY - kept) / 2;
    CHECK(want_drop > 0);
    long now = rss_bytes();
    for (int i = 0; i < 100 && peak - now < want_drop; i++) {
        co_sleep(100000000);
        now = rss_bytes();
    }
    fprintf(stderr, "  rss with %d parked: %ld MiB; after they exited: %ld MiB\n", n, peak >> 20,
            now >> 20);
    CHECK(peak > 0 && now > 0);
    CHECK(peak - now >= want_drop);
}

int main(void) {
    t_begin(290);
    T_RUN(test_dead_stacks_given_back);
    T_RUN(test_million);
    return t_end();
}
