/* co_init when no thread can be made for sysmon: it fails with CO_ENOMEM
 * and starts nothing (it returned 0 and ran without sysmon: no P lending,
 * no retry of coroutines waiting for a stack), and works once threads can
 * be made again. pthread_create is interposed here (the test links the
 * static library); not under sanitizers, which interpose it themselves. */
// ctest-no-chaos
#define _GNU_SOURCE 1
#include "t.h"

#include <colony.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define T_NO_INTERPOSE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define T_NO_INTERPOSE 1
#endif
#endif

__attribute__((unused)) static int fail_threads; /* atomic: pthread_create fails while set */

#ifndef T_NO_INTERPOSE
int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg) {
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
    if (__atomic_load_n(&fail_threads, __ATOMIC_RELAXED)) return EAGAIN;
    return real(t, a, f, arg);
}
#endif

static co_waitgroup_t wg = CO_WAITGROUP_INIT;
__attribute__((unused)) static void done(void *arg) { co_waitgroup_done(&wg); }

static void test_no_sysmon_thread(void) {
#ifdef T_NO_INTERPOSE
    fprintf(stderr, "  skipped: sanitizers interpose pthread_create themselves\n");
#else
    __atomic_store_n(&fail_threads, 1, __ATOMIC_RELAXED);
    CHECK_EQ(co_init(NULL), CO_ENOMEM);
    CHECK_EQ(co_count(), 0);
    CHECK_EQ(co_go(done, NULL), CO_ENOMEM); /* the first use starts it: same */
    __atomic_store_n(&fail_threads, 0, __ATOMIC_RELAXED);
    co_waitgroup_add(&wg, 1);
    CHECK_EQ(co_go(done, NULL), 0);
    co_waitgroup_wait(&wg);
    CHECK_EQ(T_SHUTDOWN(), 0);
#endif
}

int main(void) {
    t_begin(60);
    T_RUN(test_no_sysmon_thread);
    return t_end();
}
