/* Real servers for the hook's tests: a free loopback port, a server
 * process started and stopped by the test, the fd limit raised. Plain
 * helpers, called from main before the runtime or from coroutines. */
#ifndef COLONY_TEST_HOOK_SERVERS_H
#define COLONY_TEST_HOOK_SERVERS_H
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A port nobody listens on now (bound to port 0, then released). */
__attribute__((unused)) static int hs_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) < 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* Whether something accepts on 127.0.0.1:port. */
__attribute__((unused)) static int hs_port_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

/* Waits up to ms for the port to open (polling every 20 ms), unless pid
 * died meanwhile. 1 if it opened. */
__attribute__((unused)) static int hs_wait_port(int port, pid_t pid, int ms) {
    for (int i = 0; i < ms / 20; i++) {
        if (hs_port_open(port)) return 1;
        if (pid > 0 && waitpid(pid, NULL, WNOHANG) == pid) return 0;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* fork + exec argv with stdout/stderr to /dev/null (LD_PRELOAD dropped:
 * the server is not ours to hook); -1 on failure. */
__attribute__((unused)) static pid_t hs_spawn(char *const argv[]) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        unsetenv("LD_PRELOAD");
        int dn = open("/dev/null", O_RDWR);
        if (dn >= 0) {
            dup2(dn, 0);
            dup2(dn, 1);
            dup2(dn, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* SIGKILL (or SIGTERM first, then SIGKILL after 3 s) and reap. */
__attribute__((unused)) static void hs_stop(pid_t pid, int sig) {
    if (pid <= 0) return;
    kill(pid, sig);
    for (int i = 0; i < 150; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Raises the soft fd limit towards want (the hard limit caps it); returns
 * the soft limit in force. */
__attribute__((unused)) static long hs_raise_nofile(long want) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) < 0) return 1024;
    if ((long)r.rlim_cur < want) {
        r.rlim_cur = (rlim_t)want < r.rlim_max ? (rlim_t)want : r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
        getrlimit(RLIMIT_NOFILE, &r);
    }
    return (long)r.rlim_cur;
}

__attribute__((unused)) __attribute__((unused)) static int hs_executable(const char *p) { return access(p, X_OK) == 0; }

/* Drops LD_PRELOAD once the hook is loaded (the loader read it at
 * start): a child that is not this program must not load it. Under TSan
 * the report's symbolizer (llvm-symbolizer, run with this environment) is
 * one: the hook pulls in the instrumented libcolony.so, which cannot load
 * outside a TSan program, and every report would come out unsymbolized
 * (suppressions match symbolized frames). */
__attribute__((unused)) static void hs_preload_drop(void) { unsetenv("LD_PRELOAD"); }
#endif
