/* Strict HTTP/1.1 request framing for connections the egress proxy terminates
 * (proxy_tls.c): the proxy puts secrets into each request head it finds, so it
 * must find the same requests the host will.  Anything it could read two ways
 * (request smuggling) is refused rather than guessed at. */
#ifndef CUBICLE_AGENT_PROXY_FRAMING_H
#define CUBICLE_AGENT_PROXY_FRAMING_H

#include <stddef.h>
#include <stdint.h>

struct request_framing {
    int chunked;       /* Transfer-Encoding: chunked */
    uint64_t length;   /* else Content-Length (0 if none) */
};

/* Checks a request head (request line, headers, the empty line; len bytes)
 * sent inside TLS terminated for host:port: a request line "TOKEN SP /target
 * SP HTTP/1.x", not CONNECT; exactly one Host, naming host:port; no Upgrade;
 * header lines "name:value" (no obs-fold, no space before the colon); at most
 * one Content-Length (digits) or one Transfer-Encoding (exactly chunked, not on
 * HTTP/1.0), never both.  NULL and *f filled, or why it is refused. */
const char *framing_check_head(const char *head, size_t len, const char *host, int port,
                               struct request_framing *f);

/* A chunk-size line with its CRLF (1 to 15 hex digits, an optional
 * ";extension"): 0 and *size, or -1. */
int framing_chunk_size(const char *line, size_t len, uint64_t *size);

#endif
