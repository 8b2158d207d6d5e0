/* The read-file and replace-file builtins: see textfile.h. */
#include "textfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *path, const char *why)
{
    fprintf(stderr, "%s %s\n", path, why);
    return 2;
}

/* PATH resolved into `resolved`, which must lie inside the working directory
 * (the workspace): 0, or the builtin's exit code after saying why not. */
static int resolve_inside(const char *path, char resolved[PATH_MAX])
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return fail("the workspace", "cannot be found");
    if (!realpath(path, resolved)) {
        if (errno == ENOENT || errno == ENOTDIR) {
            fprintf(stderr, "no such file in the workspace: %s\n", path);
            return 2;
        }
        return fail(path, strerror(errno));
    }
    size_t n = strlen(cwd);
    if (strncmp(resolved, cwd, n) != 0 || resolved[n] != '/')
        return fail(path, "leads outside the workspace through a symbolic link");
    return 0;
}

static int check_regular(const char *path, const struct stat *st)
{
    if (S_ISDIR(st->st_mode))
        return fail(path, "is a directory; use list_files");
    if (!S_ISREG(st->st_mode))
        return fail(path, "is not a regular file");
    return 0;
}

static void format_stamp(const struct stat *st, char *out, size_t size)
{
    snprintf(out, size, "%lld %lld.%09ld %llu", (long long)st->st_size, (long long)st->st_mtim.tv_sec,
             st->st_mtim.tv_nsec, (unsigned long long)st->st_ino);
}

static int copy_all(int from, int to)
{
    char buf[65536];
    for (;;) {
        ssize_t n = read(from, buf, sizeof buf);
        if (n == 0)
            return 0;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        for (ssize_t done = 0; done < n;) {
            ssize_t w = write(to, buf + done, (size_t)(n - done));
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                return -1;
            }
            done += w;
        }
    }
}

/* Lines [first, last] of fd to stdout, at most max bytes of them; returns the
 * file's line count (a last line without a newline counts), or -1. */
static long long copy_lines(int fd, unsigned long long first, unsigned long long last, long long max)
{
    char buf[65536];
    unsigned long long line = 1;
    long long sent = 0, lines = 0;
    int partial = 0;   /* the last byte read was not a newline */
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return lines + partial;
        for (char *p = buf, *end = buf + n; p < end;) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            char *stop = nl ? nl + 1 : end;
            if (line >= first && line <= last && sent < max) {
                size_t take = (size_t)(stop - p);
                if ((long long)take > max - sent)
                    take = (size_t)(max - sent);
                if (fwrite(p, 1, take, stdout) != take)
                    return -1;
                sent += (long long)take;
            }
            if (nl) {
                line++;
                lines++;
            }
            partial = nl == NULL;
            p = stop;
        }
    }
}

int read_file_main(int argc, char **argv)
{
    if (argc != 3 && argc != 5)
        return fail(argv[0], "takes PATH MAX_BYTES [FIRST_LINE LAST_LINE]");
    char resolved[PATH_MAX];
    int rc = resolve_inside(argv[1], resolved);
    if (rc)
        return rc;
    int fd = open(resolved, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return fail(argv[1], errno == EACCES ? "is not readable by the sandbox user" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0)
        return fail(argv[1], strerror(errno));
    if ((rc = check_regular(argv[1], &st)))
        return rc;
    long long max = strtoll(argv[2], NULL, 10);
    char stamp[96];
    format_stamp(&st, stamp, sizeof stamp);
    if (argc == 5) {
        /* Lines: the body first (buffered by stdio up to its cap), the count
         * last, after a NUL: it is known only at the end of the file. */
        long long lines = copy_lines(fd, strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10), max);
        if (lines < 0)
            return fail(argv[1], strerror(errno));
        printf("%c%s %o %lld", 0, stamp, (unsigned)(st.st_mode & 07777), lines);
        return fflush(stdout) == 0 ? 0 : fail(argv[1], strerror(errno));
    }
    if (st.st_size > max) {
        fprintf(stderr, "%s is %lld bytes; the limit is %lld bytes\n", argv[1], (long long)st.st_size, max);
        return 2;
    }
    printf("%s %o\n", stamp, (unsigned)(st.st_mode & 07777));
    fflush(stdout);
    if (copy_all(fd, STDOUT_FILENO) != 0)
        return fail(argv[1], strerror(errno));
    return 0;
}

int replace_file_main(int argc, char **argv)
{
    if (argc != 3)
        return fail(argv[0], "takes PATH STAMP");
    char resolved[PATH_MAX];
    int rc = resolve_inside(argv[1], resolved);
    if (rc)
        return rc;
    struct stat st;
    if (stat(resolved, &st) != 0)
        return fail(argv[1], strerror(errno));
    if ((rc = check_regular(argv[1], &st)))
        return rc;
    char stamp[96];
    format_stamp(&st, stamp, sizeof stamp);
    if (strcmp(stamp, argv[2]) != 0)
        return fail(argv[1], "changed while it was being edited; read it again and retry");

    char temp[PATH_MAX + 32];
    const char *slash = strrchr(resolved, '/');
    snprintf(temp, sizeof temp, "%.*s/.%s.cubicle-edit-XXXXXX", (int)(slash - resolved), resolved, slash + 1);
    int fd = mkostemp(temp, O_CLOEXEC);
    if (fd < 0)
        return fail(argv[1], errno == EACCES ? "is in a directory the sandbox user cannot write to" : strerror(errno));
    if (fchmod(fd, st.st_mode & 07777) != 0 || copy_all(STDIN_FILENO, fd) != 0 || close(fd) != 0 ||
        rename(temp, resolved) != 0) {
        int saved = errno;
        unlink(temp);
        return fail(argv[1], strerror(saved));
    }
    return 0;
}
