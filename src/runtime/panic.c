/*
 * Panics: co_panic unwinds to the nearest co_recover frame of the calling
 * coroutine (or plain thread), like Go's panic/recover.
 *
 * Every co_recover call pushes a frame (a sigjmp_buf, the panic value, a
 * tag and the previous frame) onto a chain whose head lives in the slot
 * co__panic_slot() gives: one per coroutine (in its G), one per plain
 * thread. co_panic takes the head frame, stores the value in it and
 * siglongjmps there; co_recover then pops its frame and returns 1. The jump
 * never leaves the coroutine's own stack: a frame belongs to the coroutine
 * that pushed it, so a coroutine started inside a co_recover does not see
 * that frame (as in Go, recover only works in the panicking goroutine).
 * A coroutine may move to another M between the setjmp and the longjmp;
 * that is fine: the jump buffer only holds registers and the stack pointer
 * of this coroutine's stack.
 *
 * Nothing runs between co_panic and the recover point: C has no deferred
 * calls, so locks held by the unwound frames stay held and memory they own
 * leaks. Panics are for "this task is broken, drop it", not for control
 * flow.
 *
 * With no frame on the chain, the panic is fatal: it prints
 *   colony: panic: <value> in coroutine <id> '<name>'
 * and aborts, like an unrecovered Go panic.
 */
#include "runtime/runtime.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct co__rframe {
    struct co__rframe *prev;
    const void *tag;  /* NULL for co_recover; its owner's for co__recover_tagged */
    void *value;      /* written by co_panic before the jump */
    sigjmp_buf jb;
} co__rframe_t;

/* The slot holds the innermost frame of the calling coroutine/thread. Only
 * the coroutine (thread) itself reads or writes it. */
static inline co__rframe_t **chain(void) { return (co__rframe_t **)co__panic_slot(); }

int co__recover_tagged(void (*fn)(void *), void *arg, void **value, const void *tag) {
    /* The slot is the G's (or the plain thread's) and stays the same for
     * the life of this frame even if the coroutine moves to another M. */
    co__rframe_t **slot = chain();
    co__rframe_t f;
    f.tag = tag;
    f.value = NULL;
    f.prev = *slot;
    *slot = &f;
    /* savemask 0: no signal-mask syscall on either side. */
    if (sigsetjmp(f.jb, 0) == 0) {
        fn(arg);
        if (value) *value = NULL;
        *slot = f.prev;
        return 0;
    }
    /* Back from co_panic. f lives in memory (its address was published),
     * so its fields are valid after the jump; read them through volatile to
     * keep the compiler from reusing registers saved before the setjmp. */
    volatile co__rframe_t *vf = &f;
    *chain() = vf->prev;
    if (value) *value = vf->value;
    return 1;
}

int co_recover(void (*fn)(void *arg), void *arg, void **value) {
    if (!fn) return CO_EINVAL;
    return co__recover_tagged(fn, arg, value, NULL);
}

bool co__recover_has_tag(const void *tag) {
    for (co__rframe_t *f = *chain(); f; f = f->prev)
        if (f->tag == tag) return true;
    return false;
}

_Noreturn void co_panic(void *value) {
    co__rframe_t *f = *chain();
    if (!f) {
        struct co_g *g = co__running_g();
        if (g)
            fprintf(stderr, "colony: panic: %p in coroutine %llu '%s'\n", value,
                    (unsigned long long)co__g_id(g), co__g_name(g));
        else
            fprintf(stderr, "colony: panic: %p (not in a coroutine)\n", value);
        fflush(stderr);
        abort();
    }
    f->value = value;
    siglongjmp(f->jb, 1);
}
