/*
 * The container's cgroup as its processes see it (Docker and Podman mount the
 * container's own at /sys/fs/cgroup): where each counter lives under cgroup v2
 * and under v1, whose names differ while their meaning does not.
 */
#ifndef CUBICLE_AGENT_CGROUP_H
#define CUBICLE_AGENT_CGROUP_H

#include <stdint.h>

struct cgroup_files {
    const char *memory_events, *oom_kill, *oom;   /* OOM kills and OOM events */
    const char *pids_events;                      /* its "max": pids-limit hits */
    const char *memory_stat, *anon;               /* anonymous memory's key in memory_stat */
    const char *memory_limit;                     /* the limit in bytes ("max": none) */
};

/* The files of the cgroup version this container has. */
const struct cgroup_files *cgroup_files(void);

/* The value of `key` in a "key value" file; 0 when absent, -1 if unreadable. */
int cgroup_read_key(const char *path, const char *key, uint64_t *value);

/* The memory limit in bytes; 0 when there is none or it cannot be read. */
uint64_t cgroup_memory_limit(void);

#endif
