/*
 * Paths that do not start at "/".  On fuse-overlayfs (Docker's storage
 * driver on hosts without native overlay) a lookup that starts at the image's
 * root costs a non-root process a round trip to the fuse daemon: the kernel
 * fetches the root directory's ACL every time (20,000 stats of /tmp as the
 * sandbox user: 388 ms, 230 ms of them in fuse-overlayfs; from a descriptor
 * of /tmp: 38 ms).  The agent opens every mount point once, at its start, and
 * resolves what lies below one from there: its per-call /proc reads, saved
 * output, working directories and builtins never touch the image's layers.
 */
#ifndef CUBICLE_AGENT_PATHS_H
#define CUBICLE_AGENT_PATHS_H

#include <dirent.h>
#include <stdio.h>
#include <sys/types.h>

/* Calls fn for every mount in /proc/self/mountinfo: its mount point
 * (unescaped), mount options ("rw,nosuid,...") and file system type.
 * Returns -1 when mountinfo cannot be read. */
int mounts_each(void (*fn)(const char *point, const char *options, const char *type, void *arg), void *arg);

/* Opens each mount point that is a directory, "/" aside (O_PATH, close-on-exec). */
void paths_init(void);

/* Where an absolute path is below (or at) an opened mount point: its
 * descriptor, with *rest the remainder ("." for the mount point itself);
 * else AT_FDCWD with *rest the path itself.  For the *at calls. */
int path_at(const char *path, const char **rest);

/* What exec does with the agent's descriptors, for a builtin that runs
 * without one: every fd >= 3 closed (otherwise it would hold, among others,
 * the write end of its own stdin and never see its end) but the mount
 * points' above, which it goes on using. */
void paths_close_others(void);

/* fds from..to (inclusive) closed, or made close-on-exec. */
void fds_range(unsigned from, unsigned to, int close_them);

/* open(path, flags, mode) and chdir(path), from the mount point's
 * descriptor when there is one. */
int open_at(const char *path, int flags, mode_t mode);
int chdir_at(const char *path);
/* fopen(path, "re") and opendir(path), the same way. */
FILE *fopen_at(const char *path);
DIR *opendir_at(const char *path);

#endif
