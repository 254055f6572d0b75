/* One million coroutines alive at once, each parked, with the default
 * kernel limits (vm.max_map_count 65530): stacks past the guard-page budget
 * are canary-checked and merge into few mappings. */
// ctest-timeout: 300
#include <colony.h>
#include <stdatomic.h>
#include <stdbool.h>

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

int main(void) {
    t_begin(290);
    T_RUN(test_million);
    return t_end();
}
