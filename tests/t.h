/* Minimal test harness: CHECK records failures, T_MAIN prints the closing
 * line "N passed, N failed" and arms a watchdog so a deadlock fails. */
#ifndef COLONY_T_H
#define COLONY_T_H
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int t_checks_failed;
static int t_cur_failed;
#define CHECK(c)                                                                              \
    do {                                                                                      \
        if (!(c)) {                                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);             \
            __atomic_add_fetch(&t_checks_failed, 1, __ATOMIC_RELAXED);                        \
            __atomic_store_n(&t_cur_failed, 1, __ATOMIC_RELAXED);                             \
        }                                                                                     \
    } while (0)
#define CHECK_EQ(a, b)                                                                        \
    do {                                                                                      \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                               \
        if (t_a_ != t_b_) {                                                                   \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", __FILE__,      \
                    __LINE__, #a, t_a_, #b, t_b_);                                            \
            __atomic_add_fetch(&t_checks_failed, 1, __ATOMIC_RELAXED);                        \
            __atomic_store_n(&t_cur_failed, 1, __ATOMIC_RELAXED);                             \
        }                                                                                     \
    } while (0)

static int t_passed, t_failed;
static void t_run(const char *name, void (*fn)(void)) {
    t_cur_failed = 0;
    fprintf(stderr, "-- %s\n", name);
    fn();
    if (__atomic_load_n(&t_cur_failed, __ATOMIC_RELAXED)) {
        t_failed++;
        fprintf(stderr, "FAIL %s\n", name);
    } else {
        t_passed++;
    }
}
#define T_RUN(fn) t_run(#fn, fn)

static void t_watchdog(int sig) {
    (void)sig;
    static const char msg[] = "watchdog: test timed out (deadlock?)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(99);
}
static void t_begin(unsigned seconds) {
    signal(SIGALRM, t_watchdog);
    alarm(seconds);
}
static int t_end(void) {
    printf("%d passed, %d failed\n", t_passed, t_failed);
    return t_failed ? 1 : 0;
}
#endif
