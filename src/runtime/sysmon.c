/*
 * sysmon: a monitor thread without a P, as in Go (proc.go sysmon/retake).
 *
 * Each round it
 *  - retakes the P of an M that has been inside co_blocking for a whole
 *    round (>= 20 us) and hands it to another M (handoffp), so the other
 *    coroutines of that P keep running;
 *  - takes the run queue of a P whose coroutine has run for more than
 *    10 ms without passing through the scheduler and lends a spare P to
 *    another M to run it (see lend_spare);
 *  - polls the network if nobody has for 10 ms;
 *  - runs timers that are more than 1 ms overdue (their P is busy);
 *  - once a second frees the dead Gs and stacks nobody reused since the
 *    last second, beyond a reserve of GFREE_KEEP of each;
 *  - every 10 ms requeues the Gs that found no memory for a stack to start
 *    on (gcache.c), so they start once there is some;
 *  - compacts the stacks of coroutines parked in a compactable wait for
 *    longer than the threshold (compact.c);
 *  - prints the schedtrace line when COLONY_DEBUG=schedtrace=MS asks.
 * It sleeps 20 us, doubling after 50 idle rounds up to 10 ms, on a futex so
 * co_blocking and co_shutdown can kick it awake.
 */
#include "runtime/proc.h"
#include "runtime/yslot.h"
#include "runtime/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SYSMON_MIN_NS 20000
#define SYSMON_MAX_NS 10000000
#define FORCE_PREEMPT_NS 10000000
#define GFREE_TRIM_NS 1000000000 /* dead Gs unused this long are freed... */
#define GFREE_KEEP 1024          /* ...beyond this many kept for the next burst */
#define STACKWAIT_RETRY_NS 10000000 /* Gs that found no stack to start on retry this often */
#define BLOCKING_TIMER_SOON_NS 1000000 /* a P in co_blocking with a timer this near is retaken */

/* p is retiring (p->retire set): its yield slot's coroutine and its
 * owner's batch to the global queue, unless its owner is in a window now
 * (the next round retries: p stays on pretiring while anything is queued
 * on it). */
static void drain_yslot(co_p_t *p) {
    co_g_t *gs[1 + CO_OBATCH];
    int n = co__yslot_steal(p, gs);
    for (int i = 0; i < n; i++) gs[i] = rq_unfresh(gs[i]);
    if (n) {
        co__globrunqput(gs, n);
        co__wakep();
    }
}

static bool retake_syscall(co_p_t *p, int64_t now) {
    co_sched_t *s = &co__sched;
    uint32_t tick = __atomic_load_n(&p->syscalltick, __ATOMIC_RELAXED);
    if (p->sysmon_tick != tick) {
        p->sysmon_tick = tick;
        p->sysmon_when = now;
        return false;
    }
    /* Go's rule: keep the P with its M if it has nothing to run, somebody
     * else is looking for work, and the call is young (< 10 ms). */
    /* A timer due within a round is work too: left with the P, it would
     * fire late, from sysmon, into the global queue. */
    int64_t tw = __atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE);
    bool has_work = !co__runq_empty(p) || co__globrunq_pending(__ATOMIC_ACQUIRE) ||
                    (tw != 0 && tw - now < BLOCKING_TIMER_SOON_NS);
    bool others = __atomic_load_n(&s->nmspinning, __ATOMIC_SEQ_CST) +
                      __atomic_load_n(&s->npidle, __ATOMIC_SEQ_CST) >
                  0;
    if (!has_work && others && now - p->sysmon_when < FORCE_PREEMPT_NS) return false;
    uint32_t st = CO_P_SYSCALL;
    /* acq_rel: pairs with co_blocking's CAS on the way out; whoever wins
     * owns the P. */
    if (!__atomic_compare_exchange_n(&p->status, &st, CO_P_IDLE, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return false;
    p->m = NULL;
    CO_TRACE(CO__TEV_RETAKE, p->id, 0);
    co__handoffp(p);
    return true;
}

/* Before p's queue goes to the global queue's tail: its runnext (readied
 * last, often by a timer that fired just before p's M stopped scheduling)
 * goes to the front, or it would wait behind the whole drained queue.
 * The acq_rel CAS is the thieves' (runqgrab), pairing with the owner's
 * release store into runnext. Tokens stay for the drain: they have no
 * link of their own for the front list. */
static void runnext_to_front(co_p_t *p) {
    co_g_t *next = __atomic_load_n(&p->runnext, __ATOMIC_ACQUIRE);
    if (!next || rq_is_token(next)) return;
    if (!__atomic_compare_exchange_n(&p->runnext, &next, NULL, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return; /* its owner or a thief took it: it runs soon anyway */
    co__globrunqput_front(rq_unfresh(next));
    co__wakep();
}

uint32_t co__preempt_pending;
uint64_t co__preempt_yields;

/* Withdraw a request to yield on p (see proc.h's preempt). */
void co__preempt_clear(co_p_t *p) {
    if (__atomic_load_n(&p->preempt, __ATOMIC_RELAXED) &&
        __atomic_exchange_n(&p->preempt, 0, __ATOMIC_ACQ_REL))
        __atomic_sub_fetch(&co__preempt_pending, 1, __ATOMIC_RELAXED);
}

void co__preempt_point(void) {
    co_m_t *m = co__getm();
    co_p_t *p = m ? m->p : NULL;
    if (!p || !m->curg || m->curg->is_g0 || !__atomic_load_n(&p->preempt, __ATOMIC_RELAXED) ||
        !__atomic_exchange_n(&p->preempt, 0, __ATOMIC_ACQ_REL))
        return;
    __atomic_sub_fetch(&co__preempt_pending, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&co__preempt_yields, 1, __ATOMIC_RELAXED); /* a count for tests */
    co_yield();
}

/* The CPU time (ns) that thread clock c has used so far, or -1. */
static int64_t thread_cpuns(clockid_t c) {
    struct timespec ts;
    if (clock_gettime(c, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether thread tid is runnable (state R: on a CPU or on the kernel's run
 * queue) rather than asleep in the kernel; false if it cannot be read.
 * Taken as runnable if the /proc reader answered late: the host may not
 * be running it either, and the next look asks again. */
static bool thread_runnable(int tid) {
    int st = co__procstat_state(tid);
    return st == 'R' || st == CO__PROCSTAT_LATE;
}

/* Whether p's M has not scheduled because the host did not run its thread
 * rather than because a coroutine holds it: a spare P would need a thread
 * that the host would not run either. Judged from the thread's CPU clock
 * over intervals of at least 1 ms: starved if it ran less than half the
 * interval and is runnable now (on the kernel's run queue). The CPU clock,
 * not schedstat's run-queue wait: that grows only when a wait ends, so a
 * thread the host has not run at all shows none. A thread asleep in the
 * kernel is blocked, not starved, and gets its spare; so does a coroutine
 * computing on a shared CPU once its thread has used FORCE_PREEMPT_NS of
 * CPU since the judging began. */
static bool m_starved(co_p_t *p, int64_t now) {
    int tid = __atomic_load_n(&p->owner_tid, __ATOMIC_RELAXED);
    clockid_t clk = __atomic_load_n(&p->owner_clock, __ATOMIC_RELAXED);
    if (!tid) return false;
    if (p->sysmon_judgewhen < p->sysmon_schedwhen) { /* not judged since the last schedule */
        p->sysmon_cpu0 = p->sysmon_cpuns = thread_cpuns(clk);
        p->sysmon_judgewhen = now;
        return p->sysmon_cpuns >= 0;
    }
    if (now - p->sysmon_judgewhen < 1000000) return true; /* too short to tell yet */
    int64_t c = thread_cpuns(clk);
    if (c < 0 || p->sysmon_cpuns < 0) return false;
    bool ran = 2 * (c - p->sysmon_cpuns) >= now - p->sysmon_judgewhen;
    p->sysmon_cpuns = c;
    p->sysmon_judgewhen = now;
    if (ran || c - p->sysmon_cpu0 >= FORCE_PREEMPT_NS) return false;
    return thread_runnable(tid);
}

/* A coroutine has held p for > 10 ms without entering the scheduler. C has
 * no safe way to preempt it, so its M keeps p (it may still be pushing to
 * p's run queue) and we lend a spare P in p's place: the spare takes p's
 * slot in allp, p's timers and queued coroutines, and an M of its own. p is
 * marked to be retired by its M at its next scheduler entry. */
static bool lend_spare(co_p_t *p, int i, int64_t now) {
    co_sched_t *s = &co__sched;
    uint32_t tick = __atomic_load_n(&p->schedtick, __ATOMIC_RELAXED);
    if (p->sysmon_schedtick != tick) {
        p->sysmon_schedtick = tick;
        p->sysmon_schedwhen = now;
        co__preempt_clear(p); /* it scheduled: a request still pending is stale */
        return false;
    }
    if (now - p->sysmon_schedwhen < (s->chaos ? 1000000 : FORCE_PREEMPT_NS)) return false;
    if (__atomic_load_n(&p->retire, __ATOMIC_ACQUIRE)) return false;
    bool work = !co__runq_empty(p) || co__globrunq_pending(__ATOMIC_ACQUIRE) ||
                __atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE) != 0 ||
                co__netpoll_has_waiters() ||
                __atomic_load_n(&s->nstranded, __ATOMIC_RELAXED) != 0;
    if (!work) return false;
    /* First ask the coroutine to yield at its next I/O call, and give it
     * 1 ms to (a coroutine whose reads never wait, say); a spare P and a
     * thread only for one that does not. */
    if (p->sysmon_preemptwhen < p->sysmon_schedwhen) {
        uint32_t z = 0;
        if (__atomic_compare_exchange_n(&p->preempt, &z, 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            __atomic_add_fetch(&co__preempt_pending, 1, __ATOMIC_RELAXED);
        p->sysmon_preemptwhen = now;
        return false;
    }
    if (now - p->sysmon_preemptwhen < 1000000) return false;
    if (m_starved(p, now)) return false;
    co__lock(&s->lock);
    co_p_t *np = s->pspare;
    if (np) s->pspare = np->link;
    co__unlock(&s->lock);
    if (!np) {
        np = calloc(1, sizeof *np);
        if (!np) return false;
    }
    np->m = NULL;
    co__preempt_clear(np); /* a request left from its last time in allp */
    /* Its slot, and open to timers again. Under its lock: a thread that
     * read np from allp before it retired may be looking at both (the
     * retry loop of co__timer_add reads the id under this lock). */
    co__lock(&np->timers_lock);
    np->id = p->id;
    np->timers_closed = false;
    co__unlock(&np->timers_lock);
    np->link = NULL;
    np->sysmon_schedtick = 0;
    np->sysmon_schedwhen = now;
    __atomic_store_n(&np->retire, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&np->status, CO_P_IDLE, __ATOMIC_RELAXED);
    /* Under sched.lock, p must still be RUNNING: its owner puts it on the
     * idle list only under this lock, after checking p->retire, so a P is
     * never both idle and lent (p->link serves both lists). Everything is
     * published before p->retire: once the owner sees the flag it retires
     * p, taking it off pretiring and moving its timers to allp[p->id]. */
    co__lock(&s->lock);
    if (__atomic_load_n(&p->status, __ATOMIC_ACQUIRE) != CO_P_RUNNING || co__allp(i) != p) {
        __atomic_store_n(&np->status, CO_P_DEAD, __ATOMIC_RELAXED);
        np->link = s->pspare; /* went idle or into co_blocking meanwhile */
        s->pspare = np;
        co__unlock(&s->lock);
        return false;
    }
    p->link = s->pretiring;
    s->pretiring = p;
    __atomic_store_n(&s->allp[i], np, __ATOMIC_RELEASE);
    __atomic_store_n(&p->lends, p->lends + 1, __ATOMIC_RELAXED);
    /* store-release: p's owner sees it at its next scheduler entry */
    __atomic_store_n(&p->retire, 1, __ATOMIC_RELEASE);
    co__unlock(&s->lock);
    CO_TRACE(CO__TEV_RETAKE, p->id, 1);
    /* p's timers to np, and p closed to timers: its coroutine runs on
     * (m->p is still p) and may arm more, which must go to np, where
     * sysmon and the idle Ms look (allp), not stay on p until that
     * coroutine next schedules. The owner may be retiring p at the same
     * time and moving them too: both move p -> np under both heap locks. */
    co__timers_move(p, np, true);
    runnext_to_front(p);
    co__flifo_move(p, np); /* before the drain: in order, not to the global queue */
    co__runq_drain_global(p);
    drain_yslot(p);
    co__handoffp(np);
    return true;
}

static int retake(int64_t now) {
    co_sched_t *s = &co__sched;
    int n = 0;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *p = co__allp(i);
        uint32_t st = __atomic_load_n(&p->status, __ATOMIC_ACQUIRE);
        if (st == CO_P_SYSCALL)
            n += retake_syscall(p, now);
        else if (st == CO_P_RUNNING)
            n += lend_spare(p, i, now);
    }
    /* Coroutines readied onto Ps that are lent away but still busy: their
     * owners keep the Ps (never freed), so draining without the lock is
     * safe; runqgrab is the thieves' protocol. One P per round. */
    co__lock(&s->lock);
    co_p_t *q = s->pretiring;
    while (q && co__runq_empty(q)) q = q->link;
    co__unlock(&s->lock);
    if (q) {
        runnext_to_front(q);
        co__runq_drain_global(q);
        drain_yslot(q);
        n++;
    }
    return n;
}

static void *sysmon_main(void *arg) {
    (void)arg;
    co_sched_t *s = &co__sched;
    int64_t delay = SYSMON_MIN_NS;
    int idle = 0;
    int64_t last_trace = co_now();
    int64_t last_trim = last_trace, last_stackwait = last_trace;
    while (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        bool long_sleep = delay > 1000000;
        if (long_sleep) __atomic_store_n(&s->sysmon_sleeping, 1, __ATOMIC_SEQ_CST);
        uint32_t v = __atomic_load_n(&s->sysmon_wake, __ATOMIC_ACQUIRE);
        co__futex_wait(&s->sysmon_wake, v, co_now() + delay);
        if (long_sleep) __atomic_store_n(&s->sysmon_sleeping, 0, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) break;
        int64_t now = co_now();
        __atomic_store_n(&s->coarse_ms, (uint32_t)((uint64_t)now >> 20), __ATOMIC_RELAXED);
        int work = retake(now);
        if (co__netpoll_has_waiters() && __atomic_load_n(&s->polling, __ATOMIC_ACQUIRE) == 0 &&
            now - __atomic_load_n(&s->lastpoll, __ATOMIC_RELAXED) > 10000000) {
            __atomic_store_n(&s->lastpoll, now, __ATOMIC_RELAXED);
            work += co__netpoll(0);
        }
        /* Timers more than 1 ms overdue on a P that is not scheduling (idle,
         * or stuck in one coroutine since the last round): run them here.
         * A P that schedules runs its own, as fast as its run queue drains. */
        for (int i = 0; i < s->nprocs; i++) {
            co_p_t *p = co__allp(i);
            int64_t w = __atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE);
            if (!w || w >= now - 1000000) continue; /* (w may be INT64_MAX: no w + 1 ms) */
            uint32_t tick = __atomic_load_n(&p->schedtick, __ATOMIC_RELAXED);
            if (__atomic_load_n(&p->status, __ATOMIC_ACQUIRE) != CO_P_RUNNING ||
                tick == p->sysmon_timertick)
                work += co__timers_run(p, now);
            p->sysmon_timertick = tick;
        }
        /* Work queued while a P sleeps and no M looks for it: a wake-up
         * was lost (the pushes' StoreLoad race with an M going idle, or a
         * path that queues without waking). Wake one now. */
        if (co__work_stranded()) {
            co__wakep();
            work++;
        }
        if (__atomic_load_n(&s->nstackwait, __ATOMIC_RELAXED) &&
            now - last_stackwait >= STACKWAIT_RETRY_NS) {
            last_stackwait = now;
            work += co__stackwait_retry();
        }
        work += co__compact_scan(now);
        if (now - last_trim >= GFREE_TRIM_NS) {
            last_trim = now;
            co__gfree_trim(GFREE_KEEP);
            co__unmap_retry(); /* munmaps the kernel refused (map count) */
        }
        co__debug_sysmon_tick();
        if (s->schedtrace_ms > 0 && now - last_trace >= s->schedtrace_ms * 1000000) {
            last_trace = now;
            co__schedtrace(stderr);
        }
        /* Back off as Go does (double after 50 idle rounds), but while
         * coroutines run keep rounds within 2 ms so a coroutine hogging its
         * P is noticed within ~12 ms; 10 ms when every P is idle. */
        int64_t cap = __atomic_load_n(&s->npidle, __ATOMIC_RELAXED) < (uint32_t)s->nprocs
                          ? 2000000
                          : SYSMON_MAX_NS;
        if (work) {
            idle = 0;
            delay = SYSMON_MIN_NS;
        } else if (++idle > 50 && delay < cap) {
            delay *= 2;
        }
        if (delay > cap) delay = cap;
        if (s->schedtrace_ms > 0 && delay > s->schedtrace_ms * 1000000)
            delay = s->schedtrace_ms * 1000000;
    }
    return NULL;
}

int co__sysmon_start(void) {
    __atomic_store_n(&co__sched.coarse_ms, (uint32_t)((uint64_t)co_now() >> 20), __ATOMIC_RELAXED);
    co__procstat_start();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    int rc = pthread_create(&co__sched.sysmon_thread, &attr, sysmon_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) co__procstat_stop();
    return rc == 0 ? 0 : -rc;
}

void co__sysmon_kick(void) {
    __atomic_add_fetch(&co__sched.sysmon_wake, 1, __ATOMIC_RELEASE);
    co__futex_wake(&co__sched.sysmon_wake, 1);
}

void co__sysmon_stop(void) {
    co__sysmon_kick();
    pthread_join(co__sched.sysmon_thread, NULL);
    co__procstat_stop();
}

/* ---- co_blocking: Go's entersyscall / exitsyscall ------------------------- */

static void post_requeue(co_g_t *g, void *arg) {
    (void)arg;
    __atomic_store_n(&g->status, CO_G_RUNNABLE, __ATOMIC_RELAXED);
    co__globrunqput_front(g);
    co__wakep();
}

/* The P of another M inside co_blocking, taken as sysmon's retake would
 * (the CAS from SYSCALL decides against its M's way back and sysmon),
 * for this M; NULL if none. */
static co_p_t *steal_syscall_p(co_m_t *m) {
    co_sched_t *s = &co__sched;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *p = co__allp(i);
        uint32_t st = CO_P_SYSCALL;
        if (__atomic_load_n(&p->status, __ATOMIC_RELAXED) != st ||
            !__atomic_compare_exchange_n(&p->status, &st, CO_P_RUNNING, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        m->p = p;
        p->m = m;
        co__p_owner_hint(p, m);
        __atomic_store_n(&p->schedtick, p->schedtick + 1, __ATOMIC_RELAXED);
        return p;
    }
    return NULL;
}

/* co_blocking's way back: its P if sysmon left it, another idle one, the
 * P of another M still inside co_blocking, or, with none, the front of the
 * global queue, ahead of what waits there (this M then goes idle:
 * exitsyscall0). */
static void blocking_exit(bool pinned) {
    co_m_t *m = co__getm(); /* same thread: a G cannot migrate inside fn */
    co_p_t *p = m->syscallp;
    __atomic_store_n(&m->syscallp, NULL, __ATOMIC_RELAXED); /* deadlock.c reads it */
    uint32_t st = CO_P_SYSCALL;
    if (__atomic_compare_exchange_n(&p->status, &st, CO_P_RUNNING, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)) {
        m->p = p;
        return;
    }
    /* Without an idle P, m is in transit from here (in the same section
     * as the look): a P needing an M may wait for it (co__startm). Not a
     * pinned call's: it waits for a P below, as a thread, not in stopm. */
    co_p_t *p2 = pinned ? co__pidleget() : co__pidleget_or_transit(m);
    if (p2) {
        m->p = p2;
        p2->m = m;
        co__p_owner_hint(p2, m);
        /* as acquirep: a P that sat idle must not look stuck to sysmon */
        __atomic_store_n(&p2->schedtick, p2->schedtick + 1, __ATOMIC_RELAXED);
        __atomic_store_n(&p2->status, CO_P_RUNNING, __ATOMIC_RELEASE);
        return;
    }
    if (steal_syscall_p(m)) {
        co__transit_end(m);
        return;
    }
    if (pinned) {
        /* The coroutine must go on on this thread: it waits on this M's
         * own queue of sent-home coroutines, and the M for a P as any
         * home does (an idle P, one going idle, or a busy P's hand-over:
         * co__relieve_stranded). */
        co__park_home();
        return;
    }
    co__park_current(post_requeue, NULL, CO__WR_NONE); /* its wake-up may find this M */
}

/* ---- co_blocking's cap: at most `cap` Ms inside it at once ---------------
 * A coroutine takes a slot before it gives its P up and gives it back once
 * it holds a P again; beyond the cap it parks (its P runs on) in FIFO
 * order, and a slot given back goes straight to the first of them (busy
 * does not drop: nobody can overtake it). */
#define BLOCKING_CAP_DEFAULT 128
static struct {
    co__lock_t lock; /* protects busy and q */
    int busy;        /* slots held */
    co__waitq_t q;   /* coroutines waiting for a slot, FIFO */
    int cap;         /* atomic relaxed: read at each take, changed by co_blocking_max;
                        0 until first read from $COLONY_BLOCKING_MAX */
} blk;

static int blocking_cap(void) {
    int c = __atomic_load_n(&blk.cap, __ATOMIC_RELAXED);
    if (CO_LIKELY(c > 0)) return c;
    const char *e = getenv("COLONY_BLOCKING_MAX");
    long v = e ? strtol(e, NULL, 10) : 0;
    c = v > 0 && v <= 1000000 ? (int)v : BLOCKING_CAP_DEFAULT;
    int z = 0; /* a co_blocking_max meanwhile wins */
    if (!__atomic_compare_exchange_n(&blk.cap, &z, c, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        c = z;
    return c;
}

int co_blocking_max(int n) {
    if (n < 0) return CO_EINVAL;
    int old = blocking_cap();
    if (n == 0) return old;
    __atomic_store_n(&blk.cap, n, __ATOMIC_RELAXED);
    /* a larger cap lets waiters in now, first come first */
    co__waiter_t *list = NULL, **tail = &list;
    co__lock(&blk.lock);
    while (blk.busy < n) {
        co__waiter_t *w = co__waitq_pop(&blk.q);
        if (!w) break;
        if (!co__claim(w->pk, w)) continue;
        blk.busy++;
        w->next = NULL;
        *tail = w;
        tail = &w->next;
    }
    co__unlock(&blk.lock);
    while (list) {
        co__waiter_t *next = list->next;
        co__unpark(list->pk);
        list = next;
    }
    return old;
}

static void blocking_take(bool pinned) {
    co__lock(&blk.lock);
    /* a pinned call must not move before fn: counted, never queued */
    if (pinned || (blk.busy < blocking_cap() && co__waitq_empty(&blk.q))) {
        blk.busy++;
        co__unlock(&blk.lock);
        return;
    }
    co__pkw_t pw;
    co__wait_prepare(&pw, CO__WR_NONE);
    co__waitq_push(&blk.q, &pw.w);
    (void)co__wait(&pw.w, &blk.lock, CO_FOREVER, 0); /* the giver counted our slot */
}

static void blocking_give(void) {
    co__waiter_t *w;
    co__lock(&blk.lock);
    for (;;) {
        w = NULL;
        if (blk.busy > blocking_cap()) break; /* the cap was lowered: shrink first */
        w = co__waitq_pop(&blk.q);
        if (!w || co__claim(w->pk, w)) break;
    }
    if (!w) blk.busy--;
    co__unlock(&blk.lock);
    if (w) co__unpark(w->pk); /* into this P's runnext: it runs next */
}

int co_blocking_stats(int *busy, int *waiting) {
    int b, n = 0;
    co__lock(&blk.lock);
    b = blk.busy;
    for (co__waiter_t *w = blk.q.head; w; w = w->next) n++;
    co__unlock(&blk.lock);
    if (busy) *busy = b;
    if (waiting) *waiting = n;
    return blocking_cap();
}

/* The tag of co_blocking's own recover frames (co__recover_tagged). */
static const char blocking_tag;

bool co_parkable(void) {
    co_m_t *m = co__getm();
    return m && m->curg && m->p;
}

static int blocking(void (*fn)(void *arg), void *arg, bool pinned);
int co_blocking(void (*fn)(void *arg), void *arg) { return blocking(fn, arg, false); }
int co_blocking_on_thread(void (*fn)(void *arg), void *arg) { return blocking(fn, arg, true); }

static int blocking(void (*fn)(void *arg), void *arg, bool pinned) {
    if (!fn) return CO_EINVAL;
    co_m_t *m = co__getm();
    /* A plain thread, or a co_blocking inside another one's fn: this M
     * runs without a P already (the outer call gave it up). */
    if (!m || !m->curg || !m->p) {
        fn(arg);
        return 0;
    }
    blocking_take(pinned); /* may park: this coroutine may run on another M after */
    m = co__getm();
    co_p_t *p = m->p;
    CO_TRACE(CO__TEV_BLOCK, m->curg, 0);
    __atomic_store_n(&m->syscallp, p, __ATOMIC_RELAXED); /* deadlock.c reads it */
    m->p = NULL;
    __atomic_store_n(&p->syscalltick, p->syscalltick + 1, __ATOMIC_RELAXED);
    /* release: the P's state is published to sysmon's acquire CAS */
    __atomic_store_n(&p->status, CO_P_SYSCALL, __ATOMIC_RELEASE);
    if (__atomic_load_n(&co__sched.sysmon_sleeping, __ATOMIC_SEQ_CST)) co__sysmon_kick();
    /* A co_panic out of fn to a co_recover further out must not skip the
     * way back: the coroutine would go on without a P, beside the one
     * sysmon gives its P to (more running than COLONY_PROCS, co_yield a
     * no-op). So with a recover frame about, fn runs under one of ours,
     * and the panic goes on once this M holds a P again. With none, a
     * panic is fatal anyway: fn is called as it is, and the abort shows
     * where it panicked. */
    void *pv;
    if (*co__panic_slot() == NULL) {
        fn(arg);
    } else if (co__recover_tagged(fn, arg, &pv, &blocking_tag)) {
        blocking_exit(pinned);
        blocking_give();
        co_panic(pv);
    }
    blocking_exit(pinned);
    blocking_give();
    CO_TRACE(CO__TEV_BLOCK_END, co__getm()->curg, 0);
    return 0;
}
