#include "address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

int parse_address(const char *spec, struct sockaddr_storage *addr, socklen_t *len)
{
    char host[64];
    unsigned port;
    int used = -1;
    int v6 = spec[0] == '[';
    int fields = v6 ? sscanf(spec, "[%63[0-9a-fA-F:.]]:%u%n", host, &port, &used) : sscanf(spec, "%63[0-9.]:%u%n", host, &port, &used);
    if (fields != 2 || used < 0 || port == 0 || port > 65535)
        return -1;
    memset(addr, 0, sizeof *addr);
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)addr;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((unsigned short)port);
        *len = sizeof *a;
        return inet_pton(AF_INET6, host, &a->sin6_addr) == 1 ? used : -1;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)addr;
    a->sin_family = AF_INET;
    a->sin_port = htons((unsigned short)port);
    *len = sizeof *a;
    return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? used : -1;
}
