/*
 * The zygote: a pre-started interpreter (its program is the server's, sent in
 * a ZYGOTE frame; cubicle's is the Python one in sandbox/languages.cpp) that
 * forks a clean child for each FORK run, so that a fresh process starts with
 * the heavy modules already imported.  The zygote itself never runs a
 * program's code, and each run is a new child of it.
 *
 * The zygote runs as the sandbox user in a session of its own, with its
 * stdin /dev/null, its stdout and stderr the agent's stderr (diagnostics),
 * and fd 3 a unix stream socket to the agent.  Over that socket:
 *
 *   zygote -> agent: one byte 'R' once it is ready to fork.
 *   agent -> zygote: per run, u32 BE length, then "CWD\0ARGC\0ARGV...\0ENVC\0
 *     KEY=VALUE...\0" (the RUN payload's fields, without its numbers and
 *     stdin), with four fds attached by SCM_RIGHTS to its first byte: the
 *     run's stdin (read end), stdout and stderr (write ends) and a report pipe.
 *
 * The zygote forks twice, so that the run's process is orphaned to the agent
 * (a child subreaper) and the agent waits for it like for any child of its
 * own.  The run's process starts a session, takes the fds as 0-2 and writes
 * "PID STATUS\n" to the report pipe before it runs anything: STATUS 0 means
 * it runs; anything else that it cannot run the request exactly like exec
 * would (an option or environment the interpreter was not started with,
 * a missing cwd, ...): it exits and the agent execs the request instead.
 * Whatever goes wrong with the zygote ends in that fallback, never in a
 * failed run; a zygote that died is started again at the next FORK (given
 * up only after a few that died before they were ready).
 */
#ifndef CUBICLE_AGENT_ZYGOTE_H
#define CUBICLE_AGENT_ZYGOTE_H

#include <stddef.h>
#include <sys/types.h>

#include "wire.h"

/* ZYGOTE: keep this request (a RUN payload) as the zygote's program and
 * (re)start it.  Returns NULL or why the payload is unusable. */
const char *zygote_configure(const char *payload, size_t len);

/* Starts a run through the zygote with the given stdin/stdout/stderr ends.
 * Returns the run's pid (its session), or 0 when the request must be exec'd
 * instead (no zygote, not ready yet, refused, or failed). */
pid_t zygote_fork(const struct run_req *r, int in_r, int out_w, int err_w);

/* The zygote's pid, or 0: its session is the agent's to spare. */
pid_t zygote_pid(void);

/* A child of the agent that no execution owns was reaped. */
void zygote_reaped(pid_t pid);

/* Ends the zygote (the agent is exiting). */
void zygote_stop(void);

#endif
