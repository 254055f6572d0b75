/*
 * Deadlock detection (docs/debugging.md): sysmon reports, and exits with
 * status 2, when no coroutine can ever run again. The rule, every part of
 * it required, twice in a row at least DEADLOCK_CONFIRM_NS apart with no
 * scheduling in between:
 *  - every P is idle and no coroutine waits for a stack;
 *  - every live coroutine is WAITING (none runnable, running, or inside
 *    co_blocking, which keeps it RUNNING);
 *  - no timer is pending on any P (a sleep or a timed wait can wake one)
 *    and no coroutine waits on the netpoller;
 *  - the process has exactly as many threads as colony accounts for: its
 *    Ms, sysmon, and plain threads parked inside a colony call with no
 *    deadline. Any other thread might still call in and wake someone, so
 *    its presence alone rules a report out.
 * A missed deadlock (another thread blocked forever elsewhere) is possible;
 * a false one is not, short of a thread made between the two reads of the
 * thread count and the Ms', which the second check a second later catches.
 */
#include "runtime/netpoll.h"
#include "runtime/proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEADLOCK_CONFIRM_NS 500000000LL /* between the two checks */

/* Plain threads parked with no deadline inside colony (park.c): relaxed
 * atomic counter; the confirming check a round later absorbs its races. */
static int plain_parked;
static bool deadlock_off;   /* COLONY_DEBUG=nodeadlock; set on the init path */
static int64_t suspect_at;  /* sysmon only: when the rule first held, 0 if not */
static uint64_t suspect_ticks;

void co__deadlock_plain_enter(void) { __atomic_add_fetch(&plain_parked, 1, __ATOMIC_RELAXED); }
void co__deadlock_plain_exit(void) { __atomic_sub_fetch(&plain_parked, 1, __ATOMIC_RELAXED); }

void co__deadlock_setup(void) {
    const char *e = getenv("COLONY_DEBUG");
    deadlock_off = e && strstr(e, "nodeadlock") != NULL;
    suspect_at = 0;
}

/* The process's thread count from /proc/self/status; -1 if unknown. */
static int proc_threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Threads:", 8) == 0) {
            n = atoi(line + 8);
            break;
        }
    fclose(f);
    return n;
}

/* Whether the rule holds now; *ticks: the Ps' scheduling ticks summed. */
static bool rule_holds(uint64_t *ticks) {
    co_sched_t *s = &co__sched;
    if (__atomic_load_n(&s->npidle, __ATOMIC_ACQUIRE) != (uint32_t)s->nprocs) return false;
    if (__atomic_load_n(&s->nstackwait, __ATOMIC_RELAXED)) return false;
    if (co__netpoll_has_waiters()) return false;
    if (co__globrunq_len() != 0) return false;
    uint64_t t = 0;
    for (int i = 0; i < s->nprocs; i++) {
        co_p_t *p = co__allp(i);
        if (__atomic_load_n(&p->timer0_when, __ATOMIC_ACQUIRE) != 0) return false;
        if (co__runq_len(p) != 0) return false;
        t += __atomic_load_n(&p->schedtick, __ATOMIC_RELAXED);
    }
    *ticks = t;
    int live = 0;
    bool all_waiting = true;
    co__lock(&s->allg_lock);
    for (co_g_t *g = s->allg; g && all_waiting; g = g->alllink_next) {
        uint32_t st = __atomic_load_n(&g->status, __ATOMIC_ACQUIRE);
        if (st == CO_G_DEAD || st == CO_G_IDLE) continue;
        live++;
        if (st != CO_G_WAITING) all_waiting = false;
    }
    co__unlock(&s->allg_lock);
    if (!all_waiting || live == 0) return false;
    co__lock(&s->lock);
    int ms = s->mcount;
    co__unlock(&s->lock);
    int threads = proc_threads();
    return threads > 0 && threads == ms + 1 + __atomic_load_n(&plain_parked, __ATOMIC_RELAXED);
}

void co__deadlock_check(int64_t now) {
    if (deadlock_off) return;
    uint64_t ticks = 0;
    /* cheap first: an active P rules it out without reading anything else */
    if (__atomic_load_n(&co__sched.npidle, __ATOMIC_RELAXED) != (uint32_t)co__sched.nprocs ||
        !rule_holds(&ticks)) {
        suspect_at = 0;
        return;
    }
    if (suspect_at == 0 || ticks != suspect_ticks) {
        suspect_at = now;
        suspect_ticks = ticks;
        return;
    }
    if (now - suspect_at < DEADLOCK_CONFIRM_NS) return;
    fprintf(stderr, "colony: fatal: all coroutines are asleep - deadlock!\n\n");
    co_dump(stderr);
    fflush(stderr);
    _exit(2);
}
