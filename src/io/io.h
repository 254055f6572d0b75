/*
 * The io layer's door for the layers above it (src/net, src/hook): one
 * operation on an fd under io's reference, close and readiness protocol,
 * for system calls that co_read & co do not cover (recvmsg, sendmsg,
 * writev, ...), and the hook's blocking calls.
 */
#ifndef COLONY_IO_H
#define COLONY_IO_H

#include "base/base.h"

#include <stdint.h>
#include <sys/types.h>

enum {
    CO__IO_READ = 1,  /* fn waits for read readiness on EAGAIN */
    CO__IO_WRITE = 2, /* ... for write readiness */
    CO__IO_WLOCK = 4, /* hold co_write's lock throughout (whole writes never interleave) */
    /* co__io_hooked, with CO__IO_READ alone: fn finds nothing to do on a
     * stream that holds no input (a read of n > 0 bytes, a poll for input
     * only). When the last consuming read of the stream came back short at
     * the edge count now loaded, fn waits for the next edge before its
     * attempt instead of spending a system call on EAGAIN (co_read's rule). */
    CO__IO_NEEDS_INPUT = 8,
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
 * ns after the first wait. rdlen > 0: fn is a consuming read of up to
 * rdlen bytes (no MSG_PEEK), and a shorter result on a stream marks it
 * drained at the edge count loaded before fn (CO__IO_NEEDS_INPUT); 0 for
 * anything else. Returns fn's last result, CO_ETIMEDOUT,
 * CO_ECLOSED (closed meanwhile) or what taking the fd failed with. */
CO__IO_HOOK_API ssize_t co__io_hooked(int fd, int how, co__io_fn fn, void *arg, int64_t timeo,
                                      size_t rdlen);

/* A read the program made non-blocking itself (libpq's), which the hook
 * tries once and does not wait in: co__io_rseq(fd) before it, then, if it
 * came back short, co__io_read_short(fd, that value), so that the next
 * wait for input on fd (a hooked poll) skips its first try as after a
 * short read through co__io_hooked. UINT32_MAX: nothing known of fd. */
CO__IO_HOOK_API uint32_t co__io_rseq(int fd);
CO__IO_HOOK_API void co__io_read_short(int fd, uint32_t rs);

/* fd is a socket fresh from socket(2), non-blocking already; tcp: an
 * AF_INET/AF_INET6 TCP stream. Sets it up now with what the caller knows
 * (co_read & co ask the kernel on first use): registered with the
 * netpoller. If that fails the first use tries again. */
CO_HIDDEN void co__io_adopt(int fd, bool tcp);

#endif
