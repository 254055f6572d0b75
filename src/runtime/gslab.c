/*
 * G records, carved from slabs: large anonymous mappings of records, one
 * every STRIDE bytes.
 *
 * A burst of spawns that finds the G caches (gcache.c) empty needs new
 * records. From malloc, each 4 KiB of them cost glibc a grow of its
 * per-thread heap (an mprotect, taking the address space's lock for
 * writing, which the other threads' mappings wait on, and their page
 * faults on kernels without per-VMA locks): 62k calls for a million
 * records. A slab is one mmap for 240 to 3,850 records; its pages are
 * committed as the records are first written.
 *
 * Every slab starts with its header (gslab_t). Records are taken from the
 * free list of a slab that has one (records the trim gave back), else
 * from the unused tail of the newest slab, else from a new slab, each
 * twice the size of the one before up to GSLAB_MAX (a small program maps
 * 64 KiB, of which it touches a page or two). A slab whose records are
 * all given back is unmapped, unless it is the newest: the steady state
 * (records recycled through the G caches) maps and unmaps nothing, and
 * a burst after a trim reuses the newest slab's pages.
 *
 * All of it is under sched.allg_lock, which a new record's link onto the
 * all-G list takes anyway; the mmap and munmap are made outside it.
 *
 * Under ASan a record given back is poisoned until it is taken again (a
 * use of a dead G is reported as ASan's, as malloc's quarantine did), and
 * a slab is unpoisoned before it is unmapped (ASan keeps the shadow of
 * an unmapped range). Under Valgrind's memcheck the same, as no-access.
 */
#include "runtime/proc.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define CO_HAVE_MEMCHECK 1
#endif
#endif
#ifndef CO_HAVE_MEMCHECK
#define VALGRIND_MAKE_MEM_NOACCESS(a, n) ((void)(a), (void)(n))
#define VALGRIND_MAKE_MEM_UNDEFINED(a, n) ((void)(a), (void)(n))
#define VALGRIND_MAKE_MEM_DEFINED(a, n) ((void)(a), (void)(n))
#endif

#ifdef CO_ASAN
void __asan_poison_memory_region(void const volatile *addr, size_t size);
#define POISON(a, n) __asan_poison_memory_region((a), (n))
#define UNPOISON(a, n) __asan_unpoison_memory_region((a), (n))
#else
#define POISON(a, n) ((void)(a), (void)(n))
#define UNPOISON(a, n) ((void)(a), (void)(n))
#endif

/* A record's footprint: 16-byte aligned, as malloc's were, and no
 * header of its own (a line-aligned stride would cost 48 bytes a G). */
#define STRIDE (((sizeof(co_g_t) + 15) / 16) * 16)
_Static_assert(_Alignof(co_g_t) <= 16, "records are 16-byte aligned");
#define GSLAB_MIN ((size_t)64 * 1024)
#define GSLAB_MAX ((size_t)1024 * 1024)

typedef struct co__gslab {
    struct co__gslab *next, *prev; /* the list of slabs with a free record */
    co_g_t *free;              /* records given back, linked through schedlink */
    char *tail, *end;          /* records never taken: [tail, end) */
    size_t size;               /* the mapping's bytes */
    size_t live;               /* records taken and not given back */
    bool listed;               /* on the free-record list */
} gslab_t;

/* The header's own lines come first: the records start a line apart. */
#define HEADER (((sizeof(gslab_t) + 63) / 64) * 64)

/* All under sched.allg_lock. */
static gslab_t *partial; /* slabs with a record on their free list, most recent first */
static gslab_t *newest;  /* where records are carved from; never unmapped while newest */
static gslab_t *spare;   /* mapped by a thread that then found another's new slab: the
                          * next to become newest (a slab of next_size bytes or less) */
static size_t next_size = GSLAB_MIN; /* the next slab's bytes */
static int64_t slabs_mapped; /* atomic relaxed: slabs mapped now, the spare included (tests) */

int64_t co__gslab_slabs(void) { return __atomic_load_n(&slabs_mapped, __ATOMIC_RELAXED); }

static void list_add_locked(gslab_t *s) {
    s->prev = NULL;
    s->next = partial;
    if (partial) partial->prev = s;
    partial = s;
    s->listed = true;
}

static void list_del_locked(gslab_t *s) {
    if (s->prev)
        s->prev->next = s->next;
    else
        partial = s->next;
    if (s->next) s->next->prev = s->prev;
    s->listed = false;
}

/* A record from the free lists or the newest slab's tail, zeroed; NULL
 * if a new slab is needed. */
static co_g_t *take_locked(void) {
    gslab_t *s = partial;
    co_g_t *g;
    if (s) {
        g = s->free;
        UNPOISON(g, STRIDE);
        VALGRIND_MAKE_MEM_DEFINED(&g->schedlink, sizeof g->schedlink);
        s->free = g->schedlink;
        if (!s->free) list_del_locked(s);
        VALGRIND_MAKE_MEM_UNDEFINED(g, STRIDE);
        memset(g, 0, sizeof *g);
    } else if (newest && newest->tail + STRIDE <= newest->end) {
        s = newest;
        g = (co_g_t *)s->tail; /* fresh from the kernel: zero */
        s->tail += STRIDE;
    } else {
        return NULL;
    }
    g->slab = s;
    s->live++;
    return g;
}

/* A fresh slab of `size` bytes (not yet anyone's), or NULL. */
static gslab_t *slab_map(size_t size) {
#ifdef CO_TSAN
    /* TSan's mmap marks what it maps as written by the caller unless it
     * ignores the caller's accesses, when it clears it instead: a record
     * is no one's until it is taken (co_dump's reads of it from another
     * thread would race with the mmap otherwise) */
    __tsan_ignore_thread_begin();
#endif
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
#ifdef CO_TSAN
    __tsan_ignore_thread_end();
#endif
    if (p == MAP_FAILED) return NULL;
    __atomic_add_fetch(&slabs_mapped, 1, __ATOMIC_RELAXED);
    gslab_t *s = p;
    s->size = size;
    s->tail = (char *)p + HEADER;
    s->end = (char *)p + size;
    return s;
}

static void slab_unmap(gslab_t *s) {
    UNPOISON(s, s->size);
    VALGRIND_MAKE_MEM_UNDEFINED(s, s->size);
    (void)co__unmap(s, s->size, &slabs_mapped, NULL, false);
}

co_g_t *co__gslab_get(void) {
    co_sched_t *s = &co__sched;
    co__lock(&s->allg_lock);
    co_g_t *g = take_locked();
    while (!g) {
        gslab_t *fresh = spare;
        spare = NULL;
        if (!fresh) {
            size_t size = next_size;
            co__unlock(&s->allg_lock);
            fresh = slab_map(size);
            if (!fresh) return NULL;
            co__lock(&s->allg_lock);
            /* another thread may have made one meanwhile: take from it
             * first, and keep ours for the next time */
            g = take_locked();
            if (g) {
                if (!spare) {
                    spare = fresh;
                    fresh = NULL;
                }
                if (fresh) {
                    co__unlock(&s->allg_lock);
                    slab_unmap(fresh);
                    co__lock(&s->allg_lock);
                }
                break;
            }
        }
        /* the old newest stays wherever its records are: on the free
         * list once one is given back, unmapped once all are */
        gslab_t *old = newest;
        newest = fresh;
        if (next_size < GSLAB_MAX) next_size *= 2;
        g = take_locked();
        if (old && old->live == 0) {
            if (old->listed) list_del_locked(old);
            co__unlock(&s->allg_lock);
            slab_unmap(old);
            co__lock(&s->allg_lock);
        }
    }
    g->alllink_next = s->allg;
    if (s->allg) s->allg->alllink_prev = g;
    s->allg = g;
    /* under allg_lock, as trace.c's walk: the G is in it, or sees traced
     * as it left it */
    __atomic_store_n(&g->trace_sw, (uint8_t)__atomic_load_n(&s->traced, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    co__unlock(&s->allg_lock);
    return g;
}

void co__gslab_put(co_g_t *g) {
    co_sched_t *s = &co__sched;
    gslab_t *drop = NULL;
    co__lock(&s->allg_lock);
    if (g->alllink_prev)
        g->alllink_prev->alllink_next = g->alllink_next;
    else
        s->allg = g->alllink_next;
    if (g->alllink_next) g->alllink_next->alllink_prev = g->alllink_prev;
    gslab_t *sl = g->slab;
    if (--sl->live == 0 && sl != newest) {
        if (sl->listed) list_del_locked(sl);
        drop = sl;
    } else {
        g->schedlink = sl->free;
        sl->free = g;
        if (!sl->listed) list_add_locked(sl);
        POISON(g, STRIDE);
        VALGRIND_MAKE_MEM_NOACCESS(g, STRIDE);
    }
    co__unlock(&s->allg_lock);
    if (drop) slab_unmap(drop);
}

/* Shutdown, every G given back: the newest slab too, and the next
 * runtime starts small again. */
void co__gslab_fini(void) {
    co_sched_t *s = &co__sched;
    gslab_t *drop = NULL;
    co__lock(&s->allg_lock);
    if (newest && newest->live == 0) {
        if (newest->listed) list_del_locked(newest);
        drop = newest;
        newest = NULL;
    }
    gslab_t *sp = spare;
    spare = NULL;
    next_size = GSLAB_MIN;
    co__unlock(&s->allg_lock);
    if (drop) slab_unmap(drop);
    if (sp) slab_unmap(sp);
}
