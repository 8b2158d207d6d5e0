/*
 * The program's memory limit.  A sandbox's files live in memory too (its
 * workspace and /tmp are tmpfs, charged to the container's cgroup), so the
 * container's own limit is only the hard ceiling that protects the host:
 * programs + files + the sandbox's own processes.  What a user asked for with
 * memory_mb is held here instead: the agent watches the memory the programs
 * hold themselves -- anonymous memory, the cgroup's `anon` (v2) or `rss` (v1),
 * less the agent's and the zygote's own -- and when it passes the limit kills
 * the largest process of the sandbox user, as the kernel's OOM killer would.
 * Files, shared memory and the page cache of read-only files never count.
 * A parked checkpoint (checkpoint.h) counts for the pages it no longer shares
 * with the live interpreter (the cgroup charges a shared page once), and a
 * stopped process like it is killed before any running one.
 *
 * Where the cgroup cannot be read or is not the container's (gVisor shows
 * none), the sum of the sandbox user's processes' resident anonymous pages
 * stands in for it: pages a fork shares with its parent then count twice.
 *
 * The check runs only while an execution is live, more often the closer the
 * programs are to the limit (every millisecond within 16 MiB of it), so a
 * program allocating even several MiB per millisecond is stopped within a
 * few MiB of the limit.
 */
#ifndef CUBICLE_AGENT_MEMORY_H
#define CUBICLE_AGENT_MEMORY_H

#include <stdint.h>
#include <sys/types.h>

/* Holds the programs to `limit` bytes from now on; 0 = no watch. */
void memory_init(uint64_t limit);

/* Microseconds (monotonic) at which the next check is due, or -1 when none
 * is (no limit).  The caller checks only while an execution is live. */
int64_t memory_due_us(int64_t now_us);

/* Checks now (`now_us` monotonic).  Returns the session of the process it
 * killed for the limit (an execution's, when the program or one of its
 * children was the largest), or 0. */
pid_t memory_check(int64_t now_us);

/* How many processes it killed since the agent started. */
unsigned memory_kills(void);

#endif
