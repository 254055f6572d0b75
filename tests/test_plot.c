/* bench/plot.sh: a small results file in the two table shapes that
 * the files in bench/results/ use gives a PNG per benchmark family and an overview;
 * a file with no colony/Go rows and a missing gnuplot draw nothing and
 * still exit 0 (a chart never fails `make bench`). Skips (77) without
 * gnuplot. */
// ctest-no-chaos
// ctest-timeout: 60
#include "t.h"

#include <sys/stat.h>
#include <sys/wait.h>

static char dir[256];

static void put(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Runs the script on dir/<in> into dir/<out>; its exit status, its stderr
 * in err. */
static int plot(const char *env, const char *out, const char *in, char *err, size_t size) {
    char cmd[2048], errpath[512];
    snprintf(errpath, sizeof errpath, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "%s sh '%s/bench/plot.sh' '%s/%s' '%s/%s' 2>'%s'", env, CO_SOURCE_DIR,
             dir, out, dir, in, errpath);
    int st = system(cmd);
    err[0] = 0;
    FILE *f = fopen(errpath, "r");
    if (f) {
        size_t n = fread(err, 1, size - 1, f);
        err[n] = 0;
        fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A PNG of some size: its signature and more than a header. */
static int is_png(const char *out, const char *name) {
    char path[512];
    unsigned char sig[8];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s/%s", dir, out, name);
    if (stat(path, &sb) != 0 || sb.st_size < 2000) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(sig, 1, 8, f);
    fclose(f);
    return n == 8 && !memcmp(sig, "\x89PNG\r\n\x1a\n", 8);
}

static int exists(const char *out, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", dir, out, name);
    return access(path, F_OK) == 0;
}

static const char runtime_md[] =
    "# Runtime\n\n"
    "| benchmark | colony | Go 1.19 | colony/Go | target | met? | peak RSS colony / Go | n |\n"
    "|---|---|---|---|---|---|---|---|\n"
    "| yield round trip (per switch) | 8.84 ns [7.26–11.9] | 91.6 ns [86.5–109] | 0.096 | x | yes | 1 / 1 MiB | 5 |\n"
    "| 1M coroutines parked: peak RSS per coroutine | 4408 B [4408–4408] | 2736 B [2735–2737] | 1.6 | x | yes | 1 / 1 MiB | 3 |\n"
    "| 2 streams: throughput 2 P / 1 P | 1.96x | 1.97x | — | x | yes | — | 5 |\n"
    "| unbuffered ping-pong, 1 P (per one-way message) | 72.2 ns [48.1–72.8] | 184 ns [148–267] | 0.39 | x | no | 1 / 1 MiB | 5 |\n"
    "| contended mutex (per lock+unlock) | 39.8 ns [38.4–41.2] | 55.9 ns [51.2–58.0] | 0.71 | x | yes | 1 / 1 MiB | 5 |\n"
    "\nText between tables.\n\n"
    "## Tasks\n\n"
    "| | wall ms | peak RSS MB | runs |\n"
    "|---|---:|---:|---:|\n"
    "| colony | 642 | 99.2 | 3 |\n"
    "| go_ants | 1542 | 53.9 | 3 |\n";

static void test_draws_every_family(void) {
    char err[4096];
    put("runtime.md", runtime_md);
    CHECK_EQ(plot("", "charts", "runtime.md", err, sizeof err), 0);
    if (err[0]) fprintf(stderr, "%s", err);
    /* runtime.md's rows split by label: yield, RSS, spread -> runtime;
     * ping-pong -> channels; mutex -> sync; the "## Tasks" table too */
    CHECK(is_png("charts", "runtime.png"));
    CHECK(is_png("charts", "channels.png"));
    CHECK(is_png("charts", "sync.png"));
    CHECK(is_png("charts", "overview.png"));
    CHECK(!exists("charts", "pool.png"));
    CHECK(strstr(err, "gnuplot failed") == NULL);
}

static void test_no_rows_draws_nothing(void) {
    char err[4096];
    put("other.md", "# Nothing to draw\n\n| lock | M/s |\n|---|---:|\n| yield | 11.4 |\n| spin | 12.1 |\n");
    CHECK_EQ(plot("", "empty", "other.md", err, sizeof err), 0);
    CHECK(strstr(err, "no colony/Go rows") != NULL);
    CHECK(!exists("empty", "overview.png"));
    CHECK(!exists("empty", "other.png"));
}

static void test_without_gnuplot_skips(void) {
    char err[4096];
    put("runtime.md", runtime_md);
    CHECK_EQ(plot("GNUPLOT=/nonexistent/gnuplot", "none", "runtime.md", err, sizeof err), 0);
    CHECK(strstr(err, "gnuplot not found") != NULL);
    CHECK(!exists("none", "runtime.png"));
}

int main(void) {
    if (system("command -v gnuplot >/dev/null 2>&1 && gnuplot -e 'set terminal pngcairo' </dev/null "
               ">/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: no gnuplot with the pngcairo terminal (Debian: gnuplot-nox)\n");
        return 77;
    }
    t_begin(50);
    snprintf(dir, sizeof dir, "%s/colony-plot-test.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_draws_every_family);
    T_RUN(test_no_rows_draws_nothing);
    T_RUN(test_without_gnuplot_skips);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    (void)!system(cmd);
    return t_end();
}
