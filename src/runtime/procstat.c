/*
 * sysmon's looks at /proc (a thread's scheduling state, the process's
 * thread count), made by a thread with a file table of its own.
 *
 * fd numbers are process-wide: a file the runtime opened and closed
 * behind the program's back would take the lowest free number, perhaps
 * one the program has just closed under a read still using it, and that
 * read would then return the runtime's file instead of failing with
 * EBADF. So the reader thread first leaves the process's file table
 * (close_range over every number with CLOSE_RANGE_UNSHARE: a new, empty
 * table, Linux 5.9) and opens, reads and closes its files there, where no
 * number of the program's is ever taken. Its system calls are raw: a
 * sanitizer's fd bookkeeping knows one table per process.
 *
 * The reader is started at sysmon's first look that needs it and leaves
 * after IDLE_NS without a request, so a program whose Ps are never held
 * too long has no thread for it.
 *
 * One request at a time, from sysmon alone: with the reader idle (ans ==
 * req) sysmon writes the request and moves req on by a CAS (release:
 * pairs with the reader's acquire), the reader writes the answer and
 * stores ans = req (release: pairs with sysmon's acquire). sysmon waits up
 * to READ_WAIT_NS for it: one late (the host did not run the reader) is
 * answered "late", and no new request is made before it has come, so a
 * request is never rewritten while the reader reads it. A reader idle for
 * IDLE_NS leaves by a CAS of req to req | GONE: of that CAS and sysmon's
 * next request, one wins; sysmon joins a reader gone and starts another.
 *
 * Without CLOSE_RANGE_UNSHARE (an older kernel, a seccomp filter) there
 * is no reader, and sysmon opens the files itself, in the process's
 * table, at each look.
 */
#include "runtime/proc.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

#define READ_WAIT_NS 2000000   /* how long sysmon waits for an answer */
#define IDLE_NS 1000000000LL   /* a reader without a request this long leaves */
#define GONE 0x80000000u       /* in req: the reader has left */

enum { RQ_STATE, RQ_THREADS };

static struct {
    /* 0: no reader; 1: a reader started (detached, maybe gone: see req);
     * 2: no table of its own to be had. Written and read by sysmon, and
     * by co__procstat_start before sysmon starts and co__procstat_stop
     * after it has been joined. */
    int up;
    /* futex word: 1 up, 2 no table of its own. Stored once by the reader
     * (release), waited for by co__procstat_start (acquire). */
    uint32_t verdict;
    uint32_t req, ans; /* futex words: see the file comment */
    int kind, tid;     /* the request: sysmon writes it while ans == req */
    int result;        /* the answer: the reader writes it before ans */
    /* 1: the reader exits. Stored (release) by co__procstat_stop before it
     * bumps req; the reader loads it (acquire) after each load of req. */
    uint32_t stop;
    /* futex word: 1 once a reader stopped by co__procstat_stop is past its
     * last touch of rd (release; the stop's wait acquires). Readers are
     * detached: one that leaves idle touches nothing after its CAS. */
    uint32_t exited;
} rd;

/* path's first bytes into buf, NUL-terminated: their length, or -1. */
static long read_file(const char *path, char *buf, size_t size) {
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    long n = syscall(SYS_read, (int)fd, buf, size - 1);
    syscall(SYS_close, (int)fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    return n;
}

/* A request's answer: RQ_STATE, tid's state letter (0: unknown);
 * RQ_THREADS, num_threads, the 20th field of the process's stat (-1). */
static int answer(int kind, int tid) {
    char path[64], buf[512];
    if (kind == RQ_STATE)
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    const char *c = read_file(path, buf, sizeof buf) < 0 ? NULL : strrchr(buf, ')');
    /* the name before the last ')' may hold anything */
    if (kind == RQ_STATE) return c && c[1] == ' ' ? c[2] : 0;
    /* fields 3 (the state) to 20 follow it, each after one space */
    const char *st = c;
    for (int f = 3; c && f <= 20; f++) c = strchr(c + 1, ' ');
    if (!c) return -1;
    /* The main thread gone by pthread_exit stays in the count as a zombie
     * (the process's state is its state) until the last thread leaves. */
    return atoi(c + 1) - (st[1] == ' ' && st[2] == 'Z');
}

static void *reader_main(void *arg) {
    (void)arg;
    long r = -1;
#ifdef SYS_close_range
    r = syscall(SYS_close_range, 0u, ~0u, CLOSE_RANGE_UNSHARE);
#endif
    __atomic_store_n(&rd.verdict, r == 0 ? 1 : 2, __ATOMIC_RELEASE);
    co__futex_wake(&rd.verdict, 1);
    if (r != 0) return NULL;
    uint32_t done = 0;
    for (;;) {
        uint32_t v = __atomic_load_n(&rd.req, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&rd.stop, __ATOMIC_ACQUIRE)) break;
        if (v == done) {
            if (co__futex_wait(&rd.req, v, co_now() + IDLE_NS) == CO_ETIMEDOUT) {
                uint32_t e = v; /* idle: leave, unless a request came meanwhile */
                if (__atomic_compare_exchange_n(&rd.req, &e, v | GONE, false, __ATOMIC_ACQ_REL,
                                                __ATOMIC_ACQUIRE))
                    return NULL; /* gone: sysmon may start another at once, which
                                  * resets rd: no touch of it after this CAS */
            }
            continue;
        }
        rd.result = answer(rd.kind, rd.tid);
        done = v;
        __atomic_store_n(&rd.ans, v, __ATOMIC_RELEASE);
        co__futex_wake(&rd.ans, 1);
    }
    __atomic_store_n(&rd.exited, 1, __ATOMIC_RELEASE); /* stopped: the last touch of rd */
    co__futex_wake(&rd.exited, 1);
    return NULL;
}

/* sysmon: a reader, started; false if no table of its own is to be had
 * (or no thread), and none will be tried again. */
static bool reader_spawn(void) {
    rd.verdict = rd.req = rd.ans = rd.stop = rd.exited = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t; /* detached: never joined */
    int rc = pthread_create(&t, &attr, reader_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) return false; /* for now: the next look tries again */
    uint32_t v;
    while ((v = __atomic_load_n(&rd.verdict, __ATOMIC_ACQUIRE)) == 0)
        co__futex_wait(&rd.verdict, 0, CO_FOREVER);
    rd.up = v == 1 ? 1 : 2; /* 2: that reader has returned after its verdict */
    return v == 1;
}

/* Before sysmon starts (co_init, or a fork's child): no reader yet. */
void co__procstat_start(void) { rd.up = 0; }

/* After sysmon has been joined: nothing asks any more. */
void co__procstat_stop(void) {
    if (rd.up == 1) {
        __atomic_store_n(&rd.stop, 1, __ATOMIC_RELEASE);
        /* fails a leaving CAS; if the reader has left already, it is gone */
        uint32_t old = __atomic_fetch_add(&rd.req, 1, __ATOMIC_ACQ_REL);
        co__futex_wake(&rd.req, 1);
        if (!(old & GONE))
            while (__atomic_load_n(&rd.exited, __ATOMIC_ACQUIRE) == 0) co__futex_wait(&rd.exited, 0, CO_FOREVER);
    }
    if (rd.up != 2) rd.up = 0;
}

int co__procstat_threads_own(void) {
    return __atomic_load_n(&rd.up, __ATOMIC_RELAXED) == 1 && !(__atomic_load_n(&rd.req, __ATOMIC_ACQUIRE) & GONE);
}

/* sysmon: kind's answer for tid, from the reader, or late. */
static int ask(int kind, int tid, int late) {
    for (int tries = 0; tries < 3; tries++) {
        if (rd.up == 2 || (rd.up == 0 && !reader_spawn())) return answer(kind, tid);
        uint32_t seq = __atomic_load_n(&rd.req, __ATOMIC_ACQUIRE);
        if (seq & GONE) { /* left while idle (detached, past its last touch): another */
            rd.up = 0;
            continue;
        }
        if (__atomic_load_n(&rd.ans, __ATOMIC_ACQUIRE) != seq) return late; /* the last still unanswered */
        rd.kind = kind;
        rd.tid = tid;
        uint32_t next = (seq + 1) & ~GONE;
        if (!__atomic_compare_exchange_n(&rd.req, &seq, next, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue; /* it left just now */
        co__futex_wake(&rd.req, 1);
        int64_t until = co_now() + READ_WAIT_NS;
        uint32_t a;
        while ((a = __atomic_load_n(&rd.ans, __ATOMIC_ACQUIRE)) != next)
            if (co__futex_wait(&rd.ans, a, until) == CO_ETIMEDOUT) return late;
        return rd.result;
    }
    return late;
}

int co__procstat_state(int tid) { return ask(RQ_STATE, tid, CO__PROCSTAT_LATE); }

int co__procstat_threads(void) { return ask(RQ_THREADS, 0, -1); }
