/* Paths that do not start at "/": see paths.h. */
#include "paths.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_OPENED 64

static struct opened { char *point; size_t len; int fd; } opened[MAX_OPENED];
static size_t n_opened;

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s)
{
    char *out = s;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '7' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
            *out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *out++ = *s;
        }
    }
    *out = 0;
}

int mounts_each(void (*fn)(const char *point, const char *options, const char *type, void *arg), void *arg)
{
    FILE *f = fopen_at("/proc/self/mountinfo");
    char line[4096];

    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        /* "id parent maj:min root point options [optional...] - type source superoptions" */
        char point[PATH_MAX], options[256], type[64];
        char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s %255s", point, options) != 2 ||
            sscanf(dash + 3, "%63s", type) != 1)
            continue;
        unescape(point);
        fn(point, options, type, arg);
    }
    fclose(f);
    return 0;
}

static void open_mount(const char *point, const char *options, const char *type, void *arg)
{
    (void)options;
    (void)type;
    (void)arg;
    if (n_opened == MAX_OPENED || point[0] != '/' || point[1] == '\0')
        return;
    int fd = open(point, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;   /* a file mounted on its own (/etc/hosts), or one we may not enter */
    char *copy = strdup(point);
    if (!copy) {
        close(fd);
        return;
    }
    opened[n_opened++] = (struct opened){ copy, strlen(copy), fd };
}

void paths_init(void)
{
    mounts_each(open_mount, NULL);
}

int path_at(const char *path, const char **rest)
{
    const struct opened *best = NULL;
    for (size_t i = 0; i < n_opened; i++) {
        const struct opened *o = &opened[i];
        /* the longest mount point that is path or a directory above it */
        if (strncmp(path, o->point, o->len) == 0 && (path[o->len] == '/' || path[o->len] == '\0') &&
            (!best || o->len > best->len))
            best = o;
    }
    if (!best) {
        *rest = path;
        return AT_FDCWD;
    }
    const char *r = path + best->len;
    while (*r == '/')
        r++;
    *rest = *r ? r : ".";
    return best->fd;
}

int open_at(const char *path, int flags, mode_t mode)
{
    const char *rest;
    int fd = path_at(path, &rest);
    return openat(fd, rest, flags, mode);
}

int chdir_at(const char *path)
{
    const char *rest;
    int fd = path_at(path, &rest);
    if (fd == AT_FDCWD)
        return chdir(path);
    if (fchdir(fd) < 0)
        return -1;
    return strcmp(rest, ".") == 0 ? 0 : chdir(rest);
}

FILE *fopen_at(const char *path)
{
    int fd = open_at(path, O_RDONLY | O_CLOEXEC, 0);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f && fd >= 0)
        close(fd);
    return f;
}

DIR *opendir_at(const char *path)
{
    int fd = open_at(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0)
        close(fd);
    return d;
}

void fds_range(unsigned from, unsigned to, int close_them)
{
#if defined(SYS_close_range) && defined(CLOSE_RANGE_CLOEXEC)
    if (syscall(SYS_close_range, from, to, close_them ? 0U : (unsigned)CLOSE_RANGE_CLOEXEC) == 0)
        return;
#endif
    struct rlimit rl;
    unsigned max = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)max)
        max = (unsigned)rl.rlim_cur;
    for (unsigned fd = from; fd <= to && fd < max; fd++) {
        if (close_them)
            close((int)fd);
        else
            fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    }
}

static int by_number(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

void paths_close_others(void)
{
    int keep[MAX_OPENED];
    for (size_t i = 0; i < n_opened; i++)
        keep[i] = opened[i].fd;
    qsort(keep, n_opened, sizeof keep[0], by_number);
    unsigned from = 3;
    for (size_t i = 0; i < n_opened; i++) {
        if ((unsigned)keep[i] > from)
            fds_range(from, (unsigned)keep[i] - 1, 1);
        if ((unsigned)keep[i] + 1 > from)
            from = (unsigned)keep[i] + 1;
    }
    fds_range(from, ~0U, 1);
}
