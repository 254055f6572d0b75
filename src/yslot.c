/*
 * The yield slot's slow side (yslot.h has the design): turning it on at
 * co_init, and sysmon taking a coroutine out of a retiring P's slot.
 */
#include "yslot.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

int co__yslot_on;

static int membarrier(int cmd) { return (int)syscall(SYS_membarrier, cmd, 0, 0); }

/* co_init, before any M runs. The registration is for the whole process and
 * stays; registering again is harmless. COLONY_DEBUG=noyieldslot keeps the
 * slot off (for A/B measurements; behaviour is the same either way). */
void co__yslot_init(void) {
    int on = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
             membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 && !co__sched.no_yslot;
    /* relaxed: published to the Ms by their creation (pthread_create) */
    __atomic_store_n(&co__yslot_on, on, __ATOMIC_RELAXED);
}

co_g_t *co__yslot_steal(co_p_t *p) {
    if (!__atomic_load_n(&p->yieldg, __ATOMIC_ACQUIRE)) return NULL;
    uint32_t v = __atomic_load_n(&p->yseq, __ATOMIC_ACQUIRE);
    if (v & 1) return NULL; /* a window is open: its owner is not stuck */
    /* Every running thread of the process executes a full barrier: after
     * it, the owner's odd yseq is visible if it opened a window before, and
     * the retire flag (set by our caller) is visible to any window after. */
    if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) return NULL;
    if (__atomic_load_n(&p->yseq, __ATOMIC_ACQUIRE) != v) return NULL;
    /* acq_rel: the owner's retire flush exchanges too; one of us gets it */
    return __atomic_exchange_n(&p->yieldg, NULL, __ATOMIC_ACQ_REL);
}
