/*
 * The yield slot's slow side (yslot.h has the design): turning it on at
 * co_init, and sysmon taking a coroutine out of a retiring P's slot.
 */
#include "runtime/yslot.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

int co__yslot_on;

static int membarrier(int cmd) { return (int)syscall(SYS_membarrier, cmd, 0, 0); }

/* co_init, before any M runs. The registration is for the whole process and
 * stays; registering again is harmless. COLONY_DEBUG=noyieldslot keeps the
 * slot and the owner's batch off (for A/B measurements; behaviour is the
 * same either way). */
void co__yslot_init(void) {
    int on = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
             membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 && !co__sched.no_yslot;
    /* relaxed: published to the Ms by their creation (pthread_create) */
    __atomic_store_n(&co__yslot_on, on, __ATOMIC_RELAXED);
}

int co__yslot_steal(co_p_t *p, co_g_t **out) {
    if (!__atomic_load_n(&p->yieldg, __ATOMIC_ACQUIRE) &&
        !__atomic_load_n(&p->obn, __ATOMIC_ACQUIRE))
        return 0;
    uint32_t v = __atomic_load_n(&p->yseq, __ATOMIC_ACQUIRE);
    if (v & 1) return 0; /* a window is open: its owner is not stuck */
    /* Every running thread of the process executes a full barrier: after
     * it, the owner's odd yseq is visible if it opened a window before, and
     * the retire flag (set by our caller) is visible to any window after. */
    if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) return 0;
    if (__atomic_load_n(&p->yseq, __ATOMIC_ACQUIRE) != v) return 0;
    return co__yslot_take(p, out);
}

int co__yslot_take(co_p_t *p, co_g_t **out) {
    /* acq_rel: another taker may exchange at the same time; one of us
     * gets each */
    int k = 0;
    co_g_t *y = __atomic_exchange_n(&p->yieldg, NULL, __ATOMIC_ACQ_REL);
    if (y) out[k++] = y; /* older than the batch: it runs first */
    uint32_t n = __atomic_exchange_n(&p->obn, 0, __ATOMIC_ACQ_REL);
    while (n) out[k++] = __atomic_load_n(&p->ob[--n], __ATOMIC_RELAXED);
    return k;
}
