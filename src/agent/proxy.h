/* cubicle-agent --proxy: the sandboxes' egress proxy (proxy.c). */
#ifndef CUBICLE_AGENT_PROXY_H
#define CUBICLE_AGENT_PROXY_H

/* Runs the proxy; args are PORT [ALLOW ...] (argv after "--proxy").
 * Returns the process exit status: 2 for bad arguments, 1 if it cannot
 * listen.  Otherwise it runs until its stdin reaches EOF. */
int proxy_main(int argc, char **argv);

#endif
