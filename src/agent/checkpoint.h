/*
 * Checkpoints of a live interpreter (checkpoint_session / restore_checkpoint).
 *
 * The interpreter makes them itself, between cells: the Python driver
 * (sandbox/languages.cpp) forks, and the copy leaves the live one's session
 * (setsid), blocks SIGUSR2 and stops itself with SIGSTOP.  A parked copy
 * shares the live one's memory copy-on-write, so it costs its page tables
 * only; it runs nothing while parked and keeps the OPEN execution's pipes
 * (cells, stdout, stderr, control), which it needs to go live again.  Its
 * environment (/proc/PID/environ, copied by the fork) still carries the
 * execution's CUBICLE_RUN marker: the agent's sweep spares it while that
 * execution lives and kills it when the execution ends, so a checkpoint
 * never outlives its interpreter, the sandbox's reset or the agent.
 *
 * RESTORE "EXEC PID": PID must be a stopped session leader of our uid marked
 * with execution EXEC, which must be a live OPEN execution.  The agent kills
 * the execution's current process and its session, reaps it (its parked
 * copies, orphaned, come to the agent: a child subreaper), makes PID the
 * execution's process and wakes it with SIGUSR2 then SIGCONT.  The copy,
 * seeing SIGUSR2 pending, knows it was restored (a bare SIGCONT parks it
 * again), forks a fresh parked copy of itself so that the checkpoint stays
 * usable, and reports on its control pipe like after a cell.
 *
 * DROP "EXEC PID": the same check, then SIGKILL.
 */
#ifndef CUBICLE_AGENT_CHECKPOINT_H
#define CUBICLE_AGENT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Parses "EXEC PID"; NULL, or why it is malformed. */
const char *checkpoint_parse(const char *payload, size_t len, uint32_t *exec_id, pid_t *pid);

/* NULL when pid is a parked copy of execution exec_id's interpreter, else
 * why it is not (gone, running, another's). */
const char *checkpoint_refusal(pid_t pid, uint32_t exec_id);

/* Wakes a parked copy as the live interpreter. */
void checkpoint_wake(pid_t pid);

#endif
