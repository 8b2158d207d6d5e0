/* libFuzzer target: the egress proxy's request parser
 * (src/agent/proxy_request.c), given a request head the way proxy.c hands it
 * over: up to and including the first empty line, at most HEAD_MAX bytes,
 * NUL-terminated, into an output buffer of BUF_MAX bytes. */
#include <stdlib.h>
#include <string.h>

#include "proxy_request.h"

#define HEAD_MAX (16 * 1024)
#define BUF_MAX  (256 * 1024)

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static char out[BUF_MAX];
    const unsigned char *end = memmem(data, size, "\r\n\r\n", 4);
    if (!end || (size_t)(end + 4 - data) > HEAD_MAX)
        return 0;   /* proxy.c never calls the parser with this */
    size_t head_len = (size_t)(end + 4 - data);
    char *head = malloc(head_len + 1);
    if (!head)
        abort();
    memcpy(head, data, head_len);
    head[head_len] = '\0';

    struct proxy_request req;
    size_t out_len = 12345;
    const char *why = proxy_parse_request(head, head_len, &req, out, sizeof out, &out_len);
    if (!why) {
        size_t hl = strnlen(req.host, sizeof req.host);
        /* a host fit for the resolver, a real port, a head that ends its headers */
        if (hl == 0 || hl == sizeof req.host || req.port < 1 || req.port > 65535 ||
            !proxy_host_ok(req.host, strchr(req.host, ':') != NULL))
            abort();
        if (!req.tunnel && (out_len < 4 || out_len > sizeof out || memcmp(out + out_len - 4, "\r\n\r\n", 4) ||
                            memchr(out, '\0', out_len)))
            abort();
        if (req.tunnel && out_len != 0)
            abort();
    }
    free(head);
    return 0;
}
