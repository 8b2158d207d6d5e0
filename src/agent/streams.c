#include "streams.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "protocol.h"
#include "wire.h"

#define MAX_STREAMS 1024
/* Credit goes back in batches: the peer still has most of a window, so it
 * never waits, and a small request costs no extra frame. */
#define WINDOW_BATCH (CUBICLE_STREAM_WINDOW / 4)

struct stream {
    struct stream *next;
    uint32_t id;
    int fd;
    int connecting;         /* connect() in progress */
    uint64_t credit;        /* DATA bytes the server still takes */
    unsigned char *q;       /* the server's bytes not yet written to fd (<= a window) */
    size_t qlen, qoff;
    uint64_t unacked;       /* written to fd, credit not yet handed back */
    int peer_eof;           /* the server sent its SHUT: no more DATA */
    int wr_shut;            /* ... and we passed it on (shutdown SHUT_WR) */
    int wr_failed;          /* the program stopped taking input: the server's bytes are dropped (and credited) */
    int rd_eof;             /* the program's end: we sent our SHUT */
    int dead;               /* freed by streams_reap */
};

static struct stream *streams;
static stream_send_fn send_frame;
static stream_id_taken_fn id_taken;

void streams_init(stream_send_fn send, stream_id_taken_fn taken)
{
    send_frame = send;
    id_taken = taken;
}

static struct stream *find(uint32_t id)
{
    for (struct stream *s = streams; s; s = s->next)
        if (s->id == id && !s->dead)
            return s;
    return NULL;
}

int streams_has(uint32_t id) { return find(id) != NULL; }

size_t streams_count(void)
{
    size_t n = 0;
    for (struct stream *s = streams; s; s = s->next)
        n++;
    return n;
}

#define error_frame(id, ...) wire_send_error(send_frame, (id), __VA_ARGS__)

static void forget(struct stream *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    free(s->q);
    s->q = NULL;
    s->qlen = s->qoff = 0;
    s->dead = 1;
}

/* Both sides forget the stream; the server learns why. */
static void abort_stream(struct stream *s, const char *why)
{
    send_frame(CUBICLE_FRAME_SHUT, s->id, why, strlen(why));
    forget(s);
}

static void hand_back_credit(struct stream *s, int all)
{
    char num[24];
    if (s->unacked == 0 || (!all && s->unacked < WINDOW_BATCH))
        return;
    int n = snprintf(num, sizeof num, "%llu", (unsigned long long)s->unacked);
    send_frame(CUBICLE_FRAME_WINDOW, s->id, num, (size_t)n);
    s->unacked = 0;
}

static void end_if_done(struct stream *s)
{
    if (!s->dead && s->rd_eof && s->wr_shut && (!s->wr_failed || s->peer_eof))
        forget(s);   /* both directions ended; the server knows both */
}

/* Write what the server sent as far as the socket takes it; pass its SHUT on
 * once everything before it is written. */
static void flush(struct stream *s)
{
    while (!s->connecting && s->qoff < s->qlen) {
        ssize_t n = send(s->fd, s->q + s->qoff, s->qlen - s->qoff, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n < 0) {
            /* A program that answered and closed (EPIPE) still has its answer on
             * the way: end only this direction, keep reading what it wrote. */
            s->unacked += s->qlen - s->qoff;
            s->qoff = s->qlen;
            s->wr_failed = 1;
            s->wr_shut = 1;
            break;
        }
        s->qoff += (size_t)n;
        s->unacked += (uint64_t)n;
    }
    if (s->qoff == s->qlen) {
        s->qoff = s->qlen = 0;
        if (s->peer_eof && !s->wr_shut && !s->connecting) {
            shutdown(s->fd, SHUT_WR);
            s->wr_shut = 1;
        }
    }
    hand_back_credit(s, 0);
    end_if_done(s);
}

static void handle_connect(uint32_t id, const unsigned char *payload, size_t len)
{
    uint64_t port;

    if (wire_parse_decimal(payload, len, 65535, &port) || port == 0) {
        error_frame(id, "malformed CONNECT: port must be 1-65535");
        return;
    }
    if (id == 0 || find(id) || (id_taken && id_taken(id))) {
        error_frame(id, "stream id %u is reserved or in use", id);
        return;
    }
    if (streams_count() >= MAX_STREAMS) {
        error_frame(id, "too many open streams (%d)", MAX_STREAMS);
        return;
    }
    struct stream *s = calloc(1, sizeof *s);
    if (!s) {
        error_frame(id, "out of memory");
        return;
    }
    s->id = id;
    s->credit = CUBICLE_STREAM_WINDOW;
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr = { htonl(INADDR_LOOPBACK) } };
    int one = 1;
    if (s->fd >= 0)
        setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);   /* requests are small */
    int rc = s->fd < 0 ? -1 : connect(s->fd, (struct sockaddr *)&addr, sizeof addr);
    if (rc < 0 && (s->fd < 0 || errno != EINPROGRESS)) {
        if (errno == ECONNREFUSED)
            error_frame(id, "nothing listens on port %u in the sandbox", (unsigned)port);
        else
            error_frame(id, "cannot connect to port %u in the sandbox: %s", (unsigned)port, strerror(errno));
        if (s->fd >= 0)
            close(s->fd);
        free(s);
        return;
    }
    s->connecting = rc < 0;   /* EINPROGRESS: errno is stale after a connect that succeeded */
    s->next = streams;
    streams = s;
    if (!s->connecting)
        send_frame(CUBICLE_FRAME_CONNECTED, id, NULL, 0);
}

/* The server's bytes: queued, within the window we granted. */
static void handle_data(struct stream *s, const unsigned char *data, size_t len)
{
    if (len == 0)
        return;   /* nothing to queue (and realloc(q, 0) would free it) */
    if (s->wr_failed && !s->peer_eof) {   /* the program takes no more: drop, but credit */
        s->unacked += len;
        hand_back_credit(s, 0);
        return;
    }
    if (s->peer_eof || s->qlen - s->qoff + len > CUBICLE_STREAM_WINDOW) {
        abort_stream(s, s->peer_eof ? "DATA after SHUT" : "DATA beyond the window");
        return;
    }
    if (s->qoff) {
        memmove(s->q, s->q + s->qoff, s->qlen - s->qoff);
        s->qlen -= s->qoff;
        s->qoff = 0;
    }
    unsigned char *nq = realloc(s->q, s->qlen + len);
    if (!nq) {
        abort_stream(s, "out of memory");
        return;
    }
    memcpy(nq + s->qlen, data, len);
    s->q = nq;
    s->qlen += len;
    flush(s);
}

void streams_handle(uint8_t type, uint32_t id, const unsigned char *payload, size_t len)
{
    if (type == CUBICLE_FRAME_CONNECT) {
        handle_connect(id, payload, len);
        return;
    }
    struct stream *s = find(id);
    if (!s)
        return;   /* it just ended: the server learns it from our SHUT */
    if (type == CUBICLE_FRAME_DATA) {
        handle_data(s, payload, len);
    } else if (type == CUBICLE_FRAME_SHUT) {
        if (len) {
            forget(s);   /* the server gave up on it: nothing answers */
            return;
        }
        s->peer_eof = 1;
        flush(s);
    } else if (type == CUBICLE_FRAME_WINDOW) {
        uint64_t more;
        if (wire_parse_decimal(payload, len, CUBICLE_STREAM_WINDOW - s->credit, &more)) {
            abort_stream(s, "malformed WINDOW");
            return;
        }
        s->credit += more;
    }
}

size_t streams_add_fds(struct pollfd *pfd, struct stream **owners, size_t n)
{
    for (struct stream *s = streams; s; s = s->next) {
        if (s->dead)
            continue;
        short ev = 0;
        if (s->connecting || s->qoff < s->qlen)
            ev |= POLLOUT;
        if (!s->connecting && !s->rd_eof && s->credit > 0)
            ev |= POLLIN;
        if (!ev)   /* a hang-up would wake us for nothing until there is credit */
            continue;
        owners[n] = s;
        pfd[n++] = (struct pollfd){ s->fd, ev, 0 };
    }
    return n;
}

static void finish_connect(struct stream *s)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err == EINPROGRESS || err == EALREADY)
        return;
    if (err) {
        if (err == ECONNREFUSED)
            error_frame(s->id, "nothing listens on that port in the sandbox");
        else
            error_frame(s->id, "cannot connect in the sandbox: %s", strerror(err));
        forget(s);
        return;
    }
    s->connecting = 0;
    send_frame(CUBICLE_FRAME_CONNECTED, s->id, NULL, 0);
    flush(s);   /* a SHUT that came while connecting, with nothing queued, goes on now */
}

static void pump_in(struct stream *s)
{
    static unsigned char buf[CUBICLE_STREAM_CHUNK];
    size_t want = s->credit < sizeof buf ? (size_t)s->credit : sizeof buf;
    ssize_t n = recv(s->fd, buf, want, 0);

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n < 0) {
        char why[128];
        snprintf(why, sizeof why, "reading from the program failed: %s", strerror(errno));
        abort_stream(s, why);
        return;
    }
    if (n == 0) {
        s->rd_eof = 1;
        send_frame(CUBICLE_FRAME_SHUT, s->id, NULL, 0);
        end_if_done(s);
        return;
    }
    /* Acknowledge at once: a program that writes a response in two pieces
     * (headers, then body) holds the second under Nagle's rule until the first
     * is acknowledged, and a delayed ACK costs it 40 ms.  The flag does not
     * stick, so it is set after every read. */
    int one = 1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
    s->credit -= (uint64_t)n;
    send_frame(CUBICLE_FRAME_DATA, s->id, buf, (size_t)n);
}

void streams_service(struct stream *s, short revents)
{
    if (s->dead)
        return;
    if (s->connecting) {
        finish_connect(s);
        return;
    }
    if (revents & (POLLOUT | POLLERR | POLLHUP))
        flush(s);
    if (!s->dead && !s->rd_eof && s->credit > 0 && (revents & (POLLIN | POLLERR | POLLHUP)))
        pump_in(s);
}

void streams_reap(void)
{
    for (struct stream **pp = &streams; *pp;) {
        struct stream *s = *pp;
        if (s->dead) {
            *pp = s->next;
            free(s);
        } else {
            pp = &s->next;
        }
    }
}

void streams_close_all(const char *why)
{
    for (struct stream *s = streams; s; s = s->next)
        if (!s->dead)
            abort_stream(s, why);
    streams_reap();
}
