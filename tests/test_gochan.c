/* Go's runtime/chan_test.go cases colony differed on: a select's waiting
 * cases on one channel are chosen at random (TestPseudoRandomSend), a
 * receive from a closed channel gives the zero value, and the empty or
 * NULL-only select. */
#include "t.h"

#include "t_internal.h" /* count waiters in the queues */

#include <colony.h>

static int qlen(co__waitq_t *q) {
    int n = 0;
    for (co__waiter_t *w = q->head; w; w = w->next) n++;
    return n;
}
static int senders(co_chan_t *ch) {
    chan_lock(ch);
    int n = qlen(&ch->sendq);
    chan_unlock(ch);
    return n;
}

/* ---- TestPseudoRandomSend ------------------------------------------------ */

#define ROUNDS 200

typedef struct {
    co_chan_t *ch;
    int got[ROUNDS];
    bool wait_for_select; /* receive only once the select has parked */
    co_waitgroup_t wg;
} prs_t;

static void prs_receiver(void *arg) {
    prs_t *s = arg;
    for (int i = 0; i < ROUNDS; i++) {
        if (s->wait_for_select) {
            /* both cases of the select are queued: the select had to wait */
            while (senders(s->ch) != 2) co_gosched();
        } else {
            co_gosched();
        }
        CHECK_EQ(co_chan_recv(s->ch, &s->got[i], CO_FOREVER), 0);
    }
    co_waitgroup_done(&s->wg);
}

static void prs_run(size_t cap, bool wait_for_select) {
    static prs_t s;
    memset(&s, 0, sizeof s);
    CHECK_EQ(co_chan_new(&s.ch, sizeof(int), cap), 0);
    s.wait_for_select = wait_for_select;
    co_waitgroup_add(&s.wg, 1);
    CHECK_EQ(co_go(prs_receiver, &s), 0);
    int one = 1, zero = 0;
    for (int i = 0; i < ROUNDS; i++) {
        co_case_t c[2] = {{.ch = s.ch, .op = CO_SEND, .elem = &one},
                          {.ch = s.ch, .op = CO_SEND, .elem = &zero}};
        int r = co_select(c, 2, CO_FOREVER);
        CHECK(r == 0 || r == 1);
    }
    co_waitgroup_wait(&s.wg);
    int n0 = 0, n1 = 0;
    for (int i = 0; i < ROUNDS; i++) {
        CHECK(s.got[i] == 0 || s.got[i] == 1);
        n0 += s.got[i] == 0;
        n1 += s.got[i] == 1;
    }
    fprintf(stderr, "   cap %zu%s: %d zeros, %d ones\n", cap, wait_for_select ? ", waiting" : "",
            n0, n1);
    /* Go's bound: each side more than a tenth. With a fair coin the chance
     * of failing it is below 1e-30 for 200 rounds. */
    CHECK(n0 > ROUNDS / 10);
    CHECK(n1 > ROUNDS / 10);
    CHECK_EQ(senders(s.ch), 0);
    co_chan_free(s.ch);
}

/* Go's test as written: unbuffered and buffered, the receiver yielding. */
static void test_pseudo_random_send(void) {
    prs_run(0, false);
    prs_run(ROUNDS, false);
}

/* Every round the select has to wait with both cases on the one channel:
 * the receiver that arrives then must pick either case. */
static void test_pseudo_random_send_waiting(void) { prs_run(0, true); }

/* The same for two receive cases on one channel, woken by a sender. */
static co_chan_t *rr_ch;
static co_waitgroup_t rr_wg;
static int rr_fired[ROUNDS];
static int receivers(co_chan_t *ch) {
    chan_lock(ch);
    int n = qlen(&ch->recvq);
    chan_unlock(ch);
    return n;
}
static void rr_selector(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        int a = -1, b = -1;
        co_case_t c[2] = {{.ch = rr_ch, .op = CO_RECV, .elem = &a},
                          {.ch = rr_ch, .op = CO_RECV, .elem = &b}};
        rr_fired[i] = co_select(c, 2, CO_FOREVER);
        CHECK_EQ(rr_fired[i] == 0 ? a : b, i);
    }
    co_waitgroup_done(&rr_wg);
}
static void test_pseudo_random_recv_waiting(void) {
    CHECK_EQ(co_chan_new(&rr_ch, sizeof(int), 0), 0);
    co_waitgroup_add(&rr_wg, 1);
    CHECK_EQ(co_go(rr_selector, NULL), 0);
    for (int i = 0; i < ROUNDS; i++) {
        while (receivers(rr_ch) != 2) co_gosched();
        CHECK_EQ(co_chan_send(rr_ch, &i, CO_FOREVER), 0);
    }
    co_waitgroup_wait(&rr_wg);
    int n[2] = {0, 0};
    for (int i = 0; i < ROUNDS; i++) {
        CHECK(rr_fired[i] == 0 || rr_fired[i] == 1);
        if (rr_fired[i] == 0 || rr_fired[i] == 1) n[rr_fired[i]]++;
    }
    fprintf(stderr, "   recv cases: %d first, %d second\n", n[0], n[1]);
    CHECK(n[0] > ROUNDS / 10);
    CHECK(n[1] > ROUNDS / 10);
    co_chan_free(rr_ch);
}

/* ---- a receive from a closed channel gives the zero value --------------- */

typedef struct {
    int64_t a;
    char b[24];
} big_t;

static co_chan_t *cz_ch;
static big_t cz_parked;
static int cz_parked_rc = 1, cz_sel_rc = 1;
static big_t cz_sel_elem;
static co_waitgroup_t cz_wg;
static void cz_parked_recv(void *arg) {
    (void)arg;
    cz_parked_rc = co_chan_recv(cz_ch, &cz_parked, CO_FOREVER);
    co_waitgroup_done(&cz_wg);
}
static void cz_parked_select(void *arg) {
    (void)arg;
    co_chan_t *never = NULL;
    CHECK_EQ(co_chan_new(&never, sizeof(big_t), 0), 0);
    co_case_t c[2] = {{.ch = never, .op = CO_RECV, .elem = &cz_parked},
                      {.ch = cz_ch, .op = CO_RECV, .elem = &cz_sel_elem}};
    cz_sel_rc = co_select(c, 2, CO_FOREVER);
    CHECK_EQ(c[1].result, CO_ECLOSED);
    co_chan_free(never);
    co_waitgroup_done(&cz_wg);
}

static bool all_zero(const void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)p)[i]) return false;
    return true;
}

static void test_closed_recv_zero(void) {
    /* parked receivers (a plain one and a select) get zero at the close */
    CHECK_EQ(co_chan_new(&cz_ch, sizeof(big_t), 0), 0);
    memset(&cz_parked, 0x5a, sizeof cz_parked);
    memset(&cz_sel_elem, 0x5a, sizeof cz_sel_elem);
    co_waitgroup_add(&cz_wg, 2);
    CHECK_EQ(co_go(cz_parked_recv, NULL), 0);
    CHECK_EQ(co_go(cz_parked_select, NULL), 0);
    while (receivers(cz_ch) != 2) co_gosched();
    CHECK_EQ(co_chan_close(cz_ch), 0);
    co_waitgroup_wait(&cz_wg);
    CHECK_EQ(cz_parked_rc, CO_ECLOSED);
    CHECK_EQ(cz_sel_rc, 1);
    CHECK(all_zero(&cz_parked, sizeof cz_parked));
    CHECK(all_zero(&cz_sel_elem, sizeof cz_sel_elem));

    /* an already closed channel: after the buffered value, zero every time */
    big_t v;
    co_chan_free(cz_ch);
    CHECK_EQ(co_chan_new(&cz_ch, sizeof(big_t), 2), 0);
    big_t one = {.a = 7, .b = "seven"};
    CHECK_EQ(co_chan_send(cz_ch, &one, 0), 0);
    CHECK_EQ(co_chan_close(cz_ch), 0);
    memset(&v, 0x5a, sizeof v);
    CHECK_EQ(co_chan_recv(cz_ch, &v, CO_FOREVER), 0);
    CHECK_EQ(v.a, 7);
    memset(&v, 0x5a, sizeof v);
    CHECK_EQ(co_chan_recv(cz_ch, &v, 0), CO_ECLOSED);
    CHECK(all_zero(&v, sizeof v));
    memset(&v, 0x5a, sizeof v);
    CHECK_EQ(co_chan_recv(cz_ch, &v, CO_FOREVER), CO_ECLOSED);
    CHECK(all_zero(&v, sizeof v));
    CHECK_EQ(co_chan_recv(cz_ch, NULL, 0), CO_ECLOSED); /* NULL elem: nothing written */
    /* select on the closed channel: blocking and non-blocking */
    for (int dl = 0; dl < 2; dl++) {
        memset(&v, 0x5a, sizeof v);
        co_case_t c[1] = {{.ch = cz_ch, .op = CO_RECV, .elem = &v}};
        CHECK_EQ(co_select(c, 1, dl ? CO_FOREVER : 0), 0);
        CHECK_EQ(c[0].result, CO_ECLOSED);
        CHECK(all_zero(&v, sizeof v));
    }
    /* a timeout leaves the buffer alone */
    co_chan_t *open_ch = NULL;
    CHECK_EQ(co_chan_new(&open_ch, sizeof(big_t), 0), 0);
    memset(&v, 0x5a, sizeof v);
    CHECK_EQ(co_chan_recv(open_ch, &v, co_deadline_after(1000 * 1000)), CO_ETIMEDOUT);
    CHECK_EQ(v.a, (int64_t)0x5a5a5a5a5a5a5a5aLL);
    co_chan_free(open_ch);
    co_chan_free(cz_ch);
}

/* ---- select {} and nil channels ----------------------------------------- */

static int nil_rc = 1;
static void nil_forever(void *arg) {
    int *done = arg;
    co_case_t c[1] = {{.ch = NULL, .op = CO_RECV, .elem = NULL}};
    nil_rc = co_select(c, 1, CO_FOREVER); /* never returns */
    __atomic_store_n(done, 1, __ATOMIC_RELAXED);
}

static void test_empty_and_nil_select(void) {
    int v = 0;
    co_case_t c[1] = {{.ch = NULL, .op = CO_RECV, .elem = &v}};
    /* n == 0 is refused (CO_EINVAL) rather than blocking for ever */
    CHECK_EQ(co_select(c, 0, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_select(NULL, 0, CO_FOREVER), CO_EINVAL);
    /* Go's blocking select on nil channels: waits for the deadline */
    CHECK_EQ(co_select(c, 1, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_select(c, 1, co_deadline_after(2 * 1000 * 1000)), CO_ETIMEDOUT);
    /* ... and for ever with CO_FOREVER: the coroutine is still parked
     * after others ran (it is left parked; co_main does not wait for it) */
    static int done;
    CHECK_EQ(co_go(nil_forever, &done), 0);
    for (int i = 0; i < 100; i++) co_gosched();
    CHECK_EQ(co_sleep(5 * 1000 * 1000), 0);
    CHECK_EQ(__atomic_load_n(&done, __ATOMIC_RELAXED), 0);
    CHECK_EQ(nil_rc, 1);
    /* a NULL channel outside select is an error, not a hang */
    CHECK_EQ(co_chan_send(NULL, &v, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_chan_recv(NULL, &v, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_chan_close(NULL), CO_EINVAL);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_pseudo_random_send);
    T_RUN(test_pseudo_random_send_waiting);
    T_RUN(test_pseudo_random_recv_waiting);
    T_RUN(test_closed_recv_zero);
    T_RUN(test_empty_and_nil_select);
    return 0;
}

int main(void) {
    t_begin(60);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
