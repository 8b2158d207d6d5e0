/* "ADDRESS:PORT", ADDRESS an IPv4 one or an IPv6 one in brackets: where the
 * agent dials home (dial.c) and where the relay forwards to (relay.c). */
#ifndef CUBICLE_AGENT_ADDRESS_H
#define CUBICLE_AGENT_ADDRESS_H

#include <sys/socket.h>

/* Fills `addr` and `len` from the first word of `spec`; returns the number of
 * characters read, or -1 when it is no such address (port 0 included). */
int parse_address(const char *spec, struct sockaddr_storage *addr, socklen_t *len);

#endif
