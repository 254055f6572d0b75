/* Deadlock detection: a program whose coroutines can never run again exits
 * with status 2 and Go's line, naming what each waits on; programs that
 * only look stuck (a thread colony does not know, a sleep, an idle socket,
 * a co_blocking call, each waking them after a second) are left alone.
 * Every case runs as a child of its own, all at once. */
// ctest-no-chaos
// ctest-timeout: 120
#include "colony.h"
#include "t.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MS (1000 * 1000LL)

static co_chan_t *ch;
static int fds[2];

/* ---- the cases, each in a child ------------------------------------------ */
static int chan_main(void *a) { /* nobody will ever send */
    (void)a;
    co_chan_new(&ch, sizeof(int), 0);
    int v;
    co_chan_recv(ch, &v, CO_FOREVER);
    return 0;
}
static co_mutex_t m1, m2;
static co_waitgroup_t both = CO_WAITGROUP_INIT;
static void abba(void *a) {
    int first = a != NULL;
    co_mutex_lock(first ? &m1 : &m2);
    co_waitgroup_done(&both);
    co_waitgroup_wait(&both); /* both hold their first lock */
    co_mutex_lock(first ? &m2 : &m1);
}
static int mutex_main(void *a) {
    (void)a;
    co_waitgroup_add(&both, 2);
    co_go(abba, (void *)1);
    co_go(abba, NULL);
    co_waitgroup_t never = CO_WAITGROUP_INIT;
    co_waitgroup_add(&never, 1);
    co_waitgroup_wait(&never);
    return 0;
}
static int wg_main(void *a) {
    (void)a;
    co_waitgroup_t wg = CO_WAITGROUP_INIT;
    co_waitgroup_add(&wg, 1); /* never done */
    co_waitgroup_wait(&wg);
    return 0;
}

/* not deadlocks: each is woken after a second */
static void *late_sender(void *a) {
    (void)a;
    usleep(1000 * 1000);
    int v = 7;
    co_chan_send(ch, &v, CO_FOREVER);
    return NULL;
}
static int thread_main(void *a) {
    (void)a;
    co_chan_new(&ch, sizeof(int), 0);
    pthread_t t;
    pthread_create(&t, NULL, late_sender, NULL); /* a thread colony does not know */
    int v = 0;
    co_chan_recv(ch, &v, CO_FOREVER);
    pthread_join(t, NULL);
    return v == 7 ? 0 : 1;
}
static void sleeper(void *a) {
    (void)a;
    co_sleep(1000 * MS);
    int v = 1;
    co_chan_send(ch, &v, CO_FOREVER);
}
static int sleep_main(void *a) {
    (void)a;
    co_chan_new(&ch, sizeof(int), 0);
    co_go(sleeper, NULL);
    int v = 0;
    co_chan_recv(ch, &v, CO_FOREVER);
    return v == 1 ? 0 : 1;
}
static void *late_writer(void *a) {
    (void)a;
    usleep(1000 * 1000);
    (void)!write(fds[1], "x", 1);
    return NULL;
}
static int socket_main(void *a) {
    (void)a;
    socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
    pthread_t t;
    pthread_create(&t, NULL, late_writer, NULL);
    char c;
    ssize_t n = co_read(fds[0], &c, 1, CO_FOREVER); /* the netpoller waits */
    pthread_join(t, NULL);
    return n == 1 ? 0 : 1;
}
static void slow_call(void *a) {
    (void)a;
    usleep(1000 * 1000);
}
static void blocker(void *a) {
    (void)a;
    co_blocking(slow_call, NULL);
    int v = 2;
    co_chan_send(ch, &v, CO_FOREVER);
}
static int blocking_main(void *a) {
    (void)a;
    co_chan_new(&ch, sizeof(int), 0);
    co_go(blocker, NULL);
    int v = 0;
    co_chan_recv(ch, &v, CO_FOREVER);
    return v == 2 ? 0 : 1;
}

/* A deadlock while a trace session is on: its writer thread is colony's
 * own and wakes nobody, so the report still comes. */
static int trace_main(void *a) {
    (void)a;
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_deadlock_trace.%d.json", (int)getpid());
    if (co_trace_start(path) != 0) return 98;
    return chan_main(NULL);
}

/* main leaves by pthread_exit with a coroutine waiting for ever: its
 * thread stays in the process's thread count as a zombie, and is not one
 * that could call in. */
static void waiter(void *a) {
    (void)a;
    int v;
    co_chan_recv(ch, &v, CO_FOREVER);
}
static int pthread_exit_case(void) {
    co_chan_new(&ch, sizeof(int), 0);
    co_go(waiter, NULL);
    pthread_exit(NULL);
}

/* fork after co_shutdown (what the fork message recommends) while a plain
 * thread of the parent waits in a channel receive: that thread is not in
 * the child, and must count neither for a deadlock nor against one. The
 * child runs fn under co_main; the case exits with its status. */
static co_chan_t *parent_ch;
static void *parent_parked(void *a) {
    (void)a;
    int v;
    co_chan_recv(parent_ch, &v, CO_FOREVER);
    return NULL;
}
static int fork_case(int (*fn)(void *)) {
    co_chan_new(&parent_ch, sizeof(int), 0);
    pthread_t t;
    pthread_create(&t, NULL, parent_parked, NULL);
    co_alive_t al = {0};
    while (co_alive(&al) == 0 && al.plain_parked < 1) usleep(1000);
    if (co_shutdown() != 0) return 97;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(15); /* not inherited: the child's own */
        _exit(co_main(fn, NULL));
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return 96;
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

static int run_case(const char *name) {
    alarm(15); /* a report that never comes fails the case, not the whole test's timeout */
    if (!strcmp(name, "chan")) return co_main(chan_main, NULL);
    if (!strcmp(name, "mutex")) return co_main(mutex_main, NULL);
    if (!strcmp(name, "wg")) return co_main(wg_main, NULL);
    if (!strcmp(name, "thread")) return co_main(thread_main, NULL);
    if (!strcmp(name, "sleep")) return co_main(sleep_main, NULL);
    if (!strcmp(name, "socket")) return co_main(socket_main, NULL);
    if (!strcmp(name, "blocking")) return co_main(blocking_main, NULL);
    if (!strcmp(name, "trace")) return co_main(trace_main, NULL);
    if (!strcmp(name, "pthread_exit")) return pthread_exit_case();
    if (!strcmp(name, "fork_thread")) return fork_case(thread_main);
    if (!strcmp(name, "fork_chan")) return fork_case(chan_main);
    if (!strcmp(name, "off")) return co_main(wg_main, NULL); /* run with nodeadlock: killed by the parent */
    return 99;
}

/* ---- the parent ------------------------------------------------------------ */
typedef struct {
    const char *name;
    int want_status;          /* exit status wanted (2: reported) */
    const char *want[3];      /* lines the report must have */
    pid_t pid;
    int fd;
    char out[16384];
    int st;
} kid_t;

static kid_t kids[] = {
    {"chan", 2, {"all coroutines are asleep - deadlock!", "[waiting, chan receive", "'main'"}, 0, 0, {0}, 0},
    {"mutex", 2, {"all coroutines are asleep - deadlock!", "[waiting, sync.Mutex.Lock", "[waiting, sync.WaitGroup.Wait"}, 0, 0, {0}, 0},
    {"wg", 2, {"all coroutines are asleep - deadlock!", "[waiting, sync.WaitGroup.Wait", NULL}, 0, 0, {0}, 0},
    {"trace", 2, {"all coroutines are asleep - deadlock!", "[waiting, chan receive", NULL}, 0, 0, {0}, 0},
    {"pthread_exit", 2, {"all coroutines are asleep - deadlock!", "[waiting, chan receive", NULL}, 0, 0, {0}, 0},
    {"fork_chan", 2, {"all coroutines are asleep - deadlock!", "[waiting, chan receive", NULL}, 0, 0, {0}, 0},
    {"fork_thread", 0, {NULL}, 0, 0, {0}, 0},
    {"thread", 0, {NULL}, 0, 0, {0}, 0},
    {"sleep", 0, {NULL}, 0, 0, {0}, 0},
    {"socket", 0, {NULL}, 0, 0, {0}, 0},
    {"blocking", 0, {NULL}, 0, 0, {0}, 0},
};

static void test_cases(void) {
    int n = (int)(sizeof kids / sizeof kids[0]);
    for (int i = 0; i < n; i++) {
        kids[i].pid = t_fork_piped(2, &kids[i].fd);
        CHECK(kids[i].pid >= 0);
        if (kids[i].pid == 0) {
            t_execl("/proc/self/exe", "test_deadlock", "--case", kids[i].name, (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < n; i++) {
        kid_t *k = &kids[i];
        k->st = t_drain_and_wait(k->fd, k->out, sizeof k->out, k->pid);
        bool ok = WIFEXITED(k->st) && WEXITSTATUS(k->st) == k->want_status;
        for (int j = 0; j < 3 && k->want[j]; j++) ok = ok && strstr(k->out, k->want[j]) != NULL;
        if (k->want_status == 0) ok = ok && !strstr(k->out, "deadlock");
        if (!ok)
            fprintf(stderr, "case %s: status %#x (want exit %d), output:\n%s\n", k->name, k->st, k->want_status,
                    k->out);
        CHECK(ok);
        if (!strcmp(k->name, "trace")) {
            char path[64];
            snprintf(path, sizeof path, "/tmp/test_deadlock_trace.%d.json", (int)k->pid);
            unlink(path);
        }
    }
}

/* COLONY_DEBUG=nodeadlock: the same wait hangs (killed after 1.5 s). */
static void test_opt_out(void) {
    int fd;
    pid_t pid = t_fork_piped(2, &fd);
    CHECK(pid >= 0);
    if (pid == 0) {
        setenv("COLONY_DEBUG", "nodeadlock", 1);
        t_execl("/proc/self/exe", "test_deadlock", "--case", "off", (char *)NULL);
        _exit(127);
    }
    usleep(1500 * 1000);
    kill(pid, SIGKILL);
    static char out[4096];
    int st = t_drain_and_wait(fd, out, sizeof out, pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    CHECK(strstr(out, "deadlock") == NULL);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--case")) return run_case(argv[2]);
#if defined(__SANITIZE_THREAD__)
#define T_NO_DEADLOCK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define T_NO_DEADLOCK_CHECK 1
#endif
#endif
#ifdef T_NO_DEADLOCK_CHECK
    /* TSan's background thread comes up with the first thread made */
    fprintf(stderr, "test_deadlock: skipped: TSan's own thread is one colony cannot account for, so "
                    "detection rightly stays quiet\n");
    return 77;
#endif
    /* The rule needs every thread of the process to be one colony knows:
     * a sanitizer's or an emulator's own threads rule reports out. */
    int threads = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));) threads += e->d_name[0] != '.';
    if (d) closedir(d);
    if (threads != 1) {
        fprintf(stderr, "test_deadlock: skipped: the process starts with %d threads (a sanitizer's or an "
                        "emulator's), so detection rightly stays quiet\n", threads);
        return 77;
    }
    t_begin(100);
    T_RUN(test_cases);
    T_RUN(test_opt_out);
    return t_end();
}
