/*
 * libcolony_hook.so: the blocking socket, pipe and sleep calls of foreign
 * code, made to park the calling coroutine instead of its thread.
 * LD_PRELOAD it into a program linked with colony's shared library; each
 * call below finds libc's own with dlsym(RTLD_NEXT).
 *
 * Which calls change, and how (docs/hook.md):
 *  - On a plain thread, and for an fd that is not a socket or a pipe, a
 *    call is libc's. The hook looks at an fd the first time a coroutine
 *    uses it (fstat); a socket or pipe is then "hooked": O_NONBLOCK is set
 *    in the kernel, and the program's own view of that flag (user_nb) is
 *    kept here and shown by fcntl(F_GETFL).
 *  - A hooked fd's read, write & co: the call is tried; on EAGAIN, a
 *    program that set O_NONBLOCK itself (or passed MSG_DONTWAIT) gets
 *    EAGAIN, as from libc; otherwise a coroutine parks in the io layer's
 *    wait (co__io_hooked: on the edge count loaded before the try; with
 *    COLONY_HOOK_PIN=1, co_wait_fd) until the fd is ready or the
 *    SO_RCVTIMEO / SO_SNDTIMEO deadline passes (then EAGAIN, as libc),
 *    and a plain thread waits in poll(2) the same way (its blocking view
 *    of the fd stays libc's).
 *  - close and dup2/dup3 over a hooked fd retire it (co_fd_forget) before
 *    the number can name another file; socket, accept and dup give a
 *    number a fresh entry.
 *  - sleep, usleep, nanosleep in a coroutine are co_sleep_until.
 *  - a coroutine that parked comes back to its thread before the call
 *    returns, for foreign code that caches &errno or the address of a
 *    thread-local across a call ($COLONY_HOOK_MIGRATE=1: not;
 *    $COLONY_HOOK_PIN=1: it holds its thread instead; see co_wait below).
 *  - poll parks (one fd: the io layer's wait; several: a private epoll
 *    set in co_wait_fd); select runs
 *    inside co_blocking (a thread held, within its cap).
 * The program's errno is set after the coroutine is back on its thread.
 */
#include <colony.h>

#include "io/io.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HOOK_API __attribute__((visibility("default")))

/* ---- libc's calls ---------------------------------------------------------- */

static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static int (*real_socket)(int, int, int);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_fcntl)(int, int, ...);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
static int (*real_poll)(struct pollfd *, nfds_t, int);
static int (*real_select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
static unsigned (*real_sleep)(unsigned);
static int (*real_usleep)(useconds_t);
static int (*real_nanosleep)(const struct timespec *, struct timespec *);

/* Resolved once, on the first hooked call of any thread; a race only
 * stores the same pointers twice. */
static void resolve(void) {
#define R(name) __atomic_store_n((void **)&real_##name, dlsym(RTLD_NEXT, #name), __ATOMIC_RELAXED)
    R(read); R(write); R(readv); R(writev); R(recv); R(recvfrom); R(recvmsg);
    R(send); R(sendto); R(sendmsg); R(socket); R(connect); R(accept); R(accept4);
    R(close); R(dup); R(dup2); R(dup3); R(fcntl); R(setsockopt); R(poll); R(select);
    R(sleep); R(usleep); R(nanosleep);
#undef R
}
static int resolved; /* atomic: 1 once resolve() ran (release/acquire) */
#define REAL(name)                                                                  \
    (CO_LIKELY_(__atomic_load_n(&resolved, __ATOMIC_ACQUIRE)) ? real_##name            \
                                                               : (resolve_once(), real_##name))
#define CO_LIKELY_(x) __builtin_expect(!!(x), 1)
static void resolve_once(void) {
    resolve();
    __atomic_store_n(&resolved, 1, __ATOMIC_RELEASE);
}

/* ---- what the hook knows of each fd ---------------------------------------- */

enum { FD_UNKNOWN = 0, FD_PLAIN = 1, FD_HOOKED = 2 };
#define HOOK_NFD 65536 /* numbers above are left to libc */
typedef struct {
    uint8_t kind;    /* FD_*; atomic relaxed: set by the first coroutine use, reset
                        by close/dup/socket/accept of that number */
    uint8_t user_nb; /* atomic relaxed: the program's own O_NONBLOCK */
    uint8_t made;    /* atomic relaxed: made by socket/accept here (or a dup of one) */
    uint8_t stdio;   /* atomic relaxed: a copy (dup) of 0, 1 or 2 not made here: libc's */
    int64_t rcvtimeo, sndtimeo; /* atomic relaxed: ns, 0 = none */
} hfd_t;
static hfd_t fds[HOOK_NFD];

static hfd_t *hfd(int fd) { return fd >= 0 && fd < HOOK_NFD ? &fds[fd] : NULL; }

static void hfd_reset(int fd) {
    hfd_t *h = hfd(fd);
    if (!h) return;
    __atomic_store_n(&h->kind, FD_UNKNOWN, __ATOMIC_RELAXED);
    __atomic_store_n(&h->user_nb, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->made, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->stdio, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->rcvtimeo, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->sndtimeo, 0, __ATOMIC_RELAXED);
}

/* fd was just made by socket or accept in this process: its file is this
 * process's own (see hooked: 0, 1 and 2 otherwise stay libc's) */
static void hfd_made(int fd) {
    hfd_reset(fd);
    hfd_t *h = hfd(fd);
    if (h) __atomic_store_n(&h->made, 1, __ATOMIC_RELAXED);
}

/* nfd now names the same open file as fd (a dup): the same record, so
 * the program's own O_NONBLOCK is not read from the kernel's flag, which
 * the hook set (SO_RCVTIMEO/SO_SNDTIMEO belong to the file too). */
static void hfd_copy(int fd, int nfd) {
    hfd_t *h = hfd(fd), *n = hfd(nfd);
    if (!n) return;
    if (!h || __atomic_load_n(&h->kind, __ATOMIC_RELAXED) != FD_HOOKED) {
        /* not hooked: what the number's file is to the hook goes along
         * (a socket made here; a standard fd's shared file) */
        bool made = h && __atomic_load_n(&h->made, __ATOMIC_RELAXED);
        bool std = h && (__atomic_load_n(&h->stdio, __ATOMIC_RELAXED) || (fd <= 2 && !made));
        hfd_reset(nfd);
        __atomic_store_n(&n->made, made, __ATOMIC_RELAXED);
        __atomic_store_n(&n->stdio, std, __ATOMIC_RELAXED);
        return;
    }
    __atomic_store_n(&n->kind, FD_UNKNOWN, __ATOMIC_RELAXED);
    __atomic_store_n(&n->user_nb, __atomic_load_n(&h->user_nb, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_store_n(&n->made, 1, __ATOMIC_RELAXED); /* a hooked file, O_NONBLOCK already */
    __atomic_store_n(&n->rcvtimeo, __atomic_load_n(&h->rcvtimeo, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_store_n(&n->sndtimeo, __atomic_load_n(&h->sndtimeo, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    co__io_fresh(nfd); /* what the io layer's slot remembers is a former file's */
    __atomic_store_n(&n->kind, FD_HOOKED, __ATOMIC_RELAXED);
}

/* A coroutine that can park here. Not inside co_blocking's fn (the hook's
 * own or the program's): there colony's waits block the thread and call
 * libc's sleeps and polls themselves, which must then be libc's. */
static bool in_coroutine(void) { return co_parkable(); }

/* errno of the thread the caller runs on NOW. glibc declares
 * __errno_location const, so within one function (and what is inlined
 * into it) the compiler may reuse the address it got before a park, i.e.
 * another thread's errno: every errno access in this file goes through
 * these two. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HOOK_NO_TSAN __attribute__((no_sanitize("thread")))
#endif
#endif
#ifndef HOOK_NO_TSAN
#define HOOK_NO_TSAN
#endif
/* Not instrumented under TSan: errno belongs to whichever coroutine runs
 * on the thread (the race detector gives each coroutine a fiber of its
 * own, and libc's own errno stores are not instrumented either). */
static __attribute__((noinline)) HOOK_NO_TSAN void set_errno(int e) { errno = e; }
static __attribute__((noinline)) HOOK_NO_TSAN int get_errno(void) { return errno; }


/* The fd's entry if it is hooked. A coroutine's first use of an unknown
 * fd decides: a socket or a pipe is hooked (made O_NONBLOCK in the kernel),
 * anything else (or an fd beyond the table) is libc's. So are 0, 1 and 2
 * unless socket or accept made them here, and their copies (dup, dup2,
 * F_DUPFD, whatever the new number): standard input and output are
 * mostly files shared with other processes (a shell's pipe), which
 * O_NONBLOCK on the shared file would reach. A socket's SO_RCVTIMEO and
 * SO_SNDTIMEO are read from the kernel then (an accepted socket has its
 * listener's; an inherited one, its maker's). */
static hfd_t *hooked(int fd, bool co) {
    hfd_t *h = hfd(fd);
    if (!h) return NULL;
    uint8_t k = __atomic_load_n(&h->kind, __ATOMIC_RELAXED);
    if (k == FD_HOOKED) return h;
    if (k == FD_PLAIN || !co) return NULL;
    struct stat st;
    int e = get_errno();
    if ((fd <= 2 && !__atomic_load_n(&h->made, __ATOMIC_RELAXED)) ||
        __atomic_load_n(&h->stdio, __ATOMIC_RELAXED) || fstat(fd, &st) < 0 ||
        !(S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode))) {
        if (fd <= 2 || __atomic_load_n(&h->stdio, __ATOMIC_RELAXED) || get_errno() != EBADF)
            __atomic_store_n(&h->kind, FD_PLAIN, __ATOMIC_RELAXED);
        set_errno(e);
        return NULL;
    }
    if (S_ISSOCK(st.st_mode)) {
        struct timeval tv;
        socklen_t l = sizeof tv;
        if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &l) == 0 && l >= sizeof tv)
            __atomic_store_n(&h->rcvtimeo, (int64_t)tv.tv_sec * 1000000000 + tv.tv_usec * 1000,
                             __ATOMIC_RELAXED);
        l = sizeof tv;
        if (getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &l) == 0 && l >= sizeof tv)
            __atomic_store_n(&h->sndtimeo, (int64_t)tv.tv_sec * 1000000000 + tv.tv_usec * 1000,
                             __ATOMIC_RELAXED);
    }
    int fl = REAL(fcntl)(fd, F_GETFL);
    if (fl < 0 || (!(fl & O_NONBLOCK) && REAL(fcntl)(fd, F_SETFL, fl | O_NONBLOCK) < 0)) {
        set_errno(e);
        return NULL;
    }
    __atomic_store_n(&h->user_nb, (fl & O_NONBLOCK) != 0, __ATOMIC_RELAXED);
    /* The number names a new file for the hook: whatever the io layer's
     * slot remembers of it is a former file's (co__io_hooked's waits
     * trust the slot's set-up). */
    co__io_fresh(fd);
    __atomic_store_n(&h->kind, FD_HOOKED, __ATOMIC_RELAXED);
    set_errno(e);
    return h;
}

/* ---- where a coroutine waits ----------------------------------------------
 * By default it parks, and comes back to the thread it parked on before
 * the hook returns (co_thread_return): its thread runs other coroutines
 * meanwhile, and foreign code that took &errno or the address of a
 * thread-local before the call finds the right thread after it. Read once:
 *  - $COLONY_HOOK_MIGRATE=1: it may resume on any thread (cheaper; only
 *    for code that keeps no thread-local address across a call);
 *  - $COLONY_HOOK_PIN=1: every wait runs inside co_blocking_on_thread: the
 *    coroutine holds its thread while it waits (its P goes to another
 *    thread meanwhile), a thread per waiting coroutine, beyond
 *    co_blocking's cap if need be. */
enum { MODE_UNREAD = -1, MODE_HOME, MODE_MIGRATE, MODE_PIN };
static int wait_mode = MODE_UNREAD; /* atomic relaxed: read once from the environment */
static int mode(void) {
    int m = __atomic_load_n(&wait_mode, __ATOMIC_RELAXED);
    if (m == MODE_UNREAD) {
        const char *pin = getenv("COLONY_HOOK_PIN"), *mig = getenv("COLONY_HOOK_MIGRATE");
        m = pin && pin[0] == '1' ? MODE_PIN : mig && mig[0] == '1' ? MODE_MIGRATE : MODE_HOME;
        __atomic_store_n(&wait_mode, m, __ATOMIC_RELAXED);
    }
    return m;
}
struct wait_args {
    int fd, ev;
    int64_t deadline;
    int r;
};
static void wait_in_thread(void *arg) {
    struct wait_args *a = arg;
    a->r = a->fd >= 0 ? co_wait_fd(a->fd, a->ev, a->deadline) : co_sleep_until(a->deadline);
}
/* co_wait_fd (fd >= 0) or co_sleep_until (fd < 0), back on this thread
 * after it unless MODE_MIGRATE */
static int co_wait(int fd, int ev, int64_t deadline) {
    int m = mode();
    if (m == MODE_PIN) {
        struct wait_args a = {fd, ev, deadline, 0};
        co_blocking_on_thread(wait_in_thread, &a);
        return a.r;
    }
    void *home = m == MODE_HOME ? co_thread_home() : NULL;
    int r = fd >= 0 ? co_wait_fd(fd, ev, deadline) : co_sleep_until(deadline);
    co_thread_return(home);
    return r;
}

/* fn(arg) in co_blocking, back on this thread after it unless
 * MODE_MIGRATE: co_blocking may park the coroutine (its cap reached, or
 * no P free when fn returns) and resume it on another thread. MODE_PIN:
 * co_blocking_on_thread, which never leaves the thread. */
static void blocking_call(void (*fn)(void *), void *arg) {
    int m = mode();
    if (m == MODE_PIN) {
        co_blocking_on_thread(fn, arg);
        return;
    }
    void *home = m == MODE_HOME ? co_thread_home() : NULL;
    co_blocking(fn, arg);
    co_thread_return(home);
}

/* Wait until fd is ready for `ev` (CO_READABLE / CO_WRITABLE) or timeo ns
 * (0: none) pass. 0 when ready (retry the call), else the errno to fail
 * with: EAGAIN on the timeout (libc's answer for SO_RCVTIMEO/SO_SNDTIMEO),
 * EBADF if the fd was closed meanwhile. */
static int wait_fd(int fd, int ev, int64_t timeo, bool co) {
    if (co) {
        int64_t dl = timeo > 0 ? co_deadline_after(timeo) : CO_FOREVER;
        int r = co_wait(fd, ev, dl);
        if (r > 0) return 0;
        if (r == CO_ETIMEDOUT) return EAGAIN;
        if (r == CO_ECLOSED) return EBADF;
        return r < 0 && r > -4096 ? -r : EIO;
    }
    struct pollfd p = {.fd = fd, .events = (short)((ev & CO_READABLE ? POLLIN : 0) |
                                                   (ev & CO_WRITABLE ? POLLOUT : 0))};
    /* a deadline, not a length: a signal's EINTR does not start it over */
    int64_t dl = timeo > 0 ? co_deadline_after(timeo) : CO_FOREVER;
    for (;;) {
        int ms = -1;
        if (dl != CO_FOREVER) {
            int64_t left = dl - co_now();
            if (left <= 0) return EAGAIN;
            int64_t m = (left + 999999) / 1000000;
            ms = m > INT32_MAX ? INT32_MAX : (int)m;
        }
        int r = REAL(poll)(&p, 1, ms);
        if (r > 0) return (p.revents & POLLNVAL) ? EBADF : 0;
        if (r == 0 && dl != CO_FOREVER && co_now() >= dl) return EAGAIN;
        if (r < 0 && get_errno() != EINTR) return get_errno();
    }
}

/* A hooked fd's blocking call from a coroutine that may park (not
 * pinned): through the io layer (co__io_hooked), which loads the fd's edge
 * count before the call and, on EAGAIN, parks until an edge newer than
 * that: no poll(2) and no epoll_ctl per wait. fn is libc's call (its
 * -errno read right after it). Back on its own thread before it returns
 * unless MODE_MIGRATE. r or -1 with errno, as libc. */
static ssize_t io_call(int fd, int how, int64_t timeo, co__io_fn fn, void *arg, size_t rdlen) {
    void *home = mode() == MODE_HOME ? co_thread_home() : NULL;
    ssize_t r = co__io_hooked(fd, how, fn, arg, timeo, rdlen);
    co_thread_return(home);
    if (r >= 0) return r;
    /* CO_ETIMEDOUT: libc's answer for SO_RCVTIMEO / SO_SNDTIMEO; CO_ECLOSED:
     * the fd was closed meanwhile */
    set_errno(r == CO_ETIMEDOUT ? EAGAIN : r == CO_ECLOSED ? EBADF : r == CO_ENOMEM ? ENOMEM
              : r > -4096 ? (int)-r : EIO);
    return -1;
}

/* libc's calls as co__io_hooked's fn: one call, -errno on failure. */
struct xargs {
    void *b;
    size_t n;
    int fl, cnt;
    void *a, *al;
};
#define XFN(name, expr)                                   \
    static ssize_t x_##name(int fd, void *arg) {          \
        struct xargs *x = arg;                            \
        ssize_t r = (expr);                               \
        return r < 0 ? -(ssize_t)get_errno() : r;         \
    }
XFN(read, REAL(read)(fd, x->b, x->n))
XFN(write, REAL(write)(fd, x->b, x->n))
XFN(readv, REAL(readv)(fd, x->b, x->cnt))
XFN(writev, REAL(writev)(fd, x->b, x->cnt))
XFN(recv, REAL(recv)(fd, x->b, x->n, x->fl))
XFN(recvfrom, REAL(recvfrom)(fd, x->b, x->n, x->fl, x->a, x->al))
XFN(recvmsg, REAL(recvmsg)(fd, x->b, x->fl))
XFN(send, REAL(send)(fd, x->b, x->n, x->fl))
XFN(sendto, REAL(sendto)(fd, x->b, x->n, x->fl, x->a, (socklen_t)x->cnt))
XFN(sendmsg, REAL(sendmsg)(fd, x->b, x->fl))
#undef XFN

/* The shape of every hooked data call: on a plain thread, a pinned
 * coroutine or an fd not hooked, try it; on EAGAIN on a hooked fd the
 * program did not make non-blocking, wait and try again. A coroutine that
 * may park goes through io_call instead (the same answers); there a read
 * passes rdlen (what it asks for, 0 for a peek) and a read that needs
 * input (asks for n > 0 bytes) CO__IO_NEEDS_INPUT: a request/response
 * stream then spends no read(2) on EAGAIN after a short read (io.h). */
/* (left: the rest of a whole transfer's budget in ns, or -1 for the fd's
 * own timeout: each part of one call counts against one budget, as the
 * kernel's blocking calls count SO_RCVTIMEO/SO_SNDTIMEO) */
#define HOOK_TIMEO(h, timeo_field) \
    (left >= 0 ? left : __atomic_load_n(&(h)->timeo_field, __ATOMIC_RELAXED))
#define HOOK_IO(fd, ev, dontwait, timeo_field, call, xfn, needs_input, rdlen, ...)      \
    do {                                                                               \
        bool co_ = in_coroutine();                                                     \
        hfd_t *h_ = hooked(fd, co_);                                                   \
        if (h_ && co_ && !(dontwait) && !__atomic_load_n(&h_->user_nb, __ATOMIC_RELAXED) && \
            mode() != MODE_PIN) {                                                      \
            struct xargs x_ = {__VA_ARGS__};                                           \
            return io_call(fd,                                                         \
                           ((ev) == CO_READABLE ? CO__IO_READ : CO__IO_WRITE) |        \
                               ((needs_input) ? CO__IO_NEEDS_INPUT : 0),              \
                           HOOK_TIMEO(h_, timeo_field), xfn, &x_, (rdlen));           \
        }                                                                              \
        for (;;) {                                                                     \
            /* the program's own non-blocking read: a short one noted */              \
            size_t rl_ = (rdlen);                                                      \
            uint32_t rs_ = h_ && co_ && rl_ ? co__io_rseq(fd) : UINT32_MAX;            \
            ssize_t r_ = (call);                                                       \
            if (rs_ != UINT32_MAX && r_ > 0 && (size_t)r_ < rl_)                       \
                co__io_read_short(fd, rs_);                                            \
            int er_ = r_ < 0 ? get_errno() : 0;                                        \
            if (r_ >= 0 || !h_ || (er_ != EAGAIN && er_ != EWOULDBLOCK) ||             \
                (dontwait) || __atomic_load_n(&h_->user_nb, __ATOMIC_RELAXED))         \
                return r_;                                                             \
            int e_ = wait_fd(fd, ev, HOOK_TIMEO(h_, timeo_field), co_);                \
            if (e_) {                                                                  \
                set_errno(e_);                                                         \
                return -1;                                                             \
            }                                                                          \
        }                                                                              \
    } while (0)

HOOK_API ssize_t read(int fd, void *buf, size_t n) {
    const int64_t left = -1;
    HOOK_IO(fd, CO_READABLE, false, rcvtimeo, REAL(read)(fd, buf, n), x_read, n > 0, n, .b = buf, .n = n);
}
static ssize_t write_1(int fd, const void *buf, size_t n, int64_t left) {
    HOOK_IO(fd, CO_WRITABLE, false, sndtimeo, REAL(write)(fd, buf, n), x_write, false, 0,
            .b = (void *)buf, .n = n);
}
HOOK_API ssize_t readv(int fd, const struct iovec *iov, int cnt) {
    const int64_t left = -1;
    HOOK_IO(fd, CO_READABLE, false, rcvtimeo, REAL(readv)(fd, iov, cnt),
            x_readv, false, 0, .b = (void *)iov, .cnt = cnt);
}
static ssize_t writev_1(int fd, const struct iovec *iov, int cnt, int64_t left) {
    HOOK_IO(fd, CO_WRITABLE, false, sndtimeo, REAL(writev)(fd, iov, cnt), x_writev, false, 0,
            .b = (void *)iov, .cnt = cnt);
}
static ssize_t recv_1(int fd, void *buf, size_t n, int fl, int64_t left) {
    HOOK_IO(fd, CO_READABLE, fl & MSG_DONTWAIT, rcvtimeo,
            REAL(recv)(fd, buf, n, fl), x_recv, n > 0, fl & MSG_PEEK ? 0 : n, .b = buf, .n = n, .fl = fl);
}
static ssize_t recvfrom_1(int fd, void *buf, size_t n, int fl, struct sockaddr *a,
                          socklen_t *al, int64_t left) {
    HOOK_IO(fd, CO_READABLE, fl & MSG_DONTWAIT, rcvtimeo,
            REAL(recvfrom)(fd, buf, n, fl, a, al), x_recvfrom, n > 0,
            fl & MSG_PEEK ? 0 : n, .b = buf, .n = n, .fl = fl,
            .a = a, .al = al);
}
static ssize_t recvmsg_1(int fd, struct msghdr *m, int fl, int64_t left) {
    HOOK_IO(fd, CO_READABLE, fl & MSG_DONTWAIT, rcvtimeo,
            REAL(recvmsg)(fd, m, fl), x_recvmsg, false, 0, .b = m, .fl = fl);
}
static ssize_t send_1(int fd, const void *buf, size_t n, int fl, int64_t left) {
    HOOK_IO(fd, CO_WRITABLE, fl & MSG_DONTWAIT, sndtimeo, REAL(send)(fd, buf, n, fl), x_send, false, 0,
            .b = (void *)buf, .n = n, .fl = fl);
}
static ssize_t sendto_1(int fd, const void *buf, size_t n, int fl, const struct sockaddr *a,
                        socklen_t al, int64_t left) {
    HOOK_IO(fd, CO_WRITABLE, fl & MSG_DONTWAIT, sndtimeo, REAL(sendto)(fd, buf, n, fl, a, al),
            x_sendto, false, 0, .b = (void *)buf, .n = n, .fl = fl, .a = (void *)a, .cnt = (int)al);
}
static ssize_t sendmsg_1(int fd, const struct msghdr *m, int fl, int64_t left) {
    HOOK_IO(fd, CO_WRITABLE, fl & MSG_DONTWAIT, sndtimeo, REAL(sendmsg)(fd, m, fl), x_sendmsg, false, 0,
            .b = (void *)m, .fl = fl);
}

/* ---- whole transfers -------------------------------------------------------
 * The kernel's file of a hooked fd is O_NONBLOCK, where a write stops at
 * what fits and MSG_WAITALL at what has come. A program that sees the fd
 * as blocking (no O_NONBLOCK of its own, no MSG_DONTWAIT) gets libc's
 * blocking answer instead: the rest is written (or, for MSG_WAITALL on a
 * stream socket, read) after a wait, until all of it is done, end of file
 * or an error or timeout, which then answer the count done so far. */
static bool whole(int fd, int fl) {
    hfd_t *h = hfd(fd);
    return h && __atomic_load_n(&h->kind, __ATOMIC_RELAXED) == FD_HOOKED &&
           !__atomic_load_n(&h->user_nb, __ATOMIC_RELAXED) && !(fl & MSG_DONTWAIT);
}
static bool stream_socket(int fd) {
    int t = 0;
    socklen_t l = sizeof t;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &l) == 0 && t == SOCK_STREAM;
}
static bool is_socket(int fd) {
    int t = 0;
    socklen_t l = sizeof t;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &l) == 0;
}

/* One call's budget: the fd's SO_RCVTIMEO/SO_SNDTIMEO from now, as a
 * deadline (CO_FOREVER: none); then what is left of it for each later
 * part (-1: none; 0: spent, the transfer stops with what it has). */
static int64_t budget_start(int fd, bool snd) {
    hfd_t *h = hfd(fd);
    int64_t t = h ? __atomic_load_n(snd ? &h->sndtimeo : &h->rcvtimeo, __ATOMIC_RELAXED) : 0;
    return t > 0 ? co_deadline_after(t) : CO_FOREVER;
}
static int64_t budget_left(int64_t dl) {
    if (dl == CO_FOREVER) return -1;
    int64_t l = dl - co_now();
    return l > 0 ? l : 0;
}

/* What is left of iov[0..cnt) past its first `done` bytes, into v (cnt
 * entries at most); the number of entries. */
static int iov_rest(const struct iovec *iov, int cnt, size_t done, struct iovec *v) {
    int k = 0;
    for (int i = 0; i < cnt; i++) {
        if (done >= iov[i].iov_len) {
            done -= iov[i].iov_len;
            continue;
        }
        v[k].iov_base = (char *)iov[i].iov_base + done;
        v[k].iov_len = iov[i].iov_len - done;
        done = 0;
        k++;
    }
    return k;
}
static size_t iov_total(const struct iovec *iov, int cnt) {
    size_t t = 0;
    for (int i = 0; i < cnt; i++) t += iov[i].iov_len;
    return t;
}

/* The rest of a vectored transfer that did `done` bytes of iov: writev
 * (how 0: sent with sendmsg on a socket), sendmsg (1) with m0's address,
 * or recvmsg (2), with flags fl. Later sends carry MSG_NOSIGNAL: a peer
 * gone part-way answers the count so far, as libc's one call does, not a
 * SIGPIPE. Ancillary data goes with the first part only; a receive stops
 * at the first part that brings any (the kernel's MSG_WAITALL stops at
 * passed descriptors too), into the control space left, and ORs its
 * msg_flags into m0's. */
static ssize_t iov_whole(int fd, int how, struct msghdr *m0, const struct iovec *iov, int cnt,
                         size_t done, int fl, int64_t dl, size_t ccap) {
    size_t total = iov_total(iov, cnt);
    struct iovec small[16], *v = cnt <= 16 ? small : malloc((size_t)cnt * sizeof *v);
    if (!v) return (ssize_t)done;
    bool sock = how != 0 || is_socket(fd);
    while (done < total) {
        int64_t left = budget_left(dl);
        if (left == 0) break;
        int k = iov_rest(iov, cnt, done, v);
        struct msghdr m = {0};
        m.msg_iov = v;
        m.msg_iovlen = (size_t)k;
        ssize_t r;
        if (how == 2) {
            m.msg_control = m0->msg_control; /* the caller's space, unused so far */
            m.msg_controllen = ccap;
            r = recvmsg_1(fd, &m, fl, left);
            if (r > 0) {
                m0->msg_flags |= m.msg_flags;
                m0->msg_controllen = m.msg_controllen;
                if (m.msg_controllen > 0) { /* ancillary data: it ends here */
                    done += (size_t)r;
                    break;
                }
            }
        } else if (sock) {
            if (how == 1 && m0) {
                m.msg_name = m0->msg_name;
                m.msg_namelen = m0->msg_namelen;
            }
            r = sendmsg_1(fd, &m, fl | MSG_NOSIGNAL, left);
        } else {
            r = writev_1(fd, v, k, left);
        }
        if (r <= 0) break;
        done += (size_t)r;
    }
    if (v != small) free(v);
    return (ssize_t)done;
}

/* The rest of a byte-buffer send or write past `done` (sockets: send with
 * MSG_NOSIGNAL, as above). */
static size_t buf_whole(int fd, const char *buf, size_t n, size_t done, int fl,
                        const struct sockaddr *a, socklen_t al, bool to, int64_t dl) {
    bool sock = to || fl || is_socket(fd);
    while (done < n) {
        int64_t left = budget_left(dl);
        if (left == 0) break;
        ssize_t r = !sock ? write_1(fd, buf + done, n - done, left)
                    : to  ? sendto_1(fd, buf + done, n - done, fl | MSG_NOSIGNAL, a, al, left)
                          : send_1(fd, buf + done, n - done, fl | MSG_NOSIGNAL, left);
        if (r <= 0) break;
        done += (size_t)r;
    }
    return done;
}

HOOK_API ssize_t write(int fd, const void *buf, size_t n) {
    int64_t dl = budget_start(fd, true);
    ssize_t r = write_1(fd, buf, n, -1);
    if (r <= 0 || (size_t)r >= n || !whole(fd, 0)) return r;
    return (ssize_t)buf_whole(fd, buf, n, (size_t)r, 0, NULL, 0, false, dl);
}
HOOK_API ssize_t send(int fd, const void *buf, size_t n, int fl) {
    int64_t dl = budget_start(fd, true);
    ssize_t r = send_1(fd, buf, n, fl, -1);
    if (r <= 0 || (size_t)r >= n || !whole(fd, fl)) return r;
    return (ssize_t)buf_whole(fd, buf, n, (size_t)r, fl, NULL, 0, false, dl);
}
HOOK_API ssize_t sendto(int fd, const void *buf, size_t n, int fl, const struct sockaddr *a,
                        socklen_t al) {
    int64_t dl = budget_start(fd, true);
    ssize_t r = sendto_1(fd, buf, n, fl, a, al, -1);
    if (r <= 0 || (size_t)r >= n || !whole(fd, fl)) return r;
    return (ssize_t)buf_whole(fd, buf, n, (size_t)r, fl, a, al, true, dl);
}
HOOK_API ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    int64_t dl = budget_start(fd, true);
    ssize_t r = writev_1(fd, iov, cnt, -1);
    if (r <= 0 || !whole(fd, 0) || (size_t)r >= iov_total(iov, cnt)) return r;
    return iov_whole(fd, 0, NULL, iov, cnt, (size_t)r, 0, dl, 0);
}
HOOK_API ssize_t sendmsg(int fd, const struct msghdr *m, int fl) {
    int64_t dl = budget_start(fd, true);
    ssize_t r = sendmsg_1(fd, m, fl, -1);
    if (r <= 0 || !m || !whole(fd, fl) || (size_t)r >= iov_total(m->msg_iov, (int)m->msg_iovlen))
        return r;
    return iov_whole(fd, 1, (struct msghdr *)m, m->msg_iov, (int)m->msg_iovlen, (size_t)r, fl, dl, 0);
}
static bool waitall(int fd, int fl) {
    return (fl & MSG_WAITALL) && !(fl & MSG_PEEK) && whole(fd, fl) && stream_socket(fd);
}
/* The rest of a MSG_WAITALL receive whose first part brought r of n. */
static ssize_t recv_rest(int fd, char *buf, size_t n, ssize_t r, int fl, int64_t dl) {
    if (r <= 0 || (size_t)r >= n || !waitall(fd, fl)) return r;
    size_t done = (size_t)r;
    int64_t left;
    while (done < n && (left = budget_left(dl)) != 0 &&
           (r = recv_1(fd, buf + done, n - done, fl, left)) > 0)
        done += (size_t)r;
    return (ssize_t)done;
}
HOOK_API ssize_t recv(int fd, void *buf, size_t n, int fl) {
    int64_t dl = budget_start(fd, false);
    return recv_rest(fd, buf, n, recv_1(fd, buf, n, fl, -1), fl, dl);
}
HOOK_API ssize_t recvfrom(int fd, void *buf, size_t n, int fl, struct sockaddr *a,
                          socklen_t *al) {
    int64_t dl = budget_start(fd, false);
    return recv_rest(fd, buf, n, recvfrom_1(fd, buf, n, fl, a, al, -1), fl, dl);
}
HOOK_API ssize_t recvmsg(int fd, struct msghdr *m, int fl) {
    int64_t dl = budget_start(fd, false);
    size_t ccap = m ? m->msg_controllen : 0; /* the call sets it to what it used */
    ssize_t r = recvmsg_1(fd, m, fl, -1);
    /* a part that brought ancillary data ends it (see iov_whole) */
    if (r <= 0 || !m || m->msg_controllen > 0 || !waitall(fd, fl) ||
        (size_t)r >= iov_total(m->msg_iov, (int)m->msg_iovlen))
        return r;
    return iov_whole(fd, 2, m, m->msg_iov, (int)m->msg_iovlen, (size_t)r, fl, dl, ccap);
}

struct accept_args {
    struct sockaddr *a;
    socklen_t *al, al0;
    int fl;
};
static ssize_t x_accept4(int fd, void *arg) {
    struct accept_args *x = arg;
    if (x->al) *x->al = x->al0;
    int r = REAL(accept4)(fd, x->a, x->al, x->fl);
    return r < 0 ? -(ssize_t)get_errno() : r;
}

HOOK_API int accept4(int fd, struct sockaddr *a, socklen_t *al, int fl) {
    int r;
    bool co = in_coroutine();
    hfd_t *h = hooked(fd, co);
    socklen_t al0 = al ? *al : 0;
    if (h && co && mode() != MODE_PIN && !__atomic_load_n(&h->user_nb, __ATOMIC_RELAXED)) {
        struct accept_args x = {a, al, al0, fl};
        r = (int)io_call(fd, CO__IO_READ, __atomic_load_n(&h->rcvtimeo, __ATOMIC_RELAXED),
                         x_accept4, &x, 0);
        if (r >= 0) hfd_made(r);
        return r;
    }
    for (;;) {
        if (al) *al = al0;
        r = REAL(accept4)(fd, a, al, fl);
        int er = r < 0 ? get_errno() : 0;
        if (r >= 0 || !h || (er != EAGAIN && er != EWOULDBLOCK) ||
            __atomic_load_n(&h->user_nb, __ATOMIC_RELAXED))
            break;
        int e = wait_fd(fd, CO_READABLE, __atomic_load_n(&h->rcvtimeo, __ATOMIC_RELAXED), co);
        if (e) {
            set_errno(e);
            return -1;
        }
    }
    if (r >= 0) hfd_made(r);
    return r;
}
HOOK_API int accept(int fd, struct sockaddr *a, socklen_t *al) { return accept4(fd, a, al, 0); }

/* A Unix stream socket's connect to a listener whose backlog is full: on
 * the hook's O_NONBLOCK file the kernel answers EAGAIN at once (not
 * EINPROGRESS), where libc's blocking connect waits for room until
 * SO_SNDTIMEO. No readiness says when room comes, so this tries again
 * after sleeps of 1 ms doubling to 32 ms (a coroutine's sleep parks it). */
static int unix_connect_wait(int fd, const struct sockaddr *a, socklen_t al, hfd_t *h, bool co) {
    int64_t timeo = __atomic_load_n(&h->sndtimeo, __ATOMIC_RELAXED);
    int64_t dl = timeo > 0 ? co_deadline_after(timeo) : CO_FOREVER;
    int64_t nap = 1000000;
    for (;;) {
        int64_t left = dl - co_now();
        if (dl != CO_FOREVER && left <= 0) {
            set_errno(EAGAIN);
            return -1;
        }
        int64_t d = dl != CO_FOREVER && left < nap ? left : nap;
        if (co) {
            co_wait(-1, 0, co_deadline_after(d));
        } else {
            struct timespec ts = {(time_t)(d / 1000000000), (long)(d % 1000000000)};
            REAL(nanosleep)(&ts, NULL);
        }
        if (nap < 32000000) nap *= 2;
        int r = REAL(connect)(fd, a, al);
        if (r == 0 || get_errno() != EAGAIN) return r;
    }
}

HOOK_API int connect(int fd, const struct sockaddr *a, socklen_t al) {
    bool co = in_coroutine();
    hfd_t *h = hooked(fd, co);
    int r = REAL(connect)(fd, a, al);
    if (r < 0 && h && get_errno() == EAGAIN && a && a->sa_family == AF_UNIX &&
        !__atomic_load_n(&h->user_nb, __ATOMIC_RELAXED))
        return unix_connect_wait(fd, a, al, h, co);
    if (r == 0 || !h || get_errno() != EINPROGRESS || __atomic_load_n(&h->user_nb, __ATOMIC_RELAXED))
        return r;
    /* in progress on a socket the program thinks blocking: wait, then
     * SO_ERROR says how it went; a timeout is libc's EINPROGRESS */
    int e = wait_fd(fd, CO_WRITABLE, __atomic_load_n(&h->sndtimeo, __ATOMIC_RELAXED), co);
    if (e) {
        set_errno(e == EAGAIN ? EINPROGRESS : e);
        return -1;
    }
    int err = 0;
    socklen_t l = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0) return -1;
    if (err) {
        set_errno(err);
        return -1;
    }
    return 0;
}

HOOK_API int socket(int dom, int type, int proto) {
    int r = REAL(socket)(dom, type, proto);
    if (r >= 0) hfd_made(r);
    return r;
}

/* The number stops naming its file: colony forgets it first (its waiters
 * get EBADF), then the entry is cleared for whatever file gets it next.
 * (Under TSan its close interceptor, which runs before ours, has recorded
 * the close already, unordered with a parked waiter's use of the number:
 * tests/tsan_hook.supp names that report.) */
static void retire(int fd) {
    hfd_t *h = hfd(fd);
    if (h && __atomic_load_n(&h->kind, __ATOMIC_RELAXED) == FD_HOOKED) {
        int e = get_errno();
        (void)co_fd_forget(fd); /* may yield: errno through the helpers */
        set_errno(e);
    }
    hfd_reset(fd);
}

HOOK_API int close(int fd) {
    retire(fd);
    return REAL(close)(fd);
}
HOOK_API int dup(int fd) {
    int r = REAL(dup)(fd);
    if (r >= 0) hfd_copy(fd, r);
    return r;
}
/* Whether dup2/dup3(fd, nfd) will replace nfd: a failure (fd not open,
 * nfd out of range) must leave nfd's file and its waiters alone. */
static bool dup_would_replace(int fd, int nfd) {
    if (fd == nfd || nfd < 0) return false;
    int e = get_errno();
    bool ok = REAL(fcntl)(fd, F_GETFD) >= 0;
    set_errno(e);
    return ok;
}
HOOK_API int dup2(int fd, int nfd) {
    if (dup_would_replace(fd, nfd)) retire(nfd);
    int r = REAL(dup2)(fd, nfd);
    if (r >= 0 && fd != nfd) hfd_copy(fd, nfd);
    return r;
}
HOOK_API int dup3(int fd, int nfd, int fl) {
    if (!(fl & ~O_CLOEXEC) && dup_would_replace(fd, nfd)) retire(nfd);
    int r = REAL(dup3)(fd, nfd, fl);
    if (r >= 0) hfd_copy(fd, nfd);
    return r;
}

/* F_GETFL shows the program's own O_NONBLOCK; F_SETFL records it and keeps
 * the kernel's set; F_DUPFD* give the copy the original's record. */
static int fcntl_impl(int fd, int cmd, va_list ap) {
    void *arg = va_arg(ap, void *);
    hfd_t *h = hfd(fd);
    bool hk = h && __atomic_load_n(&h->kind, __ATOMIC_RELAXED) == FD_HOOKED;
    if (hk && cmd == F_GETFL) {
        int r = REAL(fcntl)(fd, F_GETFL);
        if (r < 0) return r;
        return (r & ~O_NONBLOCK) | (__atomic_load_n(&h->user_nb, __ATOMIC_RELAXED) ? O_NONBLOCK : 0);
    }
    if (hk && cmd == F_SETFL) {
        int v = (int)(intptr_t)arg;
        int r = REAL(fcntl)(fd, F_SETFL, v | O_NONBLOCK);
        if (r == 0) __atomic_store_n(&h->user_nb, (v & O_NONBLOCK) != 0, __ATOMIC_RELAXED);
        return r;
    }
    int r = REAL(fcntl)(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) hfd_copy(fd, r);
    return r;
}
HOOK_API int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    int r = fcntl_impl(fd, cmd, ap);
    va_end(ap);
    return r;
}
HOOK_API int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    int r = fcntl_impl(fd, cmd, ap);
    va_end(ap);
    return r;
}

HOOK_API int setsockopt(int fd, int lvl, int name, const void *v, socklen_t l) {
    int r = REAL(setsockopt)(fd, lvl, name, v, l);
    hfd_t *h = hfd(fd);
    if (r == 0 && h && lvl == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO) && v &&
        l >= sizeof(struct timeval)) {
        const struct timeval *tv = v;
        int64_t ns = (int64_t)tv->tv_sec * 1000000000 + (int64_t)tv->tv_usec * 1000;
        if (ns < 0) ns = 0;
        __atomic_store_n(name == SO_RCVTIMEO ? &h->rcvtimeo : &h->sndtimeo, ns,
                         __ATOMIC_RELAXED);
    }
    return r;
}

/* ---- poll and select ------------------------------------------------------- */

struct poll_args {
    struct pollfd *p;
    nfds_t n;
    int ms;
    int r, err;
};
static void poll_blocking(void *arg) {
    struct poll_args *a = arg;
    a->r = REAL(poll)(a->p, a->n, a->ms);
    a->err = get_errno();
}

/* poll of several fds from a coroutine: a private epoll set of them,
 * which is itself pollable, parks the coroutine in one co_wait_fd; a poll
 * with timeout 0 then fills in revents. -2 if the set could not be made
 * (the caller falls back to co_blocking). */
static uint32_t poll_to_epoll(short ev) {
    uint32_t e = 0;
    if (ev & (POLLIN | POLLRDNORM | POLLRDBAND | POLLPRI)) e |= EPOLLIN | EPOLLPRI;
    if (ev & (POLLOUT | POLLWRNORM | POLLWRBAND)) e |= EPOLLOUT;
    if (ev & POLLRDHUP) e |= EPOLLRDHUP;
    return e;
}

static int poll_many(struct pollfd *p, nfds_t n, int ms) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return -2;
    for (nfds_t i = 0; i < n; i++) {
        if (p[i].fd < 0) continue;
        struct epoll_event e = {.events = poll_to_epoll(p[i].events), .data.u64 = i};
        int rc = epoll_ctl(ep, EPOLL_CTL_ADD, p[i].fd, &e);
        if (rc < 0 && get_errno() == EEXIST) {
            /* the fd listed again: all its entries' events (a scan only
             * for such a repeat, so a poll stays linear in its fds) */
            for (nfds_t j = 0; j < i; j++)
                if (p[j].fd == p[i].fd) e.events |= poll_to_epoll(p[j].events);
            rc = epoll_ctl(ep, EPOLL_CTL_MOD, p[i].fd, &e);
        }
        /* EPERM: a regular file (always ready, so the try before us saw it) */
        if (rc < 0 && get_errno() != EPERM) {
            REAL(close)(ep);
            return -2;
        }
    }
    int64_t dl = ms < 0 ? CO_FOREVER : co_deadline_after((int64_t)ms * 1000000);
    int r;
    for (;;) {
        int w = co_wait(ep, CO_READABLE, dl);
        r = REAL(poll)(p, n, 0);
        if (r != 0 || w == CO_ETIMEDOUT || (w < 0 && w != CO_ECLOSED)) break;
    }
    int e = get_errno();
    (void)co_fd_forget(ep); /* before its number can name another file */
    REAL(close)(ep);
    set_errno(e);
    return r;
}

/* poll of one fd with timeout 0 as co__io_hooked's fn: "not ready" is
 * -EAGAIN */
static ssize_t x_poll1(int fd, void *arg) {
    (void)fd;
    int r = REAL(poll)(arg, 1, 0);
    return r > 0 ? r : r == 0 ? -EAGAIN : -(ssize_t)get_errno();
}

HOOK_API int poll(struct pollfd *p, nfds_t n, int ms) {
    if (ms == 0 || !in_coroutine()) return REAL(poll)(p, n, ms);
    /* One hooked fd (libpq's wait, hiredis's connect): the io layer's wait,
     * a poll with timeout 0 for the exact revents after each wake. */
    if (n == 1 && p && p[0].fd >= 0 && (p[0].events & (POLLIN | POLLOUT | POLLPRI | POLLRDHUP)) &&
        mode() != MODE_PIN && hooked(p[0].fd, true)) {
        int how = (p[0].events & (POLLIN | POLLPRI | POLLRDHUP) ? CO__IO_READ : 0) |
                  (p[0].events & POLLOUT ? CO__IO_WRITE : 0);
        /* a wait for input alone (POLLERR and POLLHUP are always reported,
         * and come with an edge): after a short read, wait for the next
         * edge before the first poll (libpq's wait for its reply) */
        if (!(p[0].events & ~(POLLIN | POLLRDNORM | POLLERR | POLLHUP))) how |= CO__IO_NEEDS_INPUT;
        void *home = mode() == MODE_HOME ? co_thread_home() : NULL;
        ssize_t r = co__io_hooked(p[0].fd, how, x_poll1, p, ms < 0 ? 0 : (int64_t)ms * 1000000, 0);
        co_thread_return(home);
        if (r >= 0) return (int)r;
        if (r == CO_ETIMEDOUT) {
            p[0].revents = 0;
            return 0;
        }
        if (r > -4096) {
            set_errno((int)-r);
            return -1;
        }
        return REAL(poll)(p, 1, 0); /* closed meanwhile, say: a poll of it says what */
    }
    int r = REAL(poll)(p, n, 0);
    if (r != 0) return r;
    if (n == 1 && p[0].fd >= 0 && hooked(p[0].fd, true) &&
        (p[0].events & (POLLIN | POLLOUT | POLLPRI | POLLRDHUP))) {
        int ev = (p[0].events & (POLLIN | POLLPRI | POLLRDHUP) ? CO_READABLE : 0) |
                 (p[0].events & POLLOUT ? CO_WRITABLE : 0);
        int64_t dl = ms < 0 ? CO_FOREVER : co_deadline_after((int64_t)ms * 1000000);
        for (;;) {
            int w = co_wait(p[0].fd, ev, dl);
            r = REAL(poll)(p, 1, 0);
            if (r != 0 || w == CO_ETIMEDOUT) return r;
            if (w < 0 && w != CO_ECLOSED) return r; /* a poll of it says what */
        }
    }
    if (n > 1) {
        r = poll_many(p, n, ms);
        if (r != -2) return r;
    }
    struct poll_args a = {p, n, ms, 0, 0};
    blocking_call(poll_blocking, &a);
    set_errno(a.err);
    return a.r;
}

struct select_args {
    int n;
    fd_set *r, *w, *e;
    struct timeval *tv;
    int res, err;
};
static void select_blocking(void *arg) {
    struct select_args *a = arg;
    a->res = REAL(select)(a->n, a->r, a->w, a->e, a->tv);
    a->err = get_errno();
}
HOOK_API int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv) {
    if (!in_coroutine() || (tv && tv->tv_sec == 0 && tv->tv_usec == 0))
        return REAL(select)(n, r, w, e, tv);
    struct select_args a = {n, r, w, e, tv, 0, 0};
    blocking_call(select_blocking, &a);
    set_errno(a.err);
    return a.res;
}

/* ---- sleeps ---------------------------------------------------------------- */

HOOK_API int nanosleep(const struct timespec *req, struct timespec *rem) {
    if (!in_coroutine()) return REAL(nanosleep)(req, rem);
    if (!req || req->tv_nsec < 0 || req->tv_nsec >= 1000000000 || req->tv_sec < 0) {
        set_errno(EINVAL);
        return -1;
    }
    /* (a sleep of 31 years and more is one of 31 years: no overflow) */
    int64_t sec = req->tv_sec > 1000000000 ? 1000000000 : (int64_t)req->tv_sec;
    co_wait(-1, 0, co_deadline_after(sec * 1000000000 + req->tv_nsec));
    if (rem) rem->tv_sec = rem->tv_nsec = 0;
    return 0;
}
HOOK_API int usleep(useconds_t us) {
    if (!in_coroutine()) return REAL(usleep)(us);
    co_wait(-1, 0, co_deadline_after((int64_t)us * 1000));
    return 0;
}
HOOK_API unsigned sleep(unsigned s) {
    if (!in_coroutine()) return REAL(sleep)(s);
    co_wait(-1, 0, co_deadline_after((int64_t)s * 1000000000));
    return 0;
}

/* A program (or its test) asks dlsym(RTLD_DEFAULT, "colony_hook_active")
 * whether the hook is loaded. */
HOOK_API const int colony_hook_active = 1;
