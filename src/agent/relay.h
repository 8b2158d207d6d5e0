/* cubicle-agent --relay: the only peer of sandboxes whose agents dial home
 * (protocol.h, CUBICLE_AGENT_DIAL).  Each such sandbox is alone on a network
 * of its own with this relay, which forwards every connection, bytes only
 * (TLS runs end to end between the agent and the server), to the server's
 * endpoint: so nothing else answers the sandbox, not even the host.  A few
 * connections at once per address (PER_PEER): a sandbox's programs cannot
 * take the relay's processes from the other sandboxes' agents. */
#ifndef CUBICLE_AGENT_RELAY_H
#define CUBICLE_AGENT_RELAY_H

/* args: PORT TARGET-ADDRESS:PORT (argv after "--relay"; an IPv6 target in
 * brackets).  Returns the exit status: 2 for bad arguments, 1 if it cannot
 * listen.  Otherwise it runs until its stdin reaches EOF (the server left). */
int relay_main(int argc, char **argv);

#endif
