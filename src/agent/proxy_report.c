/* The egress proxy's ledger records on stdout (see proxy_report.h). */
#include "proxy_report.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define QUEUE_MAX (256 * 1024)
#define BATCH_MS  50
#define BATCH_MAX (16 * 1024)   /* past this much, write now */

static char queue[QUEUE_MAX];
static size_t queued;
static uint64_t dropped;   /* records a full queue turned away */
static int urgent;         /* a sync or ask is queued: write now */
static int64_t first_at;   /* when the oldest queued line came (-1: none yet stamped) */

static void enqueue(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line - 1 || queued + (size_t)n + 1 > QUEUE_MAX) {
        dropped++;
        return;
    }
    if (!queued)
        first_at = -1;   /* stamped by the next report_due() */
    memcpy(queue + queued, line, (size_t)n);
    queue[queued + (size_t)n] = '\n';
    queued += (size_t)n + 1;
}

/* The strings we report are hosts proxy_host_ok() admitted, numeric
 * addresses and our own messages; still, nothing may break the line. */
static const char *clean(const char *s, char *out, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; s[i] && j + 1 < cap; i++)
        out[j++] = s[i] == '"' || s[i] == '\\' || (unsigned char)s[i] < 0x20 ? '?' : s[i];
    out[j] = '\0';
    return out;
}

/* ,"key":["A","B"] from "A,B" (names the server checked: letters, digits, _), or "". */
static const char *names(const char *key, const char *list, char *out, size_t cap)
{
    char text[256];
    out[0] = '\0';
    if (!list || !*list)
        return out;
    clean(list, text, sizeof text);
    size_t j = (size_t)snprintf(out, cap, ",\"%s\":[\"", key);
    for (size_t i = 0; text[i] && j + 8 < cap; i++) {
        if (text[i] == ',') {
            memcpy(out + j, "\",\"", 3);
            j += 3;
        } else {
            out[j++] = text[i];
        }
    }
    memcpy(out + j, "\"]", 3);
    return out;
}

void report_connection(const char *client, const char *host, int port, int allowed,
                       const char *refused, const char *error, const char *approved,
                       const char *secrets, const char *placeholders, struct report_counts delta)
{
    char c[64], h[272], why[200] = "", how[40] = "", sec[300], ph[300];
    if (refused || error) {
        char text[160];
        snprintf(why, sizeof why, ",\"%s\":\"%s\"", refused ? "refused" : "error",
                 clean(refused ? refused : error, text, sizeof text));
    }
    if (approved) {
        char text[16];
        snprintf(how, sizeof how, ",\"approved\":\"%s\"", clean(approved, text, sizeof text));
    }
    enqueue("{\"event\":\"connection\",\"client\":\"%s\",\"host\":\"%s\",\"port\":%d,"
            "\"allowed\":%s%s%s%s%s,\"requests\":%d,\"bytes_out\":%" PRIu64 ",\"bytes_in\":%" PRIu64 "}",
            clean(client, c, sizeof c), clean(host, h, sizeof h), port,
            allowed ? "true" : "false", why, how, names("secret", secrets, sec, sizeof sec),
            names("placeholder", placeholders, ph, sizeof ph), delta.requests, delta.bytes_out, delta.bytes_in);
}

void report_ask(uint64_t id, const char *client, const char *host, int port)
{
    char c[64], h[272];
    enqueue("{\"event\":\"ask\",\"id\":%" PRIu64 ",\"client\":\"%s\",\"host\":\"%s\",\"port\":%d}",
            id, clean(client, c, sizeof c), clean(host, h, sizeof h), port);
    urgent = 1;
}

void report_sync(uint64_t id)
{
    if (dropped) {
        enqueue("{\"event\":\"dropped\",\"records\":%" PRIu64 "}", dropped);
        dropped = 0;
    }
    enqueue("{\"event\":\"sync\",\"id\":%" PRIu64 "}", id);
    urgent = 1;
}

int64_t report_due(int64_t now_ms)
{
    if (!queued)
        return -1;
    if (first_at < 0)
        first_at = now_ms;
    return urgent || queued >= BATCH_MAX ? now_ms : first_at + BATCH_MS;
}

int report_flush(int fd)
{
    size_t off = 0;
    while (off < queued) {
        ssize_t n = write(fd, queue + off, queued - off);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            queued = 0;
            return -1;
        }
        off += (size_t)n;
    }
    memmove(queue, queue + off, queued - off);
    queued -= off;
    if (!queued)
        urgent = 0;
    return 0;
}
