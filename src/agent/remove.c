/* The remove builtin: see remove.h. */
#include "remove.h"
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int failed;

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    /* FTW_DNR: unreadable, so its entries stay and the rmdir below says so */
    if (type == FTW_NS || remove(path) == 0 || errno == ENOENT)
        return 0;
    fprintf(stderr, "cannot remove %s: %s\n", path, strerror(errno));
    failed = 1;
    return 0;
}

int remove_main(int argc, char **argv)
{
    failed = 0;
    for (int i = 1; i < argc; i++) {
        /* from the path's mount point, not through the image's layers (paths.h) */
        const char *rest;
        int at = path_at(argv[i], &rest);
        const char *path = at != AT_FDCWD && fchdir(at) == 0 ? rest : argv[i];
        if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0 && errno != ENOENT) {
            fprintf(stderr, "cannot remove %s: %s\n", argv[i], strerror(errno));
            failed = 1;
        }
    }
    return failed;
}
