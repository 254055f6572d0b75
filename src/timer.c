/*
 * Runtime timers: a 4-ary min-heap per P (Go's p.timers since 1.14, 4-ary
 * since fcf6a7e). Each heap is protected by its P's timers_lock; any M may
 * add to, delete from or run any P's heap. p->timer0_when mirrors the root
 * so other Ms can find the next deadline without the lock.
 *
 * Timer state (co__timer_t.state) is IDLE or PENDING and changes only
 * under the lock of the heap the timer is on (t->p): add makes it PENDING,
 * del and the runner (popping it) make it IDLE. t->running counts callbacks
 * in flight: the runner increments it under the heap lock as it pops the
 * timer and decrements it (release) as its very last touch of the timer.
 * co__timer_del removes a pending timer and then waits (acquire) until
 * running is 0, so a timer's memory can be reused once del returns, even
 * when its callback re-added it meanwhile.
 */
#include "runtime.h"

#include <sched.h>
#include <stdlib.h>

static void set_timer0(co_p_t *p) {
    /* seq_cst store: pairs with the acquire loads in the scheduler and with
     * the poller's poll_until handshake (see co__timer_add) */
    __atomic_store_n(&p->timer0_when, p->timers_len ? p->timers[0].when : 0, __ATOMIC_SEQ_CST);
}

static void sift_up(co__theap_t *h, int i) {
    co__theap_t e = h[i];
    while (i > 0) {
        int parent = (i - 1) / 4;
        if (h[parent].when <= e.when) break;
        h[i] = h[parent];
        h[i].t->idx = i;
        i = parent;
    }
    h[i] = e;
    e.t->idx = i;
}

static void sift_down(co__theap_t *h, int n, int i) {
    co__theap_t e = h[i];
    for (;;) {
        int c = 4 * i + 1;
        if (c >= n) break;
        int best = c;
        int end = c + 4 < n ? c + 4 : n;
        for (int k = c + 1; k < end; k++)
            if (h[k].when < h[best].when) best = k;
        if (h[best].when >= e.when) break;
        h[i] = h[best];
        h[i].t->idx = i;
        i = best;
    }
    h[i] = e;
    e.t->idx = i;
}

/* timers_lock held. */
static void heap_remove(co_p_t *p, int i) {
    int last = --p->timers_len;
    if (i != last) {
        co__theap_t *h = p->timers;
        h[i] = h[last];
        if (i > 0 && h[i].when < h[(i - 1) / 4].when)
            sift_up(h, i);
        else
            sift_down(h, last, i);
    }
}

/* timers_lock held. Room for one more entry, or die: a timer cannot be
 * refused (the caller is about to park on it). */
static void heap_reserve(co_p_t *p) {
    if (p->timers_len < p->timers_cap) return;
    int ncap = p->timers_cap ? p->timers_cap * 2 : 64;
    co__theap_t *nh = realloc(p->timers, (size_t)ncap * sizeof *nh);
    if (!nh) co__fatal("out of memory growing the timer heap (%d timers)", ncap);
    p->timers = nh;
    p->timers_cap = ncap;
}

static void heap_push(co_p_t *p, co__timer_t *t) {
    heap_reserve(p);
    int i = p->timers_len++;
    p->timers[i] = (co__theap_t){t->when, t};
    sift_up(p->timers, i);
}

void co__timer_add(co__timer_t *t, int64_t when) {
    co_sched_t *s = &co__sched;
    co_m_t *m = co__getm();
    co_p_t *p = (m && m->p) ? m->p : NULL;
    if (!p) p = co__allp((int)(co__fastrand() % (uint32_t)s->nprocs));
    co__lock(&p->timers_lock);
    t->when = when;
    __atomic_store_n(&t->p, p, __ATOMIC_RELEASE);
    heap_push(p, t);
    __atomic_store_n(&t->state, CO__TM_PENDING, __ATOMIC_RELAXED);
    bool first = t->idx == 0;
    if (first) set_timer0(p);
    co__unlock(&p->timers_lock);
    if (!first) return;
    /* seq_cst: pairs with the poller's store of poll_until then load of
     * the timers (sched.c block_idle): one of us sees the other. */
    int64_t until = __atomic_load_n(&s->poll_until, __ATOMIC_SEQ_CST);
    if (until != 0 && when < until) {
        co__netpoll_break();
    } else if (until == 0 && __atomic_load_n(&p->status, __ATOMIC_ACQUIRE) != CO_P_RUNNING) {
        co__wakep(); /* nobody polls and the P is idle: get an M to watch it */
    }
}

bool co__timer_del(co__timer_t *t) {
    bool removed = false;
    for (;;) {
        co_p_t *p = __atomic_load_n(&t->p, __ATOMIC_ACQUIRE);
        if (!p) break; /* never added */
        co__lock(&p->timers_lock);
        if (__atomic_load_n(&t->p, __ATOMIC_RELAXED) != p) { /* moved by a re-add */
            co__unlock(&p->timers_lock);
            continue;
        }
        if (__atomic_load_n(&t->state, __ATOMIC_RELAXED) == CO__TM_PENDING) {
            int i = t->idx;
            heap_remove(p, i);
            t->idx = -1;
            __atomic_store_n(&t->state, CO__TM_IDLE, __ATOMIC_RELAXED);
            if (i == 0) set_timer0(p);
            removed = true;
        }
        co__unlock(&p->timers_lock);
        break;
    }
    /* acquire: pairs with the runner's release decrement */
    while (__atomic_load_n(&t->running, __ATOMIC_ACQUIRE) != 0) sched_yield();
    /* A callback that was in flight may have re-added the timer. */
    if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) == CO__TM_PENDING) return co__timer_del(t) || removed;
    return removed;
}

int co__timers_run(co_p_t *p, int64_t now) {
    int ran = 0;
    if (!co__trylock(&p->timers_lock)) return 0; /* someone else is at it */
    while (p->timers_len > 0 && p->timers[0].when <= now) {
        co__timer_t *t = p->timers[0].t;
        heap_remove(p, 0);
        t->idx = -1;
        __atomic_store_n(&t->state, CO__TM_IDLE, __ATOMIC_RELAXED);
        __atomic_add_fetch(&t->running, 1, __ATOMIC_RELAXED);
        set_timer0(p);
        void (*fn)(void *) = t->fn;
        void *arg = t->arg;
        co__unlock(&p->timers_lock);
        fn(arg);
        /* release: last touch of t; the callback's effects happen before
         * co__timer_del sees 0 */
        __atomic_sub_fetch(&t->running, 1, __ATOMIC_RELEASE);
        ran++;
        co__lock(&p->timers_lock);
    }
    co__unlock(&p->timers_lock);
    return ran;
}

int64_t co__timers_next(void) {
    co_sched_t *s = &co__sched;
    int64_t best = 0;
    for (int i = 0; i < s->nprocs; i++) {
        int64_t w = __atomic_load_n(&co__allp(i)->timer0_when, __ATOMIC_SEQ_CST);
        if (w && (best == 0 || w < best)) best = w;
    }
    return best;
}

void co__timers_free(co_p_t *p) {
    free(p->timers);
    p->timers = NULL;
    p->timers_len = p->timers_cap = 0;
}

void co__timers_move(co_p_t *from, co_p_t *to) {
    if (from == to) return;
    /* Lock order: the P being emptied, then the receiving one. Only sysmon
     * and a retiring M move timers, always away from a lent P. */
    co__lock(&from->timers_lock);
    co__lock(&to->timers_lock);
    for (int i = 0; i < from->timers_len; i++) {
        co__timer_t *t = from->timers[i].t;
        __atomic_store_n(&t->p, to, __ATOMIC_RELEASE);
        heap_push(to, t);
    }
    from->timers_len = 0;
    set_timer0(from);
    set_timer0(to);
    co__unlock(&to->timers_lock);
    co__unlock(&from->timers_lock);
}
