/*
 * The workspace's usage as the disk quota (diskquota.h) counts it: a walk of
 * a directory adding up the allocated blocks (st_blocks * 512) of each inode
 * once, however many hard links it has, and the number of names below it,
 * which is what a tmpfs charges its inodes for, links included.  The walk
 * never follows a symlink, never crosses into another mount, and stops after
 * `max_files` + 1 names: its work is bounded by the quota itself.  A
 * directory the user made unreadable is opened for the walk (u+rx, then its
 * mode back): the walk runs as the same uid.  It stops at directories nested
 * deeper than USAGE_DEPTH levels (each holds a descriptor during the walk):
 * it cannot vouch for what lies below them.
 */
#ifndef CUBICLE_AGENT_USAGE_H
#define CUBICLE_AGENT_USAGE_H

#include <stdint.h>

#define USAGE_DEPTH 256

/* The usage of `dir` (bytes, files) with at most `max_files` names; returns
 * 1 when the walk stopped early (too many names, or nested too deep), else
 * 0, -1 when `dir` cannot be opened. */
int workspace_usage(const char *dir, uint64_t max_files, uint64_t *bytes, uint64_t *files);

/* The disk-usage builtin (protocol.h), argv DIR [MAX_FILES]: prints
 * "BYTES FILES STOPPED" (STOPPED: 1 when the walk stopped early). */
int disk_usage_main(int argc, char **argv);

#endif
