/*
 * Datagrams, messages and vectored I/O on the netpoller: co_recvfrom,
 * co_sendto, co_recvmsg, co_sendmsg, co_recvmmsg, co_sendmmsg, co_readv, co_writev, co_sendfile.
 * Each is a system call tried under io's protocol (io/io.h: the fd's
 * reference, parking on readiness, the deadline, co_close); sends hold
 * co_write's lock, as Go's WriteTo and Writev hold the fd's write lock, so
 * that they never interleave with a co_write.
 */
#include "base/base.h"
#include "io/io.h"
#include "net/net.h"

#include <colony.h>

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define NOINL __attribute__((noinline))

typedef struct dgram {
    void *buf;
    size_t len;
    int flags;
    struct sockaddr *addr;
    socklen_t *alen;
    socklen_t alen0;
    const struct sockaddr *to;
    socklen_t tolen;
    struct msghdr *msg;
    const struct msghdr *cmsg;
    size_t ctl0;     /* recvmsg: the caller's buffer sizes, for each try */
    socklen_t name0;
} dgram_t;

static NOINL ssize_t do_recvfrom(int fd, void *arg) {
    dgram_t *d = arg;
    if (d->alen)
        *d->alen = d->alen0;
    ssize_t r = recvfrom(fd, d->buf, d->len, d->flags, d->addr, d->alen);
    return r < 0 ? -errno : r;
}

static NOINL ssize_t do_sendto(int fd, void *arg) {
    dgram_t *d = arg;
    ssize_t r = sendto(fd, d->buf, d->len, d->flags, d->to, d->tolen);
    return r < 0 ? -errno : r;
}

static NOINL ssize_t do_recvmsg(int fd, void *arg) {
    dgram_t *d = arg;
    d->msg->msg_controllen = d->ctl0;
    d->msg->msg_namelen = d->name0;
    ssize_t r = recvmsg(fd, d->msg, d->flags);
    return r < 0 ? -errno : r;
}

static NOINL ssize_t do_sendmsg(int fd, void *arg) {
    dgram_t *d = arg;
    ssize_t r = sendmsg(fd, d->cmsg, d->flags);
    return r < 0 ? -errno : r;
}

ssize_t co_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from,
                    socklen_t *fromlen, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if ((!buf && len) || len > SSIZE_MAX || (from && !fromlen))
        return CO_EINVAL;
    dgram_t d = {.buf = buf, .len = len, .flags = flags | MSG_DONTWAIT, .addr = from,
                 .alen = from ? fromlen : NULL, .alen0 = from ? *fromlen : 0};
    return co__io_op(fd, CO__IO_READ, do_recvfrom, &d, deadline);
}

ssize_t co_sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to,
                  socklen_t tolen, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if ((!buf && len) || len > SSIZE_MAX || (!to && tolen))
        return CO_EINVAL;
    dgram_t d = {.buf = (void *)buf, .len = len, .flags = flags | MSG_NOSIGNAL | MSG_DONTWAIT,
                 .to = to, .tolen = tolen};
    return co__io_op(fd, CO__IO_WRITE | CO__IO_WLOCK, do_sendto, &d, deadline);
}

/* Descriptors that arrived with a message are fresh numbers: their slots
 * forget files closed behind colony's back (as co_accept's do). */
static void fresh_rights(struct msghdr *m) {
    if (!m->msg_control || m->msg_controllen == 0)
        return;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int fds[64];
        for (size_t i = 0; i < n; i += 64) {
            size_t k = n - i < 64 ? n - i : 64;
            memcpy(fds, CMSG_DATA(c) + i * sizeof(int), k * sizeof(int));
            for (size_t j = 0; j < k; j++)
                co__io_fresh(fds[j]);
        }
    }
}

ssize_t co_recvmsg(int fd, struct msghdr *msg, int flags, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if (!msg || (!msg->msg_iov && msg->msg_iovlen) || msg->msg_iovlen > IOV_MAX)
        return CO_EINVAL;
    dgram_t d = {.msg = msg, .flags = flags | MSG_CMSG_CLOEXEC | MSG_DONTWAIT,
                 .ctl0 = msg->msg_controllen, .name0 = msg->msg_namelen};
    ssize_t r = co__io_op(fd, CO__IO_READ, do_recvmsg, &d, deadline);
    if (r >= 0 && d.ctl0)
        fresh_rights(msg);
    return r;
}

ssize_t co_sendmsg(int fd, const struct msghdr *msg, int flags, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if (!msg || (!msg->msg_iov && msg->msg_iovlen) || msg->msg_iovlen > IOV_MAX)
        return CO_EINVAL;
    dgram_t d = {.cmsg = msg, .flags = flags | MSG_NOSIGNAL | MSG_DONTWAIT};
    return co__io_op(fd, CO__IO_WRITE | CO__IO_WLOCK, do_sendmsg, &d, deadline);
}

/* ---- batches of datagrams --------------------------------------------------- */

typedef struct mm {
    struct mmsghdr *v;
    unsigned n;
    int flags;
} mm_t;

static NOINL ssize_t do_recvmmsg(int fd, void *arg) {
    mm_t *m = arg;
    int r = recvmmsg(fd, m->v, m->n, m->flags, NULL);
    return r < 0 ? -errno : r;
}

static NOINL ssize_t do_sendmmsg(int fd, void *arg) {
    mm_t *m = arg;
    int r = sendmmsg(fd, m->v, m->n, m->flags);
    return r < 0 ? -errno : r;
}

/* The kernel takes at most UIO_MAXIOV (1024) messages a call and caps a
 * larger n silently; we refuse it, so a caller's count is never cut. */
#define MMSG_MAX 1024

static int mm_check(const struct mmsghdr *v, unsigned n) {
    if (!v || n == 0 || n > MMSG_MAX)
        return CO_EINVAL;
    for (unsigned i = 0; i < n; i++)
        if ((!v[i].msg_hdr.msg_iov && v[i].msg_hdr.msg_iovlen) ||
            v[i].msg_hdr.msg_iovlen > IOV_MAX)
            return CO_EINVAL;
    return 0;
}

int co_recvmmsg(int fd, struct mmsghdr *msgs, unsigned n, int flags, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if (mm_check(msgs, n) < 0)
        return CO_EINVAL;
    /* MSG_WAITFORONE is implied by MSG_DONTWAIT: the call returns what is
     * queued, and parks only while nothing is */
    mm_t m = {.v = msgs, .n = n, .flags = flags | MSG_CMSG_CLOEXEC | MSG_DONTWAIT};
    ssize_t r = co__io_op(fd, CO__IO_READ, do_recvmmsg, &m, deadline);
    for (ssize_t i = 0; i < r; i++)
        fresh_rights(&msgs[i].msg_hdr);
    return (int)r;
}

int co_sendmmsg(int fd, struct mmsghdr *msgs, unsigned n, int flags, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    if (mm_check(msgs, n) < 0)
        return CO_EINVAL;
    mm_t m = {.v = msgs, .n = n, .flags = flags | MSG_NOSIGNAL | MSG_DONTWAIT};
    return (int)co__io_op(fd, CO__IO_WRITE | CO__IO_WLOCK, do_sendmmsg, &m, deadline);
}

/* ---- vectored I/O ------------------------------------------------------------ */

typedef struct vec {
    const struct iovec *iov0;
    struct iovec *iov; /* a copy that co_writev advances */
    int cnt;
    size_t total, done;
    bool notsock; /* writev(2), not sendmsg(2) (no MSG_NOSIGNAL without a socket) */
} vec_t;

static NOINL ssize_t do_readv(int fd, void *arg) {
    vec_t *v = arg;
    ssize_t r = readv(fd, v->iov0, v->cnt);
    return r < 0 ? -errno : r;
}

static int iov_check(const struct iovec *iov, int iovcnt, size_t *total) {
    if (iovcnt < 0 || iovcnt > IOV_MAX || (!iov && iovcnt))
        return CO_EINVAL;
    size_t t = 0;
    for (int i = 0; i < iovcnt; i++) {
        if (!iov[i].iov_base && iov[i].iov_len)
            return CO_EINVAL;
        if (iov[i].iov_len > SSIZE_MAX - t)
            return CO_EINVAL;
        t += iov[i].iov_len;
    }
    *total = t;
    return 0;
}

ssize_t co_readv(int fd, const struct iovec *iov, int iovcnt, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    vec_t v = {.iov0 = iov, .cnt = iovcnt};
    int rc = iov_check(iov, iovcnt, &v.total);
    if (rc < 0)
        return rc;
    return co__io_op(fd, CO__IO_READ, do_readv, &v, deadline);
}

/* Writes until all of it went out or the fd would block; v->done counts. */
static NOINL ssize_t do_writev(int fd, void *arg) {
    vec_t *v = arg;
    while (v->done < v->total) {
        while (v->cnt > 0 && v->iov[0].iov_len == 0) {
            v->iov++;
            v->cnt--;
        }
        int cnt = v->cnt > IOV_MAX ? IOV_MAX : v->cnt;
        ssize_t r;
        if (!v->notsock) {
            struct msghdr m = {.msg_iov = v->iov, .msg_iovlen = (size_t)cnt};
            r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (r < 0 && errno == ENOTSOCK) {
                v->notsock = true;
                continue;
            }
        } else {
            r = writev(fd, v->iov, cnt);
        }
        if (r < 0)
            return -errno;
        v->done += (size_t)r;
        size_t k = (size_t)r;
        while (k > 0) {
            if (k >= v->iov[0].iov_len) {
                k -= v->iov[0].iov_len;
                v->iov++;
                v->cnt--;
            } else {
                v->iov[0].iov_base = (char *)v->iov[0].iov_base + k;
                v->iov[0].iov_len -= k;
                k = 0;
            }
        }
    }
    return (ssize_t)v->done;
}

ssize_t co_writev(int fd, const struct iovec *iov, int iovcnt, int64_t deadline) {
    if (fd < 0)
        return -EBADF;
    vec_t v = {.iov0 = iov, .cnt = iovcnt};
    int rc = iov_check(iov, iovcnt, &v.total);
    if (rc < 0)
        return rc;
    if (v.total == 0)
        return 0;
    struct iovec small[16];
    struct iovec *copy = iovcnt <= 16 ? small : malloc(sizeof *copy * (size_t)iovcnt);
    if (!copy)
        return CO_ENOMEM;
    memcpy(copy, iov, sizeof *copy * (size_t)iovcnt);
    v.iov = copy;
    ssize_t r = co__io_op(fd, CO__IO_WRITE | CO__IO_WLOCK, do_writev, &v, deadline);
    if (r < 0 && r == CO_ECLOSED && v.done > 0)
        r = (ssize_t)v.done; /* cut by co_close: what went out, as co_write */
    if (copy != small)
        free(copy);
    return r;
}

/* ---- sendfile ------------------------------------------------------------- */

typedef struct sf {
    int in;
    off_t *off;
    size_t count, done;
    bool eof;
} sf_t;

static NOINL ssize_t do_sendfile(int fd, void *arg) {
    sf_t *s = arg;
    while (s->done < s->count) {
        size_t want = s->count - s->done;
        if (want > 0x7ffff000)
            want = 0x7ffff000; /* what Linux moves in one call at most */
        ssize_t r = sendfile(fd, s->in, s->off, want);
        if (r < 0)
            return -errno;
        if (r == 0) {
            s->eof = true; /* in ends before count */
            break;
        }
        s->done += (size_t)r;
    }
    return (ssize_t)s->done;
}

ssize_t co_sendfile(int out_fd, int in_fd, off_t *offset, size_t count, int64_t deadline) {
    if (out_fd < 0 || in_fd < 0)
        return -EBADF;
    if (count > SSIZE_MAX || (offset && *offset < 0))
        return CO_EINVAL;
    if (count == 0)
        return 0;
    sf_t s = {.in = in_fd, .off = offset, .count = count};
    ssize_t r = co__io_op(out_fd, CO__IO_WRITE | CO__IO_WLOCK, do_sendfile, &s, deadline);
    if (r < 0 && r == CO_ECLOSED && s.done > 0)
        r = (ssize_t)s.done;
    return r;
}
