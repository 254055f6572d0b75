/* Stacks freed while the process is at vm.max_map_count. A stack of a
 * size other than the default is unmapped when its coroutine exits; in the
 * middle of a merged mapping that needs a split, which the kernel then
 * refuses (ENOMEM). The stack used to be counted unmapped anyway, its
 * pages kept for good. Now its pages are released at once, it stays
 * counted until it is really unmapped, and sysmon unmaps it once the
 * map count allows. Checked: at the map count, the count of mapped stacks
 * matches the stacks still mapped (mincore), and after the map count
 * comes back every one waiting is unmapped and counted out. Not under a sanitizer or an emulator, whose own
 * mappings would fail first. */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"
#include "t_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>


#define N 64
#define SEC (1000LL * 1000 * 1000)
static co_chan_t *chs[N];
static co_waitgroup_t wg = CO_WAITGROUP_INIT;
static char *los[N]; /* a byte on each one's stack */

static void holder(void *a) {
    intptr_t i = (intptr_t)a;
    volatile char c[2048];
    c[0] = 1;
    los[i] = (char *)&c[0];
    int v;
    co_chan_recv(chs[i], &v, CO_FOREVER);
    co_waitgroup_done(&wg);
}

static long vmas(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    long n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}
static int mapped(const char *p) {
    unsigned char v;
    return mincore((void *)((uintptr_t)p & ~(uintptr_t)4095), 4096, &v) == 0;
}
static int still_mapped(int from, int step) {
    int n = 0;
    for (int i = from; i < N; i += step) n += mapped(los[i]);
    return n;
}

static void test_unmap_refused(void) {
    for (int i = 0; i < N; i++) CHECK_EQ(co_chan_new(&chs[i], sizeof(int), 1), 0);
    co_attr_t at = {128 * 1024, "holder"}; /* not the default size: unmapped at exit */
    co_waitgroup_add(&wg, N);
    for (intptr_t i = 0; i < N; i++) CHECK_EQ(co_go_with(&at, holder, (void *)i), 0);
    int64_t t0 = co_now();
    while (co_now() - t0 < 10 * SEC) {
        int up = 0;
        for (int i = 0; i < N; i++) up += __atomic_load_n(&los[i], __ATOMIC_ACQUIRE) != NULL;
        if (up == N) break;
        usleep(1000);
    }
    int64_t base = co__stacks_mapped();
    CHECK(base >= N);

    /* the map count, used up: single pages of alternating protection */
    long max = 65530;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        if (fscanf(f, "%ld", &max) != 1) max = 65530;
        fclose(f);
    }
    size_t bigsz = (size_t)max * 2 * 4096;
    char *big = mmap(NULL, bigsz, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(big != MAP_FAILED);
    if (big == MAP_FAILED) return;
    long need = max - vmas() - 4;
    for (long i = 0; i < need / 2; i++)
        if (mprotect(big + i * 2 * 4096, 4096, PROT_READ) != 0) break;

    /* every other one exits: their stacks sit between live ones */
    for (int i = 1; i < N; i += 2) {
        int v = i;
        CHECK_EQ(co_chan_send(chs[i], &v, CO_FOREVER), 0);
    }
    t0 = co_now();
    while (co_count() > N / 2 && co_now() - t0 < 10 * SEC) usleep(1000);
    CHECK_EQ(co_count(), N / 2);
    /* (a stack goes just after its coroutine is counted out) */
    while (co_now() - t0 < 10 * SEC && co__stacks_mapped() - base + N != N / 2 + still_mapped(1, 2))
        usleep(1000);
    int odd_left = still_mapped(1, 2);
    int deferred = co__unmap_deferred();
    fprintf(stderr, "   at the map count: %d of %d exited stacks still mapped, %d waiting\n",
            odd_left, N / 2, deferred);
    /* counted as they are: the live half and those the kernel kept */
    CHECK_EQ(co__stacks_mapped() - base + N, (int64_t)(N / 2 + odd_left));
    CHECK_EQ(deferred, odd_left);

    /* the map count back: sysmon unmaps them */
    CHECK_EQ(munmap(big, bigsz), 0);
    t0 = co_now();
    while (co__unmap_deferred() > 0 && co_now() - t0 < 20 * SEC) usleep(10000);
    CHECK_EQ(co__unmap_deferred(), 0);
    /* (not mincore from here on: an address unmapped may be mapped again
     * by anything, now that the map count allows it) */
    for (int i = 0; i < N; i += 2) {
        int v = i;
        CHECK_EQ(co_chan_send(chs[i], &v, CO_FOREVER), 0);
    }
    CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(20 * SEC)), 0);
    t0 = co_now();
    while (co__stacks_mapped() > base - N && co_now() - t0 < 10 * SEC) usleep(1000);
    CHECK_EQ(co__stacks_mapped(), base - N);
    for (int i = 0; i < N; i++) co_chan_free(chs[i]);
}

int main(void) {
    if (t_sanitized() || t_emulator()) {
        fprintf(stderr, "skip: a sanitizer's or an emulator's own mappings fail first at the map count\n");
        return 77;
    }
    t_begin(50);
    co_config_t cfg = {.procs = 1};
    CHECK_EQ(co_init(&cfg), 0);
    T_RUN(test_unmap_refused);
    CHECK_EQ(co_shutdown(), 0);
    return t_end();
}
