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
#if defined(__SANITIZE_THREAD__)
#define CO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CO_TSAN 1
#endif
#endif

#ifdef CO_ASAN
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#endif
#ifdef CO_TSAN
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#endif
#endif
