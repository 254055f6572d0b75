/* Helpers shared by the net tests (not a test program itself): time
 * units, a socket's own port and its peer's address family. */
#ifndef COLONY_TEST_NET_UTIL_H
#define COLONY_TEST_NET_UTIL_H
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define MS 1000000LL
#define SEC (1000 * MS)

/* fd's local port (IPv4 or IPv6), -1 if getsockname fails. */
static inline int local_port(int fd) {
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &l) < 0)
        return -1;
    return ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                         : ((struct sockaddr_in6 *)&ss)->sin6_port);
}

/* The address family of fd's peer, AF_UNSPEC if it has none. */
static inline int peer_family(int fd) {
    struct sockaddr_storage peer;
    socklen_t pl = sizeof peer;
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
        return AF_UNSPEC;
    return peer.ss_family;
}

#endif
