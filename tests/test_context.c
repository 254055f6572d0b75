/* Context: background, cancel trees, deadlines, values, free orders,
 * errors, misuse and concurrent stress. */
// ctest-timeout: 250
#include "colony.h"
#include "t.h"
#include "t_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


#define MS (1000 * 1000LL)

/* done is closed (a receive returns CO_ECLOSED at once) */
static bool is_done(co_ctx_t *c) {
    char b;
    co_chan_t *d = co_ctx_done(c);
    return d && co_chan_recv(d, &b, 0) == CO_ECLOSED;
}

/* ---- misuse in a fresh process ----------------------------------------- */
static void expect_abort(const char *name, const char *op) {
    t_expect_abort("test_context", name, op);
}

static int run_misuse(const char *name) {
    co_ctx_t *p, *c, *d;
    if (co_ctx_with_cancel(&p, co_ctx_background()) != 0) return 3;
    if (co_ctx_with_cancel(&c, p) != 0) return 3; /* keeps p's memory alive */
    /* the object the fatal line must name */
    void *obj = !strcmp(name, "free_done") ? (void *)co_ctx_done(p) : (void *)p;
    fprintf(stderr, "obj=%p\n", obj);
    if (!strcmp(name, "double_free")) {
        co_ctx_free(p);
        co_ctx_free(p);
    } else if (!strcmp(name, "child_of_freed")) {
        co_ctx_free(p);
        co_ctx_with_value(&d, p, "k", NULL);
    } else if (!strcmp(name, "free_done")) {
        co_chan_free(co_ctx_done(p)); /* the context owns it */
    } else {
        return 2;
    }
    return 0;
}

static void test_misuse(void) {
    expect_abort("double_free", "co_ctx_free");
    expect_abort("child_of_freed", "co_ctx_with_value");
    expect_abort("free_done", "co_chan_free");
}

/* ---- background and errors ----------------------------------------------- */
static void test_background(void) {
    co_ctx_t *bg = co_ctx_background();
    CHECK(bg != NULL);
    CHECK(bg == co_ctx_background());
    CHECK(co_ctx_done(bg) == NULL);
    CHECK_EQ(co_ctx_err(bg), 0);
    CHECK(co_ctx_value(bg, "x") == NULL);
    co_ctx_cancel(bg); /* no-op */
    co_ctx_free(bg);   /* no-op */
    CHECK_EQ(co_ctx_err(bg), 0);
}

static void test_einval(void) {
    co_ctx_t *c = (co_ctx_t *)0x1;
    CHECK_EQ(co_ctx_with_cancel(NULL, co_ctx_background()), CO_EINVAL);
    CHECK_EQ(co_ctx_with_cancel(&c, NULL), CO_EINVAL);
    CHECK(c == NULL);
    CHECK_EQ(co_ctx_with_deadline(NULL, co_ctx_background(), 0), CO_EINVAL);
    CHECK_EQ(co_ctx_with_deadline(&c, NULL, CO_FOREVER), CO_EINVAL);
    CHECK_EQ(co_ctx_with_timeout(NULL, co_ctx_background(), MS), CO_EINVAL);
    CHECK_EQ(co_ctx_with_timeout(&c, NULL, MS), CO_EINVAL);
    CHECK_EQ(co_ctx_with_value(NULL, co_ctx_background(), "k", NULL), CO_EINVAL);
    CHECK_EQ(co_ctx_with_value(&c, NULL, "k", NULL), CO_EINVAL);
    CHECK_EQ(co_ctx_with_value(&c, co_ctx_background(), NULL, NULL), CO_EINVAL);
    CHECK(c == NULL);
    CHECK_EQ(co_ctx_err(NULL), CO_EINVAL);
    CHECK(co_ctx_done(NULL) == NULL);
    CHECK(co_ctx_value(NULL, "k") == NULL);
    co_ctx_free(NULL); /* co_ctx_cancel(NULL) aborts: test_null */
}

/* ---- cancel ---------------------------------------------------------------- */
static void test_cancel(void) {
    co_ctx_t *c;
    CHECK_EQ(co_ctx_with_cancel(&c, co_ctx_background()), 0);
    CHECK(co_ctx_done(c) != NULL);
    CHECK_EQ(co_ctx_err(c), 0);
    CHECK(!is_done(c));
    co_ctx_cancel(c);
    CHECK_EQ(co_ctx_err(c), CO_ECANCELED);
    CHECK(is_done(c));
    co_ctx_cancel(c); /* idempotent */
    CHECK_EQ(co_ctx_err(c), CO_ECANCELED);
    co_ctx_free(c);
}

static const char tree_key[] = "k";
static char tree_val[] = "v";
/* root -> a -> a1 -> a1v(value), a -> a2; root -> b. */
static void test_tree(void) {
    co_ctx_t *root, *a, *a1, *a1v, *a2, *b;
    CHECK_EQ(co_ctx_with_cancel(&root, co_ctx_background()), 0);
    CHECK_EQ(co_ctx_with_cancel(&a, root), 0);
    CHECK_EQ(co_ctx_with_deadline(&a1, a, CO_FOREVER), 0);
    CHECK_EQ(co_ctx_with_value(&a1v, a1, tree_key, tree_val), 0);
    CHECK_EQ(co_ctx_with_timeout(&a2, a, 3600 * 1000 * MS), 0);
    CHECK_EQ(co_ctx_with_cancel(&b, root), 0);
    /* cancel a subtree: a and below only */
    co_ctx_cancel(a);
    CHECK_EQ(co_ctx_err(a), CO_ECANCELED);
    CHECK_EQ(co_ctx_err(a1), CO_ECANCELED);
    CHECK_EQ(co_ctx_err(a1v), CO_ECANCELED);
    CHECK_EQ(co_ctx_err(a2), CO_ECANCELED);
    CHECK(is_done(a1v) && is_done(a2));
    CHECK_EQ(co_ctx_err(root), 0);
    CHECK_EQ(co_ctx_err(b), 0);
    CHECK(!is_done(b));
    /* a child of a canceled context is born canceled */
    co_ctx_t *late;
    CHECK_EQ(co_ctx_with_cancel(&late, a1v), 0);
    CHECK_EQ(co_ctx_err(late), CO_ECANCELED);
    CHECK(is_done(late));
    CHECK(co_ctx_value(late, tree_key) == tree_val);
    /* cancel the root: the rest goes */
    co_ctx_cancel(root);
    CHECK_EQ(co_ctx_err(b), CO_ECANCELED);
    CHECK(is_done(b));
    co_ctx_free(late);
    co_ctx_free(a1v);
    co_ctx_free(a1);
    co_ctx_free(a2);
    co_ctx_free(a);
    co_ctx_free(b);
    co_ctx_free(root);
}

/* Waiting on done from coroutines and threads, woken by a cancel. */
static void *done_waiter_th(void *a) {
    char x;
    CHECK_EQ(co_chan_recv(co_ctx_done(a), &x, CO_FOREVER), CO_ECLOSED);
    CHECK_EQ(co_ctx_err(a), CO_ECANCELED); /* never 0 once done is closed */
    return NULL;
}
static co_waitgroup_t dw_wg = CO_WAITGROUP_INIT;
static void done_waiter_co(void *a) {
    done_waiter_th(a);
    co_waitgroup_done(&dw_wg);
}
static void test_done_wakes_waiters(void) {
    co_ctx_t *root, *leaf;
    CHECK_EQ(co_ctx_with_cancel(&root, co_ctx_background()), 0);
    CHECK_EQ(co_ctx_with_value(&leaf, root, "x", NULL), 0);
    pthread_t th;
    pthread_create(&th, NULL, done_waiter_th, leaf);
    co_waitgroup_add(&dw_wg, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(co_go(done_waiter_co, i % 2 ? leaf : root), 0);
    co_sleep(5 * MS);
    co_ctx_cancel(root);
    pthread_join(th, NULL);
    co_waitgroup_wait(&dw_wg);
    co_ctx_free(leaf);
    co_ctx_free(root);
}

/* ---- deadlines ------------------------------------------------------------ */
static void test_deadline_fires(void) {
    co_ctx_t *c, *child, *vchild;
    int64_t dl = co_deadline_after(20 * MS);
    CHECK_EQ(co_ctx_with_timeout(&c, co_ctx_background(), 20 * MS), 0);
    CHECK_EQ(co_ctx_with_cancel(&child, c), 0);
    CHECK_EQ(co_ctx_with_value(&vchild, child, "k", NULL), 0);
    int e = co_ctx_err(c);
    if (co_now() < dl) CHECK_EQ(e, 0); /* (unless this thread was held up 20 ms) */
    char x;
    CHECK_EQ(co_chan_recv(co_ctx_done(vchild), &x, CO_FOREVER), CO_ECLOSED);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    CHECK_EQ(co_ctx_err(child), CO_ETIMEDOUT); /* the parent's error propagates */
    CHECK_EQ(co_ctx_err(vchild), CO_ETIMEDOUT);
    co_ctx_cancel(c); /* after expiry: the error stays */
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    co_ctx_free(vchild);
    co_ctx_free(child);
    co_ctx_free(c);
}

static void test_deadline_past(void) {
    co_ctx_t *c;
    CHECK_EQ(co_ctx_with_deadline(&c, co_ctx_background(), 0), 0);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    CHECK(is_done(c));
    co_ctx_free(c);
    CHECK_EQ(co_ctx_with_deadline(&c, co_ctx_background(), co_now() - 1), 0);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    co_ctx_free(c);
    CHECK_EQ(co_ctx_with_deadline(&c, co_ctx_background(), -5), 0);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    co_ctx_free(c);
    CHECK_EQ(co_ctx_with_timeout(&c, co_ctx_background(), 0), 0);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    co_ctx_free(c);
    CHECK_EQ(co_ctx_with_timeout(&c, co_ctx_background(), -1), 0);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    co_ctx_free(c);
    /* CO_FOREVER: no deadline */
    CHECK_EQ(co_ctx_with_deadline(&c, co_ctx_background(), CO_FOREVER), 0);
    CHECK_EQ(co_ctx_err(c), 0);
    co_ctx_cancel(c);
    CHECK_EQ(co_ctx_err(c), CO_ECANCELED);
    co_ctx_free(c);
    /* huge timeout: no overflow */
    CHECK_EQ(co_ctx_with_timeout(&c, co_ctx_background(), INT64_MAX), 0);
    CHECK_EQ(co_ctx_err(c), 0);
    co_ctx_free(c);
}

/* A child's effective deadline is the earlier of its own and its parent's. */
static void test_deadline_earlier_wins(void) {
    co_ctx_t *p, *c;
    /* parent earlier: the child expires with it, despite asking for 1 h */
    CHECK_EQ(co_ctx_with_timeout(&p, co_ctx_background(), 10 * MS), 0);
    CHECK_EQ(co_ctx_with_timeout(&c, p, 3600 * 1000 * MS), 0);
    char x;
    CHECK_EQ(co_chan_recv(co_ctx_done(c), &x, CO_FOREVER), CO_ECLOSED);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    co_ctx_free(c);
    co_ctx_free(p);
    /* child earlier: it expires alone */
    CHECK_EQ(co_ctx_with_timeout(&p, co_ctx_background(), 3600 * 1000 * MS), 0);
    CHECK_EQ(co_ctx_with_timeout(&c, p, 10 * MS), 0);
    CHECK_EQ(co_chan_recv(co_ctx_done(c), &x, CO_FOREVER), CO_ECLOSED);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    CHECK_EQ(co_ctx_err(p), 0);
    co_ctx_free(c);
    co_ctx_free(p); /* frees with its 1 h timer pending */
}

/* done works in co_select next to another channel. */
static void test_select_on_done(void) {
    co_ctx_t *c;
    co_chan_t *work;
    CHECK_EQ(co_chan_new(&work, sizeof(int), 0), 0);
    CHECK_EQ(co_ctx_with_timeout(&c, co_ctx_background(), 10 * MS), 0);
    int v;
    char x;
    co_case_t cs[2] = {{work, CO_RECV, &v, 0}, {co_ctx_done(c), CO_RECV, &x, 0}};
    CHECK_EQ(co_select(cs, 2, CO_FOREVER), 1);
    CHECK_EQ(cs[1].result, CO_ECLOSED);
    CHECK_EQ(co_ctx_err(c), CO_ETIMEDOUT);
    /* background's done is NULL: never ready in a select */
    co_case_t cb[1] = {{co_ctx_done(co_ctx_background()), CO_RECV, &x, 0}};
    CHECK_EQ(co_select(cb, 1, co_deadline_after(MS)), CO_ETIMEDOUT);
    co_ctx_free(c);
    co_chan_free(work);
}

/* ---- done is receive-only to users ------------------------------------------ */
static void done_recv_co(void *a) {
    co_ctx_t *c = a;
    char x = 'x';
    int rc = co_chan_recv(co_ctx_done(c), &x, CO_FOREVER);
    CHECK_EQ(rc, CO_ECLOSED);
    CHECK(x == 'x'); /* nothing was delivered */
    CHECK(co_ctx_err(c) != 0); /* released only by the context's cancellation */
    co_waitgroup_done(&dw_wg);
}

/* Waits (1 s at most) until n receivers are queued on ch. */
static void wait_receivers(co_chan_t *ch, int n) {
    for (int i = 0; i < 1000 && co__test_chan_receivers(ch) < n; i++) co_sleep(MS);
    CHECK_EQ(co__test_chan_receivers(ch), n);
}

/* A user's close of, or send on, a context's done channel is refused with
 * CO_EPERM: it neither closes it nor hands a value to a receiver, so done
 * is closed only by a cancellation, with co_ctx_err set. */
static void test_done_is_receive_only(void) {
    co_ctx_t *c;
    CHECK_EQ(co_ctx_with_cancel(&c, co_ctx_background()), 0);
    co_chan_t *d = co_ctx_done(c);
    char b = 1;
    /* with nobody waiting */
    CHECK_EQ(co_chan_close(d), CO_EPERM);
    CHECK_EQ(co_chan_send(d, &b, 0), CO_EPERM);
    CHECK_EQ(co_chan_send(d, &b, co_deadline_after(MS)), CO_EPERM);
    CHECK_EQ(co_ctx_err(c), 0);
    CHECK(!is_done(c));
    /* with receivers blocked on it: they stay blocked */
    co_waitgroup_add(&dw_wg, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ(co_go(done_recv_co, c), 0);
    wait_receivers(d, 3);
    CHECK_EQ(co_chan_close(d), CO_EPERM);
    CHECK_EQ(co_chan_send(d, &b, CO_FOREVER), CO_EPERM); /* returns: never blocks */
    CHECK_EQ(co_chan_send(d, &b, 0), CO_EPERM);
    co_sleep(5 * MS);
    CHECK_EQ(co__test_chan_receivers(d), 3);
    CHECK_EQ(co_ctx_err(c), 0);
    /* a send case in a select fires at once with CO_EPERM */
    co_case_t cs[1] = {{d, CO_SEND, &b, 0}};
    CHECK_EQ(co_select(cs, 1, CO_FOREVER), 0);
    CHECK_EQ(cs[0].result, CO_EPERM);
    cs[0].result = 0;
    CHECK_EQ(co_select(cs, 1, 0), 0);
    CHECK_EQ(cs[0].result, CO_EPERM);
    CHECK_EQ(co__test_chan_receivers(d), 3);
    /* len and cap still answer */
    CHECK_EQ(co_chan_len(d), 0);
    CHECK_EQ(co_chan_cap(d), 0);
    /* the context's own cancellation closes it and releases them */
    co_ctx_cancel(c);
    co_waitgroup_wait(&dw_wg);
    CHECK_EQ(co_ctx_err(c), CO_ECANCELED);
    CHECK(is_done(c));
    /* once closed by its context: still refused, not CO_ECLOSED */
    CHECK_EQ(co_chan_close(d), CO_EPERM);
    CHECK_EQ(co_chan_send(d, &b, 0), CO_EPERM);
    co_ctx_free(c);

    /* a deadline's and a parent's cancellation close it too */
    co_ctx_t *t, *child;
    CHECK_EQ(co_ctx_with_timeout(&t, co_ctx_background(), 5 * MS), 0);
    CHECK_EQ(co_ctx_with_cancel(&child, t), 0);
    CHECK_EQ(co_chan_close(co_ctx_done(child)), CO_EPERM);
    char x;
    CHECK_EQ(co_chan_recv(co_ctx_done(child), &x, CO_FOREVER), CO_ECLOSED);
    CHECK_EQ(co_ctx_err(child), CO_ETIMEDOUT);
    co_ctx_free(child);
    co_ctx_free(t);
}

/* ---- values ----------------------------------------------------------------- */
static const char key_a[] = "a", key_b[] = "b", key_c[] = "c";
static void test_values(void) {
    co_ctx_t *va, *cc, *vb, *va2, *dl;
    int x = 1, y = 2, z = 3;
    CHECK_EQ(co_ctx_with_value(&va, co_ctx_background(), key_a, &x), 0);
    CHECK_EQ(co_ctx_with_cancel(&cc, va), 0);
    CHECK_EQ(co_ctx_with_value(&vb, cc, key_b, &y), 0);
    CHECK_EQ(co_ctx_with_value(&va2, vb, key_a, &z), 0); /* shadows a */
    CHECK_EQ(co_ctx_with_timeout(&dl, va2, 3600 * 1000 * MS), 0);
    CHECK(co_ctx_value(dl, key_a) == &z);
    CHECK(co_ctx_value(dl, key_b) == &y);
    CHECK(co_ctx_value(dl, key_c) == NULL);
    CHECK(co_ctx_value(vb, key_a) == &x);
    CHECK(co_ctx_value(cc, key_b) == NULL);
    /* keys compare by address, not by content */
    char other_a[] = "a";
    CHECK(co_ctx_value(dl, other_a) == NULL);
    /* a NULL value is a value */
    co_ctx_t *vn;
    CHECK_EQ(co_ctx_with_value(&vn, dl, key_c, NULL), 0);
    CHECK(co_ctx_value(vn, key_c) == NULL);
    CHECK_EQ(co_ctx_err(vn), 0);
    /* free the ancestors first: lookups through them still work */
    co_ctx_free(va);
    co_ctx_free(vb);
    CHECK(co_ctx_value(vn, key_b) == &y);
    CHECK(co_ctx_value(vn, key_a) == &z);
    CHECK_EQ(co_ctx_err(vn), CO_ECANCELED); /* freeing cancels */
    co_ctx_free(dl);
    co_ctx_free(cc);
    co_ctx_free(va2);
    co_ctx_free(vn);
}

/* ---- free orders -------------------------------------------------------------- */
static void test_free_parent_first(void) {
    co_ctx_t *p, *c, *g;
    CHECK_EQ(co_ctx_with_timeout(&p, co_ctx_background(), 3600 * 1000 * MS), 0);
    CHECK_EQ(co_ctx_with_cancel(&c, p), 0);
    CHECK_EQ(co_ctx_with_value(&g, c, key_a, NULL), 0);
    co_ctx_free(p); /* cancels the subtree; c and g stay valid */
    CHECK_EQ(co_ctx_err(c), CO_ECANCELED);
    CHECK(is_done(g));
    co_ctx_t *gg;
    CHECK_EQ(co_ctx_with_cancel(&gg, g), 0); /* children of live nodes are fine */
    CHECK_EQ(co_ctx_err(gg), CO_ECANCELED);
    co_ctx_free(c);
    co_ctx_free(gg);
    co_ctx_free(g); /* releases g, then c, then p */
}

/* A random tree freed in a random order (ASan checks the memory). */
static void test_free_random(void) {
    enum { N = 200 };
    co_ctx_t *n[N];
    unsigned seed = 12345;
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++) {
            co_ctx_t *par = i == 0 ? co_ctx_background() : n[rand_r(&seed) % i];
            int k = rand_r(&seed) % 4;
            int rc = k == 0   ? co_ctx_with_cancel(&n[i], par)
                     : k == 1 ? co_ctx_with_value(&n[i], par, key_a, &n[i])
                     : k == 2 ? co_ctx_with_timeout(&n[i], par, (int64_t)(rand_r(&seed) % 3000) * 1000)
                              : co_ctx_with_deadline(&n[i], par, CO_FOREVER);
            CHECK_EQ(rc, 0);
        }
        if (round % 2) co_ctx_cancel(n[rand_r(&seed) % N]);
        int perm[N];
        for (int i = 0; i < N; i++) perm[i] = i;
        for (int i = N - 1; i > 0; i--) {
            int j = rand_r(&seed) % (i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int i = 0; i < N; i++) {
            co_ctx_t *c = n[perm[i]];
            /* every node still reachable answers */
            int e = co_ctx_err(c);
            CHECK(e == 0 || e == CO_ECANCELED || e == CO_ETIMEDOUT);
            co_ctx_free(c);
        }
    }
}

/* A deep chain: canceling the root walks 20,000 levels without recursion. */
static void deep_body(void *a) {
    int depth = t_small() ? 2000 : 20000;
    co_ctx_t **chain = malloc(sizeof *chain * (size_t)depth);
    CHECK_EQ(co_ctx_with_cancel(&chain[0], co_ctx_background()), 0);
    for (int i = 1; i < depth; i++) CHECK_EQ(co_ctx_with_cancel(&chain[i], chain[i - 1]), 0);
    co_ctx_cancel(chain[0]);
    CHECK_EQ(co_ctx_err(chain[depth - 1]), CO_ECANCELED);
    CHECK(is_done(chain[depth - 1]));
    for (int i = 0; i < depth; i++) co_ctx_free(chain[i]); /* root first */
    free(chain);
    co_waitgroup_done(a);
}
static void test_deep_chain(void) {
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 1);
    co_attr_t at = {CO_STACK_MIN, "deep"}; /* small stack: proves no recursion */
    CHECK_EQ(co_go_with(&at, deep_body, &wg), 0);
    co_waitgroup_wait(&wg);
}

/* ---- concurrency stress ------------------------------------------------------ */
/* Many coroutines and threads build and free subtrees of a shared root
 * while timers fire and the root's children are canceled under them. */
typedef struct {
    co_ctx_t *root;
    int iters;
} cs_t;
static void churn(cs_t *s, unsigned seed) {
    for (int i = 0; i < s->iters; i++) {
        co_ctx_t *a, *b, *c;
        CHECK_EQ(co_ctx_with_cancel(&a, s->root), 0);
        CHECK_EQ(co_ctx_with_timeout(&b, a, (int64_t)(rand_r(&seed) % 200) * 1000), 0);
        CHECK_EQ(co_ctx_with_value(&c, b, key_a, NULL), 0);
        if (rand_r(&seed) % 2) co_ctx_cancel(a);
        if (rand_r(&seed) % 4 == 0) {
            char x;
            CHECK_EQ(co_chan_recv(co_ctx_done(c), &x, CO_FOREVER), CO_ECLOSED);
            CHECK(co_ctx_err(c) != 0);
        }
        switch (rand_r(&seed) % 3) {
        case 0: co_ctx_free(a); co_ctx_free(b); co_ctx_free(c); break;
        case 1: co_ctx_free(c); co_ctx_free(b); co_ctx_free(a); break;
        default: co_ctx_free(b); co_ctx_free(a); co_ctx_free(c); break;
        }
    }
}
static cs_t cs;
static co_waitgroup_t cs_wg = CO_WAITGROUP_INIT;
static void churn_co(void *a) {
    churn(&cs, (unsigned)(intptr_t)a);
    co_waitgroup_done(&cs_wg);
}
static void *churn_th(void *a) {
    churn(&cs, (unsigned)(intptr_t)a);
    return NULL;
}
static void test_stress(void) {
    CHECK_EQ(co_ctx_with_cancel(&cs.root, co_ctx_background()), 0);
    cs.iters = t_small() ? 300 : 3000;
    co_waitgroup_add(&cs_wg, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ(co_go(churn_co, (void *)(intptr_t)(i + 1)), 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, churn_th, (void *)(intptr_t)(50 + i));
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    co_waitgroup_wait(&cs_wg);
    co_ctx_free(cs.root);
}

/* The root is canceled while others keep adding children to it. */
static co_ctx_t *race_root;
static void *race_adder(void *a) {
    for (int i = 0; i < 200; i++) {
        co_ctx_t *c;
        CHECK_EQ(co_ctx_with_cancel(&c, race_root), 0);
        co_ctx_free(c);
    }
    return NULL;
}
static void test_cancel_while_adding(void) {
    for (int round = 0; round < (t_small() ? 5 : 30); round++) {
        CHECK_EQ(co_ctx_with_cancel(&race_root, co_ctx_background()), 0);
        co_ctx_t *kept;
        CHECK_EQ(co_ctx_with_cancel(&kept, race_root), 0);
        pthread_t th;
        pthread_create(&th, NULL, race_adder, NULL);
        co_ctx_cancel(race_root);
        CHECK_EQ(co_ctx_err(kept), CO_ECANCELED);
        pthread_join(th, NULL);
        co_ctx_free(race_root);
        co_ctx_free(kept);
    }
}

/* co_ctx_free while a select waits on co_ctx_done(ctx): freeing cancels
 * first, which wakes the select, and the free must not pull the done
 * channel from under the woken select (it re-locked every channel of its
 * cases after waking: a use after free, or a hang on the freed lock). One
 * case, two cases (another channel as well), and the done channel twice;
 * from coroutines and from a plain thread. */
typedef struct {
    co_chan_t *done, *other;
    int shape; /* 0: done alone, 1: other + done, 2: done twice */
    int rc;
    co_waitgroup_t wg;
} fs_t;
static void fs_select(fs_t *f) {
    char x, y;
    int j;
    co_case_t cs[2] = {{f->done, CO_RECV, &x, 0}, {NULL, CO_RECV, NULL, 0}};
    int n = 1;
    if (f->shape == 1) cs[n++] = (co_case_t){f->other, CO_RECV, &j, 0};
    if (f->shape == 2) cs[n++] = (co_case_t){f->done, CO_RECV, &y, 0};
    f->rc = co_select(cs, n, CO_FOREVER);
}
static void fs_co(void *arg) {
    fs_t *f = arg;
    fs_select(f);
    co_waitgroup_done(&f->wg);
}
static void *fs_thread(void *arg) {
    fs_t *f = arg;
    fs_select(f);
    co_waitgroup_done(&f->wg);
    return NULL;
}
static void test_free_while_select_waits(void) {
    co_chan_t *other;
    CHECK_EQ(co_chan_new(&other, sizeof(int), 0), 0);
    int rounds = t_small() ? 60 : 300;
    for (int i = 0; i < rounds; i++) {
        fs_t f = {.other = other, .shape = i % 3, .wg = CO_WAITGROUP_INIT};
        co_ctx_t *ctx;
        CHECK_EQ(co_ctx_with_cancel(&ctx, co_ctx_background()), 0);
        f.done = co_ctx_done(ctx);
        co_waitgroup_add(&f.wg, 1);
        bool thread = i % 4 == 3;
        pthread_t th;
        if (thread)
            CHECK_EQ(pthread_create(&th, NULL, fs_thread, &f), 0);
        else
            CHECK_EQ(co_go(fs_co, &f), 0);
        /* until the select waits on done (freeing the channel before the
         * select even looked at it would be the test's own use after free:
         * under TSan on a loaded machine the waiter can take longer than any
         * fixed sleep to get there) */
        int want = f.shape == 2 ? 2 : 1;
        while (co__test_chan_receivers(f.done) < want) co_sleep(100 * 1000);
        co_ctx_free(ctx); /* cancels (closes done, waking it), then frees */
        co_waitgroup_wait(&f.wg);
        if (thread) pthread_join(th, NULL);
        CHECK(f.rc == 0 || (f.shape == 2 && f.rc == 1)); /* a done case fired */
    }
    co_chan_free(other);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--misuse")) return run_misuse(argv[2]);
    t_begin(t_small() ? 240 : 120);
    T_RUN(test_background);
    T_RUN(test_einval);
    T_RUN(test_cancel);
    T_RUN(test_tree);
    T_RUN(test_done_wakes_waiters);
    T_RUN(test_deadline_fires);
    T_RUN(test_deadline_past);
    T_RUN(test_deadline_earlier_wins);
    T_RUN(test_select_on_done);
    T_RUN(test_done_is_receive_only);
    T_RUN(test_free_while_select_waits);
    T_RUN(test_values);
    T_RUN(test_free_parent_first);
    T_RUN(test_free_random);
    T_RUN(test_deep_chain);
    T_RUN(test_stress);
    T_RUN(test_cancel_while_adding);
    T_RUN(test_misuse);
    return t_end();
}
