/* Announcing coroutine switches to ASan, TSan and Valgrind (see sched.c). */
#ifndef COLONY_SAN_H
#define COLONY_SAN_H
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define CO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CO_ASAN 1
#endif
#endif
/* COLONY_TSAN: set by the build for every file of a TSan build, the
 * runtime's too, which is compiled without TSan's instrumentation
 * (CMakeLists.txt) and so without the compiler's own signs of it. */
#if defined(__SANITIZE_THREAD__) || defined(COLONY_TSAN)
#define CO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CO_TSAN 1
#endif
#endif
#ifdef CO_TSAN
#define CO_TSAN_ON 1 /* for plain `if`s */
#else
#define CO_TSAN_ON 0
#endif

#ifdef CO_ASAN
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#endif
/* A function that touches only the running thread's own state (its
 * thread-locals: a select's generator, a counter of the pool's). Under TSan
 * its accesses are not recorded: the coroutines that run one after another
 * on a thread would look like racing on that state, which is the M's, not
 * theirs. */
#ifdef CO_TSAN
#define CO_THREAD_STATE __attribute__((noinline, no_sanitize("thread")))
#else
#define CO_THREAD_STATE
#endif
/* The runtime's code inline in the layers above (the wait layer's queue
 * links): its plain accesses are not instrumented under TSan, as the
 * runtime's own are not (CMakeLists.txt). */
#ifdef CO_TSAN
#define CO_TSAN_RUNTIME __attribute__((no_sanitize("thread")))
#else
#define CO_TSAN_RUNTIME
#endif

#ifdef CO_TSAN
/* TSan's fibers (sanitizer/tsan_interface.h): each coroutine lifetime is
 * one, and a switch implies no synchronisation (the flag below); the
 * runtime annotates the edges a program may rely on instead (the race
 * detector: docs/hacking.md). */
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
void __tsan_set_fiber_name(void *fiber, const char *name);
#define CO_TSAN_NO_SYNC 1 /* __tsan_switch_to_fiber_no_sync */
/* Happens-before on an address: the releaser's past is the acquirer's. */
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
/* The calling fiber's memory accesses are not seen between the two; its
 * synchronisation still is. */
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
/* The calling fiber's synchronisation is not seen between the two (a
 * fiber it creates inherits nothing from it). */
void AnnotateIgnoreSyncBegin(const char *file, int line);
void AnnotateIgnoreSyncEnd(const char *file, int line);

#ifdef COLONY_TSAN_PLAIN
/* In the files compiled without TSan's instrumentation (CMakeLists.txt:
 * the runtime, the context switch, the base lock). Their calls into the C
 * library's memory functions still go through TSan's interceptors, which
 * record the accesses (and an allocation's first write, and a free) as
 * the running fiber's: the runtime's own memory (G records, queues,
 * caches), touched by one coroutine after another with no
 * synchronisation TSan sees, would look raced. Those calls run with the
 * caller's accesses ignored instead. (A free still clears what TSan kept
 * of the block: race.c's keys rely on it.) */
#include <stdlib.h>
#include <string.h>
#define CO__PLAIN(type, call)                                                                 \
    ({                                                                                        \
        __tsan_ignore_thread_begin();                                                         \
        type co_r_ = call;                                                                    \
        __tsan_ignore_thread_end();                                                           \
        co_r_;                                                                                \
    })
#define memcpy(d, s, n) CO__PLAIN(void *, (memcpy)(d, s, n))
#define memmove(d, s, n) CO__PLAIN(void *, (memmove)(d, s, n))
#define memset(d, c, n) CO__PLAIN(void *, (memset)(d, c, n))
#define strncpy(d, s, n) CO__PLAIN(char *, (strncpy)(d, s, n))
#define strcpy(d, s) CO__PLAIN(char *, (strcpy)(d, s))
#define malloc(n) CO__PLAIN(void *, (malloc)(n))
#define calloc(n, s) CO__PLAIN(void *, (calloc)(n, s))
#define realloc(p, n) CO__PLAIN(void *, (realloc)(p, n))
#define aligned_alloc(a, n) CO__PLAIN(void *, (aligned_alloc)(a, n))
#define free(p) ((void)CO__PLAIN(int, ((free)(p), 0)))
#endif
#endif
#endif
