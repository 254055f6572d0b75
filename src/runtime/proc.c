/*
 * Ps and Ms: the idle P list, starting, waking and parking Ms (newm,
 * co__startm, co__wakep, stopm), handing a P off, an idle M's sleep (as the
 * poller until the next timer, or on its futex), retiring a P that sysmon
 * lent away, and pinned sections, which wait on every M. The spinning
 * protocol that wakep and the idle Ms follow is sched.c's essay.
 */
#include "runtime/sched_impl.h"

#include <stdlib.h>
#include <time.h>

/* ---- the idle P list ---------------------------------------------------- */

void co__pidleput_locked(co_p_t *p) { pidleput_locked(p); } /* co_init */

/* sched.lock held. */
static co_p_t *pidleget_locked(void) {
    co_sched_t *s = &co__sched;
    co_p_t *p = s->pidle;
    if (p) {
        s->pidle = p->link;
        __atomic_store_n(&s->npidle, s->npidle - 1, __ATOMIC_SEQ_CST);
        /* A P left for an M in transit, taken by another M (a co_blocking
         * return, a re-check): that M runs the work. No more are left
         * than are idle. */
        if ((uint32_t)s->nwanted > s->npidle) s->nwanted = (int)s->npidle;
    }
    return p;
}

co_p_t *co__pidleget_locked(void) { return pidleget_locked(); }

co_p_t *co__pidleget(void) {
    co__lock(&co__sched.lock);
    co_p_t *p = pidleget_locked();
    co__unlock(&co__sched.lock);
    return p;
}

/* ---- Ms in transit (sched.ntransit) ------------------------------------- */

/* sched.lock held: m has no P, is outside co_blocking's fn, and is on its
 * way to sleep or to a P. */
void co__transit_begin_locked(co_m_t *m) {
    if (!m->transit) {
        m->transit = true;
        co__sched.ntransit++;
    }
}

void co__transit_begin(co_m_t *m) {
    co__lock(&co__sched.lock);
    co__transit_begin_locked(m);
    co__unlock(&co__sched.lock);
}

co_p_t *co__pidleget_or_transit(co_m_t *m) {
    co__lock(&co__sched.lock);
    co_p_t *p = pidleget_locked();
    if (!p) co__transit_begin_locked(m);
    co__unlock(&co__sched.lock);
    return p;
}

/* sched.lock held: m, about to sleep, leaves transit. Returns a P that a
 * co__startm left idle for it, for m to take instead of sleeping; NULL if
 * none was (or another M took it meanwhile, and runs). */
static co_p_t *transit_sleep_locked(co_m_t *m) {
    co_sched_t *s = &co__sched;
    if (!m->transit) return NULL;
    m->transit = false;
    s->ntransit--;
    if (s->nwanted == 0) return NULL;
    s->nwanted--;
    co_p_t *p = pidleget_locked();
    if (p) __atomic_add_fetch(&co__transit_taken, 1, __ATOMIC_RELAXED);
    return p;
}

uint64_t co__transit_taken; /* atomic relaxed: a count for tests */

void co__transit_pause(void) {
    if (co__test_failing(CO__FAIL_SLOW_IDLE) || co__fastrand() % 4 == 0) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

/* m, in transit, took a P of its own: if a P was left idle for an M in
 * transit and too few are left to take them, it wants another M. */
void co__transit_end(co_m_t *m) {
    co_sched_t *s = &co__sched;
    if (!m->transit) return; /* read by its own M, the only writer */
    co__lock(&s->lock);
    m->transit = false;
    s->ntransit--;
    bool wake = s->nwanted > s->ntransit;
    if (wake) s->nwanted--;
    co__unlock(&s->lock);
    if (wake) co__wakep();
}

/* ---- Ms ----------------------------------------------------------------- */

/* Create an M that will start with p. */
static bool newm(co_p_t *p, bool spinning) {
    co_sched_t *s = &co__sched;
    co_m_t *m = calloc(1, sizeof *m);
    if (!m) return false;
    m->nextp = p;
    m->spinning = spinning;
    co__lock(&s->lock);
    /* co_shutdown sets stopping, then collects allm under this lock to join
     * every M: an M added after that would be missed (a leaked thread
     * running during teardown), so none is created once stopping is set. */
    if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        co__unlock(&s->lock);
        free(m);
        return false;
    }
    m->id = s->midgen++;
    s->mcount++;
    m->alllink = s->allm;
    s->allm = m;
    co__unlock(&s->lock);
    m->fastrand = 0x9E3779B97F4A7C15ull ^ ((uint64_t)m->id * 0xBF58476D1CE4E5B9ull) ^ 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1024 * 1024);
#ifdef CO_TSAN
    /* The new M inherits nothing from whoever happened to start it (its
     * coroutine, as TSan sees it); its coroutines acquire its start
     * (race.c), which would carry that past to all of them. */
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
#endif
    int rc = pthread_create(&m->thread, &attr, co__mstart, m);
#ifdef CO_TSAN
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
#endif
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        co__lock(&s->lock);
        /* Others may have been added in front of m meanwhile. */
        for (co_m_t **pp = &s->allm; *pp; pp = &(*pp)->alllink)
            if (*pp == m) {
                *pp = m->alllink;
                break;
            }
        s->mcount--;
        co__unlock(&s->lock);
        free(m);
        return false;
    }
    return true;
}

/* p's yield slot and its owner's batch, which only an owner runs and no
 * thief takes, to the global queue: p has no owner (it is being handed
 * off or retired), so no window is open on it, and a window opened later
 * reads retire set or finds them gone. acq_rel exchanges: sysmon may take
 * them at the same time (co__yslot_steal); each goes to one of us.
 * Returns how many moved. */
static int private_to_global(co_p_t *p) {
    co_g_t *gs[1 + CO_OBATCH];
    int k = co__yslot_take(p, gs);
    for (int i = 0; i < k; i++) gs[i] = rq_unfresh(gs[i]);
    if (k) co__globrunqput(gs, k);
    return k;
}

/* What only p's owner would run, to the global queue, before p goes idle
 * without one: its runnext too, which sysmon's safety net does not look
 * at (co__work_stranded). acq_rel: thieves CAS it; one of us gets it. */
static void own_to_global(co_p_t *p) {
    co_g_t *next = __atomic_exchange_n(&p->runnext, NULL, __ATOMIC_ACQ_REL);
    if (next) co__globrunqput(&next, 1);
    private_to_global(p);
}

static void startm(co_p_t *p, bool spinning, bool recheck);
static void wakep(bool recheck);

/* A wake-up that started no M gives its spinning count back, then looks
 * for work once more: a G queued while the count stood saw an M spinning
 * in wakep and woke nobody (the StoreLoad pair of sched.c's essay, with
 * this as the spinner's side). Once only: a second wake-up that starts
 * no M does not look again (the Ps it found idle are left for Ms in
 * transit, which look for work as they take them). */
static void spin_drop(bool recheck) {
    co_sched_t *s = &co__sched;
    __atomic_sub_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
    if (!recheck) return;
    bool work = co__globrunq_pending(__ATOMIC_SEQ_CST);
    for (int i = 0; !work && i < s->nprocs; i++) work = !runq_nothing_to_steal(co__allp(i));
    if (work) wakep(false);
}

/* Start an M to run p (or an idle P if p is NULL). */
void co__startm(co_p_t *p, bool spinning) { startm(p, spinning, true); }

static void startm(co_p_t *p, bool spinning, bool recheck) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    if (!p) {
        /* the idle Ps left for Ms in transit are theirs: they run what
         * this wake-up is for */
        bool left = s->nwanted > 0 && s->npidle <= (uint32_t)s->nwanted;
        p = left ? NULL : pidleget_locked();
        if (!p) {
            co__unlock(&s->lock);
            if (spinning) spin_drop(recheck && left);
            return;
        }
    }
    bool no_m = co__test_failing(CO__FAIL_NO_M);
    co_m_t *m;
    bool own_moved = false;
    for (;;) {
        m = no_m ? NULL : s->midle;
        if (m) {
            s->midle = m->link;
            s->nmidle--;
            m->onmidle = false;
            co__unstrand_locked(m);
            break;
        }
        if (!no_m && s->poller) {
            /* No M asleep, but the poller has no P: it takes p when its poll
             * returns (co__block_idle), rather than a new thread beside it. */
            m = s->poller;
            s->poller = NULL;
            m->nextp = p;
            m->spinning = spinning;
            __atomic_store_n(&s->poller_given, 1, __ATOMIC_SEQ_CST); /* see proc.h */
            co__unlock(&s->lock);
            co__netpoll_break();
            return;
        }
        /* An M about to sleep will take p at its stopm or poll (the
         * work's Gs go where any M finds them): no thread beside it. */
        if (no_m || s->ntransit <= s->nwanted) break;
        if (own_moved) {
            s->nwanted++;
            pidleput_locked(p);
            co__unlock(&s->lock);
            if (spinning) spin_drop(recheck);
            return;
        }
        co__unlock(&s->lock);
        own_to_global(p);
        own_moved = true;
        co__lock(&s->lock); /* and look again: an M may have gone to sleep */
    }
    co__unlock(&s->lock);
    if (!m) {
        if (no_m || !newm(p, spinning)) {
            /* No thread for p now (pthread_create failed: a pids cgroup,
             * RLIMIT_NPROC). p goes idle; what only its owner would run
             * goes where sysmon's safety net sees it (co__work_stranded:
             * the global queue, and the rings it checks anyway), so an M
             * starts for it once threads can be made again. Its runnext
             * too: the net does not look there, and a thief takes it only
             * in its last round, if any M looks for work at all. No wakep
             * here: it would only try the same creation again. */
            own_to_global(p);
            co__lock(&s->lock);
            pidleput_locked(p);
            co__unlock(&s->lock);
            if (spinning) __atomic_sub_fetch(&s->nmspinning, 1, __ATOMIC_SEQ_CST);
        }
        return;
    }
    m->spinning = spinning;
    m->nextp = p;
    /* store-release: publishes nextp/spinning to the woken M's acquire load */
    __atomic_store_n(&m->park, 1, __ATOMIC_RELEASE);
    co__futex_wake(&m->park, 1);
}

void co__wakep(void) { wakep(true); }

static void wakep(bool recheck) {
    co_sched_t *s = &co__sched;
    if (CO_UNLIKELY(__atomic_load_n(&s->stopping, __ATOMIC_RELAXED))) {
        co__forked_check(); /* a forked child: no M will ever take the work */
        return;             /* co_shutdown */
    }
    /* seq_cst loads: the StoreLoad half of the spinning protocol (sched.c) */
    if (__atomic_load_n(&s->npidle, __ATOMIC_SEQ_CST) == 0) return;
    uint32_t z = 0;
    if (__atomic_load_n(&s->nmspinning, __ATOMIC_SEQ_CST) != 0 ||
        !__atomic_compare_exchange_n(&s->nmspinning, &z, 1, false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_RELAXED))
        return;
    startm(NULL, true, recheck);
}

/* P released by a retake (co_blocking) or a retiring M: find it an M. */
void co__handoffp(co_p_t *p) {
    co_sched_t *s = &co__sched;
    if (!co__runq_empty(p) || co__globrunq_pending(__ATOMIC_ACQUIRE)) {
        co__startm(p, false);
        return;
    }
    uint32_t z = 0;
    if (__atomic_load_n(&s->nmspinning, __ATOMIC_SEQ_CST) +
                __atomic_load_n(&s->npidle, __ATOMIC_SEQ_CST) ==
            0 &&
        __atomic_compare_exchange_n(&s->nmspinning, &z, 1, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED)) {
        co__startm(p, true);
        return;
    }
    co__lock(&s->lock);
    pidleput_locked(p);
    co__unlock(&s->lock);
    if (__atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE) != 0 &&
        __atomic_load_n(&s->polling, __ATOMIC_ACQUIRE) == 0)
        co__wakep();
}

/* Park the M until startm hands it a P (or shutdown). */
static void stopm(co_m_t *m) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock);
    if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        co__unlock(&s->lock);
        return;
    }
    co_p_t *wp = transit_sleep_locked(m);
    if (wp) { /* left idle for an M in transit: take it, do not sleep */
        m->nextp = wp;
        co__unlock(&s->lock);
        return;
    }
    if (m->affq) {
        /* Gs only this M may run wait: take an idle P for them, or sleep
         * until a P going idle is handed over (co__affine_handoff_locked)
         * or a busy P's next look hands its own (co__relieve_stranded) */
        co_p_t *p = pidleget_locked();
        if (p) {
            m->nextp = p;
            co__unlock(&s->lock);
            return;
        }
    }
    __atomic_store_n(&m->park, 0, __ATOMIC_RELAXED);
    m->link = s->midle;
    s->midle = m;
    s->nmidle++;
    m->onmidle = true;
    if (m->affq) co__strand_locked(m); /* no P for it: a busy P's next look hands one */
    co__unlock(&s->lock);
    /* acquire: pairs with startm's store-release */
    CO_TRACE(CO__TEV_M_SLEEP, 0, 0);
    while (__atomic_load_n(&m->park, __ATOMIC_ACQUIRE) == 0) co__futex_wait(&m->park, 0, CO_FOREVER);
    CO_TRACE(CO__TEV_M_WAKE, 0, 0);
}

/* ---- an idle M ---------------------------------------------------------- */

static void run_all_timers(int64_t now) {
    co_sched_t *s = &co__sched;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *pp = co__allp(i);
        int64_t w = __atomic_load_n(&pp->timer0_when, __ATOMIC_ACQUIRE);
        if (w && w <= now) co__timers_run(pp, now);
    }
}

/* Block the P-less M m: as the poller until the next timer, or parked on
 * its futex. Returns when there may be work; m->p may be set. */
void co__block_idle(co_m_t *m) {
    co_sched_t *s = &co__sched;
    if (CO_UNLIKELY(m->spinning)) /* every caller stops spinning first */
        co__fatal("internal error: M %d goes idle while counted as spinning", m->id);
    uint32_t z = 0;
    if (__atomic_compare_exchange_n(&s->polling, &z, 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)) {
        int64_t next = co__timers_next();
        /* seq_cst store then load of the timers: pairs with co__timer_add's
         * store of timer0_when then seq_cst load of poll_until */
        __atomic_store_n(&s->poll_until, next ? next : INT64_MAX, __ATOMIC_SEQ_CST);
        int64_t next2 = co__timers_next();
        if (next2 && (next == 0 || next2 < next)) next = next2;
        int64_t delay = -1;
        if (next) {
            delay = next - co_now();
            if (delay < 0) delay = 0;
        }
        if ((co__globrunq_pending(__ATOMIC_ACQUIRE) ||
             __atomic_load_n(&m->affq, __ATOMIC_RELAXED) != NULL) &&
            __atomic_load_n(&s->npidle, __ATOMIC_ACQUIRE) > 0)
            delay = 0; /* work is waiting for a P: don't sleep */
        co__lock(&s->lock);
        co_p_t *wp = transit_sleep_locked(m);
        if (!wp) s->poller = m; /* open to a P from co__startm */
        co__unlock(&s->lock);
        if (wp) { /* left idle for an M in transit: take it, do not poll */
            __atomic_store_n(&s->poll_until, 0, __ATOMIC_SEQ_CST);
            __atomic_store_n(&s->polling, 0, __ATOMIC_RELEASE);
            acquirep(m, wp);
            /* A timer added meanwhile on an idle P counted on this poll
             * (it saw poll_until): another M watches the timers now. */
            for (int i = 0; i < s->nprocs; i++) {
                co_p_t *q = co__allp(i);
                if (q != wp && __atomic_load_n(&q->timer0_when, __ATOMIC_ACQUIRE) != 0 &&
                    __atomic_load_n(&q->status, __ATOMIC_ACQUIRE) != CO_P_RUNNING) {
                    co__wakep();
                    break;
                }
            }
            return;
        }
        CO_TRACE(CO__TEV_M_SLEEP, 0, 1);
        if (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) co__netpoll(delay);
        CO_TRACE(CO__TEV_M_WAKE, 0, 0);
        __atomic_store_n(&s->lastpoll, co_now(), __ATOMIC_RELAXED);
        __atomic_store_n(&s->poll_until, 0, __ATOMIC_SEQ_CST);
        co__lock(&s->lock);
        s->poller = NULL; /* closed: a P handed over before this is in nextp */
        co_p_t *p = m->nextp;
        m->nextp = NULL;
        if (p) __atomic_store_n(&s->poller_given, 0, __ATOMIC_RELAXED);
        else p = pidleget_locked();
        if (!p) co__transit_begin_locked(m); /* the timers below may wake an M: this one */
        co__unlock(&s->lock);
        __atomic_store_n(&s->polling, 0, __ATOMIC_RELEASE);
        if (p) acquirep(m, p);
        run_all_timers(co_now());
        if (p) return;
        /* Every P is busy: Gs readied above went to the global queue and
         * the running Ms will take them. Sleep as an ordinary idle M. */
    }
    stopm(m);
    if (m->nextp) {
        acquirep(m, m->nextp);
        m->nextp = NULL;
    }
}


bool co__netpoll_soon(int64_t now) {
    /* acquire: pairs with co__block_idle's seq_cst store before it polls */
    if (__atomic_load_n(&co__sched.poll_until, __ATOMIC_ACQUIRE) != 0) return true;
    /* Ms that run out of work poll on their way to sleep: one did lately,
     * so one will again soon (sysmon polls after 10 ms without one).
     * relaxed: a hint; pairs with nothing (a stale value costs a read(2) or
     * a wait for the next poll, never a lost wake-up: the edge stays). */
    return now - __atomic_load_n(&co__sched.lastpoll, __ATOMIC_RELAXED) < CO__POLL_RECENT_NS;
}

/* A plain thread is about to park on the netpoller (io.c): make sure an M
 * polls. With none in the poller, every M asleep on its futex or none
 * started yet, only sysmon would, every 10 ms or so: a wake-up per round
 * trip. An M woken here finds no work and, idle, becomes the poller
 * (co__block_idle). A coroutine's M needs none of this: it goes idle itself,
 * or busy Ms poll each time they run out of work, as in Go. */
void co__netpoll_want(void) {
    /* acquire: a hint (a poller about to leave comes back through
     * findrunnable, which polls while anyone waits) */
    if (__atomic_load_n(&co__sched.polling, __ATOMIC_ACQUIRE) == 0) co__wakep();
}


/* ---- retiring a P ------------------------------------------------------- */

/* g0 of the M that owns a P sysmon lent away (p->retire): give the P up.
 * Its queued Gs go to the global queue, its timers to the P that replaced
 * it, and the P itself to the spare list (pspare). Its own wakes are the
 * queue moves' (co__wakep does nothing once a shutdown is under way); the
 * shutdown path (co__mstart's exit) calls this, and must not start Ms, so
 * nothing else here wakes one. */
void co__retire_p_nowake(co_m_t *m) {
    co_sched_t *s = &co__sched;
    co_p_t *p = m->p;
    m->p = NULL;
    co__preempt_clear(p); /* its request, if any, was for the coroutine just back */
    /* The yield slot and the owner's batch first (they were to run before
     * the ring); sysmon may be taking them too. */
    if (private_to_global(p)) co__wakep();
    co__runq_drain_global(p);
    co_p_t *dst = co__allp(p->id);
    if (CO_UNLIKELY(s->chaos) && co__fastrand() % 4 == 0) { /* COLONY_DEBUG=chaos: */
        struct timespec ts = {0, 2000000}; /* dst may retire meanwhile */
        nanosleep(&ts, NULL);
    }
    co__timers_move(p, dst, true);
    co__lock(&s->lock);
    for (co_p_t **pp = &s->pretiring; *pp; pp = &(*pp)->link)
        if (*pp == p) {
            *pp = p->link;
            break;
        }
    p->m = NULL;
    /* A spare P carries no count: co_count cannot see a spare that sysmon
     * is lending (off every list for a moment). */
    co__live_global_add(p->ngo); /* lifecycle.c; seq_cst (see live_global there) */
    __atomic_store_n(&p->ngo, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->status, CO_P_DEAD, __ATOMIC_RELEASE);
    __atomic_store_n(&p->retire, 0, __ATOMIC_RELAXED);
    p->link = s->pspare;
    s->pspare = p;
    co__unlock(&s->lock);
}

void co__retire_p(co_m_t *m) {
    co__transit_begin(m); /* on its way to co__block_idle, before the wake-ups */
    co__retire_p_nowake(m);
    co__wakep(); /* for the Gs drained to the global queue */
}

/* ---- pinned sections (runtime.h) ---------------------------------------- */

void *co__pin_enter(void) {
    co_m_t *m = getm();
    if (!m) return NULL;
    /* relaxed: the caller's next release (its push) orders it */
    __atomic_store_n(&m->pin, m->pin + 1, __ATOMIC_RELAXED);
    return m;
}

void co__pin_exit(void *mv) {
    co_m_t *m = mv;
#ifdef CO_TSAN
    if (m) __tsan_release(&m->pin); /* as the store below (race.c) */
#endif
    /* release: the section's reads happen before a waiter's acquire load */
    if (m) __atomic_store_n(&m->pin, m->pin + 1, __ATOMIC_RELEASE);
}

void co__pin_wait(void) {
    co_sched_t *s = &co__sched;
    co__lock(&s->lock); /* allm's links; an M is freed only at shutdown (or
                         * before it ever ran: never inside a section) */
    for (co_m_t *m = s->allm; m; m = m->alllink) {
        uint32_t v = __atomic_load_n(&m->pin, __ATOMIC_ACQUIRE);
#ifdef CO_TSAN
        __tsan_acquire(&m->pin); /* as the loads of m->pin (race.c) */
#endif
        if (!(v & 1)) continue;
        co__unlock(&s->lock);
        while (__atomic_load_n(&m->pin, __ATOMIC_ACQUIRE) == v)
            co_yield(); /* sched_yield() on a plain thread */
#ifdef CO_TSAN
        __tsan_acquire(&m->pin);
#endif
        co__lock(&s->lock);
    }
    co__unlock(&s->lock);
}
