/* The agent dials home (protocol.h, CUBICLE_AGENT_DIAL): a TLS connection to
 * the server, whose key must have the pin it was given, carrying the one-time
 * token first, then the wire protocol. */
#ifndef CUBICLE_AGENT_DIAL_H
#define CUBICLE_AGENT_DIAL_H

/* Removes CUBICLE_AGENT_DIAL from the agent's environment and wipes its value
 * in the agent's own block (what /proc/AGENT-PID/environ shows), so that no
 * program it starts inherits it; then, when it was set, connects. The
 * container's init still shows the value in /proc/1/environ: the token is spent
 * before any program runs, and the server takes each token once. Returns a
 * descriptor for frames both ways (one end of a socketpair that a thread
 * relays through TLS), or -1 when the variable was not set or the connection
 * failed (said on stderr): the attach stream serves. */
int dial_home(void);

#endif
