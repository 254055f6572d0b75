/*
 * Weighted semaphore, as golang.org/x/sync/semaphore.
 *
 * size tokens; acquire(n) takes n of them. Waiters queue FIFO and are served
 * strictly in order: when the head waiter asks for more than is free, the
 * waiters behind it wait too, even small ones that would fit, so a large
 * request is never starved by a stream of small ones.
 *
 * Differences from x/sync, chosen for C:
 *  - n > size can never succeed: x/sync blocks until the context is done;
 *    here acquire returns CO_EINVAL at once (try_acquire returns false).
 *  - A negative n, a negative size, and releasing more than is held are
 *    misuse: co__fatal names the semaphore and aborts (x/sync panics on the
 *    last one and silently corrupts its count on the first).
 *  - A NULL semaphore: co_sem_acquire answers CO_EINVAL; the calls that
 *    cannot answer an error (void, and try_acquire, whose false means
 *    only "not now") abort naming the call, as colony.h's rule says.
 */
#include "runtime/runtime.h"

#include <string.h>

typedef struct sem {
    int64_t size;    /* immutable after co_sem_init */
    int64_t cur;     /* tokens held; under lock */
    co__lock_t lock; /* protects cur and q */
    co__waitq_t q;   /* parked acquirers, FIFO; waiter.n = tokens wanted */
} sem_t_;
CO_STATIC_ASSERT(sizeof(sem_t_) <= sizeof(co_sem_t), "co_sem_t too small");
CO_STATIC_ASSERT(_Alignof(sem_t_) <= _Alignof(co_sem_t), "co_sem_t misaligned");

void co_sem_init(co_sem_t *pub, int64_t size) {
    if (pub == NULL) co__fatal("co_sem_init(NULL): NULL semaphore");
    if (size < 0) co__fatal("co_sem_init(%p): negative size %lld", (void *)pub, (long long)size);
    memset(pub, 0, sizeof *pub);
    ((sem_t_ *)pub)->size = size;
}

/* Grant tokens to the waiters at the head of the queue while they fit.
 * Called with s->lock held. A waiter whose claim fails is timing out: it is
 * dropped (it will find itself unlinked) and the next one is considered.
 * Granted waiters are linked on *wake (through `next`, theirs to use once
 * claimed) and must be unparked with sem_wake after unlocking, so that a
 * woken acquirer that frees the semaphore never races with our unlock. */
static void sem_notify(sem_t_ *s, co__waiter_t **wake) {
    for (;;) {
        co__waiter_t *w = s->q.head;
        if (w == NULL || s->size - s->cur < w->n) return; /* head must go first */
        co__waitq_pop(&s->q);
        if (co__claim(w->pk, w)) {
            s->cur += w->n;
            w->result = 0;
            w->next = *wake;
            *wake = w;
        }
    }
}

static void sem_wake(co__waiter_t *w) {
    while (w != NULL) {
        co__waiter_t *next = w->next; /* w dies once its owner runs */
        co__unpark(w->pk);
        w = next;
    }
}

static bool deadline_past(int64_t deadline) {
    return deadline != CO_FOREVER && (deadline <= 0 || deadline <= co_now());
}

int co_sem_acquire(co_sem_t *pub, int64_t n, int64_t deadline) {
    if (pub == NULL) return CO_EINVAL;
    sem_t_ *s = (sem_t_ *)pub;
    if (n < 0) co__fatal("co_sem_acquire(%p): negative count %lld", (void *)pub, (long long)n);
    co__lock(&s->lock);
    if (n > s->size) {
        co__unlock(&s->lock);
        return CO_EINVAL;
    }
    if (s->size - s->cur >= n && co__waitq_empty(&s->q)) {
        s->cur += n;
        co__unlock(&s->lock);
        return 0;
    }
    if (deadline_past(deadline)) {
        co__unlock(&s->lock);
        return CO_ETIMEDOUT;
    }
    co__pkw_t pw;
    co__wait_prepare(&pw, CO__WR_SEM);
    co__waiter_t *const w = &pw.w;
    w->n = n;
    co__waitq_push(&s->q, w);
    if (co__wait(w, &s->lock, deadline, CO__WAIT_KEEP_LOCK) == 0) return 0; /* tokens granted */
    co__waiter_t *wake = NULL;
    if (w->q != NULL) {
        bool front = s->q.head == w;
        co__waitq_remove(w);
        /* If we were the head and blocked smaller waiters behind us, they
         * may fit now: even with every token held, a waiter for 0 does
         * (sem_notify serves the head while it fits). */
        if (front) sem_notify(s, &wake);
    }
    co__unlock(&s->lock);
    sem_wake(wake);
    return CO_ETIMEDOUT;
}

bool co_sem_try_acquire(co_sem_t *pub, int64_t n) {
    if (pub == NULL) co__fatal("co_sem_try_acquire(NULL): NULL semaphore");
    sem_t_ *s = (sem_t_ *)pub;
    if (n < 0) co__fatal("co_sem_try_acquire(%p): negative count %lld", (void *)pub, (long long)n);
    co__lock(&s->lock);
    bool ok = n <= s->size && s->size - s->cur >= n && co__waitq_empty(&s->q);
    if (ok) s->cur += n;
    co__unlock(&s->lock);
    return ok;
}

void co_sem_release(co_sem_t *pub, int64_t n) {
    if (pub == NULL) co__fatal("co_sem_release(NULL): NULL semaphore");
    sem_t_ *s = (sem_t_ *)pub;
    if (n < 0) co__fatal("co_sem_release(%p): negative count %lld", (void *)pub, (long long)n);
    co__lock(&s->lock);
    if (n > s->cur) {
        int64_t cur = s->cur;
        co__unlock(&s->lock);
        co__fatal("co_sem_release(%p): released %lld but only %lld held", (void *)pub,
                  (long long)n, (long long)cur);
    }
    co__waiter_t *wake = NULL;
    s->cur -= n;
    sem_notify(s, &wake);
    co__unlock(&s->lock);
    sem_wake(wake);
}

/* Test hook (hidden; declared by tests/test_sem.c): number of queued
 * acquirers. */
CO_HIDDEN int co__sem_waiters(co_sem_t *pub) {
    sem_t_ *s = (sem_t_ *)pub;
    int n = 0;
    co__lock(&s->lock);
    for (co__waiter_t *w = s->q.head; w; w = w->next) n++;
    co__unlock(&s->lock);
    return n;
}
