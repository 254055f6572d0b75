/* tools/colony-trace: a trace of a small run becomes an HTML page with a
 * lane per M and per P and the summary tables; where Debian's chromium is
 * installed, the page is rendered headless and the screenshot must show
 * the lanes (many distinct colours, not a blank page) and its DOM the lane
 * elements. */
// ctest-no-chaos
// ctest-timeout: 90
#include "colony.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[] = "/tmp/colony-trace-html-XXXXXX";
static co_chan_t *ch;
static co_waitgroup_t wg = CO_WAITGROUP_INIT;

static void sender(void *arg) {
    (void)arg;
    for (int i = 0; i < 300; i++) CHECK_EQ(co_chan_send(ch, &i, CO_FOREVER), 0);
    co_waitgroup_done(&wg);
}

static void receiver(void *arg) {
    (void)arg;
    int v;
    for (int i = 0; i < 300; i++) {
        CHECK_EQ(co_chan_recv(ch, &v, CO_FOREVER), 0);
        volatile long x = 0; /* (each receiver its own: there are two) */
        for (int k = 0; k < 20000; k++) x += k ^ v; /* slices wide enough to see */
        (void)x;
        if (i % 30 == 0) co_sleep(200 * 1000);
    }
    co_waitgroup_done(&wg);
}

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* the first line of a command's output, as a number (-1: none) */
static long sh_num(const char *cmd) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    long v = -1;
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    pclose(f);
    return v;
}

static int skip;

static void test_page(void) {
    char json[128], html[128], png[128], cmd[1024];
    snprintf(json, sizeof json, "%s/t.json", dir);
    snprintf(html, sizeof html, "%s/t.html", dir);
    snprintf(png, sizeof png, "%s/t.png", dir);
    co_config_t cfg = {.procs = 2};
    CHECK_EQ(co_init(&cfg), 0);
    CHECK_EQ(co_chan_new(&ch, sizeof(int), 4), 0);
    CHECK_EQ(co_trace_start(json), 0);
    co_waitgroup_add(&wg, 4);
    for (int i = 0; i < 2; i++) {
        co_go(sender, NULL);
        co_go(receiver, NULL);
    }
    co_waitgroup_wait(&wg);
    CHECK_EQ(co_trace_stop(), 0);
    co_chan_free(ch);

    /* the page: made, self-contained, with its lanes and tables */
    snprintf(cmd, sizeof cmd, "python3 %s/tools/colony-trace %s %s >/dev/null", CO_SOURCE_DIR, json, html);
    CHECK_EQ(sh(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -o 'class=\"lane[^\"]*\">M[0-9]' %s | wc -l", html);
    CHECK(sh_num(cmd) >= 1);
    snprintf(cmd, sizeof cmd, "grep -o 'class=\"lane p\">P[0-9]' %s | wc -l", html);
    CHECK(sh_num(cmd) >= 1);
    snprintf(cmd, sizeof cmd, "grep -c 'Where the time went' %s", html);
    CHECK_EQ(sh_num(cmd), 1);
    snprintf(cmd, sizeof cmd, "grep -Ec '(src|href)=\"?(https?:)?//' %s", html);
    CHECK_EQ(sh_num(cmd), 0); /* nothing fetched from anywhere */
    /* bad input: an error, not a page */
    snprintf(cmd, sizeof cmd, "python3 %s/tools/colony-trace %s/none.json %s/x.html 2>/dev/null", CO_SOURCE_DIR,
             dir, dir);
    CHECK(sh(cmd) != 0);

    if (sh("command -v chromium >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skip (rendering only): chromium not installed (apt-get install chromium)\n");
        skip = 1;
    } else {
        const char *flags = "--headless --no-sandbox --disable-gpu --hide-scrollbars";
        snprintf(cmd, sizeof cmd,
                 "timeout 60 chromium %s --window-size=1200,700 --screenshot=%s file://%s >/dev/null 2>&1", flags,
                 png, html);
        CHECK_EQ(sh(cmd), 0);
        snprintf(cmd, sizeof cmd, "python3 %s/tests/png_colours.py %s", CO_SOURCE_DIR, png);
        long colours = sh_num(cmd);
        fprintf(stderr, "screenshot: %ld distinct colours\n", colours);
        CHECK(colours >= 8);
        /* drawn lanes, not only text: pixels of the Ps' "held" colour and
         * of the coroutines' palette (tools/colony-trace) */
        snprintf(cmd, sizeof cmd, "python3 %s/tests/png_colours.py %s b3c7e6", CO_SOURCE_DIR, png);
        long held = sh_num(cmd);
        snprintf(cmd, sizeof cmd,
                 "python3 %s/tests/png_colours.py %s 4e8fd8 43a5a0 7e6bc4 5c9e49 c26f9b 3b7bbf 8f8a2f 2f8f7f",
                 CO_SOURCE_DIR, png);
        long running = sh_num(cmd);
        fprintf(stderr, "screenshot: %ld pixels of held Ps, %ld of running coroutines\n", held, running);
        CHECK(held >= 100);
        CHECK(running >= 100);
        /* the DOM after the script ran: the lanes are there */
        snprintf(cmd, sizeof cmd,
                 "timeout 60 chromium %s --dump-dom file://%s 2>/dev/null | grep -o 'class=\"lane' | wc -l", flags,
                 html);
        CHECK(sh_num(cmd) >= 3);
    }
}

int main(void) {
    if (sh("python3 -c 'import json, zlib' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skip: python3 not found\n");
        return 77;
    }
    t_begin(80);
    CHECK(mkdtemp(dir) != NULL);
    T_RUN(test_page);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (sh(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    CHECK_EQ(T_SHUTDOWN(), 0);
    int rc = t_end();
    return rc == 0 && skip ? 77 : rc;
}
