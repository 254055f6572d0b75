/*
 * The io layer's door for the layers above it (src/net): one operation on
 * an fd under io's reference, close and readiness protocol, for system
 * calls that co_read & co do not cover (recvmsg, sendmsg, writev, ...).
 */
#ifndef COLONY_IO_H
#define COLONY_IO_H

#include "base/base.h"

#include <sys/types.h>

enum {
    CO__IO_READ = 1,  /* fn waits for read readiness on EAGAIN */
    CO__IO_WRITE = 2, /* ... for write readiness */
    CO__IO_WLOCK = 4, /* hold co_write's lock throughout (whole writes never interleave) */
};

/* fn(fd, arg): one non-blocking attempt, >= 0 or -errno (it reads errno
 * right after its system call: it is never inlined across a park). */
typedef ssize_t (*co__io_fn)(int fd, void *arg);

/* Call fn until it returns something other than -EAGAIN or -EINTR,
 * parking on fd's readiness (how: CO__IO_READ or CO__IO_WRITE, with
 * CO__IO_WLOCK) between attempts, until deadline (CO_ETIMEDOUT). fd is
 * set up on first use as co_read does. With CO__IO_WLOCK, fn is not called
 * again once co_close has begun: CO_ECLOSED, and fn's arg knows how far it
 * got. -EBADF for a negative fd. */
CO_HIDDEN ssize_t co__io_op(int fd, int how, co__io_fn fn, void *arg, int64_t deadline);

/* fd is a number fresh from socket(2) or the like: forget what its slot
 * remembers of a file closed with close(2) behind colony's back. */
CO_HIDDEN void co__io_fresh(int fd);

/* fd is a socket fresh from socket(2), non-blocking already; tcp: an
 * AF_INET/AF_INET6 TCP stream. Sets it up now with what the caller knows
 * (co_read & co ask the kernel on first use): registered with the
 * netpoller. If that fails the first use tries again. */
CO_HIDDEN void co__io_adopt(int fd, bool tcp);

#endif
