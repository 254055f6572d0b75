/*
 * Private to src/net: what its files share. The public calls are in
 * colony.h's net sections (docs/net.md).
 */
#ifndef COLONY_NET_H
#define COLONY_NET_H

#include "base/base.h"

#include <sys/socket.h>

/* host as an IP literal ("127.0.0.1", "::1", "fe80::1%eth0", no
 * brackets): true, and the address with port 0 in *ss. */
CO_HIDDEN bool co__net_literal(const char *host, struct sockaddr_storage *ss, socklen_t *len);

/* The length of an AF_INET or AF_INET6 address; 0 for another family. */
CO_HIDDEN socklen_t co__net_salen(const struct sockaddr_storage *ss);

#endif
