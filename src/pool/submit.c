/*
 * Submitting (submit_impl, under the lock): closed -> CO_ECLOSED; an idle
 * record -> activate it; room (cap < 0 or running < cap) -> a new record;
 * full -> CO_EOVERLOAD if nonblocking or max_blocking submitters already
 * wait; CO_EDEADLK if the caller is a task of this very pool (it would wait
 * for itself); CO_ETIMEDOUT if the deadline is past; else queue on submitq
 * and park. The waiter leaves the queue with result 0 (a worker took its
 * task), CO_ECLOSED (release), or RETRY (tune grew the pool, a spawn
 * failed or a panicked worker retired, freeing a slot: go round again).
 *
 * An activated record goes on the run queue as a token (co__spawn_token;
 * co__spawn for a non-default stack size): a coroutine is made for it only
 * if it has to run on its own, and a worker that finishes first takes it
 * over (worker.c).
 */
#include "pool/pool_locked.h"
#include "arch/ctx.h" /* co__cycles */
#include "base/testhook.h"

#include <string.h>
#include <time.h>

/* Start a coroutine for an activated record (lock not held). On failure the
 * activation is undone and the task will not run. */
static int launch(co_pool_t *p, co__pw_t *w) {
    /* At the default stack size the record goes on the run queue as a
     * token: a finishing worker takes it over with no G at all, and a G is
     * made only if it has to run on its own. */
    if (p->opts.stack_size == 0) {
        co__spawn_token(&w->token);
        return 0;
    }
    /* Unnamed (a name is a strncpy per spawn); the panic report says what
     * it is. */
    int rc = co__spawn(co__pool_worker_main, w, p->opts.stack_size, NULL);
    if (CO_LIKELY(rc == 0)) {
        co__spawn_backpressure(); /* as co__spawn_token does */
        return 0;
    }
    wakelist_t wl = {NULL};
    co__pw_t *tofree = NULL;
    plock(p);
    p->submitted--;
    rejected_inc(p);
    st32(&p->running, p->running - 1);
    busy_dec_locked(p, w->gen, &wl);
    rec_put_locked(p, w, &tofree);
    /* The slot we held may be what a blocked submitter waits for. */
    if (p->state == CO__POOL_OPEN && has_room_locked(p)) retry_submitters_locked(p, 1, &wl);
    punlock(p);
    wl_wake(&wl);
    rec_free_list(tofree);
    return rc;
}

#ifndef THREAD_FULL_SPIN_TICKS
#define THREAD_FULL_SPIN_TICKS ((uint64_t)4 * CO__CYCLES_SHORT)
#endif

/* A submit that found no idle record at once, or a closed pool, as it goes
 * round submit_slow's loop (the lock held at the top of each round). */
typedef struct submit {
    co_pool_t *p;
    task_t task;
    int64_t deadline;
    int64_t ticket;     /* its place in submitq (sub_ticket), kept across RETRY; -1 before */
    co__pw_t *fresh;    /* a record it allocated and has not used yet */
    co__pw_t *tofree;
    wakelist_t wl;
    bool raised;        /* waiters raised and the chute drained since the lock was taken */
    bool spun;          /* a plain thread watched the chute before parking */
    /* In p->sub_parked: from its first park until the submit ends. A RETRY
     * keeps it counted, so that destroy waits for a submitter sent round
     * again while it drops the lock (fresh_alloc). */
    bool counted;
} submit_t;

/* Lock held: the submit ends and no longer holds destroy back. */
static void uncount_locked(submit_t *s) {
    if (!s->counted) return;
    s->p->sub_parked--;
    s->counted = false;
}

/* Lock held; released. The submit fails with rc, counted as a rejection. */
static int submit_refuse(submit_t *s, int rc) {
    co_pool_t *p = s->p;
    uncount_locked(s);
    rejected_inc(p);
    if (s->fresh) rec_put_locked(p, s->fresh, &s->tofree);
    punlock(p);
    wl_wake(&s->wl);
    rec_free_list(s->tofree);
    return rc;
}

/* Lock held; released. The task goes to w, an idle or new record. */
static int submit_start(submit_t *s, co__pw_t *w) {
    co_pool_t *p = s->p;
    uncount_locked(s); /* the worker's busy count holds destroy from here */
    activate_locked(p, w, s->task.fn, s->task.arg);
    if (s->fresh) rec_put_locked(p, s->fresh, &s->tofree);
    punlock(p);
    wl_wake(&s->wl);
    rec_free_list(s->tofree);
    return launch(p, w);
}

/* Lock held, the pool with room. A record for a new worker: the one this
 * submit allocated, or a spare; NULL if there is neither. */
static co__pw_t *new_record_locked(submit_t *s) {
    co_pool_t *p = s->p;
    co__pw_t *w = s->fresh ? s->fresh : rec_get_locked(p);
    if (!w) return NULL;
    if (w == s->fresh) s->fresh = NULL;
    st32(&p->running, p->running + 1);
    return w;
}

/* Lock held; released, since there is no malloc under the lock. Allocate
 * s->fresh and take the lock again: 0. Out of memory: CO_ENOMEM, the lock
 * not held and the submit over (counted as a rejection). */
static int fresh_alloc(submit_t *s) {
    co_pool_t *p = s->p;
    punlock(p);
    s->raised = false;
    /* One cache line each: a record crosses Ms twice per task (its
     * submitter's and its worker's), and one line is one miss per
     * crossing. */
    co__pw_t *w = NULL;
    if (co__test_failing(CO__FAIL_SLOW_ALLOC)) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    if (posix_memalign((void **)&w, CO__CACHELINE, sizeof *w) != 0) {
        rejected_inc(p);
        if (s->counted) { /* last: destroy may go on once it is uncounted */
            plock(p);
            uncount_locked(s);
            punlock(p);
        }
        wl_wake(&s->wl);
        rec_free_list(s->tofree);
        return CO_ENOMEM;
    }
    memset(w, 0, sizeof *w);
    w->pool = p;
    w->token.fn = co__pool_worker_main;
    s->fresh = w;
    plock(p);
    return 0;
}

/* Lock held, the pool full. Whether the submit may wait: 0, or the error
 * it fails with instead. */
static int full_verdict_locked(const submit_t *s) {
    co_pool_t *p = s->p;
    /* A submitter that already waited (ticket) and was sent round again
     * keeps its admission: newcomers that filled max_blocking meanwhile do
     * not turn it away. */
    if (p->opts.nonblocking ||
        (p->opts.max_blocking > 0 && s->ticket < 0 && p->waiting >= p->opts.max_blocking))
        return CO_EOVERLOAD;
    if (co__recover_has_tag(p)) return CO_EDEADLK; /* a task of this pool waiting for itself */
    if (s->deadline != CO_FOREVER && s->deadline <= co_now()) return CO_ETIMEDOUT;
    return 0;
}

/* Lock held; released, then taken again. A plain thread would sleep on a
 * futex, and its waker pay a wake: with tasks that end within
 * microseconds, watch the chute for a moment (a few microseconds) first,
 * without the lock. A coroutine parks without the kernel. */
static void watch_chute(submit_t *s) {
    co_pool_t *p = s->p;
    s->spun = true;
    punlock(p);
    wl_wake(&s->wl);
    uint64_t t0 = co__cycles();
    while (!__atomic_load_n(&p->chute, __ATOMIC_RELAXED) &&
           co__cycles() - t0 < THREAD_FULL_SPIN_TICKS)
        for (int i = 0; i < 16; i++) co__cpu_relax();
    plock(p);
}

/* Lock held. Queue on submitq and park until a worker takes the task, a
 * release refuses it, the deadline passes or a slot frees. Returns RETRY
 * with the lock held (go round again); otherwise the submit's result, the
 * lock not held. */
static int submit_wait(submit_t *s) {
    co_pool_t *p = s->p;
    co__pkw_t pw;
    co__wait_prepare(&pw, CO__WR_POOL);
    co__waiter_t *wt = &pw.w;
    wt->data = &s->task;
    /* First come, first served: a submitter that went round again after
     * RETRY and found the pool full again (a newcomer took the slot
     * meanwhile) goes back to its place by its first ticket, not to the
     * tail. */
    if (s->ticket < 0) {
        wt->n = s->ticket = p->sub_ticket++;
        co__waitq_push(&p->submitq, wt);
    } else {
        wt->n = s->ticket;
        co__waitq_insert_by_n(&p->submitq, wt);
    }
    st32(&p->waiting, p->waiting + 1);
    if (!s->counted) p->sub_parked++; /* once: a RETRY kept it counted */
    s->counted = true;
    wl_wake(&s->wl); /* before parking: nobody would wake them after */
    int rc = pwait(p, wt, s->deadline, CO__WAIT_KEEP_LOCK);
    s->raised = false;
    if (rc == CO_ETIMEDOUT) { /* the lock held */
        if (wt->q) { /* still queued: nobody popped us */
            co__waitq_remove(wt);
            st32(&p->waiting, p->waiting - 1);
        }
        return submit_refuse(s, CO_ETIMEDOUT); /* uncounts it */
    }
    if (wt->result == RETRY) { /* the waker left sub_parked to us: kept till the end */
        plock(p);
        return RETRY;
    }
    /* 0: a worker took the task; CO_ECLOSED: release (counted as a
     * rejection by it). Our waker accounted for us, so *p may already be
     * gone (destroy): do not touch it again. */
    rec_free_list(s->fresh);
    rec_free_list(s->tofree);
    return wt->result;
}

/* The rest of a submit that found no idle record at once, or a closed pool
 * (called with the lock held; releases it). */
static __attribute__((noinline)) int submit_slow(co_pool_t *p, void (*fn)(void *), void *arg,
                                                 int64_t deadline) {
    submit_t s = {.p = p, .task = {fn, arg}, .deadline = deadline, .ticket = -1};
    for (;;) {
        if (p->state != CO__POOL_OPEN) return submit_refuse(&s, CO_ECLOSED);
        if (co__wq_empty(&p->idle)) co__pool_drain_chute_locked(p, &s.wl, &s.tofree);
        co__pw_t *w = co__wq_detach(&p->idle);
        if (w) return submit_start(&s, w);
        if (has_room_locked(p)) {
            if ((w = new_record_locked(&s))) return submit_start(&s, w);
            int rc = fresh_alloc(&s);
            if (rc < 0) return rc;
            continue; /* the lock was dropped meanwhile: look again */
        }
        int rc = full_verdict_locked(&s);
        if (rc < 0) return submit_refuse(&s, rc);
        /* Full: park at once. The first worker to finish hands its slot
         * straight to us (its coroutine runs our task: no spawn). No yield
         * first to let queued workers run: they take over the unstarted
         * ones queued behind them, so a yield would only delay the park. */
        if (!s.raised && !s.spun && !co__cur_g()) {
            watch_chute(&s);
            continue;
        }
        if (!s.raised) {
            /* About to wait: from now on finishing workers take the lock
             * (see "The chute", worker.c); drain what they left before,
             * and look again. */
            waiters_raise_locked(p);
            s.raised = true;
            co__pool_drain_chute_locked(p, &s.wl, &s.tofree);
            continue;
        }
        rc = submit_wait(&s);
        if (rc != RETRY) return rc;
    }
}

/* A submit. The common case, an open pool with an idle record at hand, is
 * handled here, inline, without the general path's frame and bookkeeping:
 * it changes no wait queue, so the unlock skips recomputing `waiters`, and
 * at the default stack size the launch cannot fail. */
static inline int submit_impl(co_pool_t *p, void (*fn)(void *), void *arg, int64_t deadline) {
    plock(p);
    co__pw_t *w;
    if (CO_UNLIKELY(p->state != CO__POOL_OPEN) || CO_UNLIKELY(p->opts.stack_size != 0) ||
        !(w = co__wq_detach(&p->idle)))
        return submit_slow(p, fn, arg, deadline);
    /* The next submit's record was likely last written by its worker on
     * another CPU: start fetching it now, for writing. */
    __builtin_prefetch(co__wq_peek(&p->idle), 1);
    activate_locked(p, w, fn, arg);
    co__punlock(&p->lock); /* no queue changed: `waiters` stands */
    co__spawn_token(&w->token);
    return 0;
}

static inline int submit_checked(co_pool_t *p, void (*fn)(void *), void *arg, int64_t deadline,
                                 const char *call) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, call);
    if (!fn || p->fn) {
        rejected_inc(p);
        return CO_EINVAL;
    }
    return submit_impl(p, fn, arg, deadline);
}

int co_pool_submit_until(co_pool_t *p, void (*fn)(void *arg), void *arg, int64_t deadline) {
    return submit_checked(p, fn, arg, deadline, "co_pool_submit_until");
}

int co_pool_submit(co_pool_t *p, void (*fn)(void *arg), void *arg) {
    return submit_checked(p, fn, arg, CO_FOREVER, "co_pool_submit");
}

int co__pool_invoke_until(co_pool_t *p, void *arg, int64_t deadline) {
    if (!p) return CO_EINVAL;
    POOL_CHECK(p, "co_pool_invoke");
    if (!p->fn) {
        rejected_inc(p);
        return CO_EINVAL;
    }
    return submit_impl(p, NULL, arg, deadline);
}

int co_pool_invoke(co_pool_t *p, void *arg) { return co__pool_invoke_until(p, arg, CO_FOREVER); }

