/*
 * The io layer's door for the layers above it (src/net, src/hook): one
 * operation on an fd under io's reference, close and readiness protocol,
 * for system calls that co_read & co do not cover (recvmsg, sendmsg,
 * writev, ...), and the hook's blocking calls.
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

/* Exported from libcolony.so for libcolony_hook.so alone (src/hook, which
 * links the shared library); no part of the API. */
#define CO__IO_HOOK_API __attribute__((visibility("default")))

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
CO__IO_HOOK_API void co__io_fresh(int fd);

/* libcolony_hook.so's blocking call on a socket or pipe, from a coroutine:
 * fn (libc's call, made non-blocking) until it returns something other
 * than -EAGAIN (how: CO__IO_READ and/or CO__IO_WRITE, the readiness to
 * wait for). The edge count is loaded before each attempt, and a wait
 * parks only if no edge came since: no poll(2) and no epoll_ctl per wait,
 * which asks that the number still name the file set up on its first use
 * here, i.e. that every close of it go through co_close or co_fd_forget
 * (the hook's close does), and that a number the caller saw become a new
 * file be passed to co__io_fresh first. timeo > 0: CO_ETIMEDOUT that many
 * ns after the first wait. Returns fn's last result, CO_ETIMEDOUT,
 * CO_ECLOSED (closed meanwhile) or what taking the fd failed with. */
CO__IO_HOOK_API ssize_t co__io_hooked(int fd, int how, co__io_fn fn, void *arg, int64_t timeo);

/* fd is a socket fresh from socket(2), non-blocking already; tcp: an
 * AF_INET/AF_INET6 TCP stream. Sets it up now with what the caller knows
 * (co_read & co ask the kernel on first use): registered with the
 * netpoller. If that fails the first use tries again. */
CO_HIDDEN void co__io_adopt(int fd, bool tcp);

#endif
