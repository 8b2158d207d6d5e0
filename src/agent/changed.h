/*
 * The changed-files listing, built into the agent: what
 *   find ROOT -xdev \( -path ROOT/.cubicle -o -name node_modules -o -name .git
 *        -o -name __pycache__ -o -name .venv \) -prune -o -type f
 *        -newermt @SINCE -printf '%P\0' | head -z -n MAX
 * prints, without starting a shell, find and head after every run (three
 * programs, each also costing the agent a /proc sweep when it ends: most of
 * a stateful call's time in the sandbox).  It runs in a forked child of the
 * agent, as the sandbox user, with a RUN's pipes, timeout and output cap.
 */
#ifndef CUBICLE_AGENT_CHANGED_H
#define CUBICLE_AGENT_CHANGED_H

/* argv: CUBICLE_BUILTIN_CHANGED_FILES ROOT SINCE MAX: ROOT an absolute path
 * without a trailing slash, SINCE in seconds since the epoch (a fraction
 * allowed).  Writes the names to stdout; returns the
 * exit code (2 for bad arguments). */
int changed_files_main(int argc, char **argv);

#endif
