/* The egress proxy's request parser (proxy.c): the part of the proxy that
 * reads what a sandbox sends, kept apart so that it can be fuzzed. */
#ifndef CUBICLE_AGENT_PROXY_REQUEST_H
#define CUBICLE_AGENT_PROXY_REQUEST_H

#include <stddef.h>

struct proxy_request {
    char host[256];   /* a DNS name, IPv4 literal or (unbracketed) IPv6 literal */
    int port;
    int tunnel;       /* CONNECT rather than plain HTTP */
};

/* A decimal port 1..65535 of n characters, or -1. */
int proxy_parse_port(const char *s, size_t n);

/* Is h a DNS name or IPv4 literal, or (bracketed) an IPv6 literal?  Nothing
 * else gets near the resolver, the logs or a rule comparison. */
int proxy_host_ok(const char *h, int bracketed);

/* Parses a request head: head_len bytes ending in the empty line, with a NUL
 * at head[head_len]; the head is modified.  For plain HTTP, writes the head
 * to send upstream (origin-form, Host from the URL, Connection: close) into
 * out, at most cap bytes, and sets *out_len.  Returns NULL or what is
 * wrong. */
const char *proxy_parse_request(char *head, size_t head_len, struct proxy_request *req,
                                char *out, size_t cap, size_t *out_len);

#endif
