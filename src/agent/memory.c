/* The program's memory limit: see memory.h. */
#include "memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cgroup.h"
#include "paths.h"
#include "procfs.h"
#include "zygote.h"

#define MIB (1024 * 1024)
/* The next check comes after a millisecond per this much room left under the
 * limit (at least one, at most MAX_INTERVAL_MS): the room left shrinks
 * geometrically under any steady leak, so the last check before the limit is
 * a millisecond before it. */
#define ROOM_PER_MS (16 * MIB)
#define MAX_INTERVAL_MS 50
/* How long a killed process may take to free its memory before the next kill
 * (a reused pid must not hold the limit off for longer). */
#define VICTIM_WAIT_US (1000 * 1000)

static uint64_t limit;
static int from_cgroup;   /* the cgroup's anonymous memory, else the processes' sum */
static int64_t due_us = -1;
static pid_t victim;      /* killed for the limit and not gone yet */
static int64_t victim_killed_us;
static long page_size;
static unsigned kills;

void memory_init(uint64_t bytes)
{
    limit = bytes;
    due_us = bytes ? 0 : -1;
    page_size = sysconf(_SC_PAGESIZE);
    /* A cgroup without a limit is not the container's (gVisor's view, or a
     * host's): its counters would be the whole machine's. */
    uint64_t anon;
    from_cgroup = cgroup_memory_limit() != 0 && cgroup_read_key(cgroup_files()->memory_stat, cgroup_files()->anon, &anon) == 0;
}

int64_t memory_due_us(int64_t now_us)
{
    /* Checks stop while nothing runs: the first after a pause comes a
     * millisecond in, so that a run shorter than that costs no check. */
    if (due_us >= 0 && due_us + 1000 * MAX_INTERVAL_MS < now_us)
        due_us = now_us + 1000;
    return due_us;
}

unsigned memory_kills(void) { return kills; }

/* A process's resident anonymous pages in bytes (statm: resident less shared,
 * the latter being its file and shmem pages); 0 when it is gone or a zombie. */
static uint64_t process_anon(pid_t pid)
{
    char buf[256];
    unsigned long size, resident, shared;

    if (read_proc(pid, "statm", buf, sizeof buf) < 0 ||
        sscanf(buf, "%lu %lu %lu", &size, &resident, &shared) != 3 || resident < shared)
        return 0;
    return (uint64_t)(resident - shared) * (uint64_t)page_size;
}

/* Calls fn for every process of our uid but us and the zygote. */
static void each_program_process(void (*fn)(pid_t pid, uint64_t anon, void *arg), void *arg)
{
    DIR *d = opendir_at("/proc");
    struct dirent *de;
    pid_t self = getpid(), zygote = zygote_pid();
    uid_t me = getuid();

    if (!d)
        return;
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        struct stat st;
        if (*end || pid <= 1 || pid == self || pid == zygote ||
            fstatat(dirfd(d), de->d_name, &st, 0) < 0 || st.st_uid != me)
            continue;
        fn((pid_t)pid, process_anon((pid_t)pid), arg);
    }
    closedir(d);
}

static void add_anon(pid_t pid, uint64_t anon, void *sum)
{
    (void)pid;
    *(uint64_t *)sum += anon;
}

/* What the programs hold, in bytes. */
static uint64_t programs_memory(void)
{
    uint64_t anon = 0;

    if (!from_cgroup) {
        each_program_process(add_anon, &anon);
        return anon;
    }
    if (cgroup_read_key(cgroup_files()->memory_stat, cgroup_files()->anon, &anon) < 0)
        return 0;
    uint64_t ours = process_anon(getpid()) + (zygote_pid() > 0 ? process_anon(zygote_pid()) : 0);
    return anon > ours ? anon - ours : 0;
}

/* Whether a killed process may still be freeing its memory: /proc shows it
 * holding none as soon as the kernel has detached its memory, but the pages are
 * freed after that, and only a zombie (or a reaped process) is done with them. */
static int still_dying(pid_t pid)
{
    pid_t sid;
    char state = 0;
    return proc_session(pid, &sid, &state) == 0 && state != 'Z' && state != 'X';
}

struct largest { pid_t pid; uint64_t anon; int parked; };

/* A stopped process -- a parked checkpoint (checkpoint.h), or a program
 * stopped on purpose -- goes before a running one: losing an undo point
 * costs less than losing the live interpreter. */
static int stopped(pid_t pid)
{
    pid_t sid;
    char state = 0;
    return proc_session(pid, &sid, &state) == 0 && state == 'T';
}

static void keep_largest(pid_t pid, uint64_t anon, void *arg)
{
    struct largest *l = arg;
    if (!anon)
        return;
    int parked = stopped(pid);
    if (parked > l->parked || (parked == l->parked && anon > l->anon))
        *l = (struct largest){ pid, anon, parked };
}

pid_t memory_check(int64_t now_us)
{
    if (!limit)
        return 0;
    uint64_t used = programs_memory();
    uint64_t room = used < limit ? limit - used : 0;
    int64_t interval_ms = (int64_t)(room / ROOM_PER_MS);
    due_us = now_us + 1000 * (interval_ms < 1 ? 1 : interval_ms > MAX_INTERVAL_MS ? MAX_INTERVAL_MS : interval_ms);
    if (used <= limit)
        return 0;
    /* One kill at a time: the next only once the last victim's memory is freed
     * (a parked copy killed first must not take the live interpreter with it). */
    if (victim > 0 && now_us < victim_killed_us + VICTIM_WAIT_US && still_dying(victim))
        return 0;
    struct largest l = { 0, 0, 0 };
    each_program_process(keep_largest, &l);
    victim = l.pid;
    pid_t session = 0;
    char state;
    if (victim > 0)
        proc_session(victim, &session, &state);
    if (victim <= 0 || kill(victim, SIGKILL) < 0) {
        /* Nothing of ours to kill (the memory is other users' in a shared
         * container): the hard ceiling holds them; look again later. */
        due_us = now_us + 1000 * MAX_INTERVAL_MS;
        return 0;
    }
    kills++;
    victim_killed_us = now_us;
    fprintf(stderr, "cubicle-agent: the programs held %llu MiB, over their limit of %llu MiB: killed process %d\n",
            (unsigned long long)(used / MIB), (unsigned long long)(limit / MIB), (int)victim);
    return session;
}
