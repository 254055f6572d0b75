/* Stacks of coroutines for co_dump (unwind.c). */
#ifndef COLONY_RUNTIME_UNWIND_H
#define COLONY_RUNTIME_UNWIND_H
#include "runtime/proc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Up to max return addresses of a WAITING G, from its saved context; the
 * number written, 0 where this build cannot unwind. The G must stay
 * parked while this runs (a snapshot otherwise: co_dump's caveat). */
CO_HIDDEN int co__unwind_parked(const co_g_t *g, void **pcs, int max);
/* The same for the calling thread, from the caller of this function. */
CO_HIDDEN int co__unwind_self(void **pcs, int max);
/* Up to max return addresses from a signal handler's ucontext, the
 * interrupted instruction first; 0 without libunwind. */
CO_HIDDEN int co__unwind_uctx(void *uctx, void **pcs, int max);
/* The name of the function containing pc into buf and pc's offset in it;
 * false if unknown. No stdio: a crash handler calls it. */
CO_HIDDEN bool co__symbol(void *pc, char *buf, size_t len, uintptr_t *off);
/* The function containing pc, as "name+0xoff" into buf; "?" if unknown. */
CO_HIDDEN void co__symbolize(void *pc, char *buf, size_t len);
/* Which unwinder this build uses: "libunwind", "frame pointers" or "none". */
CO_HIDDEN const char *co__unwinder(void);
#endif
