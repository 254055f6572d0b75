/* The tour (`make demo`) ends with a trace: run it, and its trace must
 * parse as JSON, hold together (no overlapping slices on an M, every
 * coroutine's events in order: tests/trace_check.py) and be turned into
 * the HTML page the tour prints. */
// ctest-no-chaos
// ctest-timeout: 120
#include "colony.h"
#include "t.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN 1
#endif
#endif

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_tour_trace(void) {
    unlink("tour-trace.json");
    unlink("tour-trace.html");
    CHECK_EQ(sh("./tour > tour-trace.out 2>&1"), 0);
    CHECK_EQ(sh("grep -q 'tour-trace.json' tour-trace.out"), 0); /* it says where */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 %s/tests/trace_check.py tour-trace.json", CO_SOURCE_DIR);
    CHECK_EQ(sh(cmd), 0);
    struct stat st;
    CHECK(stat("tour-trace.html", &st) == 0 && st.st_size > 1000);
    unlink("tour-trace.out");
}

int main(void) {
#ifdef TSAN
    /* (10 s under ASan here, 5 s plain: its million-coroutine section) */
    fprintf(stderr, "skip: the whole tour is too slow under TSan (test_trace covers the trace there)\n");
    return 77;
#endif
    if (getenv("COLONY_TEST_EMULATOR")) {
        fprintf(stderr, "skip: the whole tour is too slow under an emulator (test_trace covers the trace there)\n");
        return 77;
    }
    if (access("./tour", X_OK) != 0) {
        fprintf(stderr, "skip: no ./tour in this build (examples off)\n");
        return 77;
    }
    if (sh("python3 -c 'import json' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skip: python3 not found\n");
        return 77;
    }
    t_begin(110);
    T_RUN(test_tour_trace);
    return t_end();
}
