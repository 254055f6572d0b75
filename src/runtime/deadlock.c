/*
 * Deadlock detection, as Go's checkdead: when nothing can ever run again,
 * say so and exit with status 2 instead of hanging.
 *
 * sysmon calls co__deadlock_check each round. It reports only when, at two
 * looks at least DL_STABLE_NS apart with no scheduling in between:
 *  - every P is idle, no M spins, every run queue is empty;
 *  - every live coroutine is parked (none running, runnable, or inside
 *    co_blocking, whose coroutine counts as running);
 *  - no timer is pending on any P (a sleep, a deadline, a ticker, a pool's
 *    purge: each may wake someone), nobody waits on the netpoller (a read
 *    on an idle socket may be answered), and no plain thread waits in a
 *    colony call with a deadline;
 *  - the process has no thread colony does not account for: its Ms,
 *    sysmon and its /proc reader, the trace's writer, and plain threads
 *    parked in a colony call with no deadline.
 *    A thread colony knows nothing of may still call in (wake a channel,
 *    unlock a mutex), so any such thread keeps the detector quiet: so do
 *    the signal relay (co_signal_notify: a signal may come) and sanitizer
 *    runtimes' own threads.
 * The count of the process's threads comes from /proc/self/stat, read
 * without taking an fd number of the program's (procstat.c); without
 * /proc nothing is reported. COLONY_DEBUG=nodeadlock turns it off.
 */
#include "runtime/proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DL_STABLE_NS (500 * 1000 * 1000LL)
#define DL_LOOK_NS (100 * 1000 * 1000LL)

/* Plain threads parked in a colony call (park.c): with no deadline, and
 * with one. Atomic counters, relaxed: the detector re-checks after
 * DL_STABLE_NS, and a change in between shows in the scheduler ticks or
 * the counts themselves. */
uint32_t co__plain_parked_forever, co__plain_parked_timed;
uint32_t co__plain_gen = 1;
uint32_t co__helper_threads;

static int64_t dl_since; /* sysmon only: when the current quiet stretch was first seen; 0: none */
static uint64_t dl_ticks; /* sysmon only: the ticks it was seen with */

/* The scheduler's progress: any schedule, on any P, changes it. */
static uint64_t sched_ticks(co_sched_t *s) {
    uint64_t t = 0;
    for (int i = 0; i < s->nprocs; i++) t += __atomic_load_n(&co__allp(i)->schedtick, __ATOMIC_RELAXED);
    return t;
}

struct parked_walk {
    int live;        /* coroutines seen so far */
    bool all_parked; /* every one of them WAITING */
};

/* A co__g_visit_fn: counts g, and stops at the first one not parked. */
static bool count_parked(co_g_t *g, uint32_t status, void *arg) {
    (void)g;
    struct parked_walk *w = arg;
    w->live++;
    w->all_parked = status == CO_G_WAITING;
    return w->all_parked;
}

/* true when the runtime looks stuck right now (see the file comment) */
static bool looks_dead(co_sched_t *s, int *ncoroutines) {
    if (__atomic_load_n(&s->npidle, __ATOMIC_ACQUIRE) != (uint32_t)s->nprocs) return false;
    if (__atomic_load_n(&s->nmspinning, __ATOMIC_ACQUIRE) != 0) return false;
    if (__atomic_load_n(&co__plain_parked_timed, __ATOMIC_RELAXED) != 0) return false;
    if (co__netpoll_has_waiters()) return false;
    if (co__globrunq_len() != 0) return false;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *p = co__allp(i);
        if (__atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE) != 0) return false;
        if (!co__runq_empty(p)) return false;
    }
    co__lock(&s->lock);
    bool lent = s->pretiring != NULL;
    int ms = s->mcount;
    bool blocking = false;
    for (co_m_t *m = s->allm; m; m = m->alllink)
        blocking |= __atomic_load_n(&m->syscallp, __ATOMIC_RELAXED) != NULL;
    co__unlock(&s->lock);
    if (lent || blocking) return false;
    struct parked_walk w = {0, true};
    co__each_live_g(count_parked, &w);
    int live = w.live;
    bool all_parked = w.all_parked;
    uint32_t plain = __atomic_load_n(&co__plain_parked_forever, __ATOMIC_RELAXED);
    if (!all_parked || (live == 0 && plain == 0)) return false;
    int have = co__procstat_threads(); /* first: it may start the reader */
    int want = ms + 1 + co__procstat_threads_own() + (int)plain +
               (int)__atomic_load_n(&co__helper_threads, __ATOMIC_RELAXED);
    if (have != want) return false;
    *ncoroutines = live;
    return true;
}

void co__deadlock_check(int64_t now) {
    co_sched_t *s = &co__sched;
    if (s->no_deadlock) return;
    /* at most every 100 ms: the look walks every coroutine when all Ps
     * are idle (a million parked ones included) */
    static int64_t last; /* sysmon only */
    if (now - last < DL_LOOK_NS) return;
    last = now;
    int n = 0;
    uint64_t ticks = sched_ticks(s);
    if (!looks_dead(s, &n)) {
        dl_since = 0;
        return;
    }
    if (dl_since == 0 || ticks != dl_ticks) {
        dl_since = now;
        dl_ticks = ticks;
        return;
    }
    if (now - dl_since < DL_STABLE_NS) return;
    static const char msg[] = "colony: fatal: all coroutines are asleep - deadlock!\n\n";
    (void)!write(2, msg, sizeof msg - 1);
    co_dump(stderr);
    fprintf(stderr, "\n(COLONY_DEBUG=nodeadlock turns this check off)\n");
    fflush(stderr);
    _exit(2);
}
