/*
 * I/O on the netpoller: co_read & co (Go's internal/poll). The poll
 * descriptors, readiness and parking on them are the runtime's
 * (runtime/netpoll.c); this file holds what is done to an fd: its set-up
 * on first use, the operations and the close protocol.
 *
 * Readiness: an operation loads the side's sequence number (pd->rseq or
 * pd->wseq) before its syscall and, on EAGAIN, hands it to co__pd_wait,
 * which parks only if no edge arrived since (see runtime/netpoll.c).
 *
 * Close (Go's fdMutex, reduced): every operation holds a reference on the
 * descriptor while it runs. co_close sets CLOSING, refuses co_write's lock
 * from then on (CO__PD_WL_CLOSED), wakes every parked waiter with
 * CO_ECLOSED and drops its reference; whoever drops the last reference
 * (co_close itself, or the last operation on its way out) performs
 * close(2). Operations that start while CLOSING is set fail with
 * CO_ECLOSED; so nobody stays parked on a closed fd, and the fd number is
 * not reused while an operation still uses it.
 *
 * What a close does to writes: a co_write that has not taken the write
 * lock when the close begins sends nothing (CO_ECLOSED), wherever it is:
 * starting, queued on the lock, or woken for the lock and not yet run.
 * The one that holds the lock makes no further system call once it sees
 * the flag (between two of its own) and returns how many bytes went out
 * (CO_ECLOSED if none): the peer gets whole frames and at most one cut
 * one, the last, whose writer knows where it was cut.
 */
#include "runtime/runtime.h"

#include "runtime/netpoll.h"
#include "io/io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- references and close ----------------------------------------------- */

/* The single party that sees refs == 0 with CLOSING wins FINAL and closes.
 * Returns true (and close(2)'s result in *rc) if this caller did it. */
static bool pd_try_finalize(co__pd_t *pd, int *rc) {
    uint32_t exp = CO__PD_CLOSING;
    if (!__atomic_compare_exchange_n(&pd->state, &exp, CO__PD_CLOSING | CO__PD_FINAL, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return false;
    co__lock(&pd->lock);
    /* not PLAIN: co_wait_fd's check of a reused number registers a file
     * while the slot stays UNKNOWN (a DEL of none is harmless) */
    bool polled = __atomic_load_n(&pd->kind, __ATOMIC_RELAXED) != CO__PD_PLAIN;
    __atomic_store_n(&pd->kind, CO__PD_UNKNOWN, __ATOMIC_RELEASE);
    __atomic_store_n(&pd->is_sock, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pd->stream, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pd->rdrained, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pd->hup, 0, __ATOMIC_RELAXED);
    /* the close's CLOSED, and a stray WAIT of a writer gone */
    __atomic_store_n(&pd->wlock, 0, __ATOMIC_RELAXED);
    /* A stale edge for the old file just costs a retry. */
    __atomic_add_fetch(&pd->rseq, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&pd->wseq, 1, __ATOMIC_RELEASE);
    bool keep = __atomic_load_n(&pd->noclose, __ATOMIC_RELAXED);
    __atomic_store_n(&pd->noclose, 0, __ATOMIC_RELAXED);
    co__unlock(&pd->lock);
    if (polled)
        co__np_unregister(pd->fd);
    /* co_fd_forget: the file is its owner's to close (or gone already) */
    int r = keep ? 0 : close(pd->fd) < 0 ? -errno : 0;
    /* From here the number may be reused; let operations on it in. */
    __atomic_and_fetch(&pd->state, ~(CO__PD_CLOSING | CO__PD_FINAL), __ATOMIC_RELEASE);
    if (rc)
        *rc = r;
    return true;
}

/* Drop an operation's reference (release: its syscalls happen before the
 * close(2) that the last dropper may perform). */
static void pd_exit(co__pd_t *pd) {
    uint32_t prev = __atomic_fetch_sub(&pd->state, 1, __ATOMIC_ACQ_REL);
    if (CO_UNLIKELY(prev == (CO__PD_CLOSING | 1)))
        (void)pd_try_finalize(pd, NULL);
}

/* First use of an fd: make it non-blocking and register it. */
static int pd_setup(co__pd_t *pd) {
    int rc = 0;
    co__lock(&pd->lock);
    if (__atomic_load_n(&pd->kind, __ATOMIC_RELAXED) == CO__PD_UNKNOWN) {
        /* The kernel's flags, not an interposed fcntl's view of them
         * (libcolony_hook.so shows a program its own O_NONBLOCK). */
        int fl = (int)syscall(SYS_fcntl, pd->fd, F_GETFL);
        if (fl < 0) {
            rc = -errno;
            goto out;
        }
        if (!(fl & O_NONBLOCK) && syscall(SYS_fcntl, pd->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            rc = -errno;
            goto out;
        }
        /* Whether it is a socket, and whether it is TCP, where a short read
         * means an empty buffer (co_read's skip), urgent data aside (its
         * edge turns the skip off, see hup). Not a Unix stream socket (a
         * read stops after a segment with SCM_RIGHTS, or between writers
         * with SO_PASSCRED), nor MPTCP or SCTP (their own protocol
         * numbers), nor a pipe (one in packet mode, O_DIRECT, returns one
         * write per read, and only its write end shows the flag). A
         * protocol number means something only within its family and type
         * (6 is also a raw IP socket's IPPROTO_TCP and NETLINK_XFRM): all
         * three are asked. Of every new file, co_accept's too: a number it
         * gave out may have been closed with close(2) and taken by any
         * file. */
        int proto = 0, type = 0, dom = 0;
        socklen_t pl = sizeof proto, tl = sizeof type, dl = sizeof dom;
        bool sock = getsockopt(pd->fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) == 0;
        __atomic_store_n(&pd->is_sock, sock, __ATOMIC_RELAXED);
        bool stream = sock && proto == IPPROTO_TCP &&
                      getsockopt(pd->fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 &&
                      type == SOCK_STREAM &&
                      getsockopt(pd->fd, SOL_SOCKET, SO_DOMAIN, &dom, &dl) == 0 &&
                      (dom == AF_INET || dom == AF_INET6);
        __atomic_store_n(&pd->stream, stream, __ATOMIC_RELAXED);
        /* a former file's (closed with close(2)) read-side hints */
        __atomic_store_n(&pd->rdrained, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pd->hup, 0, __ATOMIC_RELAXED);
    }
    if (__atomic_load_n(&pd->kind, __ATOMIC_RELAXED) == CO__PD_UNKNOWN) {
        rc = co__np_register(pd->fd);
        if (rc == -EPERM) { /* regular file, directory: never "not ready" */
            __atomic_store_n(&pd->kind, CO__PD_PLAIN, __ATOMIC_RELEASE);
            rc = 0;
        } else if (rc == 0) {
            __atomic_store_n(&pd->kind, CO__PD_POLLED, __ATOMIC_RELEASE);
        }
    }
out:
    co__unlock(&pd->lock);
    return rc;
}

/* Take an operation's reference on fd and make sure it is set up. A plain
 * thread's operation also holds the runtime (co__rt_hold) until op_exit:
 * co_shutdown fails with CO_EBUSY while one is under way, parked or not
 * (a coroutine's counts as a live coroutine), instead of closing the
 * poller under it and leaving it parked for good. *held says which. */
static int pd_enter(int fd, co__pd_t **out, bool *held) {
    if (fd < 0)
        return -EBADF;
    *held = co__cur_g() == NULL;
    int rc = *held ? co__rt_hold(CO__HOLD_IO) : co__ensure_init();
    if (rc < 0) {
        *held = false;
        return rc;
    }
    co__pd_t *pd = co__pd_get(fd);
    if (!pd) {
        /* co__pd_get makes no chunk for a number that is not open */
        rc = fd >= CO__PD_NFD || fcntl(fd, F_GETFD) < 0 ? -EBADF : CO_ENOMEM;
        goto fail;
    }
    for (;;) {
        uint32_t s = __atomic_fetch_add(&pd->state, 1, __ATOMIC_ACQUIRE);
        if (CO_LIKELY(!(s & (CO__PD_CLOSING | CO__PD_FINAL))))
            break;
        pd_exit(pd);
        if (!(s & CO__PD_FINAL)) {
            rc = CO_ECLOSED; /* this fd is being closed */
            goto fail;
        }
        /* The number's previous file is in close(2): ours is the next one. */
        while (__atomic_load_n(&pd->state, __ATOMIC_ACQUIRE) & CO__PD_FINAL)
            co_yield(); /* sched_yield() on a plain thread */
    }
    uint8_t k = __atomic_load_n(&pd->kind, __ATOMIC_ACQUIRE);
    if (CO_UNLIKELY(k != CO__PD_POLLED && k != CO__PD_PLAIN)) {
        rc = pd_setup(pd);
        if (rc < 0) {
            pd_exit(pd);
            goto fail;
        }
    }
    *out = pd;
    return 0;
fail:
    if (*held)
        co__rt_unhold(CO__HOLD_IO);
    *held = false;
    return rc;
}

/* The end of an operation: its reference (the last one may close the fd,
 * which unregisters it from the poller: before the hold goes), then its
 * hold. */
static void op_exit(co__pd_t *pd, bool held) {
    pd_exit(pd);
    if (held)
        co__rt_unhold(CO__HOLD_IO);
    /* A safe point: a coroutine whose calls never wait (the data is
     * always there) yields here once sysmon asks, instead of holding its
     * P until a spare P and a thread are lent in its place. */
    if (CO_UNLIKELY(__atomic_load_n(&co__preempt_pending, __ATOMIC_RELAXED)))
        co__preempt_point();
}

static bool pd_plain(co__pd_t *pd) {
    return __atomic_load_n(&pd->kind, __ATOMIC_RELAXED) == CO__PD_PLAIN;
}

static int close_pd(co__pd_t *pd, bool keep) {
    for (;;) {
        uint32_t s = __atomic_fetch_add(&pd->state, 1, __ATOMIC_ACQUIRE);
        if (!(s & CO__PD_FINAL))
            break;
        pd_exit(pd);
        while (__atomic_load_n(&pd->state, __ATOMIC_ACQUIRE) & CO__PD_FINAL)
            co_yield(); /* sched_yield() on a plain thread */
    }
    /* We hold a reference, so FINAL cannot appear; one closer wins CLOSING. */
    uint32_t prev = __atomic_fetch_or(&pd->state, CO__PD_CLOSING, __ATOMIC_ACQ_REL);
    if (prev & CO__PD_CLOSING) {
        pd_exit(pd);
        return -EBADF; /* already being closed */
    }
    if (keep) /* before our reference goes: the finaliser reads it after */
        __atomic_store_n(&pd->noclose, 1, __ATOMIC_RELAXED);
    /* Refuse the write lock before waking its waiters: one woken earlier
     * (by the last holder's unlock, or an edge) and not yet run must not
     * take it and start a write now. */
    __atomic_fetch_or(&pd->wlock, CO__PD_WL_CLOSED, __ATOMIC_RELAXED);
    co__pd_wake(pd, CO__PD_READ | CO__PD_WRITE, CO_ECLOSED);
    prev = __atomic_fetch_sub(&pd->state, 1, __ATOMIC_ACQ_REL);
    int rc = 0;
    if (prev == (CO__PD_CLOSING | 1) && pd_try_finalize(pd, &rc))
        return rc;
    return 0; /* the last operation still running closes it on its way out */
}

int co_close(int fd) {
    if (fd < 0)
        return -EBADF;
    co__pd_t *pd = co__pd_peek(fd);
    /* a fork's child of a running runtime: the table is the parent's, the
     * file the child's own to close (before its exec, typically) */
    if (!pd || __atomic_load_n(&co__rt_state, __ATOMIC_RELAXED) == CO__RT_FORKED)
        return close(fd) < 0 ? -errno : 0;
    /* A plain thread holds the runtime while it closes, if it is up, so
     * that co_shutdown does not close the poller under the unregistering.
     * Never starts it: with the runtime down no fd is registered. */
    bool held = co__cur_g() == NULL && co__rt_hold_if_up(CO__HOLD_IO);
    int rc = close_pd(pd, false);
    if (held)
        co__rt_unhold(CO__HOLD_IO);
    return rc;
}

/* co_close without the close(2): the same wake (CO_ECLOSED), the same wait
 * for the operations under way, the registration dropped and the slot's
 * knowledge reset, so that the number's next file starts afresh. Safe
 * whether the file is still open (its owner closes it after) or already
 * closed. If the number already names another file, that file's waiting
 * calls are woken with CO_ECLOSED and its registration dropped (its next
 * wait registers it again): the forget cannot tell the files apart, as
 * docs/io.md says. */
int co_fd_forget(int fd) {
    if (fd < 0)
        return -EBADF;
    co__pd_t *pd = co__pd_peek(fd);
    /* never seen, or the parent's table in a fork's child: nothing to forget */
    if (!pd || __atomic_load_n(&co__rt_state, __ATOMIC_RELAXED) == CO__RT_FORKED)
        return 0;
    /* Called from the close(2) of co_close's own finaliser (an interposed
     * close, libcolony_hook.so): that close forgets it already. */
    if (__atomic_load_n(&pd->state, __ATOMIC_ACQUIRE) & CO__PD_FINAL)
        return 0;
    bool held = co__cur_g() == NULL && co__rt_hold_if_up(CO__HOLD_IO);
    int rc = close_pd(pd, true);
    /* The caller closes the number next, and a new file may take it at
     * once: an operation still under way (woken with CO_ECLOSED, or past
     * its last system call) would keep CLOSING set over that new file,
     * whose operations would then fail with CO_ECLOSED. So return only
     * once the last one has left and the finaliser has cleared the slot,
     * as co_close's close(2) comes only then. Not for long: each such
     * operation runs or is runnable (close_pd woke the parked ones). A
     * close already under way (-EBADF) is waited for alike. Acquire:
     * pairs with pd_try_finalize's release clearing, after its reset. */
    while (__atomic_load_n(&pd->state, __ATOMIC_ACQUIRE) & (CO__PD_CLOSING | CO__PD_FINAL))
        co_yield(); /* sched_yield() on a plain thread */
    if (held)
        co__rt_unhold(CO__HOLD_IO);
    return rc == -EBADF ? 0 : rc;
}

/* Syscall wrappers returning -errno. Not inlined: glibc declares
 * __errno_location const, and a caller that parks between two syscalls
 * must not reuse the errno address of the thread it ran on before. */
#define NOINL __attribute__((noinline))
static NOINL ssize_t sys_read(int fd, void *b, size_t n) {
    ssize_t r = read(fd, b, n);
    return r < 0 ? -errno : r;
}
static NOINL ssize_t sys_write(int fd, const void *b, size_t n, bool sock) {
    ssize_t r = sock ? send(fd, b, n, MSG_NOSIGNAL) : write(fd, b, n);
    return r < 0 ? -errno : r;
}
static NOINL int sys_accept(int fd, struct sockaddr *a, socklen_t *l) {
    int r = accept4(fd, a, l, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return r < 0 ? -errno : r;
}
static NOINL int sys_connect(int fd, const struct sockaddr *a, socklen_t l) {
    return connect(fd, a, l) < 0 ? -errno : 0;
}
static NOINL int sys_sockerr(int fd) {
    int err = 0;
    socklen_t l = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
        return -errno;
    return -err;
}
static NOINL int sys_connected(int fd) {
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    return getpeername(fd, (struct sockaddr *)&ss, &l) < 0 ? -errno : 0;
}
static NOINL int sys_poll1(int fd, short events, short *revents) {
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, 0);
    *revents = p.revents;
    return r < 0 ? -errno : r;
}

static bool again(ssize_t e) {
    return e == -EAGAIN || e == -EWOULDBLOCK;
}

static bool deadline_passed(int64_t deadline) {
    return deadline >= 0 && deadline <= co_now();
}

/* co_read's skip of a read(2) that would fail with EAGAIN: the deadline
 * is not past (a past one is a try, and tries read) and a new edge will be
 * seen soon (co__netpoll_soon). */
static bool edge_wait_pays(int64_t deadline) {
    if (deadline != CO_FOREVER && deadline <= 0) return false;
    int64_t now = co_now();
    if (deadline != CO_FOREVER && deadline <= now) return false;
    return co__netpoll_soon(now);
}

/* Whether pd's last consuming read came back short at edge count seq (and
 * no hang-up, error or urgent-data edge has come since: seq was loaded
 * with acquire after the hup store it covers): see co_read. */
static inline bool drained_at(co__pd_t *pd, uint32_t seq) {
    return seq + 1 != 0 && __atomic_load_n(&pd->rdrained, __ATOMIC_RELAXED) == seq + 1 &&
           !__atomic_load_n(&pd->hup, __ATOMIC_RELAXED);
}

/* ---- the operations ------------------------------------------------------ */

ssize_t co_read(int fd, void *buf, size_t len, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if ((!buf && len) || len > SSIZE_MAX)
        return CO_EINVAL;
    co__pd_t *pd;
    bool held;
    int rc = pd_enter(fd, &pd, &held);
    if (rc < 0)
        return rc;
    ssize_t n;
    for (;;) {
        uint32_t seq = __atomic_load_n(&pd->rseq, __ATOMIC_ACQUIRE);
        /* The last read of this stream came back short at this very edge
         * count, so it was empty then and any byte since brings a new edge.
         * While the poller is watched, or polled lately (busy Ms poll each
         * time they run out of work), that edge is seen soon: wait for it
         * instead of spending a read(2) on EAGAIN (a request/response
         * connection saves one syscall per message). Never for a deadline
         * that has passed: that is a try, and tries read. Never after a
         * hang-up or error edge: EOF and errors stay pending with no edge to
         * come; nor after TCP urgent data, where a read stops short at the
         * mark (seq was loaded with acquire after the hup store it covers). */
        if (len > 0 && drained_at(pd, seq) && edge_wait_pays(deadline)) {
            __atomic_store_n(&pd->rdrained, 0, __ATOMIC_RELAXED); /* one skip per short read */
            int w = co__pd_wait(pd, CO__PD_READ, seq, 0, deadline);
            if (w < 0) {
                n = w;
                break;
            }
            continue;
        }
        n = sys_read(fd, buf, len);
        if (n > 0 && (size_t)n < len && __atomic_load_n(&pd->stream, __ATOMIC_RELAXED))
            __atomic_store_n(&pd->rdrained, seq + 1, __ATOMIC_RELAXED);
        if (n >= 0)
            break;
        if (n == -EINTR)
            continue;
        if (!again(n) || pd_plain(pd))
            break;
        int w = co__pd_wait(pd, CO__PD_READ, seq, 0, deadline);
        if (w < 0) {
            n = w;
            break;
        }
    }
    op_exit(pd, held);
    return n;
}

/* co_write's lock, so that whole writes never interleave (Go's Write holds
 * the fd's write lock throughout). A writer that finds it held parks on wq
 * with WAIT set, under pd->lock: the holder's unlock clears both bits and,
 * if WAIT was set, wakes wq (write-readiness waiters too: they only retry),
 * under pd->lock, so it cannot miss one that saw the lock held. Woken, a
 * waiter tries again. 0, CO_ETIMEDOUT (the deadline passed first: nothing
 * was written) or CO_ECLOSED. */
static int wlock_wait(co__pd_t *pd, int64_t deadline) {
    if (deadline_passed(deadline))
        return CO_ETIMEDOUT;
    co__pkw_t pw;
    co__wait_prepare(&pw, CO__WR_IO);
    co__lock(&pd->lock);
    if (__atomic_load_n(&pd->state, __ATOMIC_RELAXED) & CO__PD_CLOSING) {
        co__unlock(&pd->lock);
        return CO_ECLOSED;
    }
    uint8_t wl = __atomic_fetch_or(&pd->wlock, CO__PD_WL_WAIT, __ATOMIC_ACQ_REL);
    if (!(wl & CO__PD_WL_HELD)) {
        /* Given back meanwhile: take back the WAIT we set, if nobody had
         * (WAIT is set only under pd->lock, which we hold), so that the
         * next unlock does not wake the queue for nothing. */
        if (!(wl & CO__PD_WL_WAIT))
            __atomic_fetch_and(&pd->wlock, (uint8_t)~CO__PD_WL_WAIT, __ATOMIC_RELAXED);
        co__unlock(&pd->lock);
        return 0;
    }
    co__waitq_push(&pd->wq, &pw.w);
    if (co__wait(&pw.w, &pd->lock, deadline, 0) == CO_ETIMEDOUT)
        return CO_ETIMEDOUT;
    return pw.w.result; /* 0 (the unlock, an edge: retry) or CO_ECLOSED */
}

static void wlock_give(co__pd_t *pd) {
    /* release: pairs with the next writer's acquire. CLOSED stays. */
    uint8_t w = __atomic_fetch_and(&pd->wlock, (uint8_t) ~(CO__PD_WL_HELD | CO__PD_WL_WAIT),
                                   __ATOMIC_RELEASE);
    if (CO_UNLIKELY(w & CO__PD_WL_WAIT))
        co__pd_wake(pd, CO__PD_WRITE, 0);
}

/* co_close has begun (it sets CLOSED before waking anyone), for the lock's
 * holder between two system calls. Relaxed is enough: the holder took the
 * lock with an RMW on this byte, a later load of it sees that RMW's value
 * or a newer one, and CLOSED, once set, stays until the close(2) (with
 * nobody inside). */
static bool wlock_closed(co__pd_t *pd) {
    return __atomic_load_n(&pd->wlock, __ATOMIC_RELAXED) & CO__PD_WL_CLOSED;
}

static int wlock_take(co__pd_t *pd, int64_t deadline) {
    for (;;) {
        /* acquire: the previous writer's writes come first. The old value
         * says both whether it was free and whether the fd is closing: a
         * writer woken for the lock before a close and run after it lands
         * here, as does one that entered before the close and got here
         * after it. The RMW returns the whole byte: two bits cost what
         * one does. */
        uint8_t wl = __atomic_fetch_or(&pd->wlock, CO__PD_WL_HELD, __ATOMIC_ACQUIRE);
        if (CO_LIKELY(!(wl & (CO__PD_WL_HELD | CO__PD_WL_CLOSED))))
            return 0;
        if (wl & CO__PD_WL_CLOSED) {
            if (!(wl & CO__PD_WL_HELD))
                wlock_give(pd); /* we took it: give it back */
            return CO_ECLOSED;
        }
        int rc = wlock_wait(pd, deadline);
        if (rc < 0)
            return rc;
    }
}

ssize_t co_write(int fd, const void *buf, size_t len, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if ((!buf && len) || len > SSIZE_MAX)
        return CO_EINVAL;
    co__pd_t *pd;
    bool held;
    int rc = pd_enter(fd, &pd, &held);
    if (rc < 0)
        return rc;
    if (len > 0 && (rc = wlock_take(pd, deadline)) < 0) {
        op_exit(pd, held);
        return rc;
    }
    bool sock = __atomic_load_n(&pd->is_sock, __ATOMIC_RELAXED);
    const char *p = buf;
    size_t off = 0;
    ssize_t res = (ssize_t)len;
    for (;;) {
        uint32_t seq = __atomic_load_n(&pd->wseq, __ATOMIC_ACQUIRE);
        ssize_t n = sys_write(fd, off ? p + off : p, len - off, sock); /* NULL + 0 is UB */
        if (n >= 0) {
            off += (size_t)n;
            if (off >= len)
                break;
        } else if (n == -EINTR) {
        } else if (CO_UNLIKELY(n == -ENOTSOCK) && sock) {
            /* A number closed with close(2) behind our back (see co_close)
             * and reused by a file that is no socket: write(2) it is. */
            __atomic_store_n(&pd->is_sock, 0, __ATOMIC_RELAXED);
            sock = false;
        } else if (!again(n) || pd_plain(pd)) {
            res = n;
            break;
        } else {
            int w = co__pd_wait(pd, CO__PD_WRITE, 0, seq, deadline);
            if (w < 0) {
                res = w;
                break;
            }
        }
        /* Another system call for this write: none once co_close has begun
         * (a short write, or a wake that came before the close). */
        if (CO_UNLIKELY(wlock_closed(pd))) {
            res = CO_ECLOSED;
            break;
        }
    }
    /* Cut by co_close: how much went out, if anything did (the fd is done
     * for, so a short count cannot be taken for a place to resume at). */
    if (res == CO_ECLOSED && off > 0)
        res = (ssize_t)off;
    if (len > 0)
        wlock_give(pd);
    op_exit(pd, held);
    return res;
}

int co_accept(int fd, struct sockaddr *addr, socklen_t *addrlen, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if (addr && !addrlen)
        return CO_EINVAL;
    co__pd_t *pd;
    bool held;
    int rc = pd_enter(fd, &pd, &held);
    if (rc < 0)
        return rc;
    socklen_t len0 = addrlen ? *addrlen : 0;
    for (;;) {
        uint32_t seq = __atomic_load_n(&pd->rseq, __ATOMIC_ACQUIRE);
        if (addrlen)
            *addrlen = len0;
        rc = sys_accept(fd, addr, addrlen);
        if (rc >= 0)
            break;
        if (rc == -EINTR || rc == -ECONNABORTED)
            continue; /* the peer gave up before we took it: take the next */
        if (!again(rc) || pd_plain(pd))
            break;
        int w = co__pd_wait(pd, CO__PD_READ, seq, 0, deadline);
        if (w < 0) {
            rc = w;
            break;
        }
    }
    op_exit(pd, held);
    if (rc >= 0) {
        /* A fresh number: whatever its slot remembers is stale (a file
         * closed with close(2) had it). Its first use sets it up afresh,
         * as any file's: non-blocking already, so one fcntl, its type
         * (getsockopt) and the registration. */
        co__pd_t *npd = co__pd_get(rc);
        if (npd) {
            co__lock(&npd->lock);
            __atomic_store_n(&npd->kind, CO__PD_UNKNOWN, __ATOMIC_RELEASE);
            co__unlock(&npd->lock);
        }
    }
    return rc;
}

int co_connect(int fd, const struct sockaddr *addr, socklen_t addrlen, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if (!addr)
        return CO_EINVAL;
    co__pd_t *pd;
    bool held;
    int rc = pd_enter(fd, &pd, &held);
    if (rc < 0)
        return rc;
    uint32_t seq = __atomic_load_n(&pd->wseq, __ATOMIC_ACQUIRE);
    rc = sys_connect(fd, addr, addrlen);
    if (rc == -EINPROGRESS || rc == -EINTR || rc == -EALREADY) {
        /* In progress: writable means done; SO_ERROR says how it went. */
        for (;;) {
            rc = co__pd_wait(pd, CO__PD_WRITE, 0, seq, deadline);
            if (rc < 0)
                break;
            seq = __atomic_load_n(&pd->wseq, __ATOMIC_ACQUIRE);
            rc = sys_sockerr(fd);
            if (rc == -EINPROGRESS || rc == -EALREADY || rc == -EINTR)
                continue;
            if (rc == 0) {
                rc = sys_connected(fd);
                if (rc == -ENOTCONN) {
                    /* Not connected and no error: a spurious edge while
                     * connecting (no POLLOUT yet), or a failed connect whose
                     * error another caller's SO_ERROR took (a second
                     * co_connect of this socket): writable or hung up with
                     * no peer. That one never gets another edge. */
                    short rev = 0;
                    if (sys_poll1(fd, POLLOUT, &rev) > 0 && (rev & (POLLOUT | POLLHUP | POLLERR))) {
                        rc = -ECONNABORTED;
                        break;
                    }
                    continue;
                }
            }
            break;
        }
    }
    op_exit(pd, held);
    return rc;
}

int co_wait_fd(int fd, int events, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if (events == 0 || (events & ~(CO_READABLE | CO_WRITABLE)))
        return CO_EINVAL;
    co__pd_t *pd;
    bool held;
    int rc = pd_enter(fd, &pd, &held);
    if (rc < 0)
        return rc;
    short want = (short)(((events & CO_READABLE) ? POLLIN | POLLRDHUP : 0) |
                         ((events & CO_WRITABLE) ? POLLOUT : 0));
    int modes = ((events & CO_READABLE) ? CO__PD_READ : 0) |
                ((events & CO_WRITABLE) ? CO__PD_WRITE : 0);
    for (;;) {
        if (pd_plain(pd)) {
            /* A regular file is always ready; but the number may have been
             * closed with close(2) and given to a pipe or socket since,
             * which the check registers (else it stays plain). */
            int e = co__np_ensure(fd);
            if (e == -EPERM) {
                rc = events;
                break;
            }
            if (e < 0) {
                rc = e;
                break;
            }
            co__lock(&pd->lock);
            __atomic_store_n(&pd->kind, CO__PD_UNKNOWN, __ATOMIC_RELEASE);
            __atomic_store_n(&pd->rdrained, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&pd->hup, 0, __ATOMIC_RELAXED);
            co__unlock(&pd->lock);
            continue;
        }
        uint32_t rs = __atomic_load_n(&pd->rseq, __ATOMIC_ACQUIRE);
        uint32_t ws = __atomic_load_n(&pd->wseq, __ATOMIC_ACQUIRE);
        short rev = 0;
        rc = sys_poll1(fd, want, &rev);
        if (rc == -EINTR)
            continue;
        if (rc < 0)
            break;
        if (rev & POLLNVAL) {
            rc = -EBADF;
            break;
        }
        rc = 0;
        if ((events & CO_READABLE) && (rev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
            rc |= CO_READABLE;
        if ((events & CO_WRITABLE) && (rev & (POLLOUT | POLLHUP | POLLERR)))
            rc |= CO_WRITABLE;
        if (rc)
            break;
        /* Before parking: the number may have been closed with close(2)
         * and given to a new file (a library reconnecting), which the
         * poller has never seen and would never report. The check
         * registers it; its first edge is then the current state. */
        int e = co__np_ensure(fd);
        if (CO_UNLIKELY(e != 0)) {
            if (e < 0 && e != -EPERM) {
                rc = e;
                break;
            }
            /* a new file: what the slot knew was the old one's */
            co__lock(&pd->lock);
            __atomic_store_n(&pd->kind, e == -EPERM ? CO__PD_PLAIN : CO__PD_UNKNOWN,
                             __ATOMIC_RELEASE);
            __atomic_store_n(&pd->rdrained, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&pd->hup, 0, __ATOMIC_RELAXED);
            co__unlock(&pd->lock);
            if (e == -EPERM)
                continue;
        }
        rc = co__pd_wait(pd, modes, rs, ws, deadline);
        if (rc < 0)
            break;
    }
    op_exit(pd, held);
    return rc;
}

/* ---- the door for the layers above (io.h) -------------------------------- */

/* The door's two calls check their arguments, then enter the fd's
 * operation (pd_enter): 0, or the error to return. */
static int door_enter(int fd, int how, co__io_fn fn, co__pd_t **pd, bool *held) {
    if (fd < 0)
        return -EBADF;
    if (!fn || !(how & (CO__IO_READ | CO__IO_WRITE)))
        return CO_EINVAL;
    return pd_enter(fd, pd, held);
}

ssize_t co__io_op(int fd, int how, co__io_fn fn, void *arg, int64_t deadline) {
    co__pd_t *pd;
    bool held;
    int rc = door_enter(fd, how, fn, &pd, &held);
    if (rc < 0)
        return rc;
    bool wl = how & CO__IO_WLOCK;
    if (wl && (rc = wlock_take(pd, deadline)) < 0) {
        op_exit(pd, held);
        return rc;
    }
    bool wr = how & CO__IO_WRITE;
    ssize_t n;
    for (;;) {
        uint32_t seq = __atomic_load_n(wr ? &pd->wseq : &pd->rseq, __ATOMIC_ACQUIRE);
        n = fn(fd, arg);
        if (n >= 0)
            break;
        if (n == -EINTR)
            continue;
        if (!again(n) || pd_plain(pd))
            break;
        int w = co__pd_wait(pd, wr ? CO__PD_WRITE : CO__PD_READ, wr ? 0 : seq, wr ? seq : 0,
                            deadline);
        if (w < 0) {
            n = w;
            break;
        }
        if (wl && CO_UNLIKELY(wlock_closed(pd))) {
            n = CO_ECLOSED;
            break;
        }
    }
    if (wl)
        wlock_give(pd);
    op_exit(pd, held);
    return n;
}

/* co__io_hooked's deadline, timeo ns after the first call that needs it:
 * a call that never waits reads no clock */
static inline int64_t lazy_deadline(int64_t *deadline, bool *known, int64_t timeo) {
    if (!*known) {
        *deadline = co_deadline_after(timeo);
        *known = true;
    }
    return *deadline;
}

ssize_t co__io_hooked(int fd, int how, co__io_fn fn, void *arg, int64_t timeo, size_t rdlen) {
    co__pd_t *pd;
    bool held;
    /* CO_ECLOSED: this file is being closed (the hook's close returns
     * only once co_fd_forget has seen its last operation out, so the
     * number cannot name a new file yet) */
    int rc = door_enter(fd, how, fn, &pd, &held);
    if (rc < 0)
        return rc;
    bool rd = how & CO__IO_READ, wr = how & CO__IO_WRITE;
    int modes = (rd ? CO__PD_READ : 0) | (wr ? CO__PD_WRITE : 0);
    int64_t deadline = CO_FOREVER; /* lazy_deadline's */
    bool dl_known = timeo <= 0;
    ssize_t n;
    bool skip = (how & CO__IO_NEEDS_INPUT) && rd && !wr;
    for (;;) {
        uint32_t rs = rd ? __atomic_load_n(&pd->rseq, __ATOMIC_ACQUIRE) : 0;
        uint32_t ws = wr ? __atomic_load_n(&pd->wseq, __ATOMIC_ACQUIRE) : 0;
        /* co_read's skip: after a short read at this edge count, wait for
         * the next edge instead of trying (skip: modes is READ alone) */
        if (skip && drained_at(pd, rs) && !pd_plain(pd) &&
            edge_wait_pays(lazy_deadline(&deadline, &dl_known, timeo))) {
            __atomic_store_n(&pd->rdrained, 0, __ATOMIC_RELAXED); /* one skip per short read */
        } else {
            n = fn(fd, arg);
            if (rdlen && n > 0 && (size_t)n < rdlen && __atomic_load_n(&pd->stream, __ATOMIC_RELAXED))
                __atomic_store_n(&pd->rdrained, rs + 1, __ATOMIC_RELAXED);
            if (n >= 0 || !again(n) || pd_plain(pd))
                break;
        }
        /* No poll(2) and no epoll_ctl: the edge count was loaded before
         * fn's system call, and the number still names the file that
         * pd_enter set up (the hook retires a number before its close). */
        int w = co__pd_wait(pd, modes, rs, ws, lazy_deadline(&deadline, &dl_known, timeo));
        if (w < 0) {
            n = w;
            break;
        }
    }
    op_exit(pd, held);
    return n;
}

uint32_t co__io_rseq(int fd) {
    co__pd_t *pd = fd >= 0 ? co__pd_peek(fd) : NULL;
    if (!pd || !__atomic_load_n(&pd->stream, __ATOMIC_RELAXED) ||
        __atomic_load_n(&pd->kind, __ATOMIC_ACQUIRE) != CO__PD_POLLED)
        return UINT32_MAX;
    /* acquire: as co_read's load before its read */
    return __atomic_load_n(&pd->rseq, __ATOMIC_ACQUIRE);
}

void co__io_read_short(int fd, uint32_t rs) {
    co__pd_t *pd = rs != UINT32_MAX && fd >= 0 ? co__pd_peek(fd) : NULL;
    if (pd) __atomic_store_n(&pd->rdrained, rs + 1, __ATOMIC_RELAXED);
}

void co__io_fresh(int fd) {
    co__pd_t *pd = fd >= 0 ? co__pd_peek(fd) : NULL;
    if (!pd)
        return;
    co__lock(&pd->lock);
    __atomic_store_n(&pd->kind, CO__PD_UNKNOWN, __ATOMIC_RELEASE);
    co__unlock(&pd->lock);
}

void co__io_adopt(int fd, bool tcp) {
    if (co__ensure_init() < 0)
        return;
    co__pd_t *pd = co__pd_get(fd);
    if (!pd)
        return;
    co__lock(&pd->lock);
    __atomic_store_n(&pd->is_sock, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&pd->stream, tcp, __ATOMIC_RELAXED);
    __atomic_store_n(&pd->rdrained, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pd->hup, 0, __ATOMIC_RELAXED);
    int rc = co__np_register(fd);
    __atomic_store_n(&pd->kind, rc == 0 ? CO__PD_POLLED : CO__PD_UNKNOWN, __ATOMIC_RELEASE);
    co__unlock(&pd->lock);
}
