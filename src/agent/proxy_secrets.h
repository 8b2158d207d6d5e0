/* Secrets the egress proxy puts into sandboxes' requests (proxy.c).
 *
 * The server sends, per sandbox (by its client address) and secret, on the
 * proxy's stdin (never in its environment or command line):
 *
 *   secret CLIENT NAME PLACEHOLDER HOSTS header|query KEYHEX VALUEHEX FILLEDHEX
 *   unsecret CLIENT          (the sandbox is gone: forget all of its secrets)
 *   unsecret CLIENT NAME     (forget that one: a re-read file no longer gives it)
 *
 * A "secret" line for a CLIENT and NAME the proxy holds replaces it.
 *
 * HOSTS is a comma-separated list of HOST or HOST:PORT; KEY is the header or
 * query parameter name, VALUE the secret's value, FILLED the header's value
 * (the operator's template with the value in it) or, for a query parameter,
 * the value again.  The hex fields keep spaces and odd bytes off the line.
 *
 * On a request to one of the secret's hosts, the placeholder becomes the
 * value only inside the value of the declared header (or query parameter),
 * and a request that has no such header (or query parameter) gets one.
 * Anywhere else (the path, another header: hosts echo those in error pages),
 * and to any other host, the placeholder goes out unchanged; the ledger says so. */
#ifndef CUBICLE_AGENT_PROXY_SECRETS_H
#define CUBICLE_AGENT_PROXY_SECRETS_H

#include <stddef.h>

/* A "secret" or "unsecret" line (without its newline): 0, or -1 if it is
 * not one or is malformed (nothing is changed then). */
int secrets_command(const char *line);

/* Does any secret of client go to host:port over TLS?  (Such HTTPS connections are
 * terminated by the proxy rather than tunnelled.) */
int secrets_for(const char *client, const char *host, int port);

/* Rewrites a request head of *len bytes (request line, headers, empty line)
 * in place, in a buffer of cap bytes, for a request from client to
 * host:port (tls: inside TLS the proxy terminates, else plain HTTP; a HOST
 * listed without a port is HTTPS on 443 only).  injected and flagged receive comma-separated names: secrets
 * put in, and secrets whose placeholder went out unchanged (another host,
 * or outside the declared header or query parameter).
 * Returns 0, or -1 if the head would not fit (it is left unchanged). */
int secrets_rewrite(const char *client, const char *host, int port, int tls, char *head, size_t *len,
                    size_t cap, char *injected, size_t icap, char *flagged, size_t fcap);

#endif
