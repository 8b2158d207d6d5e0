#include "proxy_request.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Appends to out[*len..cap); -1 if it does not fit. */
static int put(char *out, size_t cap, size_t *len, const char *s, size_t n)
{
    if (n > cap - *len)
        return -1;
    memcpy(out + *len, s, n);
    *len += n;
    return 0;
}

int proxy_parse_port(const char *s, size_t n)
{
    int v = 0;
    if (n == 0 || n > 5)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 && v <= 65535 ? v : -1;
}

int proxy_host_ok(const char *h, int bracketed)
{
    struct in6_addr a6;
    if (bracketed)
        return inet_pton(AF_INET6, h, &a6) == 1;
    if (!*h)
        return 0;
    for (; *h; h++)
        if (!isalnum((unsigned char)*h) && !strchr(".-_", *h))
            return 0;
    return 1;
}

/* Split "host:port", "[v6]:port" or, if default_port is set, a bare host. */
static int parse_authority(const char *s, size_t n, char host[256], int *port, int default_port)
{
    const char *hs = s, *he = s + n, *ps = NULL;
    int br = n > 0 && s[0] == '[';

    if (br) {
        if (!(he = memchr(s, ']', n)))
            return -1;
        hs = s + 1;
        if (he + 1 < s + n && he[1] != ':')
            return -1;
        ps = he + 1 < s + n ? he + 2 : NULL;
    } else if ((ps = memchr(s, ':', n))) {
        he = ps++;
    }
    if (he - hs > 253)
        return -1;
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    *port = ps ? proxy_parse_port(ps, (size_t)(s + n - ps)) : default_port;
    return *port > 0 && proxy_host_ok(host, br) ? 0 : -1;
}

static int token_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("!#$%&'*+-.^_`|~", s[i]))
            return 0;
    return n > 0;
}

/* Check the header lines from p to the empty line ending the head and, if
 * out is set, copy them there minus the ones that are ours to set: Proxy-*,
 * Connection and Keep-Alive (we send Connection: close), and Host (a proxy
 * takes it from the URL). */
static const char *copy_headers(char *p, char *out, size_t cap, size_t *len)
{
    static const char *const drop[] = {
        "proxy-connection", "proxy-authorization", "connection", "keep-alive", "host",
    };
    for (char *eol; (eol = strstr(p, "\r\n")) != p; p = eol + 2) {
        char *colon = memchr(p, ':', (size_t)(eol - p));
        if (!colon || !token_ok(p, (size_t)(colon - p)) || strcspn(p, "\r\n") != (size_t)(eol - p))
            return "malformed header line";   /* also rejects obsolete line folding */
        int keep = 1;
        for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
            if (strlen(drop[i]) == (size_t)(colon - p) && !strncasecmp(p, drop[i], strlen(drop[i])))
                keep = 0;
        if (keep && out && put(out, cap, len, p, (size_t)(eol + 2 - p)))
            return "request head too long";
    }
    return NULL;
}

const char *proxy_parse_request(char *head, size_t head_len, struct proxy_request *req,
                                char *out, size_t cap, size_t *out_len)
{
    char *eol = strstr(head, "\r\n"), *target, *version;

    memset(req, 0, sizeof *req);
    *out_len = 0;
    if (memchr(head, '\0', head_len))
        return "NUL byte in request head";
    *eol = '\0';
    if (strchr(head, '\r') || strchr(head, '\n') || !(target = strchr(head, ' ')) ||
        !(version = strchr(target + 1, ' ')) || strchr(version + 1, ' '))
        return "malformed request line";
    *target++ = *version++ = '\0';
    if (!token_ok(head, strlen(head)))
        return "malformed method";
    if (strcmp(version, "HTTP/1.1") && strcmp(version, "HTTP/1.0"))
        return "unsupported HTTP version";
    if (!strcmp(head, "CONNECT")) {
        req->tunnel = 1;
        if (parse_authority(target, strlen(target), req->host, &req->port, 0))
            return "CONNECT needs host:port";
        return copy_headers(eol + 2, NULL, 0, NULL);
    }
    if (strncasecmp(target, "http://", 7))
        return "target must be an absolute http:// URL (use CONNECT for https)";
    char *auth = target + 7, *path = auth + strcspn(auth, "/?");
    size_t auth_len = (size_t)(path - auth);
    if (parse_authority(auth, auth_len, req->host, &req->port, 80))
        return "bad host or port in URL";

    int n = snprintf(out, cap, "%s %s%s %s\r\nHost: %.*s\r\n", head, *path == '/' ? "" : "/",
                     path, version, (int)auth_len, auth);
    const char *why = NULL;
    if (n < 0 || (size_t)n >= cap)
        return "request line too long";
    *out_len = (size_t)n;
    if ((why = copy_headers(eol + 2, out, cap, out_len)))
        return why;
    static const char close_hdr[] = "Connection: close\r\n\r\n";
    return put(out, cap, out_len, close_hdr, sizeof close_hdr - 1) ? "request head too long" : NULL;
}
