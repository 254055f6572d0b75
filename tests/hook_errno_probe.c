/* Foreign code for test_hook_ld_errno, compiled apart at -O2 (CMake): it
 * takes errno's address, and a thread-local's, once, before a read that
 * parks, and uses them afterwards, as an optimising compiler may do with
 * glibc's const __errno_location and with a library's thread-locals
 * (OpenSSL's error queue). Returns the errno it sees through the early
 * address after the read (-1 if the read did not fail); *same_thread is 1
 * when both early addresses are still those of the thread it runs on. */
#include <errno.h>
#include <unistd.h>

int hook_errno_probe(int fd, int *same_thread);

static __thread int probe_tls;
/* asked again after the read, through pointers the compiler cannot see
 * through: the addresses on the thread the caller runs on now */
static int *errno_now(void) { return &errno; }
static int *tls_now(void) { return &probe_tls; }
int *(*volatile probe_errno_now)(void) = errno_now;
int *(*volatile probe_tls_now)(void) = tls_now;

int hook_errno_probe(int fd, int *same_thread) {
    int *e = &errno; /* this thread's errno, taken before the call */
    int *t = &probe_tls;
    *e = 0;
    *t = 1;
    char c;
    ssize_t n = read(fd, &c, 1); /* parks; EAGAIN on SO_RCVTIMEO, else a byte */
    *same_thread = e == probe_errno_now() && t == probe_tls_now();
    if (n >= 0) return -1;
    return *e; /* through the address taken before */
}
