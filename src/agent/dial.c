#include "dial.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "address.h"
#include "protocol.h"

#define DIAL_TIMEOUT_MS 10000
#define PIN_SIZE 64   /* hex SHA-256 */
#define RELAY_BUFFER 16384   /* a TLS record */
/* The relay starts with the first sandbox: its agent may dial before it listens. */
#define REFUSED_RETRIES 20
#define REFUSED_PAUSE_US 50000   /* 20 x 50 ms: a second */

struct target {
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char pin[PIN_SIZE + 1];
    char token[CUBICLE_DIAL_TOKEN_SIZE + 1];
};

static int fail(const char *what)
{
    unsigned long code = ERR_get_error();
    char reason[256] = "";
    if (code)
        ERR_error_string_n(code, reason, sizeof reason);
    fprintf(stderr, "cubicle-agent: dialing home: %s%s%s; using the attach stream\n", what, code ? ": " : "", reason);
    return -1;
}

/* "ADDRESS:PORT PIN TOKEN", ADDRESS an IPv4 one or an IPv6 one in brackets. */
static int parse(const char *spec, struct target *t)
{
    char pin[PIN_SIZE + 2], token[CUBICLE_DIAL_TOKEN_SIZE + 2];
    int used = parse_address(spec, &t->addr, &t->addr_len);
    if (used < 0 || spec[used] != ' ' || sscanf(spec + used, " %65s %33s", pin, token) != 2 || strlen(pin) != PIN_SIZE ||
        strlen(token) != CUBICLE_DIAL_TOKEN_SIZE)
        return -1;
    memcpy(t->pin, pin, sizeof t->pin);
    memcpy(t->token, token, sizeof t->token);
    return 0;
}

/* Does the server's key hash to the pin? */
static int pinned(SSL *ssl, const char *pin)
{
    X509 *cert = SSL_get1_peer_certificate(ssl);
    unsigned char *der = NULL, digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    int len = cert ? i2d_PUBKEY(X509_get0_pubkey(cert), &der) : -1;
    int ok = len > 0 && EVP_Digest(der, (size_t)len, digest, &digest_len, EVP_sha256(), NULL) == 1 && digest_len * 2 == PIN_SIZE;
    char hex[PIN_SIZE + 1];
    for (unsigned int i = 0; ok && i < digest_len; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    ok = ok && memcmp(hex, pin, PIN_SIZE) == 0;
    OPENSSL_free(der);
    X509_free(cert);
    return ok;
}

struct link {
    SSL *ssl;
    int tls_fd, pair_fd;
};

/* After an SSL call that did not complete (r): adds what it waits for to *events,
 * or -1 when the connection is over. */
static int tls_wants(SSL *ssl, int r, short *events)
{
    int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        *events |= POLLIN;
    else if (e == SSL_ERROR_WANT_WRITE)
        *events |= POLLOUT;
    else
        return -1;
    return 0;
}

/* One thread moves bytes both ways, non-blocking, so that neither direction
 * waits on the other (an SSL object must not be used by two threads). */
static void *relay(void *arg)
{
    struct link *l = arg;
    static unsigned char up[RELAY_BUFFER], down[RELAY_BUFFER];
    size_t up_len = 0, up_off = 0, down_len = 0, down_off = 0;

    for (;;) {
        int progress = 0;
        short tls_events = 0, pair_events = 0;
        size_t n;

        if (down_len == 0) {   /* server -> agent */
            int r = SSL_read_ex(l->ssl, down, sizeof down, &n);
            if (r == 1) {
                down_len = n;
                down_off = 0;
                progress = 1;
            } else if (tls_wants(l->ssl, r, &tls_events) < 0) {
                break;   /* the server closed, or the connection broke */
            }
        }
        if (down_len > 0) {
            ssize_t w = write(l->pair_fd, down + down_off, down_len - down_off);
            if (w > 0) {
                down_off += (size_t)w;
                if (down_off == down_len)
                    down_len = 0;
                progress = 1;
            } else if (errno == EAGAIN) {
                pair_events |= POLLOUT;
            } else if (errno == EINTR) {
                progress = 1;   /* again */
            } else {
                break;
            }
        }
        if (up_len == 0) {   /* agent -> server */
            ssize_t r = read(l->pair_fd, up, sizeof up);
            if (r > 0) {
                up_len = (size_t)r;
                up_off = 0;
                progress = 1;
            } else if (r == 0) {
                break;
            } else if (errno == EAGAIN) {
                pair_events |= POLLIN;
            } else if (errno == EINTR) {
                progress = 1;
            } else {
                break;
            }
        }
        if (up_len > 0) {
            int r = SSL_write_ex(l->ssl, up + up_off, up_len - up_off, &n);
            if (r == 1) {
                up_off += n;
                if (up_off == up_len)
                    up_len = 0;
                progress = 1;
            } else if (tls_wants(l->ssl, r, &tls_events) < 0) {
                break;
            }
        }
        if (progress)
            continue;
        struct pollfd pfd[2] = { { l->tls_fd, tls_events, 0 }, { l->pair_fd, pair_events, 0 } };
        if (poll(pfd, 2, -1) < 0 && errno != EINTR)
            break;
    }
    /* The agent reads the end of its input, as when the server closes a socket. */
    shutdown(l->pair_fd, SHUT_RDWR);
    close(l->tls_fd);
    return NULL;
}

static int set_timeouts(int fd, int ms)
{
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) | setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* A connected socket, or -1 (said on stderr). */
static int connect_tcp(const struct target *t)
{
    for (int attempt = 0;; attempt++) {
        int fd = socket(t->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return fail("no socket");
        set_timeouts(fd, DIAL_TIMEOUT_MS);   /* bounds connect, the handshake and the token */
        int one = 1;   /* frames are small and answered at once: no Nagle wait for an ACK */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, (const struct sockaddr *)&t->addr, t->addr_len) == 0)
            return fd;
        int error = errno;
        close(fd);
        if (error != ECONNREFUSED || attempt >= REFUSED_RETRIES) {
            fprintf(stderr, "cubicle-agent: dialing home: %s; using the attach stream\n", strerror(error));
            return -1;
        }
        usleep(REFUSED_PAUSE_US);
    }
}

static int connect_tls(const struct target *t)
{
    int fd = connect_tcp(t);
    if (fd < 0)
        return -1;
    /* The image's openssl.cnf is none of the agent's business (it could name modules to load). */
    OPENSSL_init_ssl(OPENSSL_INIT_NO_LOAD_CONFIG, NULL);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL *ssl = ctx ? SSL_new(ctx) : NULL;
    SSL_CTX_free(ctx);   /* the SSL holds its own reference */
    if (!ssl || SSL_set_min_proto_version(ssl, TLS1_3_VERSION) != 1 || SSL_set_fd(ssl, fd) != 1) {
        close(fd);
        SSL_free(ssl);
        return fail("cannot set up TLS");
    }
    /* No CA: the pin alone says whose key it is. */
    SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
    SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    const char *failure = NULL;
    char line[CUBICLE_DIAL_TOKEN_SIZE + 1];
    memcpy(line, t->token, CUBICLE_DIAL_TOKEN_SIZE);
    line[CUBICLE_DIAL_TOKEN_SIZE] = '\n';
    size_t sent = 0;
    if (SSL_connect(ssl) != 1)
        failure = "TLS handshake failed";
    else if (!pinned(ssl, t->pin))
        failure = "the server's key does not match its pin";
    else if (SSL_write_ex(ssl, line, sizeof line, &sent) != 1 || sent != sizeof line)
        failure = "cannot send the token";
    char answer = 0;
    size_t got = 0;
    /* One byte, so that nothing of what follows is read here. */
    if (!failure && (SSL_read_ex(ssl, &answer, 1, &got) != 1 || answer != CUBICLE_DIAL_ACCEPTED))
        failure = "the server refused the token";
    int pair[2] = { -1, -1 };
    if (!failure && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        failure = "no socketpair";
    struct link *l = failure ? NULL : malloc(sizeof *l);
    if (!failure && !l)
        failure = "out of memory";
    if (!failure) {
        *l = (struct link){ ssl, fd, pair[1] };
        set_timeouts(fd, 0);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        fcntl(pair[1], F_SETFL, fcntl(pair[1], F_GETFL) | O_NONBLOCK);
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attr, relay, l) != 0)
            failure = "cannot start the relay thread";
        pthread_attr_destroy(&attr);
    }
    if (failure) {
        free(l);
        if (pair[0] >= 0) {
            close(pair[0]);
            close(pair[1]);
        }
        SSL_free(ssl);
        close(fd);
        return fail(failure);
    }
    return pair[0];
}

int dial_home(void)
{
    char *spec = getenv(CUBICLE_AGENT_DIAL);
    if (!spec || !*spec) {
        unsetenv(CUBICLE_AGENT_DIAL);
        return -1;
    }
    struct target t;
    int bad = parse(spec, &t);
    /* The value lives in the block /proc/PID/environ reads: wipe it there too. */
    memset(spec, 0, strlen(spec));
    unsetenv(CUBICLE_AGENT_DIAL);
    if (bad) {
        fprintf(stderr, "cubicle-agent: %s is malformed; using the attach stream\n", CUBICLE_AGENT_DIAL);
        return -1;
    }
    int fd = connect_tls(&t);
    memset(t.token, 0, sizeof t.token);
    return fd;
}
