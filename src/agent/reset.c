/* Recycling a throwaway sandbox: see reset.h.
 *
 * Pristine means "as at the agent's start": every writable mount (from
 * /proc/self/mountinfo, pseudo file systems aside) is walked once and each
 * entry recorded by path with its inode, type, owner and, for everything but
 * directories, size and ctime (ctime cannot be set back by a program, so an
 * edited file never passes for the original).  The wipe removes whatever is
 * not in that record; the verification walks again and also looks at
 * processes, System V IPC and the cgroup (no OOM kill, no pids-limit hit,
 * memory back near the start).  A file the sandbox changed but cannot be
 * restored makes verification fail, and the server then removes the
 * container: failing is always safe, only slower. */
#include "reset.h"
#include "cgroup.h"
#include "memory.h"
#include "paths.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENTRIES 20000       /* a bigger pristine state is not recycled */
#define MAX_MOUNTS  64
#define MAX_DEPTH   128         /* deeper trees are left, so verification fails */
#define MEMORY_SLACK (8u << 20) /* anon + shmem may exceed the start by this much */

struct entry {
    char *path;
    dev_t dev;
    ino_t ino;
    mode_t mode;
    uid_t uid;
    off_t size;
    struct timespec ctime;
    int seen;
};

struct cgroup_state {
    int ok;                 /* the files below could be read */
    uint64_t oom_kills;     /* OOM events and kills */
    uint64_t pids_max;      /* fork refused at the pids limit */
    uint64_t memory;        /* anon + shmem bytes */
};

static struct entry *entries;
static size_t n_entries;
static char *mounts[MAX_MOUNTS];
static size_t n_mounts;
static const char *snapshot_failure;   /* why nothing can be recycled */
static int snapshot_taken;             /* without it nothing may be wiped */
static struct cgroup_state baseline;

/* ---- the report ------------------------------------------------------- */

struct report { char *buf; size_t size, len; int items; };

static void note(struct report *r, const char *fmt, ...)
{
    if (r->items++ >= 8) {   /* enough to act on; the rest is elided */
        if (r->items == 9 && r->len + 5 < r->size)
            r->len += (size_t)snprintf(r->buf + r->len, r->size - r->len, "; ...");
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    if (r->len && r->len + 2 < r->size)
        r->len += (size_t)snprintf(r->buf + r->len, r->size - r->len, "; ");
    if (r->len < r->size) {
        int n = vsnprintf(r->buf + r->len, r->size - r->len, fmt, ap);
        if (n > 0)
            r->len += (size_t)n < r->size - r->len ? (size_t)n : r->size - r->len - 1;
    }
    va_end(ap);
}

/* ---- writable mounts -------------------------------------------------- */

static int pseudo_fs(const char *type, const char *point)
{
    static const char *const skip[] = { "proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs",
                                        "debugfs", "tracefs", "bpf", "pstore", "configfs", "fusectl", NULL };
    for (const char *const *s = skip; *s; s++)
        if (strcmp(type, *s) == 0)
            return 1;
    return strncmp(point, "/proc", 5) == 0 || strncmp(point, "/sys", 4) == 0;
}

struct writable { void (*fn)(const char *point, void *arg); void *arg; };

static void if_writable(const char *point, const char *options, const char *type, void *arg)
{
    struct writable *w = arg;
    if (strncmp(options, "rw", 2) == 0 && (options[2] == '\0' || options[2] == ',') && !pseudo_fs(type, point))
        w->fn(point, w->arg);
}

/* Calls fn for the mount point of every writable, non-pseudo mount.
 * Returns -1 when mountinfo cannot be read. */
static int each_writable_mount(void (*fn)(const char *point, void *arg), void *arg)
{
    struct writable w = { fn, arg };
    return mounts_each(if_writable, &w);
}

/* ---- walking a mount ---------------------------------------------------- */

static int by_path(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->path, ((const struct entry *)b)->path);
}

static struct entry *find_entry(const char *path)
{
    struct entry key = { .path = (char *)path };
    return n_entries ? bsearch(&key, entries, n_entries, sizeof *entries, by_path) : NULL;
}

/* Does st still match the recorded entry? */
static int unchanged(const struct entry *e, const struct stat *st)
{
    if (e->dev != st->st_dev || e->ino != st->st_ino || e->mode != st->st_mode || e->uid != st->st_uid)
        return 0;
    if (S_ISDIR(st->st_mode))   /* its times change with its entries */
        return 1;
    return e->size == st->st_size && e->ctime.tv_sec == st->st_ctim.tv_sec && e->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

enum walk_mode { W_RECORD, W_WIPE, W_VERIFY };

struct walk {
    enum walk_mode mode;
    struct report *report;
    size_t cap;   /* entries' capacity while recording */
};

static void visit(struct walk *w, const char *path, const struct stat *st)
{
    if (w->mode == W_RECORD) {
        if (n_entries == MAX_ENTRIES) {
            snapshot_failure = "too many files in the writable places to recycle";
            return;
        }
        if (n_entries == w->cap) {
            size_t cap = w->cap ? 2 * w->cap : 256;
            struct entry *grown = realloc(entries, cap * sizeof *entries);
            if (!grown) {
                snapshot_failure = "out of memory recording the pristine state";
                return;
            }
            entries = grown;
            w->cap = cap;
        }
        char *copy = strdup(path);
        if (!copy) {
            snapshot_failure = "out of memory recording the pristine state";
            return;
        }
        entries[n_entries++] = (struct entry){ copy, st->st_dev, st->st_ino, st->st_mode, st->st_uid,
                                               st->st_size, st->st_ctim, 0 };
    } else if (w->mode == W_VERIFY) {
        struct entry *e = find_entry(path);
        if (!e)
            note(w->report, "left behind: %s", path);
        else if (!unchanged(e, st))
            note(w->report, "changed: %s", path);
        else
            e->seen = 1;
    }
}

/* Walks directory dfd (whose path is path), staying on device dev. */
static void walk_dir(struct walk *w, int dfd, char *path, size_t len, dev_t dev, int depth)
{
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *de;

    if (!d) {
        if (fd >= 0)
            close(fd);
        if (w->mode == W_VERIFY)
            note(w->report, "unreadable: %s", path);
        else if (w->mode == W_RECORD)
            snapshot_failure = "a writable directory cannot be read";
        return;
    }
    while ((de = readdir(d))) {
        struct stat st;
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        size_t nlen = strlen(name);
        if (len + 1 + nlen >= PATH_MAX) {
            if (w->mode == W_VERIFY)
                note(w->report, "path too long under %s", path);
            continue;
        }
        path[len] = '/';
        memcpy(path + len + 1, name, nlen + 1);
        size_t sub = len + 1 + nlen;
        if (len == 1 && path[0] == '/') {   /* the root mount: "/name", not "//name" */
            memmove(path + 1, path + 2, nlen + 1);
            sub = 1 + nlen;
        }
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_dev != dev) {
            path[len] = 0;
            continue;   /* gone, or another mount: walked as a mount of its own */
        }
        struct entry *pristine = w->mode == W_WIPE ? find_entry(path) : NULL;
        int keep = pristine && unchanged(pristine, &st);
        if (S_ISDIR(st.st_mode)) {
            /* A directory the sandbox locked itself out of is still its own. */
            if (w->mode == W_WIPE && !keep && st.st_uid == getuid() && fchmodat(dfd, name, 0700, 0) < 0) {
                /* what cannot be opened stays, and the verification reports it */
            }
            int sub_fd = depth < MAX_DEPTH ? openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
            visit(w, path, &st);
            if (sub_fd >= 0) {
                walk_dir(w, sub_fd, path, sub, dev, depth + 1);
                close(sub_fd);
            } else if (w->mode == W_VERIFY) {
                note(w->report, "cannot enter: %s", path);
            }
            if (w->mode == W_WIPE && !pristine)
                unlinkat(dfd, name, AT_REMOVEDIR);
        } else {
            visit(w, path, &st);
            if (w->mode == W_WIPE && !keep)
                unlinkat(dfd, name, 0);
        }
        path[len] = 0;
    }
    closedir(d);
}

static void walk_mount(const char *point, void *arg)
{
    struct walk *w = arg;
    char path[PATH_MAX];
    struct stat st;

    if (w->mode == W_RECORD) {
        if (n_mounts == MAX_MOUNTS) {
            snapshot_failure = "too many writable mounts to recycle";
            return;
        }
        mounts[n_mounts++] = strdup(point);
    } else if (w->mode == W_VERIFY) {
        int known = 0;
        for (size_t i = 0; i < n_mounts; i++)
            known |= mounts[i] && strcmp(mounts[i], point) == 0;
        if (!known)
            note(w->report, "a new writable mount: %s", point);
    }
    const char *rest;
    int at = path_at(point, &rest);
    if (fstatat(at, rest, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return;
    snprintf(path, sizeof path, "%s", point);
    visit(w, path, &st);
    if (!S_ISDIR(st.st_mode))
        return;   /* a file mounted on its own (/etc/hosts): nothing inside */
    int fd = openat(at, rest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    walk_dir(w, fd, path, strlen(path), st.st_dev, 0);
    close(fd);
}

/* ---- System V IPC ------------------------------------------------------ */

/* Calls fn with the id (second column) of every object in /proc/sysvipc/name. */
static void each_ipc(const char *name, void (*fn)(const char *name, int id, void *arg), void *arg)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/sysvipc/%s", name);
    FILE *f = fopen_at(path);
    if (!f)
        return;
    if (fgets(line, sizeof line, f)) {   /* the header */
        int id;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "%*d %d", &id) == 1)
                fn(name, id, arg);
    }
    fclose(f);
}

static void remove_ipc(const char *name, int id, void *arg)
{
    (void)arg;
    if (strcmp(name, "shm") == 0)
        shmctl(id, IPC_RMID, NULL);
    else if (strcmp(name, "msg") == 0)
        msgctl(id, IPC_RMID, NULL);
    else
        semctl(id, 0, IPC_RMID);
}

static void report_ipc(const char *name, int id, void *arg)
{
    note(arg, "System V %s object %d", name, id);
}

/* ---- processes ---------------------------------------------------------- */

/* Every process but init, us and `keep`; zombies not yet reaped count. */
static int other_processes(struct report *r, pid_t keep)
{
    DIR *d = opendir_at("/proc");
    struct dirent *de;
    long self = (long)getpid();
    int found = 0;

    if (!d) {
        if (r)
            note(r, "cannot read /proc");
        return -1;
    }
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 1 || pid == self || (keep > 0 && pid == keep))
            continue;
        found++;
        if (r)
            note(r, "process %ld", pid);
    }
    closedir(d);
    return found;
}

/* ---- the cgroup --------------------------------------------------------- */

static struct cgroup_state read_cgroup(void)
{
    const struct cgroup_files *f = cgroup_files();
    struct cgroup_state s = { 0 };
    uint64_t kills = 0, ooms = 0, anon = 0, shmem = 0;

    s.ok = cgroup_read_key(f->memory_events, f->oom_kill, &kills) == 0 &&
           cgroup_read_key(f->memory_events, f->oom, &ooms) == 0 &&
           cgroup_read_key(f->pids_events, "max", &s.pids_max) == 0 &&
           cgroup_read_key(f->memory_stat, f->anon, &anon) == 0 &&
           cgroup_read_key(f->memory_stat, "shmem", &shmem) == 0;
    s.oom_kills = kills + ooms;
    s.memory = anon + shmem;
    return s;
}

/* ---- the interface ------------------------------------------------------ */

void reset_snapshot(void)
{
    struct walk w = { W_RECORD, NULL, 0 };

    if (getuid() == 0)
        return;
    snapshot_taken = 1;
    baseline = read_cgroup();
    if (!baseline.ok)
        snapshot_failure = "the cgroup's counters cannot be read";
    if (each_writable_mount(walk_mount, &w) < 0)
        snapshot_failure = "cannot read /proc/self/mountinfo";
    if (n_entries)
        qsort(entries, n_entries, sizeof *entries, by_path);
}

const char *reset_refusal(int sandbox_mode)
{
    if (!sandbox_mode || getuid() == 0)
        return "reset needs `cubicle-agent --sandbox` running as a non-root uid";
    /* The container's main process (under its init, or init itself): an agent
     * started by docker exec shares the container with others (workspaces). */
    if (getpid() != 1 && getppid() != 1)
        return "reset is only for the container's main agent";
    if (!snapshot_taken)
        return "no pristine state was recorded";
    return snapshot_failure;
}

void reset_wipe(void)
{
    struct walk w = { W_WIPE, NULL, 0 };

    if (!snapshot_taken || snapshot_failure || getuid() == 0)   /* checked again: see reset.h */
        return;
    each_ipc("shm", remove_ipc, NULL);
    each_ipc("msg", remove_ipc, NULL);
    each_ipc("sem", remove_ipc, NULL);
    /* twice: a directory read while entries were removed may hide a few */
    each_writable_mount(walk_mount, &w);
    each_writable_mount(walk_mount, &w);
}

/* The anonymous and shared memory a process maps (its RssAnon + RssShmem). */
static uint64_t process_memory(pid_t pid)
{
    char path[64], line[128];
    unsigned long long kib;
    uint64_t total = 0;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if (!(f = fopen_at(path)))
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %llu", &kib) == 1 || sscanf(line, "RssShmem: %llu", &kib) == 1)
            total += (uint64_t)kib << 10;
    fclose(f);
    return total;
}

void reset_verify(char *buf, size_t size, pid_t keep, void (*reap)(void))
{
    static const struct timespec pause = { 0, 1000000 };
    struct report r = { buf, size, 0, 0 };
    struct walk w = { W_VERIFY, &r, 0 };

    buf[0] = 0;
    /* Orphans killed by the sweep are reaped by init or by us, a moment later. */
    for (int i = 0; i < 200; i++) {
        reap();
        if (other_processes(NULL, keep) <= 0)
            break;
        nanosleep(&pause, NULL);
    }
    other_processes(&r, keep);
    each_ipc("shm", report_ipc, &r);
    each_ipc("msg", report_ipc, &r);
    each_ipc("sem", report_ipc, &r);

    for (size_t i = 0; i < n_entries; i++)
        entries[i].seen = 0;
    if (each_writable_mount(walk_mount, &w) < 0)
        note(&r, "cannot read /proc/self/mountinfo");
    for (size_t i = 0; i < n_entries; i++)
        if (!entries[i].seen)
            note(&r, "missing: %s", entries[i].path);

    struct cgroup_state now = read_cgroup();
    if (!now.ok)
        note(&r, "the cgroup's counters cannot be read");
    else {
        if (now.oom_kills != baseline.oom_kills)
            note(&r, "the memory limit was hit (OOM)");
        if (memory_kills())
            note(&r, "the programs' memory limit was hit");
        if (now.pids_max != baseline.pids_max)
            note(&r, "the process limit was hit");
        /* the zygote started after the snapshot; it keeps its memory */
        uint64_t kept = keep > 0 ? process_memory(keep) : 0;
        if (now.memory > baseline.memory + kept + MEMORY_SLACK)
            note(&r, "memory in use: %llu KiB (at start: %llu KiB)", (unsigned long long)(now.memory >> 10),
                 (unsigned long long)(baseline.memory >> 10));
    }
}
