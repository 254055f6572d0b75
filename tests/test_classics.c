/* Go's classics, written for colony: the concurrent prime sieve, a value
 * passed around a ring of 1,000 coroutines, and select fairness. */
// ctest-timeout: 300
#include "t.h"

#include <colony.h>

/* ---- the prime sieve ---------------------------------------------------------
 * generate -> filter(2) -> filter(3) -> filter(5) -> ... -> main. Each
 * filter drops the multiples of its prime. To shut down, main closes
 * `quit`; the generator sees it in its select, closes its output, and each
 * filter closes its own output when its input is closed and drained. */

#define NPRIMES 1000

static co_chan_t *quit;
static co_waitgroup_t sieve_wg;

static void generate(void *arg) {
    co_chan_t *out = arg;
    for (int i = 2;; i++) {
        co_case_t c[2] = {{.ch = out, .op = CO_SEND, .elem = &i}, {.ch = quit, .op = CO_RECV, .elem = NULL}};
        int rc = co_select(c, 2, CO_FOREVER);
        if (rc == 1) break;
        CHECK_EQ(rc, 0);
        CHECK_EQ(c[0].result, 0);
    }
    CHECK_EQ(co_chan_close(out), 0);
    co_waitgroup_done(&sieve_wg);
}

typedef struct {
    co_chan_t *in, *out;
    int prime;
} filter_t;

static void filter(void *arg) {
    filter_t *f = arg;
    int v;
    while (co_chan_recv(f->in, &v, CO_FOREVER) == 0)
        if (v % f->prime != 0) CHECK_EQ(co_chan_send(f->out, &v, CO_FOREVER), 0);
    CHECK_EQ(co_chan_close(f->out), 0);
    co_waitgroup_done(&sieve_wg);
}

static void test_prime_sieve(void) {
    static co_chan_t *chans[NPRIMES + 1];
    static filter_t filters[NPRIMES];
    static int primes[NPRIMES];
    CHECK_EQ(co_chan_new(&quit, 0, 0), 0);
    CHECK_EQ(co_chan_new(&chans[0], sizeof(int), 0), 0);
    co_waitgroup_add(&sieve_wg, 1);
    CHECK_EQ(co_go(generate, chans[0]), 0);
    for (int i = 0; i < NPRIMES; i++) {
        CHECK_EQ(co_chan_recv(chans[i], &primes[i], CO_FOREVER), 0);
        CHECK_EQ(co_chan_new(&chans[i + 1], sizeof(int), 0), 0);
        filters[i] = (filter_t){chans[i], chans[i + 1], primes[i]};
        co_waitgroup_add(&sieve_wg, 1);
        CHECK_EQ(co_go(filter, &filters[i]), 0);
    }
    CHECK_EQ(co_chan_close(quit), 0);
    int v;
    while (co_chan_recv(chans[NPRIMES], &v, CO_FOREVER) == 0) {}
    co_waitgroup_wait(&sieve_wg);

    /* the first 1,000 primes by trial division */
    int k = 0;
    for (int n = 2; k < NPRIMES; n++) {
        int prime = 1;
        for (int d = 2; d * d <= n; d++)
            if (n % d == 0) { prime = 0; break; }
        if (prime) {
            CHECK_EQ(primes[k], n);
            k++;
        }
    }
    CHECK_EQ(primes[NPRIMES - 1], 7919);
    for (int i = 0; i <= NPRIMES; i++) co_chan_free(chans[i]);
    co_chan_free(quit);
}

/* ---- a ring of 1,000 coroutines ----------------------------------------------
 * link i receives on ring[i] and sends value+1 on ring[i+1]; main feeds
 * ring[0] and reads ring[N]. A negative value is passed on and ends each
 * link. */

#define RING 1000
static co_chan_t *ring[RING + 1];
static co_waitgroup_t ring_wg;

static void ring_link(void *arg) {
    int i = (int)(intptr_t)arg;
    int v;
    for (;;) {
        CHECK_EQ(co_chan_recv(ring[i], &v, CO_FOREVER), 0);
        if (v >= 0) v++;
        CHECK_EQ(co_chan_send(ring[i + 1], &v, CO_FOREVER), 0);
        if (v < 0) break;
    }
    co_waitgroup_done(&ring_wg);
}

static void test_ring(void) {
    for (int i = 0; i <= RING; i++) CHECK_EQ(co_chan_new(&ring[i], sizeof(int), 0), 0);
    co_waitgroup_add(&ring_wg, RING);
    for (int i = 0; i < RING; i++) CHECK_EQ(co_go(ring_link, (void *)(intptr_t)i), 0);
    int v = 0;
    const int laps = 20;
    for (int lap = 0; lap < laps; lap++) {
        CHECK_EQ(co_chan_send(ring[0], &v, CO_FOREVER), 0);
        CHECK_EQ(co_chan_recv(ring[RING], &v, CO_FOREVER), 0);
    }
    CHECK_EQ(v, laps * RING);
    v = -1;
    CHECK_EQ(co_chan_send(ring[0], &v, CO_FOREVER), 0);
    CHECK_EQ(co_chan_recv(ring[RING], &v, CO_FOREVER), 0);
    CHECK_EQ(v, -1);
    co_waitgroup_wait(&ring_wg);
    for (int i = 0; i <= RING; i++) co_chan_free(ring[i]);
}

/* ---- select fairness ---------------------------------------------------------
 * Two always-ready channels: over 100,000 selects each side is chosen
 * 45 %..55 % of the time (the expected spread is ~0.16 %). */

#define NSEL 100000

static void test_fairness_recv(void) {
    co_chan_t *ch[2];
    int v[2];
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(co_chan_new(&ch[i], sizeof(int), 1), 0);
        CHECK_EQ(co_chan_send(ch[i], &i, 0), 0);
    }
    co_case_t c[2] = {{.ch = ch[0], .op = CO_RECV, .elem = &v[0]}, {.ch = ch[1], .op = CO_RECV, .elem = &v[1]}};
    long count[2] = {0, 0};
    for (int n = 0; n < NSEL; n++) {
        int rc = co_select(c, 2, n % 2 ? 0 : CO_FOREVER);
        CHECK(rc == 0 || rc == 1);
        if (rc < 0 || rc > 1) break;
        CHECK_EQ(v[rc], rc);
        count[rc]++;
        CHECK_EQ(co_chan_send(ch[rc], &rc, 0), 0); /* ready again */
    }
    fprintf(stderr, "recv fairness: %ld / %ld\n", count[0], count[1]);
    CHECK(count[0] >= NSEL * 45 / 100 && count[0] <= NSEL * 55 / 100);
    CHECK(count[1] >= NSEL * 45 / 100 && count[1] <= NSEL * 55 / 100);
    for (int i = 0; i < 2; i++) co_chan_free(ch[i]);
}

/* The same with two ready send cases and three mixed cases. */
static void test_fairness_mixed(void) {
    co_chan_t *s0, *s1, *r;
    CHECK_EQ(co_chan_new(&s0, sizeof(int), 1), 0);
    CHECK_EQ(co_chan_new(&s1, sizeof(int), 1), 0);
    CHECK_EQ(co_chan_new(&r, sizeof(int), 1), 0);
    CHECK_EQ(co_chan_send(r, &(int){0}, 0), 0);
    int out = 1, in;
    co_case_t c[3] = {{.ch = s0, .op = CO_SEND, .elem = &out},
                      {.ch = s1, .op = CO_SEND, .elem = &out},
                      {.ch = r, .op = CO_RECV, .elem = &in}};
    long count[3] = {0, 0, 0};
    const int n = NSEL * 3 / 2;
    for (int i = 0; i < n; i++) {
        int rc = co_select(c, 3, 0);
        CHECK(rc >= 0 && rc <= 2);
        if (rc < 0 || rc > 2) break;
        count[rc]++;
        int x = 0;
        if (rc == 0) CHECK_EQ(co_chan_recv(s0, &x, 0), 0);
        if (rc == 1) CHECK_EQ(co_chan_recv(s1, &x, 0), 0);
        if (rc == 2) CHECK_EQ(co_chan_send(r, &x, 0), 0);
    }
    fprintf(stderr, "mixed fairness: %ld / %ld / %ld\n", count[0], count[1], count[2]);
    for (int i = 0; i < 3; i++) CHECK(count[i] >= n * 30 / 100 && count[i] <= n * 37 / 100);
    co_chan_free(s0);
    co_chan_free(s1);
    co_chan_free(r);
}

/* Each select's choice is independent of the last: with 3 and with 4 ready
 * cases, whatever case fired, each case comes next 1/3 (1/4) of the time,
 * within +-0.06 (the expected spread is ~0.004). Once a select's generator
 * started where the last one's had stopped, and after case 2 of 3 fired,
 * case 0 never came next. Both with a deadline of 0 (the lock-free look)
 * and CO_FOREVER. */
static void fairness_transitions(int k, int64_t deadline) {
    co_chan_t *ch[4];
    int v[4];
    co_case_t c[4];
    for (int i = 0; i < k; i++) {
        CHECK_EQ(co_chan_new(&ch[i], sizeof(int), 1), 0);
        CHECK_EQ(co_chan_send(ch[i], &i, 0), 0);
        c[i] = (co_case_t){.ch = ch[i], .op = CO_RECV, .elem = &v[i]};
    }
    long t[4][4] = {{0}};
    int prev = -1;
    for (int n = 0; n < NSEL; n++) {
        int rc = co_select(c, k, deadline);
        CHECK(rc >= 0 && rc < k);
        if (rc < 0 || rc >= k) break;
        CHECK_EQ(co_chan_send(ch[rc], &rc, 0), 0); /* ready again */
        if (prev >= 0) t[prev][rc]++;
        prev = rc;
    }
    for (int i = 0; i < k; i++) {
        long tot = 0;
        for (int j = 0; j < k; j++) tot += t[i][j];
        for (int j = 0; j < k; j++) {
            double p = tot ? (double)t[i][j] / (double)tot : 0;
            if (p < 1.0 / k - 0.06 || p > 1.0 / k + 0.06) {
                fprintf(stderr, "%d cases: after %d, %d came next %.3f of the time\n", k, i, j, p);
                CHECK(0);
            }
        }
    }
    for (int i = 0; i < k; i++) co_chan_free(ch[i]);
}
static void test_fairness_independent(void) {
    fairness_transitions(3, 0);
    fairness_transitions(3, CO_FOREVER);
    fairness_transitions(4, 0);
    fairness_transitions(4, CO_FOREVER);
}

/* Four ready cases among six (a NULL channel and an empty one between
 * them): the ready ones are chosen 22 %..28 % each (the expected spread is
 * ~0.14 %), the others never. */
static void test_fairness_sparse(void) {
    co_chan_t *ch[5];
    int v[6];
    for (int i = 0; i < 5; i++) CHECK_EQ(co_chan_new(&ch[i], sizeof(int), 1), 0);
    /* cases: 0 ch0, 1 NULL, 2 ch1, 3 ch2 (kept empty), 4 ch3, 5 ch4 */
    co_chan_t *chs[6] = {ch[0], NULL, ch[1], ch[2], ch[3], ch[4]};
    co_case_t c[6];
    for (int i = 0; i < 6; i++) {
        c[i] = (co_case_t){.ch = chs[i], .op = CO_RECV, .elem = &v[i]};
        if (chs[i] && i != 3) CHECK_EQ(co_chan_send(chs[i], &i, 0), 0);
    }
    long count[6] = {0};
    for (int n = 0; n < NSEL; n++) {
        int rc = co_select(c, 6, n % 2 ? 0 : CO_FOREVER);
        CHECK(rc == 0 || rc == 2 || rc == 4 || rc == 5);
        if (rc < 0 || rc > 5) break;
        CHECK_EQ(v[rc], rc);
        count[rc]++;
        CHECK_EQ(co_chan_send(chs[rc], &rc, 0), 0); /* ready again */
    }
    fprintf(stderr, "sparse fairness: %ld %ld %ld %ld %ld %ld\n", count[0], count[1], count[2],
            count[3], count[4], count[5]);
    for (int i = 0; i < 6; i++) {
        if (i == 1 || i == 3)
            CHECK_EQ(count[i], 0);
        else
            CHECK(count[i] >= NSEL * 22 / 100 && count[i] <= NSEL * 28 / 100);
    }
    for (int i = 0; i < 5; i++) co_chan_free(ch[i]);
}

static int run(void *arg) {
    T_RUN(test_prime_sieve);
    T_RUN(test_ring);
    T_RUN(test_fairness_recv);
    T_RUN(test_fairness_mixed);
    T_RUN(test_fairness_sparse);
    T_RUN(test_fairness_independent);
    return 0;
}

int main(void) {
    t_begin(280);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
