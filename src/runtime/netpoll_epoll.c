/*
 * The epoll backend of the netpoller (Go's netpoll_epoll.go): one epoll
 * instance for the process, every fd registered once, edge-triggered, for
 * both directions; an eventfd in the set (level-triggered) to break a
 * blocked poll. The per-fd bookkeeping (who waits, edge counters) lives
 * in netpoll.c, the close protocol in the fd layer (src/io); this file only
 * turns kernel events into co__pd_ready() calls. See netpoll.h for the
 * split.
 *
 * Concurrency: co__netpoll may run on several Ms at once with delay 0 (the
 * kernel hands each edge-triggered event to one of them); at most one M
 * calls it with a non-zero delay at a time (the scheduler's guarantee).
 */
#include "runtime/proc.h"

#include "runtime/netpoll.h"

#include <errno.h>
#include <limits.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* epoll_event.data of the break eventfd; fds use their (non-negative) number. */
#define NP_TAG_BREAK ((uint64_t)1 << 63)
#define NP_MAX_EVENTS 128

static struct {
    /* epfd, evfd: written by init/fini only, which the runtime runs while no
     * M polls; read everywhere else. -1 when not initialised. */
    int epfd;
    int evfd;
    /* atomic, seq_cst: 1 while an M is (about to be) blocked in epoll with
     * a non-zero delay. Set and cleared by that M around the wait; read by
     * co__netpoll_break so that a break with nobody blocked costs one load.
     * A break issued before the poller stored 1 is not delivered: after
     * its store the poller looks again at what each breaker publishes
     * before its break (poller_given, its affq, the timers) and does not
     * block past it. */
    uint32_t sleeping;
    /* atomic: 1 from a break's eventfd write until a blocking poll drains
     * it, so that a storm of breaks writes the eventfd once. CAS 0->1 by
     * co__netpoll_break (acq_rel), store 0 by the draining poller
     * (release) after its read(2). */
    uint32_t wake_sig;
    /* atomic, relaxed: operations parked on the netpoller (co__pd_wait keeps it).
     * Only a hint for the scheduler: may briefly count a waiter that was
     * already woken but has not run yet. */
    int32_t waiters;
    /* atomic, relaxed: 0 untested, 1 epoll_pwait2 works, -1 ENOSYS. */
    int32_t pwait2;
} np = {.epfd = -1, .evfd = -1};

/* Before a use of the poller's descriptors by a thread that may be a
 * plain one (a wake-up's write, a registration): under TSan, co_init's
 * making of them happens before, by the runtime's own order, which TSan
 * does not see (the runtime is not instrumented). An M's start says so
 * for its thread (co__m_race_start); this says it for the others. */
static inline void np_race_seen(void) {
#ifdef CO_TSAN
    co__race_init_seen();
#endif
}

int co__netpoll_init(void) {
    if (np.epfd >= 0)
        return 0;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        return -errno;
    int ev = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ev < 0) {
        int e = -errno;
        close(ep);
        return e;
    }
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = NP_TAG_BREAK};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ev, &e) < 0) {
        int err = -errno;
        close(ev);
        close(ep);
        return err;
    }
    __atomic_store_n(&np.sleeping, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&np.wake_sig, 0, __ATOMIC_RELAXED);
    np.evfd = ev;
    np.epfd = ep;
    return 0;
}

void co__netpoll_fini(void) {
    if (np.epfd < 0)
        return;
    co__pd_forget_all();
    close(np.evfd);
    close(np.epfd);
    np.evfd = -1;
    np.epfd = -1;
}

void co__netpoll_forget(void) {
    if (np.epfd >= 0) {
        close(np.evfd);
        close(np.epfd);
    }
    np.evfd = np.epfd = -1;
    __atomic_store_n(&np.sleeping, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&np.wake_sig, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&np.waiters, 0, __ATOMIC_RELAXED);
    co__pd_forget_table();
}

int co__np_register(int fd) {
    if (np.epfd < 0)
        return -EBADF;
    np_race_seen();
    struct epoll_event e = {
        .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET,
        .data.u64 = (uint64_t)(uint32_t)fd,
    };
    if (epoll_ctl(np.epfd, EPOLL_CTL_ADD, fd, &e) == 0)
        return 0;
    int err = errno;
    /* The open file description is already in the set (a dup of an fd we
     * registered, or a number reused without co_close): point it here. */
    if (err == EEXIST && epoll_ctl(np.epfd, EPOLL_CTL_MOD, fd, &e) == 0)
        return 0;
    if (err == EEXIST)
        err = errno;
    return -err;
}

int co__np_ensure(int fd) {
    if (np.epfd < 0)
        return -EBADF;
    np_race_seen();
    /* The kernel keys its set by (number, open file description): ADD
     * fails with EEXIST exactly when this number's current file is in. */
    struct epoll_event e = {
        .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET,
        .data.u64 = (uint64_t)(uint32_t)fd,
    };
    if (epoll_ctl(np.epfd, EPOLL_CTL_ADD, fd, &e) == 0)
        return 1;
    return errno == EEXIST ? 0 : -errno;
}

void co__np_unregister(int fd) {
    if (np.epfd >= 0) {
        np_race_seen();
        (void)epoll_ctl(np.epfd, EPOLL_CTL_DEL, fd, NULL);
    }
}

void co__np_waiters_add(int delta) {
    __atomic_add_fetch(&np.waiters, delta, __ATOMIC_RELAXED);
}

bool co__netpoll_has_waiters(void) {
    return __atomic_load_n(&np.waiters, __ATOMIC_RELAXED) > 0;
}

void co__netpoll_break(void) {
    if (np.epfd < 0 || !__atomic_load_n(&np.sleeping, __ATOMIC_SEQ_CST))
        return;
    uint32_t z = 0;
    if (!__atomic_compare_exchange_n(&np.wake_sig, &z, 1, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return; /* a write is already pending */
    uint64_t one = 1;
    np_race_seen();
    for (;;) {
        ssize_t n = write(np.evfd, &one, sizeof one);
        if (n == (ssize_t)sizeof one || errno != EINTR)
            return; /* EAGAIN: the counter is saturated, i.e. readable anyway */
    }
}

/* Wait for events with nanosecond resolution: epoll_pwait2 (Linux 5.11+)
 * when the kernel has it, else epoll_wait in milliseconds, rounding a
 * sub-millisecond delay up to 1 ms and a longer one down (the scheduler
 * polls again for the remainder). */
static int np_wait(struct epoll_event *evs, int64_t delay) {
    if (delay <= 0)
        return epoll_wait(np.epfd, evs, NP_MAX_EVENTS, delay < 0 ? -1 : 0);
#ifdef SYS_epoll_pwait2
    if (__atomic_load_n(&np.pwait2, __ATOMIC_RELAXED) >= 0) {
        struct timespec ts = {.tv_sec = delay / 1000000000, .tv_nsec = delay % 1000000000};
        long n = syscall(SYS_epoll_pwait2, np.epfd, evs, NP_MAX_EVENTS, &ts, NULL, 0);
        if (n >= 0 || errno != ENOSYS) {
            __atomic_store_n(&np.pwait2, 1, __ATOMIC_RELAXED);
            return (int)n;
        }
        __atomic_store_n(&np.pwait2, -1, __ATOMIC_RELAXED);
    }
#endif
    int64_t ms = delay < 1000000 ? 1 : delay / 1000000;
    if (ms > INT_MAX)
        ms = INT_MAX;
    return epoll_wait(np.epfd, evs, NP_MAX_EVENTS, (int)ms);
}

/* The kernel pads short sleeps by the thread's timer slack (50 us by
 * default); a poller that sleeps until the next timer wants it gone. Set
 * once per M (a thread-local read here is safe: nothing switches
 * coroutines inside co__netpoll). */
static __thread bool np_slack_set;

int co__netpoll(int64_t delay_ns) {
    if (np.epfd < 0)
        return 0;
    struct epoll_event evs[NP_MAX_EVENTS];
    int n;
    if (delay_ns != 0) {
        if (CO_UNLIKELY(!np_slack_set)) {
            (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
            np_slack_set = true;
        }
        __atomic_store_n(&np.sleeping, 1, __ATOMIC_SEQ_CST);
        /* A P handed to this poller before it could break the poll
         * (co__startm; the Dekker pair is in proc.h): do not block. */
        if (__atomic_load_n(&co__sched.poller_given, __ATOMIC_SEQ_CST)) delay_ns = 0;
        /* Nor with a coroutine sent home to this M meanwhile: post_affine
         * queues it, then (seq_cst fence) breaks the poll only if it sees
         * sleeping set; this store of sleeping, then this load, is the
         * other half. */
        co_m_t *me = co__getm();
        if (me && __atomic_load_n(&me->affq, __ATOMIC_SEQ_CST) != NULL) delay_ns = 0;
        /* Nor past a timer added meanwhile: co__timer_add stores its P's
         * timer0_when, then (seq_cst) breaks the poll only if it sees
         * sleeping set; a timer it stored after the caller read the
         * timers, whose break came before that flag, is seen here. */
        int64_t next = co__timers_next();
        if (next && delay_ns != 0) {
            int64_t d = next - co_now();
            if (d < 0) d = 0;
            if (delay_ns < 0 || d < delay_ns) delay_ns = d;
        }
        n = np_wait(evs, delay_ns);
        __atomic_store_n(&np.sleeping, 0, __ATOMIC_SEQ_CST);
    } else {
        n = np_wait(evs, 0);
    }
    if (n <= 0)
        return 0; /* EINTR or timeout: the caller re-evaluates its timers */

    int made_runnable = 0;
    /* Several wake-ups: in their order at the tail of this M's P (if it
     * has one), leaving runnext to whoever is there (proc.h, np_batch).
     * co__netpoll never runs nested on one M. */
    co_m_t *self = n > 1 ? co__getm() : NULL;
    if (self) self->np_batch = true;
    for (int i = 0; i < n; i++) {
        uint32_t ev = evs[i].events;
        if (evs[i].data.u64 == NP_TAG_BREAK) {
            /* Only a blocking poll drains the break: a delay-0 poll that
             * sees it leaves it pending (level-triggered), so the blocked
             * poller it was meant for still wakes. */
            if (delay_ns != 0) {
                uint64_t cnt;
                (void)!read(np.evfd, &cnt, sizeof cnt);
                __atomic_store_n(&np.wake_sig, 0, __ATOMIC_RELEASE);
            }
            continue;
        }
        int modes = 0;
        if (ev & (EPOLLIN | EPOLLPRI | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            modes |= CO__PD_READ;
        if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR))
            modes |= CO__PD_WRITE;
        /* EPOLLPRI: TCP urgent data, where a read stops short of what is
         * buffered: like a hang-up, it ends co_read's skip for good */
        if (ev & (EPOLLPRI | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            modes |= CO__PD_HUP;
        co__pd_t *pd = co__pd_peek((int)(uint32_t)evs[i].data.u64);
        if (pd && modes)
            made_runnable += co__pd_ready(pd, modes);
    }
    if (self) self->np_batch = false;
    return made_runnable;
}
