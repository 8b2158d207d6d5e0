/* The egress proxy's TLS termination for hosts that carry a sandbox's secrets
 * (proxy.c, proxy_secrets.h).
 *
 * A CONNECT to such a host is not tunnelled: a thread of its own first opens
 * TLS to the host, verified against the trust store the server sent ("trust"
 * commands: the certificates the machine running cubicle trusts, and a test's
 * CA when the server was told to add one) with the host's name or address
 * checked; then answers the CONNECT and speaks TLS to the sandbox with a
 * certificate for the host signed by the sandbox's own CA ("ca" command; its
 * key never leaves the server and the proxy).  Between the two it passes
 * HTTP/1.1 requests (keep-alive: each request's head gets the sandbox's
 * secrets, bodies by Content-Length or chunked pass through) and the
 * responses as they come.  ALPN offers and accepts http/1.1 only.
 *
 * Commands on the proxy's stdin:
 *   trust PEMHEX                 a certificate the upstream may chain to
 *   ca CLIENT CERTHEX KEYHEX     the CA of the sandbox at CLIENT (replaces its old one)
 *   unca CLIENT                  the sandbox is gone */
#ifndef CUBICLE_AGENT_PROXY_TLS_H
#define CUBICLE_AGENT_PROXY_TLS_H

#include <stdint.h>

/* A "trust", "ca" or "unca" line: 0, or -1 if it is none or malformed. */
int tls_command(const char *line);

/* What a terminated connection did, handed back to the main loop. */
struct tls_outcome {
    int slot;                  /* the caller's connection */
    uint64_t out, in;          /* plaintext bytes each way */
    int requests;              /* request heads passed */
    char secrets[256], placeholders[256];   /* comma-separated names (proxy_secrets.h) */
    char error[160];           /* why it failed, or "" */
};

/* Takes over a connection whose CONNECT to host:port is answered by the
 * thread (cfd: the sandbox, ufd: the host, connected).  When the thread is
 * done it writes a struct tls_outcome * to notify_fd; the caller frees it
 * and closes both sockets.  Returns 0, or -1 (nothing started). */
int tls_start(int slot, int cfd, int ufd, const char *client, const char *host, int port, int notify_fd);

#endif
