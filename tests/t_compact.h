/* What the stack-compaction tests share: waiting for compactions, and
 * frames of locals with a known pattern, live across a wait. */
#ifndef COLONY_T_COMPACT_H
#define COLONY_T_COMPACT_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <colony.h>

/* Until co_stack_compacted() reaches n: true, or false after ~20 s. */
__attribute__((unused)) static bool wait_compacted(int64_t n) {
    for (int i = 0; i < 20000; i++) {
        if (co_stack_compacted() >= n) return true;
        co_sleep(CO_MILLISECOND);
    }
    fprintf(stderr, "compacted: %lld of %lld\n", (long long)co_stack_compacted(), (long long)n);
    return false;
}

/* n words of a pattern made from seed, and how many of them differ. */
__attribute__((unused)) static void t_pattern_fill(volatile uint64_t *a, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) a[i] = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i;
}
__attribute__((unused)) static int t_pattern_bad(volatile uint64_t *a, int n, uint64_t seed) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad += a[i] != seed * 0x9e3779b97f4a7c15ull + (uint64_t)i;
    return bad;
}
#endif
