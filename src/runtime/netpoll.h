/*
 * The netpoller (Go's runtime/netpoll.go and its backends) and what the fd
 * layer above it uses.
 *
 *  - netpoll.c: one poll descriptor (co__pd_t, Go's pollDesc) per fd
 *    number, in a table that grows and never moves; readiness (the edge
 *    counters and the read/write wait queues): reporting an edge, waking
 *    the waiters of a side, parking on a descriptor (Go's netpollblock).
 *  - netpoll_<backend>.c (epoll today; kqueue or io_uring can follow): the
 *    kernel object, registration of an fd, the blocking wait and the break,
 *    i.e. the co__netpoll_* hooks of runtime.h. When the kernel reports
 *    an fd ready, the backend calls co__pd_ready(); it never touches a wait
 *    queue itself.
 *  - src/io (above the runtime; Go's internal/poll): the operations
 *    (co_read & co), the set-up of an fd on first use and the close
 *    protocol (the reference count and flags in pd->state). It includes
 *    this header; nothing in the runtime includes or calls anything of io.
 *
 * Nothing here is public.
 */
#ifndef COLONY_NETPOLL_H
#define COLONY_NETPOLL_H

#include "runtime/runtime.h"

/* Which side(s) of an fd became ready (backend -> co__pd_ready), or which
 * side(s) an operation waits for (co__pd_wait, co__pd_wake). */
enum {
    CO__PD_READ = 1,
    CO__PD_WRITE = 2,
    CO__PD_HUP = 4 /* with READ: the peer hung up or an error is pending (EOF/error
                      stays readable with no further edge) */
};

/* pd->kind: what the fd layer knows about the fd. Written under pd->lock;
 * read without it with an acquire load (a stale read only costs the slow
 * path). Every access is atomic, those under the lock too: the hook's
 * calls run inside TSan's blocking-call interceptors, where TSan records
 * no atomic operation (so no lock) but still checks plain accesses. */
enum {
    CO__PD_UNKNOWN = 0,  /* never used, reset by co_close / co_accept, or forgotten
                            by co__pd_forget_all */
    CO__PD_POLLED = 2,   /* O_NONBLOCK set and registered with the backend */
    CO__PD_PLAIN = 3     /* the backend refused it (regular file...): plain syscalls */
};

/* pd->state: in-flight operation count (low 30 bits) plus two flags, as in
 * Go's fdMutex; the fd layer keeps it. Every co_* call on an fd holds one
 * reference while it runs. CLOSING is set once by co_close, before it wakes
 * every waiter with CO_ECLOSED under pd->lock; co__pd_wait reads it under
 * pd->lock, so no waiter parks after that wake. FINAL is set by the single
 * party that performs the close(2) after the count dropped to zero; both
 * are cleared together right after close(2) returns. */
#define CO__PD_CLOSING 0x80000000u
#define CO__PD_FINAL 0x40000000u
#define CO__PD_REFMASK 0x3fffffffu
#define CO__PD_WL_HELD 1u
#define CO__PD_WL_WAIT 2u
#define CO__PD_WL_CLOSED 4u

/* fd numbers with a descriptor: 0 to CO__PD_NFD - 1 (64 Mi: above any
 * RLIMIT_NOFILE in practice). */
#define CO__PD_NFD (1 << 26)

typedef struct co__pd {
    co__lock_t lock;   /* protects rq, wq, kind, is_sock (writes) */
    uint32_t state;    /* atomic: refs | CLOSING | FINAL, see above */
    uint32_t rseq;     /* atomic: read-side edges seen; bumped under lock by
                          co__pd_ready (release), loaded by an operation
                          before its syscall (acquire) */
    uint32_t wseq;     /* atomic: same for the write side */
    uint8_t kind;      /* CO__PD_*, see above */
    uint8_t is_sock;   /* atomic relaxed (as kind); valid when kind is POLLED:
                          send(MSG_NOSIGNAL); written under lock, or cleared by
                          co_write on ENOTSOCK */
    uint8_t stream;    /* atomic relaxed; TCP: a short read drained it */
    uint8_t wlock;     /* atomic: co_write's lock (Go's fdMutex write lock), so that
                          whole writes never interleave: CO__PD_WL_HELD by the
                          writer (fetch_or acquire / fetch_and release);
                          CO__PD_WL_WAIT set under lock by a writer about to park
                          on wq for it, cleared with HELD by the unlock, which then
                          wakes wq; CO__PD_WL_CLOSED set by co_close before it wakes
                          anyone (the lock is refused from then on, as Go's
                          fdMutex refuses it once closing), cleared with the rest
                          by the close(2) */
    uint32_t rdrained; /* atomic relaxed, a hint: rseq + 1 when a read of a stream came
                          back short (the kernel buffer was empty then); 0: none */
    uint8_t hup;       /* atomic: a hang-up, an error or urgent data was reported (never
                          skip a read after that); set before the rseq bump (release)
                          that reports it */
    uint8_t noclose;   /* set by co_fd_forget after it won CLOSING, read by the
                          finaliser after its CAS on state (the acq_rel chain on
                          state orders them): retire without close(2); cleared
                          by the finaliser */
    int fd;            /* the fd number this slot belongs to (constant) */
    co__waitq_t rq;    /* parked readers (co_read, co_accept, co_wait_fd) */
    co__waitq_t wq;    /* parked writers (co_write, co_connect, co_wait_fd) */
} co__pd_t;

/* ---- poll descriptors (netpoll.c) --------------------------------------- */

/* The fd's descriptor, allocating its table chunk if needed; NULL if fd is
 * negative, too large (CO__PD_NFD and up) or memory is exhausted. The
 * memory is never freed while the process runs, so the backend may keep
 * the fd number in its kernel object and look the descriptor up on every
 * event. */
CO_HIDDEN co__pd_t *co__pd_get(int fd);
/* The descriptor if its chunk exists, else NULL (never allocates). */
CO_HIDDEN co__pd_t *co__pd_peek(int fd);
/* Called by the backend for each ready fd. Bumps the edge counters of
 * `modes` (CO__PD_*) and unparks every waiter of those sides. Returns how
 * many coroutines it made runnable (woken plain threads are not counted).
 * Callable from any M, with or without a P, holding no lock. */
CO_HIDDEN int co__pd_ready(co__pd_t *pd, int modes);
/* Unparks every waiter of the sides in `modes` with `result` (their wait
 * returns it), without an edge: the counters stay. The fd layer's close
 * (CO_ECLOSED, both sides) and write lock (0, the write side). Takes
 * pd->lock; call it without. */
CO_HIDDEN void co__pd_wake(co__pd_t *pd, int modes, int result);
/* Park until one of `modes` (CO__PD_*) sees an edge newer than rseq/wseq
 * (the counters the caller loaded before its syscall), the deadline passes
 * or the fd is closed (CLOSING). 0 (retry the syscall), CO_ETIMEDOUT or
 * CO_ECLOSED. Call it without pd->lock. */
CO_HIDDEN int co__pd_wait(co__pd_t *pd, int modes, uint32_t rseq, uint32_t wseq,
                          int64_t deadline);
/* Forget every registration (the backend's kernel object is going away:
 * co__netpoll_fini calls it). */
CO_HIDDEN void co__pd_forget_all(void);
/* Forget the whole table, leaking it: a forked child's fresh runtime
 * (co__netpoll_forget), whose parent's threads may hold its locks. */
CO_HIDDEN void co__pd_forget_table(void);

/* ---- the backend (netpoll_<backend>.c) ---------------------------------- */

/* Register fd (edge-triggered, read and write, once). 0 or -errno; -EPERM
 * means "this fd cannot be polled" (regular files). Called by the fd
 * layer's set-up, under pd->lock. */
CO_HIDDEN int co__np_register(int fd);
/* Make sure the file that fd names now is in the set: 1 if it was not (the
 * number was closed behind the fd layer's back and names another file, or
 * was never registered; it is registered now), 0 if it was, -errno on
 * failure (-EPERM: a regular file; -EBADF: fd is closed). One epoll_ctl. */
CO_HIDDEN int co__np_ensure(int fd);
/* Forget fd (before it is closed). Errors are ignored. */
CO_HIDDEN void co__np_unregister(int fd);
/* Count of operations parked on the netpoller (co__netpoll_has_waiters).
 * co__pd_wait increments it before parking and decrements it after waking. */
CO_HIDDEN void co__np_waiters_add(int delta);

#endif
