/*
 * Go's context: a tree of cancelable contexts.
 *
 * Every context made by co_ctx_with_* is a node with its own `done` channel
 * (closed exactly once, when the node is canceled; receive-only to users,
 * chan/chan.h, so nobody else closes it) and a list of children.
 * Canceling a node cancels its whole subtree with the same error. A value
 * node is a cancelable node that also carries one key/value pair (Go's
 * valueCtx shares its parent's Done; here it has its own, closed when the
 * parent is canceled, which looks the same to a reader).
 *
 * Lifetime. A node's memory lives while its user handle is not freed or a
 * child still points at it (refs = 1 for the handle + 1 per live child), so
 * freeing in any order is safe: a freed parent stays in memory, canceled,
 * until its last child is freed, and value lookups through it keep working.
 * A node leaves its parent's child list only when its memory is released.
 *
 * Locks. Each node's `lock` protects its `canceled`, `freed`, its child
 * list and the sibling links of its children. Locks are only ever taken
 * parent before child (cancellation walks down holding the path from the
 * walk's root to the current node), never two siblings at once, and a
 * done channel's lock nests inside. Nothing takes a context lock while
 * holding a channel lock, so there is no cycle.
 *
 * Deadlines use a runtime timer whose callback cancels the node (and its
 * subtree). That takes context locks briefly and closes channels, which a
 * timer callback may do: the runtime runs callbacks with no lock held (after
 * the post-switch action of a parking coroutine, or on sysmon). The callback
 * never frees anything (memory is released only by co_ctx_free and
 * co_ctx_cancel callers), and releasing a node deletes its timer first,
 * which waits for a running callback to return.
 */
#include "runtime/runtime.h"
#include "chan/chan.h"
#include "context/ctx_check.h"

#include <stdlib.h>

struct co_ctx {
    co__lock_t lock;       /* protects: canceled, freed, first_child, children's sibling links */
    int32_t err;           /* atomic: 0, then CO_ECANCELED/CO_ETIMEDOUT; stored once,
                              under lock, after done was closed (release); read
                              with acquire (co_ctx_err) */
    uint32_t refs;         /* atomic acq_rel: handle + live children */
    uint32_t timer_armed;  /* atomic: 1 while the timer may still be pending;
                              whoever exchanges it to 0 deletes the timer */
    bool canceled;         /* under lock */
    bool freed;            /* under lock: co_ctx_free was called */
    bool is_background;    /* immutable */
    bool has_value;        /* immutable */
    struct co_ctx *parent; /* immutable; NULL below background */
    struct co_ctx *first_child;        /* under this node's lock */
    struct co_ctx *next_sib, *prev_sib; /* under the parent's lock */
    co_chan_t *done;       /* immutable; NULL for background */
    uint32_t tag;          /* CO__TAG_CTX from ctx_new until co_ctx_free (chan/chan.h),
                              which writes the freed value (under lock) at once, though
                              children may keep the memory; read by the entry checks */
    int64_t deadline;      /* immutable: effective deadline, CO_FOREVER if none */
    const void *key;       /* immutable */
    void *value;           /* immutable */
    co__timer_t timer;     /* armed when this node's own deadline is the earliest */
};

_Static_assert(offsetof(struct co_ctx, tag) >= 32, "the tag must lie past what free() writes");

static co_ctx_t background = {.is_background = true, .deadline = CO_FOREVER, .tag = CO__TAG_CTX};

#define CTX_CHECK(c, call) CO__HANDLE_CHECK(c, CO__TAG_CTX, call)

void co__ctx_check(const co_ctx_t *c, const char *call) { CTX_CHECK(c, call); }

co_ctx_t *co_ctx_background(void) { return &background; }

/* Mark c canceled with err and close its done channel. c->lock held.
 * Returns false if it was already canceled. */
static bool mark_canceled(co_ctx_t *c, int err) {
    if (c->canceled) return false;
    c->canceled = true;
    co__chan_close_by_owner(c->done); /* users may not close it (CO_EPERM) */
    /* release: a reader that sees err != 0 also sees done closed */
    __atomic_store_n(&c->err, err, __ATOMIC_RELEASE);
    return true;
}

/* Cancel root and every descendant not yet canceled, with err.
 *
 * An iterative walk of the tree that holds the locks on the path from root
 * to the current node, exactly as a recursive walk would, but with no
 * recursion (trees may be deep, stacks are fixed). It relies on:
 *  1) a node found already canceled has its whole subtree canceled: its
 *     canceller held its lock for the whole walk below it, and we took that
 *     lock after; a child added to a canceled node is born canceled;
 *  2) the child list of a locked node cannot change, so the sibling link
 *     of the node we leave, read under its parent's lock, stays valid;
 *  3) locks go parent before child only. */
static void cancel_tree(co_ctx_t *root, int err) {
    co__lock(&root->lock);
    if (!mark_canceled(root, err)) {
        co__unlock(&root->lock);
        return;
    }
    co_ctx_t *cur = root, *next = root->first_child;
    for (;;) {
        /* Visit the children of cur from `next` on; descend into the first
         * one we cancel. */
        while (next != NULL) {
            co__lock(&next->lock);
            if (mark_canceled(next, err)) break;
            co_ctx_t *sib = next->next_sib; /* stable: cur is locked */
            co__unlock(&next->lock);
            next = sib;
        }
        if (next != NULL) { /* descend; next stays locked */
            cur = next;
            next = cur->first_child;
            continue;
        }
        /* All of cur's subtree is done: go back up to its parent. */
        if (cur == root) break;
        co_ctx_t *par = cur->parent;
        next = cur->next_sib; /* stable: par is locked */
        co__unlock(&cur->lock);
        cur = par;
    }
    co__unlock(&root->lock);
}

/* Timer callback: the node's own deadline passed. It cannot be released
 * meanwhile: release deletes this timer first, which waits for us. */
static void timer_fire(void *arg) { cancel_tree((co_ctx_t *)arg, CO_ETIMEDOUT); }

static void disarm_timer(co_ctx_t *c) {
    if (__atomic_exchange_n(&c->timer_armed, 0, __ATOMIC_ACQ_REL)) co__timer_del(&c->timer);
}

/* Drop one reference; free the node (and, in turn, parents whose last
 * reference was this node) when none remain. Never called with a context
 * lock held, nor from a timer callback. */
static void ctx_unref(co_ctx_t *c) {
    while (c != NULL && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        disarm_timer(c);
        co_ctx_t *par = c->parent;
        if (par != NULL) {
            co__lock(&par->lock);
            if (c->prev_sib)
                c->prev_sib->next_sib = c->next_sib;
            else
                par->first_child = c->next_sib;
            if (c->next_sib) c->next_sib->prev_sib = c->prev_sib;
            co__unlock(&par->lock);
        }
        co__chan_free_by_owner(c->done);
        free(c);
        c = par;
    }
}

static bool deadline_before(int64_t a, int64_t b) { /* a < b, CO_FOREVER = +inf */
    if (a == CO_FOREVER) return false;
    if (b == CO_FOREVER) return true;
    return a < b;
}

static int ctx_new(co_ctx_t **out, co_ctx_t *parent, int64_t deadline, bool has_value,
                   const void *key, void *value, const char *op) {
    if (out == NULL) return CO_EINVAL;
    *out = NULL;
    if (parent == NULL) return CO_EINVAL;
    CTX_CHECK(parent, op);
    if (has_value && key == NULL) return CO_EINVAL;
    int rc = co__ensure_init(); /* timers and channels need the runtime */
    if (rc < 0) return rc;
    co_ctx_t *c = calloc(1, sizeof *c);
    if (c == NULL) return CO_ENOMEM;
    /* receive-only to users (Go's Done() is a <-chan): their send and
     * close answer CO_EPERM, so done closes only with err set */
    rc = co__chan_new_recv_only(&c->done, 0, 0);
    if (rc < 0) {
        free(c);
        return rc;
    }
    c->refs = 1;
    c->tag = CO__TAG_CTX;
    c->has_value = has_value;
    c->key = key;
    c->value = value;
    c->deadline = deadline_before(deadline, parent->deadline) ? deadline : parent->deadline;
    bool own_deadline = deadline_before(deadline, parent->deadline);

    int born_err = 0;
    if (!parent->is_background) {
        co__lock(&parent->lock);
        if (parent->freed) {
            co__unlock(&parent->lock);
            co__fatal("%s(%p): parent context was freed", op, (void *)parent);
        }
        c->parent = parent;
        /* relaxed: parent is alive (we hold its lock), and the release
         * that frees it is an acq_rel decrement */
        __atomic_add_fetch(&parent->refs, 1, __ATOMIC_RELAXED);
        c->next_sib = parent->first_child;
        if (c->next_sib) c->next_sib->prev_sib = c;
        parent->first_child = c;
        if (parent->canceled) {
            /* Born canceled, before anyone can see it (keeps "a canceled
             * node's subtree is canceled" true at every moment). */
            born_err = __atomic_load_n(&parent->err, __ATOMIC_RELAXED);
            mark_canceled(c, born_err);
        }
        co__unlock(&parent->lock);
    }
    if (!born_err && own_deadline) {
        if (deadline < 0 || deadline <= co_now()) {
            cancel_tree(c, CO_ETIMEDOUT);
        } else {
            c->timer.fn = timer_fire;
            c->timer.arg = c;
            __atomic_store_n(&c->timer_armed, 1, __ATOMIC_RELAXED);
            co__timer_add(&c->timer, deadline);
        }
    }
    *out = c;
    return 0;
}

int co_ctx_with_cancel(co_ctx_t **out, co_ctx_t *parent) {
    return ctx_new(out, parent, CO_FOREVER, false, NULL, NULL, "co_ctx_with_cancel");
}

int co_ctx_with_deadline(co_ctx_t **out, co_ctx_t *parent, int64_t deadline) {
    /* any negative deadline other than CO_FOREVER is in the past */
    return ctx_new(out, parent, deadline, false, NULL, NULL, "co_ctx_with_deadline");
}

int co_ctx_with_timeout(co_ctx_t **out, co_ctx_t *parent, int64_t ns) {
    int64_t deadline;
    if (ns <= 0) {
        deadline = 0; /* already expired, as Go's WithTimeout(ctx, 0) */
    } else {
        int64_t now = co_now();
        deadline = ns > INT64_MAX - now ? CO_FOREVER : now + ns;
    }
    return ctx_new(out, parent, deadline, false, NULL, NULL, "co_ctx_with_timeout");
}

int co_ctx_with_value(co_ctx_t **out, co_ctx_t *parent, const void *key, void *value) {
    return ctx_new(out, parent, CO_FOREVER, true, key, value, "co_ctx_with_value");
}

void co_ctx_cancel(co_ctx_t *c) {
    /* void: it cannot answer CO_EINVAL (colony.h's NULL rule); Go's nil
     * CancelFunc panics too */
    if (c == NULL) co__fatal("co_ctx_cancel(NULL): NULL context");
    CTX_CHECK(c, "co_ctx_cancel");
    if (c->is_background) return;
    cancel_tree(c, CO_ECANCELED);
    disarm_timer(c);
}

co_chan_t *co_ctx_done(co_ctx_t *c) {
    if (c == NULL) return NULL;
    CTX_CHECK(c, "co_ctx_done");
    return c->done; /* NULL for background: never ready */
}

int co_ctx_err(co_ctx_t *c) {
    if (c == NULL) return CO_EINVAL;
    CTX_CHECK(c, "co_ctx_err");
    if (c->is_background) return 0;
    /* acquire: pairs with the release store in mark_canceled */
    int e = __atomic_load_n(&c->err, __ATOMIC_ACQUIRE);
    if (e != 0) return e;
    /* A cancellation may be in progress (done closed, err not yet stored):
     * wait for it under the lock, so that after a receive on done returns,
     * err is never 0. */
    co__lock(&c->lock);
    e = __atomic_load_n(&c->err, __ATOMIC_RELAXED);
    co__unlock(&c->lock);
    return e;
}

/* Go's Context.Deadline: the effective deadline (the earliest of the
 * node's own and its ancestors'), immutable after creation, so no lock. */
bool co_ctx_deadline(co_ctx_t *c, int64_t *deadline) {
    if (c) CTX_CHECK(c, "co_ctx_deadline");
    int64_t d = c ? c->deadline : CO_FOREVER;
    if (deadline) *deadline = d;
    return d != CO_FOREVER;
}

void *co_ctx_value(co_ctx_t *c, const void *key) {
    /* only the handle is checked: a freed ancestor stays readable for its
     * children (see "Lifetime" above) */
    if (c) CTX_CHECK(c, "co_ctx_value");
    for (; c != NULL && !c->is_background; c = c->parent)
        if (c->has_value && c->key == key) return c->value;
    return NULL;
}

void co_ctx_free(co_ctx_t *c) {
    if (c == NULL) return;
    CTX_CHECK(c, "co_ctx_free");
    if (c->is_background) return;
    co__lock(&c->lock);
    if (c->freed) {
        co__unlock(&c->lock);
        co__fatal("co_ctx_free(%p): context freed twice", (void *)c);
    }
    c->freed = true;
    /* the handle is dead from here, even while children keep the node */
    CO__HANDLE_KILL(c, CO__TAG_CTX);
    co__unlock(&c->lock);
    cancel_tree(c, CO_ECANCELED);
    disarm_timer(c);
    ctx_unref(c);
}
