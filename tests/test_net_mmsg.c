/* net: co_recvmmsg and co_sendmmsg, batches of datagrams on the
 * netpoller: bad input, deadlines, contents and sources of a batch, from a
 * plain thread and from coroutines, co_close of a parked receiver, and a
 * stress run of a batching echo server served by several coroutines. */
// ctest-timeout: 120
#define _GNU_SOURCE 1
#include "t.h"
#include "test_net_util.h"

#include <colony.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static void test_bad_input(void) {
    struct mmsghdr m[2];
    memset(m, 0, sizeof m);
    CHECK_EQ(co_recvmmsg(-1, m, 1, 0, 0), -EBADF);
    CHECK_EQ(co_sendmmsg(-1, m, 1, 0, 0), -EBADF);
    int s = co_listen("udp4", "127.0.0.1:0", NULL);
    CHECK(s >= 0);
    CHECK_EQ(co_recvmmsg(s, NULL, 1, 0, 0), CO_EINVAL);
    CHECK_EQ(co_sendmmsg(s, NULL, 1, 0, 0), CO_EINVAL);
    CHECK_EQ(co_recvmmsg(s, m, 0, 0, 0), CO_EINVAL);
    CHECK_EQ(co_sendmmsg(s, m, 0, 0, 0), CO_EINVAL);
    CHECK_EQ(co_recvmmsg(s, m, 1025, 0, 0), CO_EINVAL);
    CHECK_EQ(co_sendmmsg(s, m, 1025, 0, 0), CO_EINVAL);
    m[1].msg_hdr.msg_iovlen = 1; /* no iov */
    CHECK_EQ(co_recvmmsg(s, m, 2, 0, 0), CO_EINVAL);
    CHECK_EQ(co_sendmmsg(s, m, 2, 0, 0), CO_EINVAL);
    /* nothing queued: the deadline holds, past or near */
    char b[8];
    struct iovec iov = {b, sizeof b};
    m[0].msg_hdr = (struct msghdr){.msg_iov = &iov, .msg_iovlen = 1};
    CHECK_EQ(co_recvmmsg(s, m, 1, 0, 0), CO_ETIMEDOUT);
    CHECK_EQ(co_recvmmsg(s, m, 1, 0, co_deadline_after(20 * MS)), CO_ETIMEDOUT);
    co_close(s);
}

/* A batch sent with co_sendmmsg arrives whole and in order; co_recvmmsg
 * takes what is queued, with each datagram's length and source. Runs on
 * a plain thread (the test's main). */
static void test_batch_plain_thread(void) {
    int r = co_listen("udp4", "127.0.0.1:0", NULL);
    int s = co_listen("udp4", "127.0.0.1:0", NULL);
    CHECK(r >= 0 && s >= 0);
    if (r < 0 || s < 0)
        return;
    enum { N = 8 };
    struct sockaddr_in to = loopback(local_port(r));
    char out[N][32];
    struct iovec oiov[N];
    struct mmsghdr om[N];
    memset(om, 0, sizeof om);
    for (int i = 0; i < N; i++) {
        int len = snprintf(out[i], sizeof out[i], "batch %d%.*s", i, i, "xxxxxxxx");
        oiov[i] = (struct iovec){out[i], (size_t)len};
        om[i].msg_hdr = (struct msghdr){.msg_name = &to, .msg_namelen = sizeof to,
                                        .msg_iov = &oiov[i], .msg_iovlen = 1};
    }
    int sent = 0;
    while (sent < N) {
        int k = co_sendmmsg(s, om + sent, N - sent, 0, co_deadline_after(10 * SEC));
        CHECK(k >= 1);
        if (k < 1)
            break;
        for (int i = sent; i < sent + k; i++)
            CHECK_EQ(om[i].msg_len, oiov[i].iov_len);
        sent += k;
    }
    char in[16][32];
    struct iovec iiov[16];
    struct sockaddr_in from[16];
    struct mmsghdr im[16];
    int got = 0;
    while (got < N) {
        memset(im, 0, sizeof im);
        for (int i = 0; i < 16; i++) {
            iiov[i] = (struct iovec){in[i], sizeof in[i]};
            im[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                            .msg_iov = &iiov[i], .msg_iovlen = 1};
        }
        int k = co_recvmmsg(r, im, 16, 0, co_deadline_after(10 * SEC));
        CHECK(k >= 1 && k <= N - got);
        if (k < 1 || k > N - got)
            break;
        for (int i = 0; i < k; i++) {
            CHECK_EQ(im[i].msg_len, oiov[got + i].iov_len);
            CHECK(memcmp(in[i], out[got + i], im[i].msg_len) == 0);
            CHECK_EQ(im[i].msg_hdr.msg_namelen, sizeof from[i]);
            CHECK_EQ(ntohs(from[i].sin_port), local_port(s));
        }
        got += k;
    }
    CHECK_EQ(got, N);
    /* all taken: nothing more */
    CHECK_EQ(co_recvmmsg(r, im, 16, 0, 0), CO_ETIMEDOUT);
    co_close(r);
    co_close(s);
}

/* co_close of a socket a coroutine waits on in co_recvmmsg wakes it with
 * CO_ECLOSED. */
static int closed_rc;
static co_waitgroup_t closed_wg = CO_WAITGROUP_INIT;
static void parked_receiver(void *arg) {
    int fd = (int)(intptr_t)arg;
    char b[8];
    struct iovec iov = {b, sizeof b};
    struct mmsghdr m = {.msg_hdr = {.msg_iov = &iov, .msg_iovlen = 1}};
    closed_rc = co_recvmmsg(fd, &m, 1, 0, co_deadline_after(30 * SEC));
    co_waitgroup_done(&closed_wg);
}
static void test_close_wakes(void) {
    int s = co_listen("udp4", "127.0.0.1:0", NULL);
    CHECK(s >= 0);
    if (s < 0)
        return;
    co_waitgroup_add(&closed_wg, 1);
    CHECK_EQ(co_go(parked_receiver, (void *)(intptr_t)s), 0);
    co_sleep(50 * MS); /* most likely parked by now; either way it must not hang */
    co_close(s);
    co_waitgroup_wait(&closed_wg);
    CHECK(closed_rc == CO_ECLOSED || closed_rc == -EBADF);
}

/* The stress run: an echo server of 3 coroutines on one socket, each
 * taking batches with co_recvmmsg and answering them with co_sendmmsg;
 * 40 client coroutines, 200 numbered round trips each. A datagram lost by
 * the kernel is sent again after a second; answers must come back to the
 * right client with the right number. */
enum { SRV = 3, CLIENTS = 40, TRIPS = 200, BATCH = 16 };
static int64_t bad_answers, done_trips;
static co_waitgroup_t srv_wg = CO_WAITGROUP_INIT, cli_wg = CO_WAITGROUP_INIT;
static char srv_addr[64];

static void batch_echo(void *arg) {
    int s = (int)(intptr_t)arg;
    char buf[BATCH][64];
    struct iovec iov[BATCH];
    struct sockaddr_in from[BATCH];
    struct mmsghdr m[BATCH];
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            iov[i] = (struct iovec){buf[i], sizeof buf[i]};
            m[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                           .msg_iov = &iov[i], .msg_iovlen = 1};
        }
        int k = co_recvmmsg(s, m, BATCH, 0, CO_FOREVER);
        if (k < 0)
            break;
        for (int i = 0; i < k; i++)
            iov[i].iov_len = m[i].msg_len; /* send back what came */
        for (int sent = 0; sent < k;) {
            int w = co_sendmmsg(s, m + sent, (unsigned)(k - sent), 0, co_deadline_after(5 * SEC));
            if (w < 1)
                break;
            sent += w;
        }
    }
    co_waitgroup_done(&srv_wg);
}

static void client(void *arg) {
    int id = (int)(intptr_t)arg;
    int fd = co_dial("udp", srv_addr, co_deadline_after(10 * SEC));
    CHECK(fd >= 0);
    for (int i = 0; fd >= 0 && i < TRIPS; i++) {
        int msg[2] = {id, i}, got[2];
        int tries = 0;
        for (;;) {
            if (tries++ == 30) { /* 30 s without an answer: count it and stop */
                __atomic_add_fetch(&bad_answers, 1, __ATOMIC_RELAXED);
                i = TRIPS;
                break;
            }
            if (co_write(fd, msg, sizeof msg, co_deadline_after(5 * SEC)) != sizeof msg)
                continue;
            ssize_t n;
            /* a late answer to an earlier resend may come first: skip it */
            while ((n = co_read(fd, got, sizeof got, co_deadline_after(SEC))) == sizeof got &&
                   got[0] == id && got[1] < i)
                ;
            if (n == CO_ETIMEDOUT)
                continue;
            if (n != sizeof got || got[0] != id || got[1] != i)
                __atomic_add_fetch(&bad_answers, 1, __ATOMIC_RELAXED);
            else
                __atomic_add_fetch(&done_trips, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    if (fd >= 0)
        co_close(fd);
    co_waitgroup_done(&cli_wg);
}

static void test_stress_echo(void) {
    int s = co_listen("udp4", "127.0.0.1:0", NULL);
    CHECK(s >= 0);
    if (s < 0)
        return;
    snprintf(srv_addr, sizeof srv_addr, "127.0.0.1:%d", local_port(s));
    co_waitgroup_add(&srv_wg, SRV);
    for (int i = 0; i < SRV; i++)
        CHECK_EQ(co_go(batch_echo, (void *)(intptr_t)s), 0);
    co_waitgroup_add(&cli_wg, CLIENTS);
    for (int i = 0; i < CLIENTS; i++)
        CHECK_EQ(co_go(client, (void *)(intptr_t)i), 0);
    co_waitgroup_wait(&cli_wg);
    CHECK_EQ(bad_answers, 0);
    CHECK_EQ(done_trips, (int64_t)CLIENTS * TRIPS);
    co_close(s); /* the servers see CO_ECLOSED and end */
    co_waitgroup_wait(&srv_wg);
}

int main(void) {
    t_begin(110);
    CHECK_EQ(co_init(NULL), 0);
    T_RUN(test_bad_input);
    T_RUN(test_batch_plain_thread);
    T_RUN(test_close_wakes);
    T_RUN(test_stress_echo);
    CHECK_EQ(T_SHUTDOWN(), 0);
    return t_end();
}
