/* Error codes as text, and the fatal-error line. */
#include "base/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *co_strerror(int err) {
    switch (err) {
    case 0: return "success";
    case CO_ECLOSED: return "closed (channel, pool or fd)";
    case CO_EOVERLOAD: return "overloaded (pool full in nonblocking mode, or too many blocked submitters)";
    case CO_ETIMEDOUT: return "deadline passed";
    case CO_EINVAL: return "invalid argument";
    case CO_ENOMEM: return "out of memory";
    case CO_ECANCELED: return "context canceled";
    case CO_EBUSY: return "busy (still in use)";
    case CO_EDEADLK: return "would deadlock (a worker submitted to its own full pool)";
    case CO_EPERM: return "not allowed from this context";
    case CO_ETLS: return "TLS handshake or protocol failure";
    case CO_ETLSVERIFY: return "TLS peer certificate failed verification";
    case CO_ENOTFOUND: return "no such host";
    case CO_EADDR: return "malformed address, or none of the network's family";
    case CO_ENETUNKNOWN: return "unknown network";
    case CO_EDNS: return "name server failure";
    default:
        if (err < 0 && err > -4096) {
            /* strerrordesc_np: glibc's own constant text, never the
             * "Unknown error N" that strerror formats into a buffer shared
             * by every thread (glibc 2.32+) */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
            const char *d = strerrordesc_np(-err);
            return d ? d : "unknown error";
#else
            return strerror(-err);
#endif
        }
        return "unknown error";
    }
}

void co__fatal(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    fprintf(stderr, "colony: fatal: %.*s\n", n, buf);
    fflush(stderr);
    abort();
}
