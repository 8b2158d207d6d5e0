/* The egress proxy's reports to the server (proxy.c): one JSON object per
 * line on stdout, the ledger of what each sandbox connection reached.
 *
 *   {"event":"connection","client":C,"host":H,"port":P,"allowed":B,
 *    ["refused":WHY,]["error":WHY,]["approved":"once"|"sandbox",]
 *    ["secret":[NAME,...],]["placeholder":[NAME,...],]
 *    "requests":N,"bytes_out":N,"bytes_in":N}
 *   {"event":"sync","id":N}
 *   {"event":"ask","id":N,"client":C,"host":H,"port":P}   (egress approvals)
 *
 * A connection's counts are deltas since its previous record (requests is 1
 * in its first record, 0 after), so the server adds them up.  A record holds
 * the client's address and the requested host and port, never anything else
 * the client sent.  Lines are queued here and written when stdout takes them;
 * a server that stops reading loses records, never the proxy's progress.
 * Connection records wait up to BATCH_MS to go out together (one wakeup of
 * the server for many connections); sync and ask records go at once. */
#ifndef CUBICLE_AGENT_PROXY_REPORT_H
#define CUBICLE_AGENT_PROXY_REPORT_H

#include <stdint.h>

struct report_counts {
    int requests;
    uint64_t bytes_out, bytes_in;
};

/* Queues a connection record; refused (allowed == 0), error and approved
 * (how the user allowed it) may be NULL.  secrets (put into the request) and
 * placeholders (a secret's placeholder sent unchanged to a host not the
 * secret's) are comma-separated names, or NULL or empty. */
void report_connection(const char *client, const char *host, int port, int allowed,
                       const char *refused, const char *error, const char *approved,
                       const char *secrets, const char *placeholders, struct report_counts delta);

/* Queues a question to the server: may this client reach host:port? */
void report_ask(uint64_t id, const char *client, const char *host, int port);

/* Queues a sync marker: every record queued before it is on its way. */
void report_sync(uint64_t id);

/* Lines are waiting for stdout and should be written by now_ms (a time on
 * the caller's monotonic clock): returns when they are due, or -1 if none. */
int64_t report_due(int64_t now_ms);

/* Writes what stdout takes now (nonblocking); -1 once stdout is gone. */
int report_flush(int fd);

#endif
