/* The agent's side of the wire protocol (protocol.h): frame headers and the
 * RUN/OPEN payload.  Pure functions on buffers, kept apart from agent.c so
 * that hostile input can be fuzzed without starting processes. */
#ifndef CUBICLE_AGENT_WIRE_H
#define CUBICLE_AGENT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

struct frame_header {
    uint32_t len;   /* payload length */
    uint8_t type;
    uint32_t id;
};

/* How a frame goes out (the agent has one writer). */
typedef void (*wire_send_fn)(uint8_t type, uint32_t id, const void *data, size_t len);

/* Sends an ERROR frame for `id` through `send`: the text printf-style, cut at 1 KiB. */
void wire_send_error(wire_send_fn send, uint32_t id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Encodes a header into out[CUBICLE_FRAME_HEADER_SIZE]. */
void wire_put_header(unsigned char *out, uint8_t type, uint32_t id, size_t len);

/* Decodes the header at p, which holds at least CUBICLE_FRAME_HEADER_SIZE
 * bytes.  Returns 0, or -1 if its payload exceeds CUBICLE_FRAME_MAX_PAYLOAD
 * (the stream cannot be resynchronised then: h is still filled in). */
int wire_get_header(const unsigned char *p, struct frame_header *h);

/* A parsed RUN/OPEN payload; its strings point into the payload (which
 * must outlive it). */
struct run_req {
    uint64_t timeout_ms, cap;
    char *cwd;
    char **argv, **env;   /* NULL-terminated, owned: wire_free_run */
    size_t envc;
    const char *in;       /* stdin bytes */
    size_t in_len;
};

/* Returns NULL on success or a description of what is malformed.  Call
 * wire_free_run afterwards either way. */
const char *wire_parse_run(char *payload, size_t len, struct run_req *r);
/* A NUL-terminated decimal number (as in RUN, SAVE and SIGNAL payloads); 0 on success. */
int wire_parse_u64(const char *s, uint64_t *out);
void wire_free_run(struct run_req *r);
/* A decimal number of `len` bytes, not NUL-terminated (CONNECT's port, WINDOW's
 * credit), at most `max`; 0 on success. */
int wire_parse_decimal(const unsigned char *p, size_t len, uint64_t max, uint64_t *out);

#endif
