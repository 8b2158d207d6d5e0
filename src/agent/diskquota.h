/*
 * The workspace's disk quota, where no kernel holds one.  A tmpfs workspace
 * has its size and inode count capped by the kernel; a workspace on disk (a
 * persistent sandbox's named volume) has no cap at all (no project quotas on
 * Docker's volumes), so the agent holds it: `--disk-limit BYTES:FILES`.
 *
 * Usage is a walk of the agent's working directory (the container's
 * WorkingDir, /workspace): see usage.h.  A walk that stopped early (more
 * names than the limit, or nested too deep) counts as over.
 *
 * A walk costs 0.5 to 2.5 microseconds per name, so it runs only when something
 * may have changed the workspace: the sandbox user's processes wrote to disk
 * (the write_bytes of their threads grew) or spent CPU time (making empty files
 * writes nothing), counted since the last walk, with what ended runs did
 * (their rusage) on top.  While programs run a cheap check of those counters
 * comes every 1 to 50 ms, sooner the closer the estimate (the last walk plus
 * the bytes written since) is to the limit, as memory.h does; an estimate
 * past the limit walks at once, anything else at most every
 * DISKQUOTA_WALK_GAP_MS or ten times the last walk's duration.  Past either
 * limit the process of the sandbox user that wrote the most since the last
 * walk (for the file count with no writer, the one that spent the most CPU)
 * is killed, one at a time, until usage is back under or no such process is
 * left; the execution it belonged to says so in its EXIT.  Nothing is
 * deleted: the workspace stays over until the user deletes files, and while
 * it is over a new run is refused (diskquota_refusal), but for `rm`.
 *
 * Not seen until the next walk: files the server writes itself (uploads go
 * through the engine's archive API, as root) and blocks allocated without a
 * write (fallocate): the next run is refused then.
 */
#ifndef CUBICLE_AGENT_DISKQUOTA_H
#define CUBICLE_AGENT_DISKQUOTA_H

#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#define DISKQUOTA_WALK_GAP_MS 100

/* Parses "BYTES:FILES" (both > 0); -1 if malformed. */
int diskquota_parse(const char *arg, uint64_t *bytes, uint64_t *files);

/* Holds the directory `dir` to `bytes` and `files` from now on (0: no watch). */
void diskquota_init(const char *dir, uint64_t bytes, uint64_t files);

/* Microseconds (monotonic) at which the next check is due, or -1 when none
 * is.  The caller checks only while an execution is live. */
int64_t diskquota_due_us(int64_t now_us);

/* Checks now.  Returns the session of the process it killed for the quota
 * (an execution's, when the writer was one of its processes), or 0. */
pid_t diskquota_check(int64_t now_us);

/* What an ended execution did (its main process and the children it
 * waited for), counted as activity since the last walk. */
void diskquota_run_ended(const struct rusage *ru);

/* NULL when a run of argv may start; else why not (a static string): the
 * workspace is over its quota and argv is no `rm`. */
const char *diskquota_refusal(char *const *argv);

/* How many processes it killed since the agent started. */
unsigned diskquota_kills(void);

#endif
