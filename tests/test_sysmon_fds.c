/*
 * The runtime opens no file in the program's fd table once it runs. fd
 * numbers are process-wide: a file the runtime opened and closed in the
 * background could take a number the program has just closed, and a read
 * still using that number would read the runtime's file instead of
 * failing with EBADF.
 *
 * sysmon reads a thread's state from /proc each time it judges whether the
 * host runs a stuck P's thread (it lends a spare P only if not). Here a
 * coroutine holds the only P asleep in the kernel, so each episode is
 * judged before the coroutine queued behind it may run through a lent P,
 * while the lowest free fd numbers are watched two ways:
 *  - the fd table's size (FDSize in /proc/self/status), which never
 *    shrinks: every number below it is taken first, so a file opened in
 *    the episodes, even for a moment, grows it;
 *  - a plain thread looking at the lowest free numbers all along: none
 *    may become taken.
 * Where the kernel cannot give sysmon's /proc reader a file table of its
 * own (close_range's CLOSE_RANGE_UNSHARE, Linux 5.9), sysmon opens the
 * files in the program's table, and the test is skipped.
 */
// ctest-timeout: 60
#include "t.h"
#include "t_internal.h"
#include "t_lend.h"

#include <colony.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>

#define MS 1000000LL
#define EPISODES 20

static bool fd_open(int fd) { return fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

static int lowest_free_from(int fd) {
    while (fd_open(fd)) fd++;
    return fd;
}

/* The fd table's size, or -1 without /proc. Opens a file: call it only
 * while a number below the size is free. */
static int fd_table_size(void) {
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "FDSize: %d", &n) == 1) break;
    fclose(f);
    return n;
}

/* ---- the watcher ---------------------------------------------------------- */

static int watch_stop; /* atomic */
static int taken_fd = -1; /* the first number seen taken while watched (watcher only) */
static uint64_t looks;

static void *watcher(void *arg) {
    int low = *(int *)arg;
    while (!__atomic_load_n(&watch_stop, __ATOMIC_RELAXED)) {
        if (taken_fd < 0 && fd_open(low)) taken_fd = low;
        looks++;
    }
    return NULL;
}

/* ---- the episodes (as test_lend_starved's) -------------------------------- */

/* Whether the coroutine queued behind a holder asleep in the kernel ran
 * while the holder held the only P: sysmon judged the holder's thread. */
static bool judged_episode(void) { return hold_and_queue(sleep_in_kernel); }

static void test_no_file_opened_and_closed(void) {
    (void)judged_episode(); /* the Ms exist before the watch begins */
    /* Take every number below the table's size (none under an emulator,
     * whose own files share the table). */
    int size = t_emulator() ? -1 : fd_table_size();
    int src = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECK(src >= 0);
    int fill[1024], nfill = 0;
    while (size > 0 && nfill < 1024) {
        int f = fcntl(src, F_DUPFD_CLOEXEC, 0);
        if (f < 0 || f >= size) { /* the limit, or a table grown meanwhile */
            if (f >= 0) close(f);
            size = -1;
            break;
        }
        fill[nfill++] = f;
        if (f == size - 1) break;
    }
    int low = lowest_free_from(0);
    int kept = 0; /* numbers from the first free one on taken in the episodes */
    for (int fd = low; fd < low + 64; fd++) kept -= fd_open(fd);
    __atomic_store_n(&watch_stop, 0, __ATOMIC_RELAXED);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, watcher, &low), 0);
    int lent = 0;
    for (int i = 0; i < EPISODES; i++) lent += judged_episode();
    __atomic_store_n(&watch_stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    for (int fd = low; fd < low + 64; fd++) kept += fd_open(fd);
    for (int i = 0; i < nfill; i++) close(fill[i]);
    close(src);
    int grown = size > 0 ? fd_table_size() : -1;
    fprintf(stderr, "   (%d of %d episodes lent; fd table %d -> %d; %llu looks)\n", lent, EPISODES,
            size, grown, (unsigned long long)looks);
    CHECK_EQ(lent, EPISODES); /* every episode was judged through the holder's state */
    if (grown > size) fprintf(stderr, "   a file was opened in the background (the table grew)\n");
    CHECK(grown <= size);
    if (taken_fd >= 0) fprintf(stderr, "   fd %d was taken in the background\n", taken_fd);
    CHECK_EQ(taken_fd, -1);
    CHECK_EQ(kept, 0);
    if (kept != 0) /* which numbers, and what they name (an emulator's own files, say) */
        for (int fd = low; fd < low + 64; fd++) {
            char path[64], what[256];
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(path, what, sizeof what - 1);
            if (n >= 0 || fd_open(fd))
                fprintf(stderr, "   fd %d open: %.*s\n", fd, n > 0 ? (int)n : 1, n > 0 ? what : "?");
        }
}

/* The reader is there only while sysmon looks: it leaves a second after
 * the last look, and the next look starts another, which answers. */
static void test_reader_leaves_and_returns(void) {
    CHECK(judged_episode());
    int64_t t0 = co_now();
    while (co__procstat_threads_own() && co_now() - t0 < 20 * 1000 * MS) co_sleep(10 * MS);
    CHECK_EQ(co__procstat_threads_own(), 0);
    CHECK(judged_episode());
    CHECK_EQ(co__procstat_threads_own(), 1);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_no_file_opened_and_closed);
    T_RUN(test_reader_leaves_and_returns);
    return 0;
}

/* Whether a thread can have a file table of its own here, as the
 * runtime's /proc reader asks for one (in a thread that then ends). */
static void *try_unshare(void *arg) {
    (void)arg;
#ifdef SYS_close_range
    return (void *)(intptr_t)(syscall(SYS_close_range, 0u, ~0u, 2u /* CLOSE_RANGE_UNSHARE */) == 0);
#else
    return NULL;
#endif
}
static bool own_table_possible(void) {
    pthread_t t;
    void *r = NULL;
    if (pthread_create(&t, NULL, try_unshare, NULL) != 0) return false;
    pthread_join(t, &r);
    return r != NULL;
}

int main(void) {
    t_begin(50);
    int before = t_count_fds();
    if (!own_table_possible()) {
        fprintf(stderr, "test_sysmon_fds: skipped: no file table of its own for sysmon's /proc "
                        "reader (close_range's CLOSE_RANGE_UNSHARE, Linux 5.9)\n");
        return 77;
    }
    t_start(1);
    CHECK_EQ(co_main(run, NULL), 0);
    CHECK_EQ(T_SHUTDOWN(), 0);
    CHECK_EQ(t_count_fds(), before); /* co_shutdown closed the netpoller's */
    return t_end();
}
