/* The container's cgroup: see cgroup.h. */
#include "cgroup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "paths.h"

static const struct cgroup_files cgroup_v2 = {
    "/sys/fs/cgroup/memory.events", "oom_kill", "oom", "/sys/fs/cgroup/pids.events",
    "/sys/fs/cgroup/memory.stat", "anon", "/sys/fs/cgroup/memory.max",
};
static const struct cgroup_files cgroup_v1 = {
    "/sys/fs/cgroup/memory/memory.oom_control", "oom_kill", "under_oom", "/sys/fs/cgroup/pids/pids.events",
    "/sys/fs/cgroup/memory/memory.stat", "rss", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
};

const struct cgroup_files *cgroup_files(void)
{
    return access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0 ? &cgroup_v2 : &cgroup_v1;
}

int cgroup_read_key(const char *path, const char *key, uint64_t *value)
{
    FILE *f = fopen_at(path);
    char name[64];
    unsigned long long v;

    *value = 0;
    if (!f)
        return -1;
    while (fscanf(f, "%63s %llu", name, &v) == 2)
        if (strcmp(name, key) == 0)
            *value = v;
    fclose(f);
    return 0;
}

/* v1 spells "no limit" as the largest page-aligned number, v2 as "max". */
#define NO_LIMIT_FROM (1ULL << 60)

uint64_t cgroup_memory_limit(void)
{
    FILE *f = fopen_at(cgroup_files()->memory_limit);
    unsigned long long v = 0;

    if (!f)
        return 0;
    if (fscanf(f, "%llu", &v) != 1 || v >= NO_LIMIT_FROM)
        v = 0;
    fclose(f);
    return v;
}
