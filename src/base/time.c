/* The monotonic clock every deadline in colony is measured on. */
#include "base/base.h"

#include <time.h>

int64_t co_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t co_deadline_after(int64_t ns) {
    if (ns < 0) return CO_FOREVER;
    int64_t now = co_now();
    if (ns > INT64_MAX - now) return CO_FOREVER;
    return now + ns;
}
