/* Recycling a throwaway sandbox (the RESET frame, protocol.h): bring the
 * container back to the state it had when the agent started, then check
 * that it is.  Only for `cubicle-agent --sandbox` as the container's main
 * process and never as root: the wipe deletes files in every writable mount,
 * which on a host would be a disaster (the host-side tests run the agent as
 * root).  The processes are ended by agent.c's uid-wide sweep before
 * reset_wipe runs. */
#ifndef CUBICLE_AGENT_RESET_H
#define CUBICLE_AGENT_RESET_H

#include <stddef.h>
#include <sys/types.h>

/* Records the pristine state: the writable mounts and every entry in them,
 * the cgroup's limit counters and memory.  Called once, at start, in
 * sandbox mode only. */
void reset_snapshot(void);

/* NULL when this agent may reset its container, else why not. */
const char *reset_refusal(int sandbox_mode);

/* Removes System V IPC objects and every file, directory and POSIX queue
 * the snapshot does not hold.  Processes must be dead by then. */
void reset_wipe(void);

/* Writes what differs from the snapshot into report (NUL-terminated): an
 * empty string when the container is pristine.  keep (> 0: the zygote,
 * started after the snapshot) may remain, and so may the memory it maps.
 * reap collects dead children of ours: as a subreaper (zygote.h) the agent,
 * not init, inherits the orphans the sweep killed. */
void reset_verify(char *report, size_t size, pid_t keep, void (*reap)(void));

#endif
