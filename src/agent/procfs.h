/* Reading a process's files in /proc, from the mount's descriptor (paths.h). */
#ifndef CUBICLE_AGENT_PROCFS_H
#define CUBICLE_AGENT_PROCFS_H

#include <stddef.h>
#include <sys/types.h>

/* Reads /proc/PID/NAME into buf as a string; -1 if the process is gone. */
int read_proc(pid_t pid, const char *name, char *buf, size_t size);

/* Session and state of a process from /proc; -1 if it is gone. */
int proc_session(pid_t pid, pid_t *sid, char *state);

#endif
