/*
 * `rm -rf -- PATH...`, built into the agent: expired saved outputs go without
 * starting a shell and rm (two programs loaded through the image's layers, and
 * a /proc sweep when they end).  It runs in a forked child of the agent, as
 * the sandbox user, with a RUN's pipes, timeout and output cap.
 */
#ifndef CUBICLE_AGENT_REMOVE_H
#define CUBICLE_AGENT_REMOVE_H

/* argv: CUBICLE_BUILTIN_REMOVE PATH...: removes each PATH and everything
 * below it, never following a symlink; a missing PATH is not an error.
 * Says on stderr what it could not remove; returns 1 then, else 0. */
int remove_main(int argc, char **argv);

#endif
