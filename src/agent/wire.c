#include "wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t get_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

void wire_send_error(wire_send_fn send, uint32_t id, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    send(CUBICLE_FRAME_ERROR, id, msg, n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
}

void wire_put_header(unsigned char *out, uint8_t type, uint32_t id, size_t len)
{
    put_be32(out, (uint32_t)len);
    out[4] = type;
    put_be32(out + 5, id);
}

int wire_get_header(const unsigned char *p, struct frame_header *h)
{
    h->len = get_be32(p);
    h->type = p[4];
    h->id = get_be32(p + 5);
    return h->len > CUBICLE_FRAME_MAX_PAYLOAD ? -1 : 0;
}

/* Next NUL-terminated string at *p, or NULL if the payload ends first. */
static char *next_str(char **p, char *end)
{
    char *s = *p, *z = memchr(s, 0, (size_t)(end - s));
    if (!z)
        return NULL;
    *p = z + 1;
    return s;
}

int wire_parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!s || !*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

const char *wire_parse_run(char *p, size_t len, struct run_req *r)
{
    char *end = p + len;
    uint64_t argc, envc;

    memset(r, 0, sizeof *r);
    if (wire_parse_u64(next_str(&p, end), &r->timeout_ms))
        return "bad timeout_ms";
    if (wire_parse_u64(next_str(&p, end), &r->cap))
        return "bad max_output_bytes";
    if (!(r->cwd = next_str(&p, end)))
        return "missing cwd";
    /* each string needs at least its NUL, which bounds the counts */
    if (wire_parse_u64(next_str(&p, end), &argc) || argc == 0 || argc > (uint64_t)(end - p))
        return "bad argc";
    r->argv = calloc(argc + 1, sizeof *r->argv);
    if (!r->argv)
        return "out of memory";
    for (uint64_t i = 0; i < argc; i++)
        if (!(r->argv[i] = next_str(&p, end)))
            return "truncated argv";
    if (!r->argv[0][0])
        return "empty argv[0]";
    if (wire_parse_u64(next_str(&p, end), &envc) || envc > (uint64_t)(end - p))
        return "bad envc";
    r->env = calloc(envc + 1, sizeof *r->env);
    if (!r->env)
        return "out of memory";
    for (r->envc = 0; r->envc < envc; r->envc++) {
        char *kv = next_str(&p, end);
        if (!kv)
            return "truncated env";
        if (kv[0] == '=' || !strchr(kv, '='))
            return "env entry is not KEY=VALUE";
        r->env[r->envc] = kv;
    }
    r->in = p;
    r->in_len = (size_t)(end - p);
    return NULL;
}

void wire_free_run(struct run_req *r)
{
    free(r->argv);
    free(r->env);
    r->argv = r->env = NULL;
}

int wire_parse_decimal(const unsigned char *p, size_t len, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (len == 0 || len > 20)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9' || v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}
