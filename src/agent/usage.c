/* The workspace's usage, as the disk quota counts it: see usage.h. */
#include "usage.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "paths.h"
#include "wire.h"

/* Inodes with more than one link already counted in this walk. */
struct inode_set { ino_t *slots; size_t cap, used; };

static int inode_set_add(struct inode_set *s, ino_t ino)
{
    if (2 * (s->used + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        ino_t *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return 1;   /* counted again: an overestimate, never an escape */
        for (size_t i = 0; i < s->cap; i++)
            for (size_t j = s->slots[i] % cap; s->slots[i]; j = (j + 1) % cap)
                if (!slots[j]) {
                    slots[j] = s->slots[i];
                    break;
                }
        free(s->slots);
        s->slots = slots;
        s->cap = cap;
    }
    if (!ino)   /* 0 marks a free slot; no file system hands it out */
        return 1;
    for (size_t j = ino % s->cap; ; j = (j + 1) % s->cap) {
        if (s->slots[j] == ino)
            return 0;
        if (!s->slots[j]) {
            s->slots[j] = ino;
            s->used++;
            return 1;
        }
    }
}

struct walk {
    dev_t dev;
    uint64_t bytes, files, max_files;
    int stopped;   /* too many names, or nested too deep */
    struct inode_set links;
};

/* Opens a subdirectory; one the user made unreadable is opened all the same
 * (we are its owner) and its mode put back. */
static int open_subdir(int parent, const char *name, const struct stat *st)
{
    int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = openat(parent, name, flags);
    if (fd >= 0 || errno != EACCES || fchmodat(parent, name, st->st_mode | S_IRUSR | S_IXUSR, 0) < 0)
        return fd;
    fd = openat(parent, name, flags);
    if (fchmodat(parent, name, st->st_mode & 07777, 0) < 0) { /* gone meanwhile */ }
    return fd;
}

static void walk_dir(int fd, int depth, struct walk *w)
{
    DIR *d = fdopendir(fd);
    struct dirent *de;

    if (!d) {
        close(fd);
        return;
    }
    while (!w->stopped && (de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        if (++w->files > w->max_files) {
            w->stopped = 1;
            break;
        }
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_dev != w->dev)
            continue;   /* gone meanwhile, or another mount's */
        if (S_ISDIR(st.st_mode)) {
            w->bytes += (uint64_t)st.st_blocks * 512;
            if (depth + 1 >= USAGE_DEPTH) {
                w->stopped = 1;
                break;
            }
            int sub = open_subdir(dirfd(d), de->d_name, &st);
            if (sub >= 0)
                walk_dir(sub, depth + 1, w);
        } else if (st.st_nlink <= 1 || inode_set_add(&w->links, st.st_ino)) {
            w->bytes += (uint64_t)st.st_blocks * 512;
        }
    }
    closedir(d);
}

int workspace_usage(const char *dir, uint64_t max_files, uint64_t *bytes, uint64_t *files)
{
    struct walk w = { .max_files = max_files };
    struct stat st;
    int fd = open_at(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);

    if (fd < 0 || fstat(fd, &st) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    w.dev = st.st_dev;
    walk_dir(fd, 0, &w);
    free(w.links.slots);
    *bytes = w.bytes;
    *files = w.files;
    return w.stopped;
}

int disk_usage_main(int argc, char **argv)
{
    uint64_t max_files = UINT64_MAX, bytes, files;

    if (argc < 2 || argc > 3 || (argc == 3 && wire_parse_u64(argv[2], &max_files))) {
        fprintf(stderr, "usage: %s DIR [MAX_FILES]\n", argv[0]);
        return 2;
    }
    int stopped = workspace_usage(argv[1], max_files, &bytes, &files);
    if (stopped < 0) {
        fprintf(stderr, "cannot open %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    printf("%llu %llu %d\n", (unsigned long long)bytes, (unsigned long long)files, stopped);
    return fflush(stdout) == 0 ? 0 : 1;   /* the builtin ends in _exit */
}
