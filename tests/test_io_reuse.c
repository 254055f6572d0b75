/* The io layer where numbers and files part ways: a number that named a
 * regular file reused by a socket, a registration made for a reused
 * number, a failed connect seen by two callers, a fork's child closing
 * its files, and calls on numbers that are not open. Each case failed
 * (or hung) before. Behaviour, not timing. */
// ctest-timeout: 90
#define _GNU_SOURCE 1
#include "t.h"
#include "t_internal.h"

#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MS 1000000LL
#define SEC (1000 * MS)


/* A number that named a regular file (always ready), closed with close(2)
 * and reused by an empty socket: co_wait_fd waits for it. It used to say
 * "ready" at once, for good (a wait-then-EAGAIN loop spun). */
static void test_plain_number_reused(void) {
    int f = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECK(f >= 0);
    CHECK_EQ(co_wait_fd(f, CO_READABLE, co_deadline_after(SEC)), CO_READABLE);
    close(f);
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    CHECK_EQ(dup2(sv[0], f), f);
    CHECK_EQ(co_wait_fd(f, CO_READABLE, co_deadline_after(100 * MS)), CO_ETIMEDOUT);
    CHECK_EQ(write(sv[1], "r", 1), 1);
    CHECK_EQ(co_wait_fd(f, CO_READABLE, co_deadline_after(10 * SEC)), CO_READABLE);
    CHECK_EQ(co_fd_forget(f), 0);
    close(f);
    close(sv[0]);
    close(sv[1]);
}

/* colony's epoll fd, found among this process's files */
static int epoll_fd(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[300], l[64];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(p, l, sizeof l - 1);
        if (n <= 0) continue;
        l[n] = 0;
        if (!strcmp(l, "anon_inode:[eventpoll]")) found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}
/* registrations of number fd in epoll set ep */
static int registrations(int ep, int fd) {
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/self/fdinfo/%d", ep);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int n = 0, t;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "tfd: %d", &t) == 1 && t == fd) n++;
    fclose(f);
    return n;
}

/* A registration made by co_wait_fd's check of a reused number is dropped
 * by co_fd_forget: it used to stay (the slot did not count it as
 * registered), and stayed for good while the file was open elsewhere. */
static void test_reuse_registration_dropped(void) {
    int a[2], b[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b), 0);
    int n = a[0];
    CHECK_EQ(co_wait_fd(n, CO_WRITABLE, co_deadline_after(SEC)), CO_WRITABLE); /* registered */
    int ep = epoll_fd();
    CHECK(ep >= 0);
    CHECK_EQ(registrations(ep, n), 1);
    close(n); /* behind colony's back: the registration goes with the file */
    CHECK_EQ(dup2(b[0], n), n); /* the number, a new file (b[0]'s) */
    CHECK_EQ(co_wait_fd(n, CO_READABLE, co_deadline_after(50 * MS)), CO_ETIMEDOUT);
    CHECK_EQ(registrations(ep, n), 1); /* the check registered the new file */
    CHECK_EQ(co_fd_forget(n), 0);
    CHECK_EQ(registrations(ep, n), 0);
    close(n);
    CHECK_EQ(registrations(ep, n), 0);
    close(a[1]);
    close(b[0]);
    close(b[1]);
}

/* two coroutines connect one socket to a closed port */
static int port_closed(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t l = sizeof sa;
    CHECK_EQ(getsockname(s, (struct sockaddr *)&sa, &l), 0);
    close(s); /* nobody listens there now */
    return ntohs(sa.sin_port);
}
struct dial {
    int fd, port, rc;
    co_waitgroup_t *wg;
};
static void dialer(void *arg) {
    struct dial *d = arg;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    d->rc = co_connect(d->fd, (struct sockaddr *)&sa, sizeof sa, co_deadline_after(20 * SEC));
    co_waitgroup_done(d->wg);
}

/* Both get an error, neither waits for its deadline: the one whose
 * SO_ERROR read came second used to find no error and wait for an edge
 * that never comes. */
static void test_connect_twice_refused(void) {
    for (int round = 0; round < 8; round++) {
        int port = port_closed();
        int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        CHECK(s >= 0);
        co_waitgroup_t wg = CO_WAITGROUP_INIT;
        struct dial d[2] = {{s, port, 1, &wg}, {s, port, 1, &wg}};
        co_waitgroup_add(&wg, 2);
        CHECK_EQ(co_go(dialer, &d[0]), 0);
        CHECK_EQ(co_go(dialer, &d[1]), 0);
        CHECK_EQ(co_waitgroup_wait_until(&wg, co_deadline_after(60 * SEC)), 0);
        for (int i = 0; i < 2; i++) {
            CHECK(d[i].rc < 0);
            CHECK(d[i].rc != CO_ETIMEDOUT);
        }
        CHECK_EQ(co_close(s), 0);
    }
}

/* A fork's child of a running runtime closes its files, as a child on its
 * way to exec does: co_close and co_fd_forget used to end it with
 * "colony used in a child of fork()". */
static void test_fork_child_closes(void) {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    CHECK_EQ(co_wait_fd(sv[0], CO_WRITABLE, co_deadline_after(SEC)), CO_WRITABLE);
    CHECK_EQ(co_wait_fd(sv[1], CO_WRITABLE, co_deadline_after(SEC)), CO_WRITABLE);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int a = co_fd_forget(sv[0]);
        int b = close(sv[0]);
        int c = co_close(sv[1]);
        int d = fcntl(sv[1], F_GETFD); /* really closed */
        _exit(a == 0 && b == 0 && c == 0 && d < 0 ? 0 : 1);
    }
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) fprintf(stderr, "child status %#x\n", st);
    CHECK_EQ(co_close(sv[0]), 0);
    CHECK_EQ(co_close(sv[1]), 0);
}

/* Calls on numbers that are not open answer EBADF and keep no table
 * memory: each used to make (and keep) a 64 KiB chunk of the table. */
static void test_stray_numbers(void) {
    char b[4];
    int found = 0;
    for (int fd = 30000; fd < 60000 && found < 8; fd += 1024) {
        if (fcntl(fd, F_GETFD) >= 0 || co__pd_peek(fd) != NULL) continue; /* open, or a chunk already */
        found++;
        CHECK_EQ(co_read(fd, b, sizeof b, co_deadline_after(SEC)), -EBADF);
        CHECK_EQ(co_write(fd, b, sizeof b, co_deadline_after(SEC)), -EBADF);
        CHECK_EQ(co_wait_fd(fd, CO_READABLE, co_deadline_after(SEC)), -EBADF);
        CHECK(co__pd_peek(fd) == NULL);
    }
    CHECK(found > 0);
}

static int run(void *arg) {
    (void)arg;
    T_RUN(test_plain_number_reused);
    T_RUN(test_reuse_registration_dropped);
    T_RUN(test_connect_twice_refused);
    T_RUN(test_fork_child_closes);
    T_RUN(test_stray_numbers);
    return 0;
}

int main(void) {
    t_begin(80);
    CHECK_EQ(co_main(run, NULL), 0);
    return t_end();
}
