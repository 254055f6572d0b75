/*
 * errgroup (golang.org/x/sync/errgroup) with a limit.
 *
 * co_group_go runs fn in a new coroutine; co_group_wait waits for all of
 * them and returns the first non-zero result. The group owns a context, a
 * child of the parent given to co_group_new, canceled on the first error
 * and when co_group_wait returns (as errgroup.WithContext). With a limit,
 * co_group_go waits for a slot; a finishing task hands its slot straight
 * to the oldest waiting co_group_go caller (FIFO).
 */
#include "runtime/runtime.h"
#include "chan/chan.h"
#include "context/ctx_check.h"

#include <stdlib.h>
#include <string.h>

struct co_group {
    co_ctx_t *ctx;      /* immutable; freed by co_group_free */
    co__lock_t lock;    /* protects every field below */
    int err;            /* first non-zero result, 0 if none */
    int limit;          /* max running tasks, 0 = unlimited */
    int active;         /* tasks holding a slot (spawned or being spawned) */
    int64_t pending;    /* tasks started and not finished (the waitgroup) */
    co__waitq_t slotq;  /* co_group_go callers waiting for a slot */
    co__waitq_t waitq;  /* co_group_wait callers waiting for pending == 0 */
    uint32_t tag;       /* not under lock: CO__TAG_GROUP from new until free (chan/chan.h) */
};
_Static_assert(offsetof(struct co_group, tag) >= 32, "the tag must lie past what free() writes");

#define GROUP_CHECK(g, call) CO__HANDLE_CHECK(g, CO__TAG_GROUP, call)

struct task {
    co_group_t *g;
    int (*fn)(void *);
    void *arg;
};

int co_group_new(co_group_t **out, co_ctx_t *parent) {
    if (out == NULL) return CO_EINVAL;
    *out = NULL;
    if (parent) co__ctx_check(parent, "co_group_new");
    co_group_t *g = calloc(1, sizeof *g);
    if (g == NULL) return CO_ENOMEM;
    int rc = co_ctx_with_cancel(&g->ctx, parent ? parent : co_ctx_background());
    if (rc < 0) {
        free(g);
        return rc;
    }
    g->tag = CO__TAG_GROUP;
    *out = g;
    return 0;
}

void co_group_limit(co_group_t *g, int n) {
    /* void: it cannot answer CO_EINVAL (colony.h's NULL rule) */
    if (g == NULL) co__fatal("co_group_limit(NULL): NULL group");
    GROUP_CHECK(g, "co_group_limit");
    co__lock(&g->lock);
    if (g->active > 0 || !co__waitq_empty(&g->slotq)) {
        int active = g->active;
        co__unlock(&g->lock);
        co__fatal("co_group_limit(%p): limit changed while %d coroutines of the group are active",
                  (void *)g, active);
    }
    g->limit = n > 0 ? n : 0;
    co__unlock(&g->lock);
}

co_ctx_t *co_group_ctx(co_group_t *g) {
    if (g == NULL) return NULL;
    GROUP_CHECK(g, "co_group_ctx");
    return g->ctx;
}

/* A task is over (or its spawn failed, res = 0): record res, pass its slot
 * on, and wake the waiters if it was the last. The group may be freed as
 * soon as a waiter runs, so waiters are unparked after the last touch of g. */
static void task_done(co_group_t *g, int res) {
    co__waiter_t *wake = NULL; /* claimed waiters, linked by ->next */
    co__lock(&g->lock);
    if (res != 0 && g->err == 0) {
        g->err = res;
        co_ctx_cancel(g->ctx); /* lock order: group, then context */
    }
    co__waiter_t *w = NULL;
    while ((w = co__waitq_pop(&g->slotq)) != NULL)
        if (co__claim(w->pk, w)) break; /* the slot passes to it: active unchanged */
    if (w != NULL) {
        w->next = wake;
        wake = w;
    } else {
        g->active--;
    }
    if (--g->pending == 0) {
        while ((w = co__waitq_pop(&g->waitq)) != NULL) {
            if (co__claim(w->pk, w)) {
                w->next = wake;
                wake = w;
            }
        }
    }
    co__unlock(&g->lock);
    while (wake != NULL) {
        co__waiter_t *nx = wake->next; /* wake lives on its owner's stack */
        co__unpark(wake->pk);
        wake = nx;
    }
}

static void task_main(void *arg) {
    struct task t = *(struct task *)arg;
    free(arg);
    task_done(t.g, t.fn(t.arg));
}

int co_group_go(co_group_t *g, int (*fn)(void *arg), void *arg) {
    if (g == NULL) return CO_EINVAL;
    GROUP_CHECK(g, "co_group_go");
    if (fn == NULL) return CO_EINVAL;
    struct task *t = malloc(sizeof *t);
    if (t == NULL) return CO_ENOMEM;
    t->g = g;
    t->fn = fn;
    t->arg = arg;
    co__lock(&g->lock);
    g->pending++;
    if (g->limit > 0 && g->active >= g->limit) {
        co__pkw_t pw;
        co__wait_prepare(&pw, CO__WR_GROUP);
        co__waitq_push(&g->slotq, &pw.w);
        co__wait(&pw.w, &g->lock, CO_FOREVER, 0); /* woken holding a slot */
    } else {
        g->active++;
        co__unlock(&g->lock);
    }
    int rc = co__spawn(task_main, t, 0, "co_group");
    if (rc < 0) {
        free(t);
        task_done(g, 0); /* give the slot back; fn never runs */
        return rc;
    }
    co__spawn_backpressure(); /* as co_go: yield once if this P's queue is full */
    return 0;
}

int co_group_wait(co_group_t *g) {
    if (g == NULL) return CO_EINVAL;
    GROUP_CHECK(g, "co_group_wait");
    co__lock(&g->lock);
    if (g->pending > 0) {
        co__pkw_t pw;
        co__wait_prepare(&pw, CO__WR_GROUP);
        co__waitq_push(&g->waitq, &pw.w);
        co__wait(&pw.w, &g->lock, CO_FOREVER, 0);
        co__lock(&g->lock);
    }
    int err = g->err;
    co__unlock(&g->lock);
    co_ctx_cancel(g->ctx);
    return err;
}

void co_group_free(co_group_t *g) {
    if (g == NULL) return;
    GROUP_CHECK(g, "co_group_free");
    co__lock(&g->lock);
    int64_t pending = g->pending;
    co__unlock(&g->lock);
    if (pending > 0)
        co__fatal("co_group_free(%p): %lld coroutines of the group still running "
                  "(call co_group_wait first)",
                  (void *)g, (long long)pending);
    co_ctx_free(g->ctx);
    CO__HANDLE_KILL(g, CO__TAG_GROUP);
    free(g);
}
