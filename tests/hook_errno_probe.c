/* Foreign code for test_hook_ld_errno, compiled apart at -O2 (CMake): it
 * takes errno's address once, before a read that parks, and reads errno
 * through it afterwards, as an optimising compiler may do with glibc's
 * const __errno_location. Returns the errno it sees after the read, or
 * -1 if the read did not fail. */
#include <errno.h>
#include <unistd.h>

int hook_errno_probe(int fd);
int hook_errno_probe(int fd) {
    int *e = &errno; /* this thread's errno, taken before the call */
    *e = 0;
    char c;
    ssize_t n = read(fd, &c, 1); /* parks, times out (SO_RCVTIMEO): EAGAIN */
    if (n >= 0) return -1;
    return *e; /* through the address taken before */
}
