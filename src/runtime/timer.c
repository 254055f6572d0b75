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
 *
 * A timer is never refused: one that finds no memory to grow the run or
 * the heap goes on the P's overflow list, linked through the timer itself
 * and kept sorted (an O(n) insert, for as long as memory stays short).
 * The earliest timer is the earliest of the three heads.
 */
#include "runtime/proc.h"

#include <sched.h>
#include <stdlib.h>

/* ---- the run ----------------------------------------------------------
 * Most timers are added in deadline order: sleeps of one length, deadlines
 * of one timeout, each computed from a clock that only goes forward. Such a
 * timer (no earlier than the run's last entry) is appended to the run, a
 * ring kept sorted by construction: adding and popping it are O(1) and
 * touch only the ring's ends, where the heap would sift it through every
 * level of a cold array. Other timers go on the heap; the earliest timer is
 * the earlier of the two heads. A timer earlier than the run's last few
 * entries moves those to the heap and joins the run (RUN_EVICT), so one
 * far timer cannot turn every later add away. A deleted run entry is
 * cleared in place (t = NULL) and skipped when it reaches the head; when
 * cleared entries outnumber live ones the run is compacted, so timers that
 * are always deleted before they fire (deadlines) cannot grow it without
 * bound.
 * A run timer's t->slot is -2 - its ring index; an index changes only
 * when the ring is repacked (growth, compaction), which rewrites them. */

static inline bool run_empty(const co_p_t *p) { return p->trun_head == p->trun_tail; }
static inline co__trun_t *run_at(co_p_t *p, uint32_t i) { return &p->trun[i & p->trun_mask]; }

/* Growth of the run and the heap, failing on purpose while a test sets
 * CO__FAIL_TIMER_GROW (base/testhook.h). */
static inline bool grow_refused(void) {
    return co__test_failing(CO__FAIL_TIMER_GROW);
}
static void *grow_realloc(void *old, size_t size) {
    return grow_refused() ? NULL : realloc(old, size);
}

/* Repack the live entries at the start of a ring of `size` entries; false
 * (the run unchanged) without memory. */
static bool run_repack(co_p_t *p, uint32_t size) {
    co__trun_t *n = grow_realloc(NULL, (size_t)size * sizeof *n);
    if (!n) return false;
    uint32_t k = 0;
    for (uint32_t i = p->trun_head; i != p->trun_tail; i++) {
        co__trun_t e = *run_at(p, i);
        if (!e.t) continue;
        e.t->slot = -2 - (int32_t)k;
        n[k++] = e;
    }
    free(p->trun);
    p->trun = n;
    p->trun_mask = size - 1;
    p->trun_head = 0;
    p->trun_tail = k;
    p->trun_dead = 0;
    return true;
}

static void heap_or_list(co_p_t *p, co__timer_t *t);

/* A timer earlier than the run's last few entries moves them to the heap
 * and joins the run: one far deadline (a pool's purge timer, a second
 * ahead) must not send every sleep after it to the heap. More than this
 * many later entries, and t goes to the heap itself: one add never moves
 * more than a few. */
#define RUN_EVICT 4

/* Whether t may join the run, and if so, append it. */
static bool run_push(co_p_t *p, co__timer_t *t) {
    int evicted = 0;
    while (!run_empty(p) && t->when < run_at(p, p->trun_tail - 1)->when) {
        co__trun_t *e = run_at(p, p->trun_tail - 1);
        if (e->t && evicted == RUN_EVICT) return false;
        co__timer_t *et = e->t;
        p->trun_tail--;
        if (et) {
            heap_or_list(p, et);
            evicted++;
        } else {
            p->trun_dead--; /* a deleted entry: just drop it */
        }
    }
    uint32_t len = p->trun_tail - p->trun_head;
    if (p->trun_mask == 0 || len == p->trun_mask + 1) {
        uint32_t size = p->trun_mask ? p->trun_mask + 1 : 64;
        if (p->trun_dead * 2 < len || len == 0) size *= 2; /* else compaction is room enough */
        if (size > (1u << 30)) return false;               /* the heap takes it */
        if (!run_repack(p, size)) return false;            /* no memory: the heap or the list */
    }
    uint32_t i = p->trun_tail++;
    *run_at(p, i) = (co__trun_t){.when = t->when, .t = t};
    t->slot = -2 - (int32_t)(i & p->trun_mask);
    return true;
}

/* Drop cleared entries from the head, so that the head is live or the run
 * is empty. */
static void run_trim(co_p_t *p) {
    while (!run_empty(p) && !run_at(p, p->trun_head)->t) {
        p->trun_head++;
        p->trun_dead--;
    }
}

#define RUN_LOOKAHEAD 6

/* Take the live head entry's timer off the run. */
static co__timer_t *run_pop(co_p_t *p) {
    co__timer_t *t = run_at(p, p->trun_head)->t;
    p->trun_head++;
    run_trim(p);
    /* Those next in line live on cold stacks: start the timer a few
     * entries ahead coming (a batch pops up to TIMER_BATCH back to back). */
    uint32_t ahead = p->trun_head + RUN_LOOKAHEAD;
    if ((int32_t)(p->trun_tail - ahead) > 0) __builtin_prefetch(run_at(p, ahead)->t, 1);
    return t;
}

/* Delete a pending run timer. */
static void run_del(co_p_t *p, co__timer_t *t) {
    uint32_t pos = (uint32_t)(-2 - t->slot);
    p->trun[pos].t = NULL;
    p->trun_dead++;
    run_trim(p);
    uint32_t len = p->trun_tail - p->trun_head;
    if (len >= 64 && p->trun_dead * 2 > len)
        (void)run_repack(p, p->trun_mask + 1); /* without memory: compacted later */
}

/* ---- the overflow list ---------------------------------------------------
 * Timers that found no memory for the run or the heap, sorted by `when`,
 * linked through their lnext/lprev. */

static void list_insert(co_p_t *p, co__timer_t *t) {
    co__timer_t *prev = NULL, *cur = p->tlist;
    while (cur && cur->when <= t->when) {
        prev = cur;
        cur = cur->lnext;
    }
    t->lprev = prev;
    t->lnext = cur;
    if (cur) cur->lprev = t;
    if (prev)
        prev->lnext = t;
    else
        p->tlist = t;
    t->slot = CO__TSLOT_LIST;
    p->tlist_len++;
}

static void list_del(co_p_t *p, co__timer_t *t) {
    if (t->lprev)
        t->lprev->lnext = t->lnext;
    else
        p->tlist = t->lnext;
    if (t->lnext) t->lnext->lprev = t->lprev;
    t->lnext = t->lprev = NULL;
    p->tlist_len--;
}

/* The earliest pending deadline on p, 0 if none. */
static inline int64_t timers_min(co_p_t *p) {
    int64_t w = p->timers_len ? p->timers[0].when : 0;
    if (!run_empty(p)) {
        int64_t r = run_at(p, p->trun_head)->when;
        if (w == 0 || r < w) w = r;
    }
    if (CO_UNLIKELY(p->tlist != NULL) && (w == 0 || p->tlist->when < w)) w = p->tlist->when;
    return w;
}

static void set_timer0(co_p_t *p) {
    /* seq_cst store: pairs with the acquire loads in the scheduler and with
     * the poller's poll_until handshake (see co__timer_add) */
    __atomic_store_n(&p->timer0_when, timers_min(p), __ATOMIC_SEQ_CST);
}

/* ---- the heap and its slots (timers_lock held for all of these) ---------
 * A heap entry is {when, slot}; p->tslots[slot] holds the timer and the
 * entry's position. Every move of an entry writes its slot's pos, so the
 * position of any pending timer t is p->tslots[t->slot].pos. */

static inline void heap_set(co_p_t *p, int i, co__theap_t e) {
    p->timers[i] = e;
    p->tslots[e.slot].pos = i;
}

static void sift_up(co_p_t *p, int i) {
    co__theap_t *h = p->timers;
    co__theap_t e = h[i];
    while (i > 0) {
        int parent = (i - 1) / 4;
        if (h[parent].when <= e.when) break;
        heap_set(p, i, h[parent]);
        i = parent;
    }
    heap_set(p, i, e);
}

static void sift_down(co_p_t *p, int n, int i) {
    co__theap_t *h = p->timers;
    co__theap_t e = h[i];
    for (;;) {
        int c = 4 * i + 1;
        if (c >= n) break;
        int best = c;
        int end = c + 4 < n ? c + 4 : n;
        for (int k = c + 1; k < end; k++)
            if (h[k].when < h[best].when) best = k;
        if (h[best].when >= e.when) break;
        heap_set(p, i, h[best]);
        i = best;
    }
    heap_set(p, i, e);
}

/* Remove the entry at position i (its slot stays allocated: the caller
 * frees it). */
static void heap_remove(co_p_t *p, int i) {
    int last = --p->timers_len;
    if (i != last) {
        co__theap_t *h = p->timers;
        heap_set(p, i, h[last]);
        if (i > 0 && h[i].when < h[(i - 1) / 4].when)
            sift_up(p, i);
        else
            sift_down(p, last, i);
    }
}

static void slot_free(co_p_t *p, uint32_t slot) {
    p->tslots[slot].t = NULL;
    p->tslots[slot].pos = p->tslot_free; /* the chain: next free + 1 */
    p->tslot_free = (int)slot + 1;
}

/* Room for one more entry and one more slot; false without memory (the
 * overflow list takes the timer). */
static bool heap_reserve(co_p_t *p) {
    if (p->timers_len == p->timers_cap) {
        if (p->timers_cap > INT32_MAX / 2) return false;
        int ncap = p->timers_cap ? p->timers_cap * 2 : 64;
        co__theap_t *nh = grow_realloc(p->timers, (size_t)ncap * sizeof *nh);
        if (!nh) return false;
        p->timers = nh;
        p->timers_cap = ncap;
    }
    if (p->tslot_free == 0 && p->tslots_hw == p->tslots_cap) {
        if (p->tslots_cap > INT32_MAX / 2) return false;
        int ncap = p->tslots_cap ? p->tslots_cap * 2 : 64;
        co__tslot_t *ns = grow_realloc(p->tslots, (size_t)ncap * sizeof *ns);
        if (!ns) return false;
        p->tslots = ns;
        p->tslots_cap = ncap;
    }
    return true;
}

static void heap_insert(co_p_t *p, co__timer_t *t) {
    uint32_t slot;
    if (p->tslot_free) {
        slot = (uint32_t)(p->tslot_free - 1);
        p->tslot_free = p->tslots[slot].pos;
    } else {
        slot = (uint32_t)p->tslots_hw++;
    }
    p->tslots[slot].t = t;
    t->slot = (int32_t)slot;
    int i = p->timers_len++;
    heap_set(p, i, (co__theap_t){.when = t->when, .slot = slot});
    sift_up(p, i);
}

static void heap_or_list(co_p_t *p, co__timer_t *t) {
    if (CO_LIKELY(heap_reserve(p)))
        heap_insert(p, t);
    else
        list_insert(p, t);
}

static void heap_push(co_p_t *p, co__timer_t *t) {
    if (!run_push(p, t)) heap_or_list(p, t);
}

void co__timer_add(co__timer_t *t, int64_t when) {
    co_sched_t *s = &co__sched;
#ifdef CO_TSAN
    __tsan_release(t); /* the arming's past, for the callback (race.c) */
#endif
    co_m_t *m = co__getm();
    co_p_t *p = (m && m->p) ? m->p : NULL;
    if (!p) p = co__allp((int)(co__fastrand() % (uint32_t)s->nprocs));
    co__lock(&p->timers_lock);
    while (p->timers_closed) { /* retired since we read allp: take its replacement */
        /* id read under the lock: once we let go, p may go back into
         * service as a spare for another slot (sysmon's lend_spare sets its
         * id under this lock) */
        int id = p->id;
        co__unlock(&p->timers_lock);
        p = co__allp(id);
        co__lock(&p->timers_lock);
    }
    t->when = when;
    __atomic_store_n(&t->p, p, __ATOMIC_RELEASE);
    int64_t old = timers_min(p);
    heap_push(p, t);
    /* release: pairs with co__timer_del's acquire load of PENDING, which
     * must then see the t->p stored above */
    __atomic_store_n(&t->state, CO__TM_PENDING, __ATOMIC_RELEASE);
    bool first = old == 0 || when < old;
    if (first) set_timer0(p);
    co__unlock(&p->timers_lock);
    if (!first) return;
    /* seq_cst: pairs with the poller's store of poll_until then load of
     * the timers (proc.c co__block_idle): one of us sees the other. */
    int64_t until = __atomic_load_n(&s->poll_until, __ATOMIC_SEQ_CST);
    if (until != 0 && when < until) {
        co__netpoll_break();
    } else if (until == 0 && __atomic_load_n(&p->status, __ATOMIC_ACQUIRE) != CO_P_RUNNING) {
        co__wakep(); /* nobody polls and the P is idle: get an M to watch it */
    }
}

void co__timer_wait_fired(co__timer_t *t) {
    /* acquire: pairs with the runner's release decrement */
    while (__atomic_load_n(&t->running, __ATOMIC_ACQUIRE) != 0) sched_yield();
}

bool co__timer_del(co__timer_t *t) {
    bool removed = false;
    /* Not pending: nothing to take off a heap, so t->p (the heap it was on
     * last) is not touched: it may have gone with a runtime shut down since
     * (a context freed after co_shutdown, its deadline long fired). Only a
     * callback in flight, which may re-add it, is waited for. acquire:
     * pairs with the runner's release store of IDLE after its count. */
    if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) == CO__TM_IDLE) {
        co__timer_wait_fired(t);
        if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) == CO__TM_IDLE) return false;
    }
    for (;;) {
        co_p_t *p = __atomic_load_n(&t->p, __ATOMIC_ACQUIRE);
        if (!p) break; /* never added */
        co__lock(&p->timers_lock);
        if (__atomic_load_n(&t->p, __ATOMIC_RELAXED) != p) { /* moved by a re-add */
            co__unlock(&p->timers_lock);
            continue;
        }
        if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) == CO__TM_PENDING) {
            /* A callback in flight may have re-added t to another P's heap
             * between the check of t->p above and this load (under that
             * P's lock, not this one): PENDING then names that heap. Its
             * store of t->p came before its release of PENDING. */
            if (__atomic_load_n(&t->p, __ATOMIC_RELAXED) != p) {
                co__unlock(&p->timers_lock);
                continue;
            }
            if (CO_UNLIKELY(t->slot == CO__TSLOT_LIST)) {
                list_del(p, t);
            } else if (t->slot <= -2) {
                run_del(p, t);
            } else {
                heap_remove(p, p->tslots[t->slot].pos);
                slot_free(p, (uint32_t)t->slot);
            }
            t->slot = -1;
            __atomic_store_n(&t->state, CO__TM_IDLE, __ATOMIC_RELAXED);
            if (t->when <= p->timer0_when) set_timer0(p); /* it may have been the first */
            removed = true;
        }
        co__unlock(&p->timers_lock);
        break;
    }
    co__timer_wait_fired(t); /* a callback in flight: wait for its end */
    /* A callback that was in flight may have re-added the timer. */
    if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) == CO__TM_PENDING) return co__timer_del(t) || removed;
    return removed;
}

/* Due timers are popped in batches: the timers live on parked coroutines'
 * stacks (cold), so the whole batch is prefetched before the first one is
 * written, one lock round and one timer0 update cover the batch, and the
 * callbacks then run without the lock. Each popped timer counts as running
 * until its callback returns, so co__timer_del (on another M) waits for it
 * as before; callbacks never delete timers themselves (see co__timer_del). */
enum { TIMER_BATCH = 16 };

__thread bool co__timer_ready_front __attribute__((tls_model("initial-exec")));

int co__timers_run(co_p_t *p, int64_t now) {
    int ran = 0;
    if (!co__trylock(&p->timers_lock)) return 0; /* someone else is at it */
    /* Without a P here (sysmon, an idle M), the timers are the ones their
     * own P failed to run in time: what they wake goes to the front of the
     * global queue, ahead of the backlog a lent P's queue left there. */
    co_m_t *self = co__getm();
    bool front = !self || !self->p;
    if (front) co__timer_ready_front = true;
    /* With a P: the first callback's wake-up takes runnext (its timer was
     * due first), later ones go to the ring's tail (m->np_batch) instead
     * of each pushing the one before out of runnext to the tail: a 1 ms
     * heartbeat was sent behind hundreds that way by a sleep of the same
     * millisecond fired after it. */
    co_m_t *onp = front ? NULL : self;
    bool batch0 = onp ? onp->np_batch : false;
    for (;;) {
        co__timer_t *batch[TIMER_BATCH];
        int n = 0;
        while (n < TIMER_BATCH) {
            co__timer_t *t;
            co__timer_t *l = p->tlist;
            if (CO_UNLIKELY(l != NULL) && l->when <= now && l->when <= timers_min(p)) {
                list_del(p, l); /* the earliest of all, and due */
                batch[n++] = l;
                continue;
            }
            bool heap = p->timers_len > 0 &&
                        (run_empty(p) || p->timers[0].when < run_at(p, p->trun_head)->when);
            if (heap) {
                if (p->timers[0].when > now) break;
                uint32_t slot = p->timers[0].slot;
                t = p->tslots[slot].t;
                __builtin_prefetch(t, 1);
                heap_remove(p, 0);
                slot_free(p, slot);
            } else {
                if (run_empty(p) || run_at(p, p->trun_head)->when > now) break;
                t = run_pop(p);
            }
            batch[n++] = t;
        }
        if (n == 0) break;
        for (int i = 0; i < n; i++) {
            co__timer_t *t = batch[i];
            t->slot = -1;
            __atomic_add_fetch(&t->running, 1, __ATOMIC_RELAXED);
            /* release, after the count: co__timer_del's lock-free look that
             * sees IDLE sees the callback counted */
            __atomic_store_n(&t->state, CO__TM_IDLE, __ATOMIC_RELEASE);
            __builtin_prefetch(t->arg, 1); /* the callback's parker, usually */
        }
        set_timer0(p);
        co__unlock(&p->timers_lock);
        for (int i = 0; i < n; i++) {
            co__timer_t *t = batch[i];
#ifdef CO_TSAN
            /* Its arming's past; its own accesses unrecorded: it may run
             * on a coroutine's stack (race.c) */
            __tsan_acquire(t);
            __tsan_ignore_thread_begin();
#endif
            t->fn(t->arg); /* fn and arg never change while a timer may run */
            if (onp) onp->np_batch = true; /* the next ones: the tail */
#ifdef CO_TSAN
            __tsan_ignore_thread_end();
#endif
            /* release: last touch of t; the callback's effects happen
             * before co__timer_del sees 0 */
            __atomic_sub_fetch(&t->running, 1, __ATOMIC_RELEASE);
        }
        ran += n;
        co__lock(&p->timers_lock);
    }
    co__unlock(&p->timers_lock);
    if (front) co__timer_ready_front = false;
    if (onp) onp->np_batch = batch0;
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

/* Timers pending on every P (each P's under its lock), or only those on
 * the overflow lists. */
static int64_t timers_count(bool listed_only) {
    co_sched_t *s = &co__sched;
    int64_t n = 0;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *p = co__allp(i);
        co__lock(&p->timers_lock);
        n += p->tlist_len;
        if (!listed_only)
            n += p->timers_len + (int64_t)(p->trun_tail - p->trun_head) - p->trun_dead;
        co__unlock(&p->timers_lock);
    }
    return n;
}

int64_t co__timers_pending(void) { return timers_count(false); }

/* For tests: timers on the overflow lists now. */
CO_HIDDEN int64_t co__test_timers_listed(void);
int64_t co__test_timers_listed(void) { return timers_count(true); }

void co__timers_free(co_p_t *p) {
    free(p->timers);
    free(p->tslots);
    free(p->trun);
    p->trun = NULL;
    p->trun_head = p->trun_tail = p->trun_mask = p->trun_dead = 0;
    p->timers = NULL;
    p->tslots = NULL;
    p->timers_len = p->timers_cap = 0;
    p->tslots_hw = p->tslots_cap = p->tslot_free = 0;
    p->tlist = NULL; /* (nothing is pending at shutdown) */
    p->tlist_len = 0;
}

void co__timers_move(co_p_t *from, co_p_t *to, bool close) {
    if (from == to) return;
    /* Lock order: the P being emptied, then the receiving one. Only sysmon
     * and a retiring M move timers, always away from a lent P to a newer P
     * of the same slot of allp: no cycle. */
    co__lock(&from->timers_lock);
    co__lock(&to->timers_lock);
    while (to->timers_closed) {
        /* `to` retired meanwhile (it was lent away too): a timer left on it
         * would never fire. Its replacement in allp takes them. */
        co__unlock(&to->timers_lock);
        to = co__allp(from->id);
        co__lock(&to->timers_lock);
    }
    if (close) from->timers_closed = true;
    for (uint32_t i = from->trun_head; i != from->trun_tail; i++) { /* in order */
        co__timer_t *t = run_at(from, i)->t;
        if (!t) continue;
        __atomic_store_n(&t->p, to, __ATOMIC_RELEASE);
        heap_push(to, t);
    }
    from->trun_head = from->trun_tail = from->trun_dead = 0;
    for (int i = 0; i < from->timers_len; i++) {
        co__timer_t *t = from->tslots[from->timers[i].slot].t;
        __atomic_store_n(&t->p, to, __ATOMIC_RELEASE);
        heap_push(to, t);
    }
    from->timers_len = 0;
    from->tslots_hw = from->tslot_free = 0; /* every slot is free again */
    while (from->tlist) {
        co__timer_t *t = from->tlist;
        list_del(from, t);
        __atomic_store_n(&t->p, to, __ATOMIC_RELEASE);
        heap_push(to, t);
    }
    set_timer0(from);
    set_timer0(to);
    co__unlock(&to->timers_lock);
    co__unlock(&from->timers_lock);
}
