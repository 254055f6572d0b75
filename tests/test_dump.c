/* co_dump: every coroutine's header, entry function and stack, unwound from
 * its saved context, checked for 10,000 coroutines in five wait states. */
// ctest-no-chaos
// ctest-timeout: 120
#include "t.h"

#define PER 2000

static co_chan_t *rch, *sch, *selch;
static co_mutex_t mu = CO_MUTEX_INIT;
static co_waitgroup_t wg;
static int started; /* atomic: workers about to block */

__attribute__((noinline)) void dump_recv_worker(void *a) {
    (void)a;
    __atomic_add_fetch(&started, 1, __ATOMIC_RELAXED);
    int v;
    int r = co_chan_recv(rch, &v, CO_FOREVER);
    __asm__ volatile("" ::"r"(r) : "memory");
}
__attribute__((noinline)) void dump_send_worker(void *a) {
    (void)a;
    __atomic_add_fetch(&started, 1, __ATOMIC_RELAXED);
    int v = 1;
    int r = co_chan_send(sch, &v, CO_FOREVER);
    __asm__ volatile("" ::"r"(r) : "memory");
}
__attribute__((noinline)) void dump_mutex_worker(void *a) {
    (void)a;
    __atomic_add_fetch(&started, 1, __ATOMIC_RELAXED);
    co_mutex_lock(&mu);
    co_mutex_unlock(&mu);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void dump_wg_worker(void *a) {
    (void)a;
    __atomic_add_fetch(&started, 1, __ATOMIC_RELAXED);
    co_waitgroup_wait(&wg);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) void dump_select_worker(void *a) {
    (void)a;
    __atomic_add_fetch(&started, 1, __ATOMIC_RELAXED);
    int v;
    co_case_t c[2] = {{.ch = selch, .op = CO_RECV, .elem = &v}, {.ch = NULL, .op = CO_RECV}};
    int r = co_select(c, 2, CO_FOREVER);
    __asm__ volatile("" ::"r"(r) : "memory");
}

static int64_t long_started; /* atomic: when dump_long_worker began its receive */
__attribute__((noinline)) void dump_long_worker(void *a) {
    int v;
    __atomic_store_n(&long_started, co_now(), __ATOMIC_RELEASE);
    int r = co_chan_recv(a, &v, CO_FOREVER);
    __asm__ volatile("" ::"r"(r) : "memory");
}

static const struct {
    const char *reason, *fn;
    void (*f)(void *);
} kinds[5] = {
    {"chan receive", "dump_recv_worker", dump_recv_worker},
    {"chan send", "dump_send_worker", dump_send_worker},
    {"sync.Mutex.Lock", "dump_mutex_worker", dump_mutex_worker},
    {"sync.WaitGroup.Wait", "dump_wg_worker", dump_wg_worker},
    {"select", "dump_select_worker", dump_select_worker},
};

/* For each kind: how many coroutines are shown waiting for its reason with
 * its entry function and a frame in it; bad: blocks of a kind without. */
static char creator[64]; /* " in coroutine <main_co's id>\n" */

static void tally(const char *d, int *ok, int *bad) {
    memset(ok, 0, 5 * sizeof *ok);
    *bad = 0;
    for (const char *p = strstr(d, "coroutine "); p;) {
        const char *next = strstr(p + 1, "\ncoroutine ");
        size_t len = next ? (size_t)(next - p) + 1 : strlen(p); /* with its last newline */
        const char *eol = memchr(p, '\n', len);
        for (int k = 0; k < 5; k++) {
            char hdr[64];
            /* "[waiting, chan receive]:" or, past a second, "..., 2 seconds]:" */
            snprintf(hdr, sizeof hdr, "[waiting, %s", kinds[k].reason);
            const char *h = strstr(p, hdr);
            if (!h || !eol || h > eol) continue;
            char after = h[strlen(hdr)];
            if (after != ']' && after != ',') continue;
            char entry[64], frame[64];
            snprintf(entry, sizeof entry, "  entry: %s+", kinds[k].fn);
            snprintf(frame, sizeof frame, "\n  %s+", kinds[k].fn);
            char *blk = strndup(p, len);
            /* and where it was made: main_co's frame, in main_co's coroutine */
            if (blk && strstr(blk, entry) && strstr(eol, frame) && strstr(blk, frame) &&
                strstr(blk, "\n  created by main_co+") && strstr(blk, creator))
                ok[k]++;
            else
                (*bad)++;
            free(blk);
        }
        p = next ? next + 1 : NULL;
    }
}

static int main_co(void *arg) {
    (void)arg;
    char *d = t_dump();
    CHECK(d != NULL);
    if (d && (strstr(d, "(no frames") || !strstr(d, "\n  main_co+"))) {
        fprintf(stderr, "skip: this build cannot unwind or symbolize coroutine stacks\n");
        free(d);
        return 77;
    }
    free(d);
    snprintf(creator, sizeof creator, " in coroutine %llu\n", (unsigned long long)co_id());
    CHECK_EQ(co_chan_new(&rch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&sch, sizeof(int), 0), 0);
    CHECK_EQ(co_chan_new(&selch, sizeof(int), 0), 0);
    co_waitgroup_add(&wg, 1);
    co_mutex_lock(&mu);
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < PER; i++) CHECK_EQ(co_go(kinds[k].f, NULL), 0);
    /* every worker on its way to block, then a dump until all show parked
     * (each dump unwinds 10,000 stacks: few of them) */
    while (__atomic_load_n(&started, __ATOMIC_RELAXED) < 5 * PER) co_sleep(1000000);
    int ok[5], bad = 0, all = 0;
    for (int tries = 0; tries < 20 && !all; tries++) {
        co_sleep(100 * 1000000LL);
        d = t_dump();
        if (!d) continue;
        tally(d, ok, &bad);
        free(d);
        all = 1;
        for (int k = 0; k < 5; k++) all &= ok[k] == PER;
    }
    for (int k = 0; k < 5; k++) {
        if (ok[k] != PER) fprintf(stderr, "%s: %d of %d shown right\n", kinds[k].fn, ok[k], PER);
        CHECK_EQ(ok[k], PER);
    }
    CHECK_EQ(bad, 0);
    /* let them all finish */
    co_chan_close(rch);
    co_chan_close(selch);
    int v;
    for (int i = 0; i < PER; i++) CHECK_EQ(co_chan_recv(sch, &v, CO_FOREVER), 0);
    co_mutex_unlock(&mu);
    co_waitgroup_done(&wg);

    /* How long: a coroutine parked 2.5 s shows at least "2 seconds" */
    co_chan_t *lch;
    CHECK_EQ(co_chan_new(&lch, sizeof(int), 0), 0);
    CHECK_EQ(co_go_with(&(co_attr_t){.name = "long"}, dump_long_worker, lch), 0);
    /* 2.5 s from its receive's start, not from its spawn: a loaded host
     * may run it late */
    while (__atomic_load_n(&long_started, __ATOMIC_ACQUIRE) == 0) co_sleep(1000000LL);
    while (co_now() - __atomic_load_n(&long_started, __ATOMIC_ACQUIRE) < 2500 * 1000000LL) co_sleep(10 * 1000000LL);
    d = t_dump();
    CHECK(d != NULL);
    const char *lh = d ? strstr(d, "'long' [waiting, chan receive, ") : NULL;
    CHECK(lh != NULL);
    if (d && !lh) { /* what it said instead */
        const char *l = strstr(d, "'long'");
        fprintf(stderr, "the long wait's line: %.100s\n", l ? l : "(absent)");
    }
    if (lh) {
        unsigned long long secs = strtoull(lh + strlen("'long' [waiting, chan receive, "), NULL, 10);
        if (secs < 2) fprintf(stderr, "long wait shown as: %.60s\n", lh);
        CHECK(secs >= 2);
        CHECK(strstr(lh, " seconds]:") != NULL || strstr(lh, " minutes]:") != NULL);
    }
    free(d);
    co_chan_close(lch);
    while (co_count() > 1) co_sleep(1000000);
    co_chan_free(rch);
    co_chan_free(sch);
    co_chan_free(selch);
    co_chan_free(lch);
    return 0;
}

int main(void) {
    t_begin(100);
    int r = co_main(main_co, NULL);
    if (r == 77) return 77;
    CHECK_EQ(r, 0);
    t_passed += !t_checks_failed;
    t_failed += !!t_checks_failed;
    return t_end();
}
