/* Secrets the egress proxy puts into sandboxes' requests (proxy_secrets.h). */
#include "proxy_secrets.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_SECRETS 4096
#define MAX_VALUE   (8 * 1024)

struct secret {
    char client[48];
    char name[64];
    char placeholder[128];
    char hosts[1024];
    int query;           /* a query parameter rather than a header */
    char key[128];
    char *value, *filled;
    size_t value_len, filled_len;
};

static struct secret *secrets[MAX_SECRETS];
static int nsecrets;
/* the main loop changes the set; TLS threads (proxy_tls.c) read it */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void drop(int i)
{
    struct secret *s = secrets[i];
    explicit_bzero(s->value, s->value_len);
    explicit_bzero(s->filled, s->filled_len);
    free(s->value);
    free(s->filled);
    explicit_bzero(s, sizeof *s);
    free(s);
    secrets[i] = secrets[--nsecrets];
}

static int unhex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes n hex digits into a new buffer (NUL-terminated); NULL if bad. */
static char *unhex(const char *s, size_t n, size_t *out_len)
{
    if (n % 2 || n / 2 > MAX_VALUE)
        return NULL;
    char *out = malloc(n / 2 + 1);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 2) {
        int hi = unhex_digit(s[i]), lo = unhex_digit(s[i + 1]);
        /* nothing that could end a header line or the head */
        if (hi < 0 || lo < 0 || (hi << 4 | lo) == '\r' || (hi << 4 | lo) == '\n' || (hi << 4 | lo) == 0) {
            explicit_bzero(out, i / 2);
            free(out);
            return NULL;
        }
        out[i / 2] = (char)(hi << 4 | lo);
    }
    out[n / 2] = '\0';
    *out_len = n / 2;
    return out;
}

/* The next space-separated word of *p, copied into out (cap bytes); -1 if none or too long. */
static int word(const char **p, char *out, size_t cap)
{
    const char *s = *p;
    while (*s == ' ')
        s++;
    size_t n = strcspn(s, " ");
    if (!n || n >= cap)
        return -1;
    memcpy(out, s, n);
    out[n] = '\0';
    *p = s + n;
    return 0;
}

static int plain_word(const char *w)   /* names, placeholders: letters, digits, _ and - */
{
    for (; *w; w++)
        if (!(*w == '_' || *w == '-' || (*w >= '0' && *w <= '9') || ((*w | 32) >= 'a' && (*w | 32) <= 'z')))
            return 0;
    return 1;
}

static int command(const char *line)
{
    const char *p = line;
    char verb[16], client[48];
    if (word(&p, verb, sizeof verb) || word(&p, client, sizeof client))
        return -1;
    if (!strcmp(verb, "unsecret")) {   /* all of the client's, or the one NAME given */
        char name[64];
        int one = !word(&p, name, sizeof name);
        for (int i = nsecrets - 1; i >= 0; i--)
            if (!strcmp(secrets[i]->client, client) && (!one || !strcmp(secrets[i]->name, name)))
                drop(i);
        return 0;
    }
    if (strcmp(verb, "secret"))
        return -1;
    struct secret *s = calloc(1, sizeof *s);
    char kind[8], keyhex[2 * sizeof s->key], valhex[2 * MAX_VALUE + 2], filledhex[2 * MAX_VALUE + 2];
    size_t key_len = 0;
    char *key = NULL;
    if (!s || word(&p, s->name, sizeof s->name) || word(&p, s->placeholder, sizeof s->placeholder) ||
        word(&p, s->hosts, sizeof s->hosts) || word(&p, kind, sizeof kind) ||
        word(&p, keyhex, sizeof keyhex) || word(&p, valhex, sizeof valhex) ||
        word(&p, filledhex, sizeof filledhex) || !plain_word(s->name) ||
        strlen(s->placeholder) < 16 || !plain_word(s->placeholder) ||
        (strcmp(kind, "header") && strcmp(kind, "query")) ||
        !(key = unhex(keyhex, strlen(keyhex), &key_len)) || key_len >= sizeof s->key ||
        !(s->value = unhex(valhex, strlen(valhex), &s->value_len)) ||
        !(s->filled = unhex(filledhex, strlen(filledhex), &s->filled_len))) {
        free(key);
        if (s) {
            free(s->value);
            free(s->filled);
        }
        free(s);
        explicit_bzero(valhex, sizeof valhex);
        explicit_bzero(filledhex, sizeof filledhex);
        return -1;
    }
    explicit_bzero(valhex, sizeof valhex);
    explicit_bzero(filledhex, sizeof filledhex);
    memcpy(s->key, key, key_len + 1);
    free(key);
    strcpy(s->client, client);
    s->query = !strcmp(kind, "query");
    /* a new value for the same sandbox and name replaces the old (a re-read file) */
    for (int i = nsecrets - 1; i >= 0; i--)
        if (!strcmp(secrets[i]->client, client) && !strcmp(secrets[i]->name, s->name))
            drop(i);
    if (nsecrets == MAX_SECRETS) {
        drop(nsecrets - 1);   /* cannot happen with the server's limits; never grow unbounded */
    }
    secrets[nsecrets++] = s;
    return 0;
}

/* Is host:port one of the comma-separated HOST or HOST:PORT in hosts?  A HOST
 * without a port means HTTPS on 443 only (tls: the proxy terminates it); a
 * secret goes over plain HTTP only to a port the operator wrote out. */
static int host_listed(const char *hosts, const char *host, int port, int tls)
{
    size_t hl = strlen(host);
    for (const char *h = hosts; *h;) {
        size_t n = strcspn(h, ",");
        if (n >= hl && !strncasecmp(h, host, hl)) {
            if (n == hl && tls && port == 443)
                return 1;
            if (n > hl + 1 && h[hl] == ':' && n - hl - 1 <= 5) {
                long p = 0;
                size_t k = hl + 1;
                for (; k < n && h[k] >= '0' && h[k] <= '9'; k++)
                    p = p * 10 + (h[k] - '0');
                if (k == n && p == port)
                    return 1;
            }
        }
        h += n + (h[n] == ',');
    }
    return 0;
}

static int for_host(const char *client, const char *host, int port)
{
    for (int i = 0; i < nsecrets; i++)
        if (!strcmp(secrets[i]->client, client) && host_listed(secrets[i]->hosts, host, port, 1))
            return 1;
    return 0;
}

static void add_name(char *list, size_t cap, const char *name)
{
    size_t n = strlen(list);
    if (n + strlen(name) + 2 <= cap) {
        if (n)
            list[n++] = ',';
        strcpy(list + n, name);
    }
}

/* Replace n bytes at at with what (wn bytes): -1 if it does not fit. */
static int splice(char *head, size_t *len, size_t cap, size_t at, size_t n, const char *what, size_t wn)
{
    if (*len - n + wn > cap)
        return -1;
    memmove(head + at + wn, head + at + n, *len - at - n);
    memcpy(head + at, what, wn);
    *len = *len - n + wn;
    return 0;
}

/* Does the head (request line excluded) have a header named key? */
static int has_header(const char *head, size_t len, const char *key)
{
    size_t kl = strlen(key);
    const char *end = head + len;
    for (const char *p = memchr(head, '\n', len); p && p + 1 < end; p = memchr(p + 1, '\n', (size_t)(end - p - 1))) {
        if ((size_t)(end - p - 1) > kl && !strncasecmp(p + 1, key, kl) && p[1 + kl] == ':')
            return 1;
    }
    return 0;
}

/* The end of the request target (the space before the version). */
static size_t target_end(const char *head, size_t len)
{
    const char *eol = memchr(head, '\r', len);
    size_t line = eol ? (size_t)(eol - head) : len;
    const char *sp = NULL;
    for (size_t i = 0; i < line; i++)
        if (head[i] == ' ')
            sp = head + i;
    return sp ? (size_t)(sp - head) : line;
}

static int has_query_param(const char *head, size_t len, const char *key)
{
    size_t end = target_end(head, len), kl = strlen(key);
    const char *q = memchr(head, '?', end);
    for (const char *p = q; p && p < head + end; p = memchr(p + 1, '&', (size_t)(head + end - p - 1)))
        if ((size_t)(head + end - p - 1) > kl && !strncmp(p + 1, key, kl) && p[1 + kl] == '=')
            return 1;
    return 0;
}

static size_t percent_encode(const char *s, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t j = 0;
    for (size_t i = 0; i < n && j + 4 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("-._~", c))
            out[j++] = (char)c;
        else {
            out[j++] = '%';
            out[j++] = hex[c >> 4];
            out[j++] = hex[c & 15];
        }
    }
    return j;
}

/* Is the placeholder at pos inside the value of s's declared header, or of its
 * declared query parameter in the request target?  Only there does it become
 * the value: hosts echo paths and other headers in error pages. */
static int in_declared_value(const char *head, size_t len, size_t pos, const struct secret *s)
{
    size_t kl = strlen(s->key), ls = pos;
    while (ls > 0 && head[ls - 1] != '\n')
        ls--;
    if (!s->query)   /* "Key:" at the start of a header line (never the request line) */
        return ls > 0 && pos >= ls + kl + 1 && !strncasecmp(head + ls, s->key, kl) && head[ls + kl] == ':';
    if (ls > 0)
        return 0;
    const char *sp = memchr(head, ' ', len);
    size_t te = target_end(head, len);
    if (!sp || pos >= te)
        return 0;
    const char *q = memchr(sp, '?', te - (size_t)(sp - head));
    if (!q || pos <= (size_t)(q - head))
        return 0;
    size_t seg = pos;   /* the start of this parameter: after the nearest '?' or '&' */
    while (head[seg - 1] != '&' && head + seg - 1 != q)
        seg--;
    return pos >= seg + kl + 1 && !strncmp(head + seg, s->key, kl) && head[seg + kl] == '=';
}

static int rewrite(const char *client, const char *host, int port, int tls, char *head, size_t *len,
                   size_t cap, char *injected, size_t icap, char *flagged, size_t fcap)
{
    size_t orig_len = *len;
    injected[0] = flagged[0] = '\0';
    for (int i = 0; i < nsecrets; i++) {
        struct secret *s = secrets[i];
        if (strcmp(s->client, client))
            continue;
        size_t pl = strlen(s->placeholder);
        int mine = host_listed(s->hosts, host, port, tls);
        int seen = 0, elsewhere = 0;
        for (size_t at = 0; at + pl <= *len;) {
            char *hit = memmem(head + at, *len - at, s->placeholder, pl);
            if (!hit)
                break;
            size_t pos = (size_t)(hit - head);
            if (!mine || !in_declared_value(head, *len, pos, s)) {
                elsewhere = 1;   /* left as it is, and noted */
                at = pos + pl;
                continue;
            }
            seen = 1;
            char enc[3 * MAX_VALUE + 8];
            const char *with = s->value;
            size_t wn = s->value_len;
            if (s->query) {   /* a space or '&' in the value must not change the target's shape */
                wn = percent_encode(s->value, s->value_len, enc, sizeof enc);
                with = enc;
            }
            int rc = splice(head, len, cap, pos, pl, with, wn);
            explicit_bzero(enc, sizeof enc);
            if (rc)
                goto too_long;
            at = pos + wn;
        }
        if (elsewhere)
            add_name(flagged, fcap, s->name);
        if (!mine)
            continue;
        int put = seen;   /* the placeholder became the value */
        if (s->query && !has_query_param(head, *len, s->key)) {
            put = 1;
            char add[3 * MAX_VALUE + 256];
            size_t end = target_end(head, *len), n = 0;
            add[n++] = memchr(head, '?', end) ? '&' : '?';
            n += percent_encode(s->key, strlen(s->key), add + n, sizeof add - n);
            add[n++] = '=';
            n += percent_encode(s->filled, s->filled_len, add + n, sizeof add - n);
            if (splice(head, len, cap, end, 0, add, n))
                goto too_long;
            explicit_bzero(add, n);
        } else if (!s->query && !has_header(head, *len, s->key)) {
            put = 1;
            /* before the empty line that ends the head */
            size_t kl = strlen(s->key);
            if (*len < 2 || splice(head, len, cap, *len - 2, 0, s->key, kl) ||
                splice(head, len, cap, *len - 2, 0, ": ", 2) ||
                splice(head, len, cap, *len - 2, 0, s->filled, s->filled_len) ||
                splice(head, len, cap, *len - 2, 0, "\r\n", 2))
                goto too_long;
        }
        if (put)   /* else the request carries a header of that name of its own: left alone */
            add_name(injected, icap, s->name);
    }
    return 0;
too_long:
    /* the caller refuses the request; nothing half-rewritten goes anywhere */
    explicit_bzero(head, cap);
    *len = orig_len;
    injected[0] = flagged[0] = '\0';
    return -1;
}

int secrets_command(const char *line)
{
    pthread_mutex_lock(&lock);
    int rc = command(line);
    pthread_mutex_unlock(&lock);
    return rc;
}

int secrets_for(const char *client, const char *host, int port)
{
    pthread_mutex_lock(&lock);
    int rc = for_host(client, host, port);
    pthread_mutex_unlock(&lock);
    return rc;
}

int secrets_rewrite(const char *client, const char *host, int port, int tls, char *head, size_t *len,
                    size_t cap, char *injected, size_t icap, char *flagged, size_t fcap)
{
    pthread_mutex_lock(&lock);
    int rc = rewrite(client, host, port, tls, head, len, cap, injected, icap, flagged, fcap);
    pthread_mutex_unlock(&lock);
    return rc;
}
