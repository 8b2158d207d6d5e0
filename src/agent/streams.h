/* Streams: byte relays between the server and a port on the sandbox's own
 * loopback (port previews; frames CONNECT, DATA, SHUT, WINDOW, CONNECTED in
 * protocol.h).  The agent dials 127.0.0.1 only, from the sandbox's network
 * namespace, as the sandbox user: a preview reaches what a program of the
 * sandbox could reach on its loopback, and nothing else.
 *
 * Single-threaded like the rest of the agent: the main loop adds each
 * stream's socket to its poll set and services it; frames go out through
 * the function given to streams_init (the agent's one writer). */
#ifndef CUBICLE_AGENT_STREAMS_H
#define CUBICLE_AGENT_STREAMS_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

struct stream;
typedef void (*stream_send_fn)(uint8_t type, uint32_t id, const void *data, size_t len);

/* Whether an execution already uses the id (a stream may not take it). */
typedef int (*stream_id_taken_fn)(uint32_t id);

void streams_init(stream_send_fn send, stream_id_taken_fn taken);
/* CONNECT, DATA, SHUT or WINDOW from the server. */
void streams_handle(uint8_t type, uint32_t id, const unsigned char *payload, size_t len);
/* Whether id names a live stream (an execution may not take it). */
int streams_has(uint32_t id);
size_t streams_count(void);
/* Adds each stream's socket with the events it waits for; returns the new n.
 * owners[i] receives the stream polled at pfd[i]. */
size_t streams_add_fds(struct pollfd *pfd, struct stream **owners, size_t n);
void streams_service(struct stream *s, short revents);
/* Frees the streams that ended (after a poll pass: the owners stay valid until then). */
void streams_reap(void);
/* Closes every stream, telling the server (RESET). */
void streams_close_all(const char *why);

#endif
