/* The workspace's disk quota: see diskquota.h. */
#include "diskquota.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"
#include "usage.h"
#include "procfs.h"
#include "wire.h"
#include "zygote.h"

#define MIB (1024 * 1024)
/* As in memory.c: a millisecond per this much room left under the limit
 * (1 to MAX_INTERVAL_MS), so the last check before the limit comes a
 * millisecond before it under any steady writer. */
#define ROOM_PER_MS (16 * MIB)
#define MAX_INTERVAL_MS 50
#define OVER_INTERVAL_MS 10
/* CPU time the sandbox user's processes may spend without a walk: making
 * empty files writes nothing, but costs ~10 us each. */
#define CPU_PER_WALK_US 20000

/* ---- the sandbox user's processes ------------------------------------ */

/* What one process did so far, and at the last walk. */
struct tracked {
    pid_t pid;
    unsigned long long start;   /* tells a reused pid */
    uint64_t written, cpu_us;
    uint64_t written_base, cpu_base;
    int seen;
};

static struct tracked *procs;
static size_t nprocs, procs_cap;
static uint64_t departed_written, departed_cpu_us;   /* of processes gone since the last walk */
static long ticks_per_s;

static uint64_t tv_us(struct timeval tv) { return (uint64_t)tv.tv_sec * 1000000 + (uint64_t)tv.tv_usec; }

/* Start time and CPU time (µs) from /proc/PID/stat; -1 if gone or a zombie. */
static int proc_times(pid_t pid, unsigned long long *start, uint64_t *cpu_us)
{
    char buf[1024];
    char state;
    unsigned long utime, stime;
    unsigned long long starttime;

    if (read_proc(pid, "stat", buf, sizeof buf) < 0)
        return -1;
    char *p = strrchr(buf, ')');
    /* after comm: state ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime cutime cstime priority nice threads
     * itrealvalue starttime */
    if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d %llu",
                     &state, &utime, &stime, &starttime) != 4 || state == 'Z' || state == 'X')
        return -1;
    *start = starttime;
    *cpu_us = (uint64_t)(utime + stime) * 1000000 / (uint64_t)ticks_per_s;
    return 0;
}

/* What a process's threads wrote (write_bytes of each /proc/PID/task/TID/io),
 * 0 when it cannot be read.  Not /proc/PID/io: it adds what the process's
 * reaped children wrote, and would make a shell the writer of its dd. */
static uint64_t proc_written(pid_t pid)
{
    char path[64], name[64], buf[512];
    unsigned long long v;
    uint64_t sum = 0;
    struct dirent *de;
    char *p;

    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir_at(path);
    if (!d)
        return 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        snprintf(name, sizeof name, "task/%.20s/io", de->d_name);
        if (read_proc(pid, name, buf, sizeof buf) == 0 && (p = strstr(buf, "\nwrite_bytes:")) &&
            sscanf(p + 13, "%llu", &v) == 1)
            sum += v;
    }
    closedir(d);
    return sum;
}

/* The entry of a process; a new one starts from zero: it was not alive at
 * the last walk, which comes right after a scan. */
static struct tracked *track(pid_t pid, unsigned long long start)
{
    for (size_t i = 0; i < nprocs; i++)
        if (procs[i].pid == pid && procs[i].start == start)
            return &procs[i];
    if (nprocs == procs_cap) {
        size_t cap = procs_cap ? 2 * procs_cap : 64;
        struct tracked *more = realloc(procs, cap * sizeof *more);
        if (!more)
            return NULL;
        procs = more;
        procs_cap = cap;
    }
    struct tracked *t = &procs[nprocs++];
    *t = (struct tracked){ .pid = pid, .start = start };
    return t;
}

/* Reads every process of our uid but us and the zygote; forgets the gone,
 * keeping what they did since the last walk. */
static void scan(void)
{
    DIR *d = opendir_at("/proc");
    struct dirent *de;
    pid_t self = getpid(), zygote = zygote_pid();
    uid_t me = getuid();

    if (!d)
        return;
    for (size_t i = 0; i < nprocs; i++)
        procs[i].seen = 0;
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        struct stat st;
        unsigned long long start;
        uint64_t cpu_us;
        if (*end || pid <= 1 || pid == self || pid == zygote ||
            fstatat(dirfd(d), de->d_name, &st, 0) < 0 || st.st_uid != me ||
            proc_times((pid_t)pid, &start, &cpu_us) < 0)
            continue;
        struct tracked *t = track((pid_t)pid, start);
        if (!t)
            continue;
        t->seen = 1;
        t->cpu_us = cpu_us;
        uint64_t written = proc_written((pid_t)pid);
        if (written > t->written)   /* unreadable reads 0: keep the last */
            t->written = written;
    }
    closedir(d);
    size_t kept = 0;
    for (size_t i = 0; i < nprocs; i++) {
        if (procs[i].seen) {
            procs[kept++] = procs[i];
            continue;
        }
        departed_written += procs[i].written - procs[i].written_base;
        departed_cpu_us += procs[i].cpu_us - procs[i].cpu_base;
    }
    nprocs = kept;
}

/* Bytes written and CPU time spent since the last walk. */
static void activity(uint64_t *written, uint64_t *cpu_us)
{
    *written = departed_written;
    *cpu_us = departed_cpu_us;
    for (size_t i = 0; i < nprocs; i++) {
        *written += procs[i].written - procs[i].written_base;
        *cpu_us += procs[i].cpu_us - procs[i].cpu_base;
    }
}

/* ---- the watch ------------------------------------------------------- */

static const char *dir;
static uint64_t limit_bytes, limit_files;
static int64_t due_us = -1;
static uint64_t used_bytes, used_files;   /* at the last walk */
static int over, walked;                  /* over either limit at the last walk; a walk was made */
static int64_t walked_us, walk_cost_us;   /* when the last walk ended, what it took */
static pid_t victim;
static unsigned kills;

static int64_t monotonic_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int diskquota_parse(const char *arg, uint64_t *bytes, uint64_t *files)
{
    char num[24];
    const char *colon = strchr(arg, ':');

    if (!colon || (size_t)(colon - arg) >= sizeof num)
        return -1;
    memcpy(num, arg, (size_t)(colon - arg));
    num[colon - arg] = '\0';
    if (wire_parse_u64(num, bytes) || wire_parse_u64(colon + 1, files) || !*bytes || !*files)
        return -1;
    return 0;
}

void diskquota_init(const char *watched, uint64_t bytes, uint64_t files)
{
    dir = watched;
    limit_bytes = bytes;
    limit_files = files;
    due_us = bytes && files ? 0 : -1;
    ticks_per_s = sysconf(_SC_CLK_TCK);
    if (ticks_per_s <= 0)
        ticks_per_s = 100;
}

unsigned diskquota_kills(void) { return kills; }

int64_t diskquota_due_us(int64_t now_us)
{
    /* As memory.c: after a pause without programs, the first check comes a
     * millisecond in. */
    if (due_us >= 0 && due_us + 1000 * MAX_INTERVAL_MS < now_us)
        due_us = now_us + 1000;
    return due_us;
}

void diskquota_run_ended(const struct rusage *ru)
{
    if (!limit_bytes)
        return;
    departed_written += (uint64_t)ru->ru_oublock * 512;
    departed_cpu_us += tv_us(ru->ru_utime) + tv_us(ru->ru_stime);
}

/* Walks now; what the processes did so far becomes the new baseline. */
static void walk(void)
{
    int64_t start = monotonic_us();
    int stopped = workspace_usage(dir, limit_files, &used_bytes, &used_files);
    walked_us = monotonic_us();
    walk_cost_us = walked_us - start;
    walked = 1;
    if (stopped < 0)   /* no workspace to hold (never so in a container of ours) */
        fprintf(stderr, "cubicle-agent: cannot walk the workspace: %s\n", strerror(errno));
    /* Nested too deep, or more names than the limit: over, either way. */
    over = stopped > 0 || used_bytes > limit_bytes || used_files > limit_files;
    if (stopped > 0 && used_files <= limit_files)
        used_files = limit_files + 1;
    for (size_t i = 0; i < nprocs; i++) {
        procs[i].written_base = procs[i].written;
        procs[i].cpu_base = procs[i].cpu_us;
    }
    departed_written = departed_cpu_us = 0;
}

/* Does what happened since the last walk call for one now? */
static int walk_due(int64_t now, uint64_t written, uint64_t cpu_us)
{
    if (!walked)
        return 1;
    if (!written && cpu_us < CPU_PER_WALK_US && !(over && cpu_us))
        return 0;
    if (written && (over || used_bytes + written > limit_bytes))
        return 1;   /* perhaps past the limit, or writing while past it: find out now */
    int64_t gap = 10 * walk_cost_us > 1000 * DISKQUOTA_WALK_GAP_MS ? 10 * walk_cost_us : 1000 * DISKQUOTA_WALK_GAP_MS;
    return now - walked_us >= gap;
}

/* Who to stop if the walk finds the workspace over: the process that wrote
 * the most since the last walk; past the file count with nobody writing, the
 * one that spent the most CPU time (making empty files writes nothing). */
struct suspects { pid_t writer, spender; };

static struct suspects suspects(void)
{
    struct suspects s = { 0, 0 };
    uint64_t wrote = 0, spent = 0;

    for (size_t i = 0; i < nprocs; i++) {
        if (procs[i].written - procs[i].written_base > wrote) {
            wrote = procs[i].written - procs[i].written_base;
            s.writer = procs[i].pid;
        }
        if (procs[i].cpu_us - procs[i].cpu_base > spent) {
            spent = procs[i].cpu_us - procs[i].cpu_base;
            s.spender = procs[i].pid;
        }
    }
    return s;
}

static int gone(pid_t pid)
{
    unsigned long long start;
    uint64_t cpu;
    return proc_times(pid, &start, &cpu) < 0;
}

/* "the workspace holds ... over its quota of ...", from the last walk. */
static const char *describe_usage(char *buf, size_t size)
{
    snprintf(buf, size, "the workspace holds %llu MiB in %s%llu files, over its quota of %llu MiB and %llu files",
             (unsigned long long)((used_bytes + MIB - 1) / MIB), used_files > limit_files ? "more than " : "",
             (unsigned long long)(used_files > limit_files ? limit_files : used_files),
             (unsigned long long)(limit_bytes / MIB), (unsigned long long)limit_files);
    return buf;
}

pid_t diskquota_check(int64_t now_us)
{
    uint64_t written, cpu_us;

    if (!limit_bytes)
        return 0;
    scan();
    activity(&written, &cpu_us);
    uint64_t estimate = used_bytes + written;
    uint64_t room = estimate < limit_bytes ? limit_bytes - estimate : 0;
    /* Over already, new runs are refused: a check every OVER_INTERVAL_MS
     * stops what was running should it write. */
    int64_t interval_ms = over ? OVER_INTERVAL_MS : (int64_t)(room / ROOM_PER_MS);
    due_us = now_us + 1000 * (interval_ms < 1 ? 1 : interval_ms > MAX_INTERVAL_MS ? MAX_INTERVAL_MS : interval_ms);
    /* One kill at a time: a process's last writes may land as it dies. */
    if (victim > 0 && !gone(victim))
        return 0;
    victim = 0;
    if (!walk_due(now_us, written, cpu_us))
        return 0;
    /* Chosen on what they did since the walk before this one. */
    struct suspects who = suspects();
    walk();
    if (!over)
        return 0;
    pid_t pid = who.writer > 0 || used_files <= limit_files ? who.writer : who.spender;
    pid_t session = 0;
    char state;
    if (pid <= 0 || proc_session(pid, &session, &state) < 0 || kill(pid, SIGKILL) < 0)
        return 0;   /* nobody is writing: the next run is refused until files go */
    victim = pid;
    kills++;
    char what[160];
    fprintf(stderr, "cubicle-agent: %s: killed process %d\n", describe_usage(what, sizeof what), (int)pid);
    return session;
}

/* `rm ...`, run directly or as a plain `sh -c 'rm ...'`: it deletes and
 * writes nothing, so it may run while the workspace is over. */
static int deletes_only(char *const *argv)
{
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (strcmp(base, "rm") == 0)
        return 1;
    if ((strcmp(base, "sh") != 0 && strcmp(base, "bash") != 0) || !argv[1] || strcmp(argv[1], "-c") != 0 || !argv[2] ||
        argv[3])
        return 0;
    const char *script = argv[2] + strspn(argv[2], " \t");
    return strncmp(script, "rm ", 3) == 0 && !script[strcspn(script, ";&|<>`$()\n\\{}")];
}

const char *diskquota_refusal(char *const *argv)
{
    static char why[512];
    uint64_t written, cpu_us;

    if (!limit_bytes)
        return NULL;
    scan();
    activity(&written, &cpu_us);
    if (over || walk_due(monotonic_us(), written, cpu_us))   /* over: files may have gone since */
        walk();
    if (!over || deletes_only(argv))
        return NULL;
    char what[160];
    snprintf(why, sizeof why,
             "%s: delete files to get back under (rm runs while it is over: run_command {\"command\": \"rm -r PATH ...\"})",
             describe_usage(what, sizeof what));
    return why;
}
