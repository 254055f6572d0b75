/*
 * Poll descriptors (Go's pollDesc and netpollblock/netpollready): the
 * table, readiness and waiting. The backend (netpoll_epoll.c) turns kernel
 * events into co__pd_ready calls; the fd layer (src/io) parks its
 * operations here with co__pd_wait. See netpoll.h for the split.
 *
 * Every fd number has a poll descriptor (co__pd_t) in a two-level table
 * that grows by chunks and never moves or frees, so the backend can look
 * one up from the fd number carried in a kernel event.
 *
 * Readiness (Go's rg/wg, made counter-shaped so several waiters per side
 * are safe): the backend reports edges; co__pd_ready bumps the side's
 * sequence number and wakes every waiter of that side. An operation loads
 * the sequence number, tries its syscall and, on EAGAIN, hands the number
 * to co__pd_wait, which re-checks it under pd->lock before parking: an
 * edge that arrived after the syscall started has changed it, so the
 * operation retries instead of parking. No edge is lost, whatever the
 * number of waiters.
 */
#include "runtime/runtime.h"

#include "runtime/netpoll.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

/* ---- the descriptor table ------------------------------------------------ */

#define PD_CHUNK_SHIFT 10
#define PD_CHUNK (1 << PD_CHUNK_SHIFT)
#define PD_DIR (CO__PD_NFD / PD_CHUNK)

CO_STATIC_ASSERT(sizeof(co__pd_t) <= 64, "a poll descriptor fits a cache line");
CO_STATIC_ASSERT(PD_DIR * PD_CHUNK == CO__PD_NFD, "the table covers CO__PD_NFD numbers");

/* Chunk pointers: atomic; published once by CAS (release), read with an
 * acquire load; never freed. */
static co__pd_t *pd_dir[PD_DIR];

co__pd_t *co__pd_peek(int fd) {
    if (fd < 0 || fd >= PD_DIR * PD_CHUNK)
        return NULL;
    co__pd_t *c = __atomic_load_n(&pd_dir[fd >> PD_CHUNK_SHIFT], __ATOMIC_ACQUIRE);
    return c ? &c[fd & (PD_CHUNK - 1)] : NULL;
}

co__pd_t *co__pd_get(int fd) {
    if (fd < 0 || fd >= PD_DIR * PD_CHUNK)
        return NULL;
    co__pd_t **slot = &pd_dir[fd >> PD_CHUNK_SHIFT];
    co__pd_t *c = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (CO_LIKELY(c != NULL))
        return &c[fd & (PD_CHUNK - 1)];
    /* A chunk is 64 KiB, kept for good: none for a number that is not
     * open (calls on stray numbers answer EBADF without growing memory) */
    int e = errno;
    bool open_now = fcntl(fd, F_GETFD) >= 0;
    errno = e;
    if (!open_now)
        return NULL;
    co__pd_t *fresh = aligned_alloc(64, sizeof(co__pd_t) * PD_CHUNK);
    if (!fresh)
        return NULL;
    memset(fresh, 0, sizeof(co__pd_t) * PD_CHUNK);
    int base = fd & ~(PD_CHUNK - 1);
    for (int i = 0; i < PD_CHUNK; i++)
        fresh[i].fd = base + i;
    if (!__atomic_compare_exchange_n(slot, &c, fresh, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        free(fresh); /* another thread published the chunk first: use it */
        return &c[fd & (PD_CHUNK - 1)];
    }
    return &fresh[fd & (PD_CHUNK - 1)];
}

void co__pd_forget_all(void) {
    for (int d = 0; d < PD_DIR; d++) {
        co__pd_t *c = __atomic_load_n(&pd_dir[d], __ATOMIC_ACQUIRE);
        if (!c)
            continue;
        for (int i = 0; i < PD_CHUNK; i++) {
            co__lock(&c[i].lock);
            if (c[i].kind == CO__PD_POLLED)
                __atomic_store_n(&c[i].kind, CO__PD_UNKNOWN, __ATOMIC_RELEASE);
            co__unlock(&c[i].lock);
        }
    }
}

void co__pd_forget_table(void) { memset(pd_dir, 0, sizeof pd_dir); }

/* ---- waking -------------------------------------------------------------- */

/* Under pd->lock: pop every waiter of q, claim it with `result`, and chain
 * the claimed ones on *list (through ->next) for waking after the unlock.
 * A waiter whose claim fails is timing out (or its other side already
 * fired): it relocks pd and finds itself unlinked. */
static void pd_claim_all(co__waitq_t *q, int result, co__waiter_t **list) {
    co__waiter_t *w;
    while ((w = co__waitq_pop(q)) != NULL) {
        if (co__claim(w->pk, w)) {
            w->result = result;
            w->next = *list;
            *list = w;
        }
    }
}

/* Outside the lock: unpark a chain built by pd_claim_all. Returns how many
 * coroutines (not threads) it made runnable. */
static int pd_wake_list(co__waiter_t *w) {
    int n = 0;
    while (w) {
        co__waiter_t *next = w->next; /* w may vanish once unparked */
        co__parker_t *pk = w->pk;
        if (pk->g)
            n++;
        co__unpark_cold(pk);
        w = next;
    }
    return n;
}

int co__pd_ready(co__pd_t *pd, int modes) {
    co__waiter_t *list = NULL;
    co__lock(&pd->lock);
    if (modes & CO__PD_READ) {
        if (modes & CO__PD_HUP) __atomic_store_n(&pd->hup, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&pd->rseq, 1, __ATOMIC_RELEASE);
        pd_claim_all(&pd->rq, 0, &list);
    }
    if (modes & CO__PD_WRITE) {
        __atomic_add_fetch(&pd->wseq, 1, __ATOMIC_RELEASE);
        pd_claim_all(&pd->wq, 0, &list);
    }
    co__unlock(&pd->lock);
    return pd_wake_list(list);
}

void co__pd_wake(co__pd_t *pd, int modes, int result) {
    co__waiter_t *list = NULL;
    co__lock(&pd->lock);
    if (modes & CO__PD_READ)
        pd_claim_all(&pd->rq, result, &list);
    if (modes & CO__PD_WRITE)
        pd_claim_all(&pd->wq, result, &list);
    co__unlock(&pd->lock);
    (void)pd_wake_list(list);
}

/* ---- waiting ------------------------------------------------------------- */

static bool deadline_passed(int64_t deadline) {
    return deadline >= 0 && deadline <= co_now();
}

int co__pd_wait(co__pd_t *pd, int modes, uint32_t rseq, uint32_t wseq, int64_t deadline) {
    if (deadline_passed(deadline))
        return CO_ETIMEDOUT;
    co__parker_t pk;
    co__parker_init(&pk, CO__WR_IO);
    if (!pk.g)
        co__netpoll_want(); /* before pd->lock: it may start an M */
    co__waiter_t wr = {0}, ww = {0};
    wr.pk = ww.pk = &pk;
    co__lock(&pd->lock);
    if (((modes & CO__PD_READ) && __atomic_load_n(&pd->rseq, __ATOMIC_RELAXED) != rseq) ||
        ((modes & CO__PD_WRITE) && __atomic_load_n(&pd->wseq, __ATOMIC_RELAXED) != wseq)) {
        co__unlock(&pd->lock);
        return 0; /* an edge arrived since the syscall: retry it */
    }
    if (__atomic_load_n(&pd->state, __ATOMIC_RELAXED) & CO__PD_CLOSING) {
        co__unlock(&pd->lock);
        return CO_ECLOSED;
    }
    if (modes & CO__PD_READ)
        co__waitq_push(&pd->rq, &wr);
    if (modes & CO__PD_WRITE)
        co__waitq_push(&pd->wq, &ww);
    co__np_waiters_add(1);
    /* One side, no deadline: only a waker popping its waiter under
     * pd->lock claims it, so the wait may be compacted (compact.c). */
    if (pk.g && deadline == CO_FOREVER && modes != (CO__PD_READ | CO__PD_WRITE) && co__g_compact_on(pk.g))
        co__compact_offer(pk.g, &pd->lock, modes == CO__PD_READ ? &wr : &ww);
    int rc = co__park_lock(&pk, deadline, &pd->lock);
    co__np_waiters_add(-1);
    if (rc == CO_ETIMEDOUT || modes == (CO__PD_READ | CO__PD_WRITE)) {
        co__lock(&pd->lock);
        co__waitq_remove(&wr); /* no-op for the side that fired */
        co__waitq_remove(&ww);
        co__unlock(&pd->lock);
    }
    if (rc == CO_ETIMEDOUT)
        return CO_ETIMEDOUT;
    return ((co__waiter_t *)pk.winner)->result;
}
