/* The changed-files listing: see changed.h. */
#include "changed.h"
#include "paths.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct timespec since;
static size_t root_len, left;

/* Trees that hold thousands of files nobody asked about. */
static int pruned(const char *name, int level)
{
    static const char *const names[] = { "node_modules", ".git", "__pycache__", ".venv" };
    if (level == 1 && strcmp(name, ".cubicle") == 0)
        return 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return 1;
    return 0;
}

static int newer(const struct timespec *t)
{
    return t->tv_sec > since.tv_sec || (t->tv_sec == since.tv_sec && t->tv_nsec > since.tv_nsec);
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    if (type == FTW_D && ftw->level > 0 && pruned(path + ftw->base, ftw->level))
        return FTW_SKIP_SUBTREE;
    if (type != FTW_F || !S_ISREG(st->st_mode) || !newer(&st->st_mtim))
        return FTW_CONTINUE;
    /* %P: the path below the root */
    fwrite(path + root_len + 1, 1, strlen(path + root_len + 1) + 1, stdout);
    return --left ? FTW_CONTINUE : FTW_STOP;
}

int changed_files_main(int argc, char **argv)
{
    char *end;
    if (argc != 4)
        return 2;
    const char *root = argv[1];
    double when = strtod(argv[2], &end);
    if (*end || when < 0)
        return 2;
    left = strtoul(argv[3], &end, 10);
    if (*end || left == 0)
        return 2;
    since.tv_sec = (time_t)when;
    since.tv_nsec = (long)((when - (double)since.tv_sec) * 1e9);
    /* From the root's mount point, not through the image's layers (paths.h):
     * the walk's paths are then relative, "./name" for the root's own. */
    const char *rest;
    int at = path_at(root, &rest);
    if (at != AT_FDCWD && fchdir(at) == 0)
        root = rest;
    root_len = strlen(root);
    /* -xdev, no links followed; what cannot be read is passed over, like
     * find with its errors sent to /dev/null */
    nftw(root, visit, 16, FTW_PHYS | FTW_MOUNT | FTW_ACTIONRETVAL);
    return fflush(stdout) == 0 ? 0 : 1;
}
