/*
 * cubicle-agent --proxy PORT [ALLOW ...]: the sandboxes' egress proxy.
 *
 * Networked sandboxes sit on an internal Docker network with no route out;
 * this process, in its own container on that network and the default bridge,
 * is their only way out.  It is a small HTTP forward proxy: CONNECT tunnels
 * (HTTPS) and absolute-form plain HTTP requests, one request per client
 * connection.  It enforces the egress policy and trusts nothing the client
 * says:
 *
 *  - with ALLOW rules (HOST or HOST:PORT), the requested host must equal a
 *    rule's host (case-insensitive) and the port the rule's, if it has one;
 *  - the address actually connected to is checked after resolution:
 *    loopback, private, link-local, multicast and reserved ones are refused,
 *    except an IPv4 literal the client asked for that a rule names verbatim
 *    (an operator's LAN mirror).  Names never unlock such addresses, and we
 *    connect to exactly the address checked, so DNS rebinding gains nothing.
 *
 * Single-threaded like the agent: one poll() loop over nonblocking sockets.
 * Name resolution blocks the loop, bounded by a short resolver timeout.  The
 * server holds our stdin open; EOF there means stop.
 *
 * Each connection's outcome goes to the server as records on stdout (the
 * ledger, proxy_report.h): when it closes, every REPORT_MS while it lasts,
 * and when the server sends "sync ID" on stdin (then a sync record follows
 * every record owed so far, which is how a run's result knows it has them).
 *
 * With --ask=SECONDS (egress approvals), a host the rules refuse is put to
 * the server as an "ask" record; the connection waits, at most SECONDS, for
 * "answer ID once|sandbox|no[ WHY]" on stdin.  An approval only stands in
 * for a rule: the address check after resolution still applies, with no
 * literal exception, so the user can never open a private address.
 */
#include "proxy.h"
#include "proxy_report.h"
#include "proxy_request.h"
#include "proxy_secrets.h"
#include "proxy_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS  256
#define TLS_PER_CLIENT 32   /* terminated TLS connections (a thread each) one sandbox may hold at once */
#define HEAD_MAX   (16 * 1024)    /* request line and headers */
#define BUF_MAX    (256 * 1024)   /* per direction: a full buffer stops reading its source */
#define CONNECT_MS 10000
#define HEAD_MS    30000          /* a client gets this long to send its request head */
#define LINGER_MS  2000           /* and this long to read an error reply */
#define REPORT_MS  5000           /* a long connection's counts go out this often */

/* S_TLS: a thread of proxy_tls.c has the connection until it hands it back */
enum state { S_FREE, S_HEAD, S_ASKING, S_CONNECTING, S_RELAY, S_CLOSING, S_TLS };

struct buf { char *p; size_t off, len; };   /* pending bytes are p[off..len) */

struct conn {
    enum state st;
    int cfd, ufd;              /* client and upstream sockets, -1 = none */
    struct buf up, down;       /* bytes on their way upstream / to the client */
    int c_eof, u_eof;          /* EOF read from the client / upstream */
    int shut;                  /* our write side is shut (upstream in RELAY, client in CLOSING) */
    int tunnel;                /* CONNECT rather than plain HTTP */
    int64_t deadline;          /* monotonic ms, 0 = none */
    char target[272];          /* host:port as requested, for logs and replies */
    char addr[INET6_ADDRSTRLEN];
    /* the ledger: who asked for what, and what went each way */
    char client[INET6_ADDRSTRLEN];
    char host[256];
    int port;
    int ledger;                /* allowed by the policy: its counts are owed to the server */
    int told_request;          /* its request has been counted in a record */
    const char *approved;      /* the user's approval ("once", "sandbox"), NULL if none */
    uint64_t ask_id;           /* S_ASKING: the question the server answers */
    uint64_t out, in, out_told, in_told;
    char secrets[256];         /* names of the secrets put into its request */
    char placeholders[256];    /* names whose placeholder went out unchanged (not their host) */
};

struct rule { char host[256]; int port; int literal; struct in_addr addr; };

static struct conn conns[MAX_CONNS];
static struct rule *rules;
static int nrules;
static int64_t ask_ms;         /* 0: never ask the server */
static int tls_done[2] = { -1, -1 };   /* TLS threads hand their connections back here */
static uint64_t last_ask;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* stderr may be an attach stream nobody drains: drop a line rather than let
 * a full pipe stall every connection.  Lines stay under PIPE_BUF, so a
 * writable pipe takes one whole. */
static void logmsg(const char *fmt, ...)
{
    char line[512] = "cubicle-proxy: ";
    size_t pre = strlen(line);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + pre, sizeof line - pre - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t len = pre + ((size_t)n < sizeof line - pre - 2 ? (size_t)n : sizeof line - pre - 2);
    line[len++] = '\n';
    struct pollfd p = { STDERR_FILENO, POLLOUT, 0 };
    if (poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) && write(STDERR_FILENO, line, len) < 0) {
        /* nowhere left to complain */
    }
}

/* ---- buffers --------------------------------------------------------- */

static size_t pending(const struct buf *b) { return b->len - b->off; }

static void buf_free(struct buf *b)
{
    free(b->p);
    *b = (struct buf){ 0 };
}

/* Allocate on first use and slide pending bytes to the front when the tail
 * runs short.  Returns the free space at the tail, or -1 if out of memory. */
static long buf_room(struct buf *b)
{
    if (!b->p && !(b->p = malloc(BUF_MAX)))
        return -1;
    if (b->off && BUF_MAX - b->len < BUF_MAX / 4) {
        memmove(b->p, b->p + b->off, pending(b));
        b->len -= b->off;
        b->off = 0;
    }
    return (long)(BUF_MAX - b->len);
}

static int buf_append(struct buf *b, const void *data, size_t n)
{
    long room = buf_room(b);
    if (room < 0 || n > (size_t)room)
        return -1;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

/* Read at most max bytes from fd into b: >0 read, 0 EOF, -1 error, -2 none yet. */
static ssize_t buf_read(int fd, struct buf *b, size_t max)
{
    long room = buf_room(b);
    if (room < 0)
        return -1;
    ssize_t n = recv(fd, b->p + b->len, (size_t)room < max ? (size_t)room : max, 0);
    if (n > 0)
        b->len += (size_t)n;
    return n < 0 && (errno == EAGAIN || errno == EINTR) ? -2 : n;
}

/* Send what b holds: 0 if all sent or the socket is full, -1 if the peer is gone. */
static int buf_flush(int fd, struct buf *b)
{
    while (pending(b)) {
        ssize_t n = send(fd, b->p + b->off, pending(b), MSG_NOSIGNAL);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -1;
        b->off += (size_t)n;
    }
    buf_free(b);   /* idle connections hold no buffer memory */
    return 0;
}

/* ---- connections and replies ----------------------------------------- */

/* Reports what an allowed connection did since its last record. */
static void tell(struct conn *c, const char *error)
{
    struct report_counts delta = { !c->told_request, c->out - c->out_told, c->in - c->in_told };
    if (!delta.requests && !delta.bytes_out && !delta.bytes_in && !error)
        return;
    const char *secrets = c->told_request ? NULL : c->secrets, *placeholders = c->told_request ? NULL : c->placeholders;
    report_connection(c->client, c->host, c->port, 1, NULL, error, c->approved, secrets, placeholders, delta);
    c->told_request = 1;
    c->out_told = c->out;
    c->in_told = c->in;
}

static void close_conn(struct conn *c)
{
    if (c->ledger)
        tell(c, NULL);
    if (c->cfd >= 0)
        close(c->cfd);
    if (c->ufd >= 0)
        close(c->ufd);
    buf_free(&c->up);
    buf_free(&c->down);
    *c = (struct conn){ .st = S_FREE, .cfd = -1, .ufd = -1 };
}

/* Answer with an error and stop relaying.  The client gets LINGER_MS to
 * read the reply; closing on unread input at once could reset it away. */
static void reply(struct conn *c, const char *status, const char *fmt, ...)
{
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "HTTP/1.1 %s\r\nContent-Type: text/plain\r\n"
                     "Connection: close\r\n\r\n", status);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (c->ufd >= 0)
        close(c->ufd);
    c->ufd = -1;
    buf_free(&c->up);
    buf_free(&c->down);
    buf_append(&c->down, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    c->st = S_CLOSING;
    c->shut = 0;
    c->deadline = now_ms() + LINGER_MS;
}

static void deny(struct conn *c, const char *why)
{
    logmsg("deny %s %s", c->target, why);
    report_connection(c->client, c->host, c->port, 0, why, NULL, NULL, NULL, c->placeholders,
                      (struct report_counts){ 1, 0, 0 });
    c->ledger = 0;
    reply(c, "403 Forbidden", "cubicle egress policy: %s is not allowed (%s)\n", c->target, why);
}

static void fail(struct conn *c, const char *why)
{
    logmsg("fail %s %s", c->target, why);
    if (c->ledger)
        tell(c, why);
    c->ledger = 0;
    reply(c, "502 Bad Gateway", "cubicle proxy: cannot connect to %s: %s\n", c->target, why);
}

static void bad(struct conn *c, const char *status, const char *why)
{
    logmsg("bad request: %s", why);
    reply(c, status, "cubicle proxy: bad request: %s\n", why);
}

/* ---- policy ---------------------------------------------------------- */

static int blocked4(uint32_t a)   /* host byte order */
{
    static const struct { uint32_t net; int bits; } nets[] = {
        { 0x00000000, 8 },  { 0x7f000000, 8 },    /* "this" network, loopback */
        { 0x0a000000, 8 },  { 0xac100000, 12 },   /* private */
        { 0xc0a80000, 16 }, { 0x64400000, 10 },   /* private, carrier-grade NAT */
        { 0xa9fe0000, 16 },                       /* link-local, cloud metadata */
        { 0xe0000000, 4 },  { 0xf0000000, 4 },    /* multicast; reserved, broadcast */
    };
    for (size_t i = 0; i < sizeof nets / sizeof nets[0]; i++)
        if ((a ^ nets[i].net) >> (32 - nets[i].bits) == 0)
            return 1;
    return 0;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int blocked6(const unsigned char *a)
{
    static const unsigned char mapped[12] = { [10] = 0xff, [11] = 0xff };
    static const unsigned char nat64[12] = { 0, 0x64, 0xff, 0x9b };
    /* forms that carry an IPv4 address are judged by it */
    if (!memcmp(a, mapped, 12) || !memcmp(a, nat64, 12))
        return blocked4(be32(a + 12));
    if (a[0] == 0x20 && a[1] == 0x02)   /* 6to4 */
        return blocked4(be32(a + 2));
    return a[0] == 0x00                          /* ::, ::1, IPv4-compatible */
        || (a[0] & 0xfe) == 0xfc                 /* unique local */
        || (a[0] == 0xfe && (a[1] & 0x80))       /* link-local, old site-local */
        || a[0] == 0xff;                         /* multicast */
}

/* May we connect to sa?  r is the rule the request matched, if any: an IPv4
 * literal rule unlocks exactly its own address. */
static int permitted(const struct sockaddr *sa, const struct rule *r)
{
    if (sa->sa_family == AF_INET) {
        struct in_addr a = ((const struct sockaddr_in *)(const void *)sa)->sin_addr;
        return (r && r->literal && a.s_addr == r->addr.s_addr) || !blocked4(ntohl(a.s_addr));
    }
    return sa->sa_family == AF_INET6 &&
           !blocked6(((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr.s6_addr);
}

static const struct rule *match_rule(const char *host, int port)
{
    for (int i = 0; i < nrules; i++)
        if (!strcasecmp(rules[i].host, host) && (!rules[i].port || rules[i].port == port))
            return &rules[i];
    return NULL;
}

/* The allowlist refused c's host: ask the server, or refuse now. */
static void ask_or_deny(struct conn *c)
{
    if (!ask_ms) {
        deny(c, "not in the allow list");
        return;
    }
    c->ask_id = ++last_ask;
    c->st = S_ASKING;
    c->deadline = now_ms() + ask_ms;
    report_ask(c->ask_id, c->client, c->host, c->port);
}

/* Resolve host and start a nonblocking connect to the first address the
 * policy permits, IPv4 first (Docker bridges rarely route IPv6). */
static void start_upstream(struct conn *c, const char *host, int port)
{
    const struct rule *r = c->approved ? NULL : match_rule(host, port);
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res, *pick = NULL;
    char service[8], refused[INET6_ADDRSTRLEN + 48] = "";

    if (nrules && !r && !c->approved) {
        ask_or_deny(c);
        return;
    }
    c->ledger = 1;
    snprintf(service, sizeof service, "%d", port);
    int err = getaddrinfo(host, service, &hints, &res);
    if (err) {
        fail(c, err == EAI_SYSTEM ? strerror(errno) : gai_strerror(err));
        return;
    }
    for (int pass = 0; pass < 2 && !pick; pass++)
        for (struct addrinfo *ai = res; ai && !pick; ai = ai->ai_next) {
            if (ai->ai_family != (pass ? AF_INET6 : AF_INET))
                continue;
            getnameinfo(ai->ai_addr, ai->ai_addrlen, c->addr, sizeof c->addr, NULL, 0,
                        NI_NUMERICHOST);
            if (permitted(ai->ai_addr, r))
                pick = ai;
            else if (!refused[0])
                snprintf(refused, sizeof refused, "%s is a private or reserved address", c->addr);
        }
    int fd = -1;
    if (!pick)
        deny(c, refused[0] ? refused : "no usable address");
    else if ((fd = socket(pick->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0 ||
             (connect(fd, pick->ai_addr, pick->ai_addrlen) < 0 && errno != EINPROGRESS)) {
        fail(c, strerror(errno));
        if (fd >= 0)
            close(fd);
    } else {
        c->ufd = fd;
        c->st = S_CONNECTING;
        c->deadline = now_ms() + CONNECT_MS;
    }
    freeaddrinfo(res);
}

/* The request head is complete: check it, apply the policy, start
 * connecting.  Bytes after the head (a body, early TLS) go upstream after it. */
static void handle_head(struct conn *c, size_t head_len)
{
    char head[HEAD_MAX + 1];
    struct proxy_request req;
    struct buf out = { 0 };
    const char *why;

    memcpy(head, c->up.p + c->up.off, head_len);
    head[head_len] = '\0';
    c->up.off += head_len;
    if (buf_room(&out) < 0)
        why = "out of memory";
    else
        why = proxy_parse_request(head, head_len, &req, out.p, BUF_MAX, &out.len);
    /* plain HTTP: the sandbox's secrets go in here (proxy_secrets.h); the placeholders
     * of secrets not for this host are only noted */
    if (!why && !req.tunnel &&
        secrets_rewrite(c->client, req.host, req.port, 0, out.p, &out.len, BUF_MAX, c->secrets,
                        sizeof c->secrets, c->placeholders, sizeof c->placeholders))
        why = "request head too long";
    if (!why && pending(&c->up) && buf_append(&out, c->up.p + c->up.off, pending(&c->up)))
        why = "out of memory";
    buf_free(&c->up);
    c->up = out;
    if (why) {
        bad(c, "400 Bad Request", why);
        return;
    }
    c->tunnel = req.tunnel;
    memcpy(c->host, req.host, sizeof c->host);
    c->port = req.port;
    int br = strchr(req.host, ':') != NULL;
    snprintf(c->target, sizeof c->target, "%s%s%s:%d", br ? "[" : "", req.host, br ? "]" : "",
             req.port);
    start_upstream(c, req.host, req.port);
}

/* ---- events ---------------------------------------------------------- */

static void client_readable(struct conn *c)
{
    if (c->st == S_CLOSING) {   /* discard until the client has read our reply and gone */
        char junk[4096];
        ssize_t n = recv(c->cfd, junk, sizeof junk, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            close_conn(c);
        return;
    }
    size_t max = c->st == S_HEAD ? HEAD_MAX + 1 - pending(&c->up) : BUF_MAX;
    ssize_t n = buf_read(c->cfd, &c->up, max);
    if (n == -2)
        return;
    if (n < 0 || (n == 0 && c->st == S_HEAD)) {
        close_conn(c);
        return;
    }
    if (n == 0)
        c->c_eof = 1;
    else if (c->st == S_HEAD) {
        char *start = c->up.p + c->up.off;
        char *end = memmem(start, pending(&c->up), "\r\n\r\n", 4);
        if (end && (size_t)(end + 4 - start) <= HEAD_MAX)
            handle_head(c, (size_t)(end + 4 - start));
        else if (pending(&c->up) > HEAD_MAX)
            bad(c, "431 Request Header Fields Too Large", "request head over 16 KiB");
    }
}

static void upstream_writable(struct conn *c)
{
    static const char established[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    int err = 0;
    socklen_t len = sizeof err;

    if (c->st == S_RELAY) {
        size_t before = pending(&c->up);
        int gone = buf_flush(c->ufd, &c->up);
        c->out += before - pending(&c->up);
        if (gone)
            close_conn(c);
        return;
    }
    if (getsockopt(c->ufd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err) {
        fail(c, strerror(err));
        return;
    }
    logmsg("allow %s (%s)", c->target, c->addr);
    c->deadline = 0;
    if (c->tunnel && secrets_for(c->client, c->host, c->port)) {
        /* the sandbox's secrets go to this host: TLS ends here (proxy_tls.h) */
        if (pending(&c->up)) {
            fail(c, "the client sent data before the tunnel was established");
            return;
        }
        int held = 0;   /* one sandbox must not take every slot and thread from the others */
        for (int i = 0; i < MAX_CONNS; i++)
            held += conns[i].st == S_TLS && !strcmp(conns[i].client, c->client);
        if (held >= TLS_PER_CLIENT) {
            fail(c, "too many HTTPS connections to secrets' hosts from this sandbox at once");
            return;
        }
        c->st = S_TLS;
        c->ledger = 0;   /* the thread counts; nothing is told until it is back */
        if (tls_start((int)(c - conns), c->cfd, c->ufd, c->client, c->host, c->port, tls_done[1])) {
            c->st = S_CONNECTING;
            c->ledger = 1;
            fail(c, "cannot start TLS for the sandbox's secrets");
        }
        return;
    }
    c->st = S_RELAY;
    if (c->tunnel && buf_append(&c->down, established, sizeof established - 1))
        close_conn(c);
}

static void upstream_readable(struct conn *c)
{
    ssize_t n = buf_read(c->ufd, &c->down, BUF_MAX);
    if (n > 0)
        c->in += (uint64_t)n;
    if (n == 0 || n == -1)
        c->u_eof = 1;   /* end or reset: the client gets what arrived, then EOF */
}

/* Decide what follows from the buffers and EOFs after an event. */
static void settle(struct conn *c)
{
    if (c->st == S_RELAY && c->c_eof && !pending(&c->up) && !c->shut) {
        shutdown(c->ufd, SHUT_WR);   /* pass the client's half-close on */
        c->shut = 1;
    }
    if (c->st == S_RELAY && c->u_eof && !pending(&c->down)) {
        close_conn(c);   /* the server is done and the client has it all */
    } else if (c->st == S_CLOSING && !pending(&c->down) && !c->shut) {
        shutdown(c->cfd, SHUT_WR);   /* reply sent: let the client see its end */
        c->shut = 1;
    }
}

/* One socket of c polled ready; ev is what we asked for. */
static void service(struct conn *c, int fd, short ev, short rev)
{
    int client = fd == c->cfd;
    if ((ev & POLLOUT) && (rev & (POLLOUT | POLLERR | POLLHUP))) {
        if (!client)
            upstream_writable(c);
        else if (buf_flush(c->cfd, &c->down))
            close_conn(c);
    }
    if (c->st == S_FREE || fd != (client ? c->cfd : c->ufd))
        return;
    if ((ev & POLLIN) && (rev & (POLLIN | POLLERR | POLLHUP))) {
        if (client)
            client_readable(c);
        else
            upstream_readable(c);
    }
    if (c->st != S_FREE)
        settle(c);
}

static short client_events(const struct conn *c)
{
    switch (c->st) {
    case S_HEAD:
        return POLLIN;
    case S_RELAY:
        return (short)((!c->c_eof && pending(&c->up) < BUF_MAX ? POLLIN : 0) |
                       (pending(&c->down) ? POLLOUT : 0));
    case S_CLOSING:
        return pending(&c->down) ? POLLOUT : POLLIN;
    default:
        return 0;
    }
}

static short upstream_events(const struct conn *c)
{
    if (c->st == S_CONNECTING)
        return POLLOUT;
    if (c->st != S_RELAY)
        return 0;
    return (short)((!c->u_eof && pending(&c->down) < BUF_MAX ? POLLIN : 0) |
                   (pending(&c->up) ? POLLOUT : 0));
}

static void expire(int64_t now)
{
    for (int i = 0; i < MAX_CONNS; i++) {
        struct conn *c = &conns[i];
        if (c->st == S_FREE || !c->deadline || now < c->deadline)
            continue;
        if (c->st == S_HEAD)
            bad(c, "408 Request Timeout", "no complete request head in time");
        else if (c->st == S_ASKING)
            deny(c, "not in the allow list; no answer from the server");
        else if (c->st == S_CONNECTING)
            fail(c, strerror(ETIMEDOUT));
        else
            close_conn(c);
    }
}

/* TLS threads that are done: their connections come back to be told and closed. */
static void tls_finished(int fd)
{
    struct tls_outcome *r;
    while (read(fd, &r, sizeof r) == sizeof r) {
        struct conn *c = &conns[r->slot];
        if (c->st != S_TLS) {
            free(r);
            continue;
        }
        c->out += r->out;
        c->in += r->in;
        snprintf(c->secrets, sizeof c->secrets, "%s", r->secrets);
        snprintf(c->placeholders, sizeof c->placeholders, "%s", r->placeholders);
        c->ledger = 1;
        if (r->error[0]) {
            logmsg("fail %s %s", c->target, r->error);
            tell(c, r->error);
        }
        close_conn(c);
        free(r);
    }
}

/* Reports the counts of every connection still open. */
static void tell_open(void)
{
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].st != S_FREE && conns[i].ledger)
            tell(&conns[i], NULL);
}

/* Milliseconds until the nearest deadline (or accept_after, or the next
 * periodic report while a connection is open), -1 for none. */
static int poll_timeout(int64_t now, int64_t accept_after, int64_t report_at)
{
    int64_t next = accept_after > now ? accept_after : -1;
    for (int i = 0; i < MAX_CONNS; i++) {
        if (conns[i].st != S_FREE && conns[i].deadline && (next < 0 || conns[i].deadline < next))
            next = conns[i].deadline;
        if (conns[i].ledger && (next < 0 || report_at < next))
            next = report_at;
    }
    return next < 0 ? -1 : next <= now ? 0 : (int)(next - now);
}

/* The client's address as the server knows the sandbox: numeric, IPv4
 * rather than IPv4-mapped IPv6 (the listener is dual-stack). */
static void client_address(const struct sockaddr_storage *peer, char out[INET6_ADDRSTRLEN])
{
    const struct sockaddr_in6 *p6 = (const struct sockaddr_in6 *)(const void *)peer;
    if (peer->ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&p6->sin6_addr))
        inet_ntop(AF_INET, p6->sin6_addr.s6_addr + 12, out, INET6_ADDRSTRLEN);
    else if (peer->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &p6->sin6_addr, out, INET6_ADDRSTRLEN);
    else if (peer->ss_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)peer)->sin_addr, out,
                  INET6_ADDRSTRLEN);
    else
        strcpy(out, "unknown");
}

/* Accept what is waiting.  Beyond MAX_CONNS a client is told so at once
 * rather than left in the backlog.  Returns when to try again if out of
 * file descriptors or memory (0 = whenever). */
static int64_t accept_clients(int lfd)
{
    static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                               "Connection: close\r\n\r\ncubicle proxy: too many connections\n";
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof peer;
        int fd = accept4(lfd, (struct sockaddr *)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM
                   ? now_ms() + 100 : 0;
        struct conn *c = conns;
        while (c < conns + MAX_CONNS && c->st != S_FREE)
            c++;
        if (c == conns + MAX_CONNS) {
            logmsg("busy: over %d connections", MAX_CONNS);
            if (send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
                /* the client is gone already */
            }
            close(fd);
            continue;
        }
        *c = (struct conn){ .st = S_HEAD, .cfd = fd, .ufd = -1, .deadline = now_ms() + HEAD_MS };
        client_address(&peer, c->client);
    }
    return 0;
}

/* Dual-stack where IPv6 exists, else IPv4 only. */
static int listen_on(int port)
{
    struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                               .sin6_addr = IN6ADDR_ANY_INIT };
    struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_ANY) };
    int one = 1, zero = 0;

    for (int v6 = 1; v6 >= 0; v6--) {
        int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if ((!v6 || setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0) &&
            bind(fd, v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4,
                 v6 ? sizeof a6 : sizeof a4) == 0 && listen(fd, 511) == 0)
            return fd;
        close(fd);
    }
    return -1;
}

static int parse_rules(int n, char **args)
{
    rules = calloc((size_t)n + 1, sizeof *rules);
    if (!rules)
        return -1;
    for (nrules = 0; nrules < n; nrules++) {
        struct rule *r = &rules[nrules];
        const char *arg = args[nrules], *colon = strchr(arg, ':');
        size_t hl = colon ? (size_t)(colon - arg) : strlen(arg);
        if (hl <= 253)
            memcpy(r->host, arg, hl);
        if (hl > 253 || !proxy_host_ok(r->host, 0) ||
            (colon && (r->port = proxy_parse_port(colon + 1, strlen(colon + 1))) < 0)) {
            fprintf(stderr, "cubicle-proxy: bad allow rule '%s' (want HOST or HOST:PORT)\n", arg);
            return -1;
        }
        r->literal = inet_pton(AF_INET, r->host, &r->addr) == 1;
    }
    return 0;
}

/* The server's attach stream: only a pipe or socket is watched, so that run
 * by hand with stdin on /dev/null or a terminal the proxy keeps going. */
/* The server's answer to question id.  The verdict and reason are words of
 * the server's; the texts the client and the ledger see are ours. */
static void answer(uint64_t id, const char *verdict, const char *why)
{
    struct conn *c = conns;
    while (c < conns + MAX_CONNS && !(c->st == S_ASKING && c->ask_id == id))
        c++;
    if (c == conns + MAX_CONNS)
        return;   /* gone, or refused at the deadline already */
    if (!strcmp(verdict, "once") || !strcmp(verdict, "sandbox")) {
        c->approved = !strcmp(verdict, "once") ? "once" : "sandbox";
        c->st = S_HEAD;   /* as if the head had just come: policy, then connect */
        c->deadline = 0;
        logmsg("approved %s (%s)", c->target, c->approved);
        start_upstream(c, c->host, c->port);
    } else if (!strcmp(why, "declined")) {
        deny(c, "not in the allow list; the user declined");
    } else if (!strcmp(why, "timeout")) {
        deny(c, "not in the allow list; no answer from the user in time");
    } else if (!strcmp(why, "unasked")) {
        deny(c, "not in the allow list; the client cannot ask the user (no elicitation)");
    } else {
        deny(c, "not in the allow list");
    }
}

static int is_stream(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
}

/* Commands from the server, a line each: "sync ID", "answer ID ...", and
 * "secret ..."/"unsecret ..." (proxy_secrets.h; never logged: they hold
 * values).  Returns 0, or -1 at EOF (the server let go of us). */
static int read_commands(int fd)
{
    static char line[64 * 1024];
    static size_t len;
    ssize_t r = read(fd, line + len, sizeof line - 1 - len);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
        return -1;
    if (r < 0)
        return 0;
    len += (size_t)r;
    char *nl;
    while ((nl = memchr(line, '\n', len))) {
        *nl = '\0';
        uint64_t id;
        char verdict[16], why[16] = "";
        if (sscanf(line, "sync %" SCNu64, &id) == 1) {
            tls_finished(tls_done[0]);   /* connections a TLS thread just ended count too */
            tell_open();
            report_sync(id);
        } else if (sscanf(line, "answer %" SCNu64 " %15s %15s", &id, verdict, why) >= 2) {
            answer(id, verdict, why);
        } else if (!strncmp(line, "secret ", 7) || !strncmp(line, "unsecret ", 9)) {
            if (secrets_command(line))
                logmsg("a malformed secret command was ignored");
        } else if (!strncmp(line, "trust ", 6) || !strncmp(line, "ca ", 3) || !strncmp(line, "unca ", 5)) {
            if (tls_command(line))
                logmsg("a malformed %.5s command was ignored", line);
        }
        explicit_bzero(line, (size_t)(nl + 1 - line));
        len -= (size_t)(nl + 1 - line);
        memmove(line, nl + 1, len);
    }
    if (len == sizeof line - 1)
        len = 0;   /* no command is this long */
    return 0;
}

int proxy_main(int argc, char **argv)
{
    static struct pollfd pfd[4 + 2 * MAX_CONNS];
    static int owner[4 + 2 * MAX_CONNS];   /* slot -> connection index */
    int port = argc >= 1 ? proxy_parse_port(argv[0], strlen(argv[0])) : -1;
    int64_t accept_after = 0;

    if (port < 0) {
        fprintf(stderr, "usage: cubicle-agent --proxy PORT [--ask=SECONDS] [HOST[:PORT] ...]\n");
        return 2;
    }
    int first_rule = 1;
    if (argc > 1 && !strncmp(argv[1], "--ask=", 6)) {
        int s = proxy_parse_port(argv[1] + 6, strlen(argv[1] + 6));   /* 1..65535 seconds will do */
        if (s < 0) {
            fprintf(stderr, "cubicle-proxy: bad %s (want --ask=SECONDS)\n", argv[1]);
            return 2;
        }
        ask_ms = (int64_t)s * 1000;
        first_rule = 2;
    }
    if (parse_rules(argc - first_rule, argv + first_rule))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    /* resolution blocks every connection: give up on a silent server soon */
    setenv("RES_OPTIONS", "timeout:2 attempts:2", 0);
    int lfd = listen_on(port);
    if (lfd < 0) {
        fprintf(stderr, "cubicle-proxy: cannot listen on port %d: %s\n", port, strerror(errno));
        return 1;
    }
    for (int i = 0; i < MAX_CONNS; i++)
        conns[i] = (struct conn){ .st = S_FREE, .cfd = -1, .ufd = -1 };
    if (pipe2(tls_done, O_CLOEXEC) || fcntl(tls_done[0], F_SETFL, O_NONBLOCK)) {
        perror("cubicle-proxy: pipe");
        return 1;
    }
    int in_fd = is_stream(STDIN_FILENO) ? STDIN_FILENO : -1;
    int out_fd = STDOUT_FILENO;
    if (is_stream(out_fd))   /* a server slow to read must not stall the connections */
        fcntl(out_fd, F_SETFL, fcntl(out_fd, F_GETFL) | O_NONBLOCK);
    int64_t report_at = now_ms() + REPORT_MS;
    logmsg("listening on port %d, %d allow rule(s)", port, nrules);

    for (;;) {
        int64_t now = now_ms();
        size_t n = 4;
        pfd[0] = (struct pollfd){ now < accept_after ? -1 : lfd, POLLIN, 0 };
        pfd[1] = (struct pollfd){ in_fd, POLLIN, 0 };
        int64_t due = out_fd >= 0 ? report_due(now) : -1;
        pfd[2] = (struct pollfd){ due >= 0 && due <= now ? out_fd : -1, POLLOUT, 0 };
        pfd[3] = (struct pollfd){ tls_done[0], POLLIN, 0 };
        for (int i = 0; i < MAX_CONNS; i++) {
            if (conns[i].st == S_FREE)
                continue;
            short ce = client_events(&conns[i]), ue = upstream_events(&conns[i]);
            owner[n] = i;   /* an fd of -1 (nothing wanted) keeps POLLHUP from spinning */
            pfd[n++] = (struct pollfd){ ce ? conns[i].cfd : -1, ce, 0 };
            owner[n] = i;
            pfd[n++] = (struct pollfd){ ue ? conns[i].ufd : -1, ue, 0 };
        }
        int timeout = poll_timeout(now, accept_after, report_at);
        if (due > now && (timeout < 0 || due - now < timeout))
            timeout = (int)(due - now);
        if (poll(pfd, n, timeout) < 0) {
            if (errno == EINTR)
                continue;
            perror("cubicle-proxy: poll");
            return 1;
        }
        /* Nothing is accepted until the pass is over, so a slot's fd still
         * belongs to its connection unless that one closed it. */
        for (size_t i = 4; i < n; i++) {
            struct conn *c = &conns[owner[i]];
            if (pfd[i].revents && c->st != S_FREE && (pfd[i].fd == c->cfd || pfd[i].fd == c->ufd))
                service(c, pfd[i].fd, pfd[i].events, pfd[i].revents);
        }
        if (pfd[3].revents)
            tls_finished(tls_done[0]);
        if (pfd[1].revents && read_commands(in_fd))
            return 0;   /* the server let go of us */
        if (pfd[0].revents)
            accept_after = accept_clients(lfd);
        now = now_ms();
        expire(now);
        if (now >= report_at) {
            tell_open();
            report_at = now + REPORT_MS;
        }
        /* records are written when due (a sync or ask at once), not only when poll says so */
        due = out_fd >= 0 ? report_due(now) : -1;
        if (due >= 0 && due <= now && report_flush(out_fd))
            out_fd = -1;
    }
}
