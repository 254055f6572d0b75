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
 * One request at a time, from sysmon alone: with the reader idle (ans ==
 * req) sysmon writes the request and bumps req (release: pairs with the
 * reader's acquire), the reader writes the answer and stores ans = req
 * (release: pairs with sysmon's acquire). sysmon waits up to READ_WAIT_NS
 * for it: one late (the host did not run the reader) is answered "late",
 * and no new request is made before it has come, so a request is never
 * rewritten while the reader reads it.
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

#define READ_WAIT_NS 2000000 /* how long sysmon waits for an answer */

enum { RQ_STATE, RQ_THREADS };

static struct {
    pthread_t thread;
    /* 1 while the reader runs in a table of its own. Written by
     * co__procstat_start before sysmon starts and by co__procstat_stop
     * after it has been joined; read by sysmon in between. */
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
    for (int f = 3; c && f <= 20; f++) c = strchr(c + 1, ' ');
    return c ? atoi(c + 1) : -1;
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
            co__futex_wait(&rd.req, v, CO_FOREVER);
            continue;
        }
        rd.result = answer(rd.kind, rd.tid);
        done = v;
        __atomic_store_n(&rd.ans, v, __ATOMIC_RELEASE);
        co__futex_wake(&rd.ans, 1);
    }
    return NULL;
}

void co__procstat_start(void) {
    rd.up = 0;
    rd.verdict = rd.req = rd.ans = rd.stop = 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    int rc = pthread_create(&rd.thread, &attr, reader_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) return; /* no reader: sysmon reads the files itself */
    uint32_t v;
    while ((v = __atomic_load_n(&rd.verdict, __ATOMIC_ACQUIRE)) == 0)
        co__futex_wait(&rd.verdict, 0, CO_FOREVER);
    if (v == 1)
        rd.up = 1;
    else
        pthread_join(rd.thread, NULL);
}

void co__procstat_stop(void) {
    if (!rd.up) return;
    __atomic_store_n(&rd.stop, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&rd.req, 1, __ATOMIC_RELEASE); /* sysmon is gone: no request races it */
    co__futex_wake(&rd.req, 1);
    pthread_join(rd.thread, NULL);
    rd.up = 0;
}

int co__procstat_threads_own(void) { return rd.up; }

/* sysmon: kind's answer for tid, from the reader, or late. */
static int ask(int kind, int tid, int late) {
    if (!rd.up) return answer(kind, tid);
    uint32_t seq = __atomic_load_n(&rd.req, __ATOMIC_RELAXED); /* sysmon alone bumps it */
    if (__atomic_load_n(&rd.ans, __ATOMIC_ACQUIRE) != seq) return late; /* the last still unanswered */
    rd.kind = kind;
    rd.tid = tid;
    __atomic_store_n(&rd.req, seq + 1, __ATOMIC_RELEASE);
    co__futex_wake(&rd.req, 1);
    int64_t until = co_now() + READ_WAIT_NS;
    uint32_t a;
    while ((a = __atomic_load_n(&rd.ans, __ATOMIC_ACQUIRE)) != seq + 1)
        if (co__futex_wait(&rd.ans, a, until) == CO_ETIMEDOUT) return late;
    return rd.result;
}

int co__procstat_state(int tid) { return ask(RQ_STATE, tid, CO__PROCSTAT_LATE); }

int co__procstat_threads(void) { return ask(RQ_THREADS, 0, -1); }
