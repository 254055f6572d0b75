/* Channel stress: 8 producers and 8 consumers, coroutines and plain threads
 * mixed, through channels of capacity 0, 1 and 64, with random deadlines
 * (a timed-out operation is retried, so nothing is lost), plain operations
 * and selects mixed, and a close at the end: every value arrives exactly
 * once. Then a close racing with busy senders and receivers: exactly the
 * values whose send returned 0 arrive. Meant to run under TSan and ASan. */
// ctest-timeout: 600
#include "t.h"

#include <colony.h>
#include <pthread.h>
#include <sched.h>


#define NPROD 8
#define NCONS 8
#define NTHREADS_EACH 2 /* of the 8 on each side, this many are plain threads */

static long n_values; /* per capacity */

static uint64_t rnd(uint64_t *s) { /* xorshift64 */
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* A random deadline: forever, already past, or a few microseconds away. */
static int64_t rnd_deadline(uint64_t *s) {
    switch (rnd(s) % 4) {
    case 0: return CO_FOREVER;
    case 1: return 0;
    default: return co_deadline_after((int64_t)(rnd(s) % 20000));
    }
}

static void backoff(bool thread) {
    if (thread)
        sched_yield();
    else
        co_yield();
}

typedef struct {
    co_chan_t *ch;
    co_chan_t *never; /* only ever received from: a case that is never ready */
    int id;
    bool thread;
    co_waitgroup_t *wg;
    uint8_t *seen;
    long got, sum; /* consumers */
    long sent;     /* producers */
} worker_t;

static void producer(void *arg) {
    worker_t *w = arg;
    uint64_t s = 0x9E3779B97F4A7C15ULL * (uint64_t)(w->id + 1);
    for (long v = w->id; v < n_values; v += NPROD) {
        int64_t x = v;
        for (;;) {
            int64_t dl = rnd_deadline(&s);
            int rc;
            if (rnd(&s) % 3 == 0) {
                int64_t junk;
                co_case_t c[3] = {{.ch = w->never, .op = CO_RECV, .elem = &junk},
                                  {.ch = w->ch, .op = CO_SEND, .elem = &x},
                                  {.ch = NULL, .op = CO_RECV, .elem = NULL}};
                rc = co_select(c, 3, dl);
                if (rc >= 0) {
                    CHECK_EQ(rc, 1);
                    CHECK_EQ(c[1].result, 0);
                    rc = 0;
                }
            } else {
                rc = co_chan_send(w->ch, &x, dl);
            }
            if (rc == 0) break;
            CHECK_EQ(rc, CO_ETIMEDOUT);
            if (rc != CO_ETIMEDOUT) goto out;
            backoff(w->thread);
        }
        w->sent++;
    }
out:
    co_waitgroup_done(w->wg);
}

static void consumer(void *arg) {
    worker_t *w = arg;
    uint64_t s = 0xD1B54A32D192ED03ULL * (uint64_t)(w->id + 1);
    for (;;) {
        int64_t dl = rnd_deadline(&s);
        int64_t x = -1;
        int rc;
        if (rnd(&s) % 3 == 0) {
            int64_t junk;
            co_case_t c[2] = {{.ch = w->ch, .op = CO_RECV, .elem = &x},
                              {.ch = w->never, .op = CO_RECV, .elem = &junk}};
            rc = co_select(c, 2, dl);
            if (rc >= 0) {
                CHECK_EQ(rc, 0);
                rc = c[0].result;
            }
        } else {
            rc = co_chan_recv(w->ch, &x, dl);
        }
        if (rc == CO_ECLOSED) break;
        if (rc == CO_ETIMEDOUT) {
            backoff(w->thread);
            continue;
        }
        CHECK_EQ(rc, 0);
        if (rc != 0) break;
        CHECK(x >= 0 && x < n_values);
        if (x < 0 || x >= n_values) continue;
        __atomic_add_fetch(&w->seen[x], 1, __ATOMIC_RELAXED);
        w->got++;
        w->sum += x;
    }
    co_waitgroup_done(w->wg);
}

static void *thread_main(void *arg) {
    worker_t *w = arg;
    if (w->id >= 100) {
        w->id -= 100;
        consumer(w);
    } else {
        producer(w);
    }
    return NULL;
}

static void run_capacity(size_t cap) {
    co_chan_t *ch, *never;
    CHECK_EQ(co_chan_new(&ch, sizeof(int64_t), cap), 0);
    CHECK_EQ(co_chan_new(&never, sizeof(int64_t), 0), 0);
    uint8_t *seen = calloc((size_t)n_values, 1);
    CHECK(seen != NULL);
    co_waitgroup_t pwg = CO_WAITGROUP_INIT, cwg = CO_WAITGROUP_INIT;
    worker_t prod[NPROD], cons[NCONS];
    pthread_t pth[NTHREADS_EACH], cth[NTHREADS_EACH];
    co_waitgroup_add(&pwg, NPROD);
    co_waitgroup_add(&cwg, NCONS);
    for (int i = 0; i < NCONS; i++) {
        cons[i] = (worker_t){.ch = ch, .never = never, .id = i, .thread = i < NTHREADS_EACH,
                             .wg = &cwg, .seen = seen};
        if (cons[i].thread) {
            cons[i].id += 100;
            CHECK_EQ(pthread_create(&cth[i], NULL, thread_main, &cons[i]), 0);
        } else {
            CHECK_EQ(co_go(consumer, &cons[i]), 0);
        }
    }
    for (int i = 0; i < NPROD; i++) {
        prod[i] = (worker_t){.ch = ch, .never = never, .id = i, .thread = i < NTHREADS_EACH,
                             .wg = &pwg, .seen = seen};
        if (prod[i].thread)
            CHECK_EQ(pthread_create(&pth[i], NULL, thread_main, &prod[i]), 0);
        else
            CHECK_EQ(co_go(producer, &prod[i]), 0);
    }
    co_waitgroup_wait(&pwg);
    CHECK_EQ(co_chan_close(ch), 0);
    co_waitgroup_wait(&cwg);
    for (int i = 0; i < NTHREADS_EACH; i++) {
        pthread_join(pth[i], NULL);
        pthread_join(cth[i], NULL);
    }
    long got = 0, sum = 0, sent = 0;
    for (int i = 0; i < NCONS; i++) {
        got += cons[i].got;
        sum += cons[i].sum;
    }
    for (int i = 0; i < NPROD; i++) sent += prod[i].sent;
    CHECK_EQ(sent, n_values);
    CHECK_EQ(got, n_values);
    CHECK_EQ(sum, n_values * (n_values - 1) / 2);
    long bad = 0;
    for (long i = 0; i < n_values; i++) bad += seen[i] != 1;
    CHECK_EQ(bad, 0);
    fprintf(stderr, "cap %zu: %ld values, every one exactly once\n", cap, got);
    free(seen);
    co_chan_free(ch);
    co_chan_free(never);
}

static void test_cap0(void) { run_capacity(0); }
static void test_cap1(void) { run_capacity(1); }
static void test_cap64(void) { run_capacity(64); }

/* ---- close racing with senders and receivers ------------------------------ */

typedef struct {
    co_chan_t *ch;
    int id;
    bool thread;
    co_waitgroup_t *wg;
    long n, sum;
} racer_t;

static void race_sender(void *arg) {
    racer_t *r = arg;
    uint64_t s = (uint64_t)(r->id + 1) * 0x2545F4914F6CDD1DULL;
    for (int64_t v = 1;; v++) {
        int rc = co_chan_send(r->ch, &v, rnd(&s) % 2 ? CO_FOREVER : co_deadline_after(5000));
        if (rc == CO_ECLOSED) break;
        if (rc == CO_ETIMEDOUT) continue;
        CHECK_EQ(rc, 0);
        r->n++;
        r->sum += v;
    }
    co_waitgroup_done(r->wg);
}

static void race_receiver(void *arg) {
    racer_t *r = arg;
    int64_t v;
    int rc;
    while ((rc = co_chan_recv(r->ch, &v, CO_FOREVER)) == 0) {
        r->n++;
        r->sum += v;
    }
    CHECK_EQ(rc, CO_ECLOSED);
    co_waitgroup_done(r->wg);
}

static void *race_thread(void *arg) {
    racer_t *r = arg;
    if (r->id < 0)
        race_receiver(r);
    else
        race_sender(r);
    return NULL;
}

static void test_close_race(void) {
    const int rounds = 10;
    for (int round = 0; round < rounds * 3; round++) {
        size_t cap = (size_t[]){0, 1, 64}[round % 3];
        co_chan_t *ch;
        CHECK_EQ(co_chan_new(&ch, sizeof(int64_t), cap), 0);
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        racer_t snd[4], rcv[4];
        pthread_t ts, tr;
        co_waitgroup_add(&wg, 8);
        for (int i = 0; i < 4; i++) {
            snd[i] = (racer_t){.ch = ch, .id = i, .thread = i == 0, .wg = &wg};
            rcv[i] = (racer_t){.ch = ch, .id = -1 - i, .thread = i == 0, .wg = &wg};
        }
        CHECK_EQ(pthread_create(&ts, NULL, race_thread, &snd[0]), 0);
        CHECK_EQ(pthread_create(&tr, NULL, race_thread, &rcv[0]), 0);
        for (int i = 1; i < 4; i++) {
            CHECK_EQ(co_go(race_sender, &snd[i]), 0);
            CHECK_EQ(co_go(race_receiver, &rcv[i]), 0);
        }
        co_sleep(2 * 1000000);
        CHECK_EQ(co_chan_close(ch), 0);
        co_waitgroup_wait(&wg);
        pthread_join(ts, NULL);
        pthread_join(tr, NULL);
        long sn = 0, ss = 0, rn = 0, rs = 0;
        for (int i = 0; i < 4; i++) {
            sn += snd[i].n;
            ss += snd[i].sum;
            rn += rcv[i].n;
            rs += rcv[i].sum;
        }
        CHECK_EQ(sn, rn);
        CHECK_EQ(ss, rs);
        co_chan_free(ch);
    }
}

static int run(void *arg) {
    T_RUN(test_cap0);
    T_RUN(test_cap1);
    T_RUN(test_cap64);
    T_RUN(test_close_race);
    return 0;
}

int main(void) {
    /* The figure: 1,000,000 values through the three capacities
     * (more than a third of a million each), under TSan and ASan too; a
     * million through each in the plain build. */
    n_values = t_sanitized() ? 340000 : 1000000;
    t_begin(580);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
