/* Strict HTTP/1.1 request framing for terminated TLS (proxy_framing.h). */
#include "proxy_framing.h"

#include <string.h>
#include <strings.h>

static int tchar(unsigned char c)   /* RFC 9110 token characters */
{
    return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int ows(char c)
{
    return c == ' ' || c == '\t';
}

/* Does the Host value v (n bytes) name host:port?  A missing port is 443. */
static int same_host(const char *v, size_t n, const char *host, int port)
{
    const char *name = v, *colon;
    size_t nl;
    if (n && v[0] == '[') {   /* an IPv6 literal */
        const char *close = memchr(v, ']', n);
        if (!close)
            return 0;
        name = v + 1;
        nl = (size_t)(close - name);
        colon = close + 1 < v + n ? close + 1 : NULL;
        if (colon && *colon != ':')
            return 0;
    } else {
        colon = memchr(v, ':', n);
        nl = colon ? (size_t)(colon - v) : n;
    }
    long p = 443;
    if (colon) {
        size_t digits = (size_t)(v + n - colon - 1);
        if (!digits || digits > 5)
            return 0;
        p = 0;
        for (const char *d = colon + 1; d < v + n; d++) {
            if (*d < '0' || *d > '9')
                return 0;
            p = p * 10 + (*d - '0');
        }
    }
    return nl && nl == strlen(host) && !strncasecmp(name, host, nl) && p == port;
}

const char *framing_check_head(const char *head, size_t len, const char *host, int port,
                               struct request_framing *f)
{
    f->chunked = 0;
    f->length = 0;
    if (len < 4 || memcmp(head + len - 4, "\r\n\r\n", 4))
        return "bad request head";
    /* the request line: TOKEN SP origin-form SP HTTP/1.x CRLF */
    size_t i = 0;
    while (i < len && tchar((unsigned char)head[i]))
        i++;
    size_t method_len = i;
    if (!method_len || head[i] != ' ')
        return "bad request line";
    if (method_len == 7 && !memcmp(head, "CONNECT", 7))
        return "CONNECT inside a terminated TLS connection is not supported";
    size_t t = ++i;
    while (i < len && (unsigned char)head[i] > 0x20 && (unsigned char)head[i] < 0x7f)
        i++;
    if (i == t || head[t] != '/' || head[i] != ' ')
        return "bad request target (origin-form /path only)";
    i++;
    if (len - i < 10 || memcmp(head + i, "HTTP/1.", 7) || (head[i + 7] != '0' && head[i + 7] != '1') ||
        memcmp(head + i + 8, "\r\n", 2))
        return "bad request line";
    int http10 = head[i + 7] == '0';
    i += 10;
    int hosts = 0, lengths = 0, encodings = 0;
    while (i + 2 < len) {   /* header lines up to the empty line */
        const char *line = head + i, *eol = memchr(line, '\r', len - i);
        if (!eol || eol[1] != '\n')
            return "bad header line";
        size_t ll = (size_t)(eol - line);
        if (memchr(line, '\n', ll) || memchr(line, '\0', ll))
            return "bad header line";
        if (ows(line[0]))
            return "folded header line";
        size_t nl = 0;
        while (nl < ll && tchar((unsigned char)line[nl]))
            nl++;
        if (!nl || nl == ll || line[nl] != ':')
            return "bad header name";
        const char *v = line + nl + 1, *ve = eol;
        while (v < ve && ows(*v))
            v++;
        while (ve > v && ows(ve[-1]))
            ve--;
        size_t vl = (size_t)(ve - v);
        if (nl == 4 && !strncasecmp(line, "host", 4)) {
            if (++hosts > 1 || !same_host(v, vl, host, port))
                return "the Host header must name the host of the CONNECT";
        } else if (nl == 14 && !strncasecmp(line, "content-length", 14)) {
            if (++lengths > 1 || !vl || vl > 18)
                return "bad Content-Length";
            for (const char *d = v; d < ve; d++) {
                if (*d < '0' || *d > '9')
                    return "bad Content-Length";
                f->length = f->length * 10 + (uint64_t)(*d - '0');
            }
        } else if (nl == 17 && !strncasecmp(line, "transfer-encoding", 17)) {
            if (++encodings > 1 || vl != 7 || strncasecmp(v, "chunked", 7))
                return "unsupported Transfer-Encoding (only chunked)";
            f->chunked = 1;
        } else if (nl == 7 && !strncasecmp(line, "upgrade", 7)) {
            return "Upgrade (WebSocket, h2c) to a secret's host is not supported";
        }
        i += ll + 2;
    }
    if (hosts != 1)
        return "the Host header must name the host of the CONNECT";
    if (encodings && (lengths || http10))
        return "Transfer-Encoding with Content-Length or on HTTP/1.0";
    if (f->chunked)
        f->length = 0;
    return NULL;
}

int framing_chunk_size(const char *line, size_t len, uint64_t *size)
{
    if (len < 3 || memcmp(line + len - 2, "\r\n", 2))
        return -1;
    size_t i = 0;
    uint64_t s = 0;
    for (; i < len - 2 && i < 16; i++) {
        char c = line[i];
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
        if (d < 0)
            break;
        s = s << 4 | (uint64_t)d;
    }
    if (!i || i > 15 || (i < len - 2 && line[i] != ';'))
        return -1;
    for (size_t k = i; k < len - 2; k++)   /* an extension: no control bytes */
        if ((unsigned char)line[k] < 0x20 && line[k] != '\t')
            return -1;
    *size = s;
    return 0;
}
