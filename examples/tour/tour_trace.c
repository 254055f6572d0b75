/* The tour's last stop: an execution trace. A small pipeline (a producer,
 * four workers, a collector) runs under co_trace_start; co_trace_stop
 * writes the trace as Chrome trace-event JSON (open it in Perfetto or
 * chrome://tracing), and tools/colony-trace turns it into a page any
 * browser shows offline. */
#include "tour.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ITEMS 400

static co_chan_t *work, *done;
static co_waitgroup_t workers = CO_WAITGROUP_INIT;

static void producer(void *arg) {
    (void)arg;
    for (int i = 0; i < ITEMS; i++) co_chan_send(work, &i, CO_FOREVER);
    co_chan_close(work);
}

static void nap(void *arg) { usleep(*(int *)arg); }

static void worker(void *arg) {
    int id = (int)(intptr_t)arg;
    int v;
    while (co_chan_recv(work, &v, CO_FOREVER) == 0) {
        volatile long x = 0;
        for (int k = 0; k < 20000; k++) x += k ^ v; /* some work */
        if (v % 50 == id) { /* now and then a blocking call: the P goes to another M */
            int us = 1000;
            co_blocking(nap, &us);
        } else if (v % 7 == 0) {
            co_sleep(100 * 1000);
        }
        long r = (long)x;
        co_chan_send(done, &r, CO_FOREVER);
    }
    co_waitgroup_done(&workers);
}

static void collector(void *arg) {
    long r;
    int n = 0;
    while (co_chan_recv(done, &r, CO_FOREVER) == 0) n++;
    *(int *)arg = n;
}

/* where the trace goes: beside the tour's binary (build/ in a source tree) */
static void beside_exe(char *out, size_t len, const char *name) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(out, len, "%s", name);
        return;
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(out, len, "%s/%s", exe, name);
}

void tour_trace(void) {
    printf("== an execution trace ==\n");
    char json[PATH_MAX + 32], html[PATH_MAX + 32], tool[PATH_MAX + 64];
    beside_exe(json, sizeof json, "tour-trace.json");
    beside_exe(html, sizeof html, "tour-trace.html");
    beside_exe(tool, sizeof tool, "../tools/colony-trace");
    int rc = co_trace_start(json);
    if (rc < 0) {
        printf("co_trace_start(%s): %s\n", json, co_strerror(rc));
        return;
    }
    co_chan_new(&work, sizeof(int), 16);
    co_chan_new(&done, sizeof(long), 16);
    int got = 0;
    co_waitgroup_add(&workers, 4);
    co_go(producer, NULL);
    for (int i = 0; i < 4; i++) co_go_with(&(co_attr_t){.name = "worker"}, worker, (void *)(intptr_t)i);
    co_go(collector, &got);
    co_waitgroup_wait(&workers);
    co_chan_close(done);
    while (__atomic_load_n(&got, __ATOMIC_RELAXED) == 0) co_sleep(100 * 1000);
    rc = co_trace_stop();
    co_chan_free(work);
    co_chan_free(done);
    if (rc < 0) {
        printf("co_trace_stop: %s\n", co_strerror(rc));
        return;
    }
    printf("%d items through a pipeline of 4 workers, traced:\n  %s\n", got, json);
    printf("  (Perfetto: https://ui.perfetto.dev, or chrome://tracing)\n");
    char cmd[3 * PATH_MAX + 3 * 64 + 64];
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' '%s' >/dev/null 2>&1", tool, json, html);
    if (access(tool, X_OK) == 0 && system(cmd) == 0)
        printf("  as a page for any browser, offline: %s\n", html);
    else
        printf("  to view it offline: tools/colony-trace %s\n", json);
}
