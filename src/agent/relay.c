#include "relay.h"

#include "address.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define RELAY_CHUNK 16384
/* Connections at once from one address: its agent's alone. The agent dials before
 * any program runs and holds its connection for the sandbox's life, so a program
 * never gets a slot, nor makes the server do TLS handshakes for it. */
#define PER_PEER 1
#define MOST_CHILDREN 4000   /* under the container's PidsLimit */

static struct child {
    pid_t pid;
    struct in6_addr peer;
} children[MOST_CHILDREN];
static size_t child_count;

static size_t from_peer(const struct in6_addr *peer)
{
    size_t n = 0;
    for (size_t i = 0; i < child_count; i++)
        n += memcmp(&children[i].peer, peer, sizeof *peer) == 0;
    return n;
}

static void reap(void)
{
    pid_t pid;
    while ((pid = waitpid(-1, NULL, WNOHANG)) > 0)
        for (size_t i = 0; i < child_count; i++)
            if (children[i].pid == pid) {
                children[i] = children[--child_count];
                break;
            }
}

/* Bytes read from one side and not yet written to the other. */
struct direction {
    int from, to;
    char buf[RELAY_CHUNK];
    size_t len, off;
    int ended;   /* `from` sent its end, passed on to `to` */
};

/* Copies both ways until both sides end; a half-close is passed on. Non-blocking,
 * a buffer per direction: a blocked write one way never stops the other way, or
 * the agent (writing output, not reading input) and the server could wait on each
 * other forever. */
static void splice_both(int a, int b)
{
    static struct direction dirs[2];
    dirs[0] = (struct direction){ .from = a, .to = b };
    dirs[1] = (struct direction){ .from = b, .to = a };
    int fds[2] = { a, b };
    fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK);
    fcntl(b, F_SETFL, fcntl(b, F_GETFL) | O_NONBLOCK);
    for (;;) {
        struct pollfd pfd[2] = { { a, 0, 0 }, { b, 0, 0 } };   /* pfd[i] is fds[i], which dirs[i] reads */
        int busy = 0;
        for (int i = 0; i < 2; i++) {
            if (dirs[i].len == 0 && !dirs[i].ended)
                pfd[i].events |= POLLIN;
            if (dirs[i].len > 0)
                pfd[1 - i].events |= POLLOUT;
            busy |= !dirs[i].ended || dirs[i].len > 0;
        }
        if (!busy)
            return;
        for (int i = 0; i < 2; i++)   /* a hung-up side nobody waits on must not wake poll */
            pfd[i].fd = pfd[i].events ? fds[i] : -1;
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        for (int i = 0; i < 2; i++) {
            struct direction *d = &dirs[i];
            if (d->len == 0 && !d->ended && pfd[i].revents) {
                ssize_t n = read(d->from, d->buf, sizeof d->buf);
                if (n > 0) {
                    d->len = (size_t)n;
                    d->off = 0;
                } else if (n == 0) {
                    d->ended = 1;
                    shutdown(d->to, SHUT_WR);
                } else if (errno != EAGAIN && errno != EINTR) {
                    return;
                }
            }
            if (d->len > 0) {   /* try at once: the other side is mostly ready */
                ssize_t w = write(d->to, d->buf + d->off, d->len - d->off);
                if (w > 0) {
                    d->off += (size_t)w;
                    if (d->off == d->len)
                        d->len = 0;
                } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                    return;
                }
            }
        }
    }
}

int relay_main(int argc, char **argv)
{
    struct sockaddr_storage target;
    socklen_t target_len;
    char *end;
    long port = argc == 2 ? strtol(argv[0], &end, 10) : 0;
    int used = argc == 2 ? parse_address(argv[1], &target, &target_len) : -1;
    if (argc != 2 || *end || port <= 0 || port > 65535 || used < 0 || argv[1][used]) {
        fprintf(stderr, "usage: cubicle-agent --relay PORT TARGET-ADDRESS:PORT\n");
        return 2;
    }
    int listener = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), off = 0, one = 1;
    struct sockaddr_in6 any = { .sin6_family = AF_INET6, .sin6_port = htons((unsigned short)port), .sin6_addr = IN6ADDR_ANY_INIT };
    if (listener >= 0)
        setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);   /* IPv4 too */
    if (listener < 0 || setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(listener, (struct sockaddr *)&any, sizeof any) != 0 || listen(listener, 64) != 0) {
        fprintf(stderr, "cubicle-agent --relay: cannot listen on port %ld: %s\n", port, strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    for (;;) {
        reap();
        struct pollfd pfd[2] = { { listener, POLLIN, 0 }, { STDIN_FILENO, POLLIN, 0 } };
        if (poll(pfd, 2, 1000) < 0) {   /* a second at most between reaps */
            if (errno == EINTR)
                continue;
            return 1;
        }
        if (pfd[1].revents) {
            char c;
            if (read(STDIN_FILENO, &c, 1) <= 0)
                return 0;   /* the server is gone */
        }
        if (!(pfd[0].revents & POLLIN))
            continue;
        struct sockaddr_in6 peer;
        socklen_t peer_len = sizeof peer;
        int client = accept4(listener, (struct sockaddr *)&peer, &peer_len, SOCK_CLOEXEC);
        if (client < 0)
            continue;
        reap();
        if (child_count >= MOST_CHILDREN || from_peer(&peer.sin6_addr) >= PER_PEER) {
            close(client);
            continue;
        }
        /* One process per connection: a sandbox's agent holds one for its life. */
        pid_t pid = fork();
        if (pid > 0)
            children[child_count++] = (struct child){ pid, peer.sin6_addr };
        if (pid == 0) {
            close(listener);
            int server = socket(target.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (server >= 0 && connect(server, (struct sockaddr *)&target, target_len) == 0) {
                setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                splice_both(client, server);
            }
            _exit(0);
        }
        close(client);
    }
}
