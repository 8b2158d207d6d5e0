/* The search builtin: see search.h. */
#include "search.h"
#include "ignore.h"
#include "paths.h"
#include "pattern.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* grep's and ripgrep's test: a NUL this early means a binary file */
#define BINARY_PROBE_BYTES 8192
/* files up to this size are read; larger ones mapped */
#define READ_MAX_BYTES (1u << 20)
#define MAX_CONTEXT 10
#define MAX_IGNORE_DEPTH 256
#define MAX_GLOBS 64

static const char ellipsis[] = "\xE2\x80\xA6";
static const char replacement[] = "\xEF\xBF\xBD";   /* U+FFFD, for a NUL */

/* what to look for */
static regex_t regex;
static int use_regex, ignore_case;
static char *literal;   /* every match contains it (the whole pattern with 'F') */
static size_t literal_len;
static int context;
/* what was found and written */
static unsigned long max_written, written, total, files_searched;
static size_t budget, written_bytes;
static int cut;

static char *globs[MAX_GLOBS];
static size_t glob_count;

/* The .gitignore files in force: the workspace's, every directory's on the way down. */
static struct {
    struct ignore_list list;
    size_t base_len;   /* the length of its directory's relative path, with its '/' */
} ignores[MAX_IGNORE_DEPTH];
static size_t ignore_depth;

/* the relative path being visited; the first root_len bytes name the directory searched */
static char rel[PATH_MAX];
static size_t root_len;

/* ---- output ---------------------------------------------------------- */

static void put_field(const char *s, size_t n)
{
    fwrite(s, 1, n, stdout);
    putchar('\0');
    written_bytes += n + 1;
}

static void put_number(unsigned long value)
{
    char digits[24];
    put_field(digits, (size_t)snprintf(digits, sizeof digits, "%lu", value));
}

/* Bytes with every NUL as U+FFFD. */
static void put_bytes(const char *s, size_t n)
{
    for (const char *nul; n && (nul = memchr(s, '\0', n)); n -= (size_t)(nul + 1 - s), s = nul + 1) {
        fwrite(s, 1, (size_t)(nul - s), stdout);
        fputs(replacement, stdout);
        written_bytes += (size_t)(nul - s) + 3;
    }
    fwrite(s, 1, n, stdout);
    written_bytes += n;
}

/* Moves i back to the start of the UTF-8 character it is in. */
static size_t char_start(const char *line, size_t i)
{
    for (int k = 0; k < 3 && i > 0 && ((unsigned char)line[i] & 0xC0) == 0x80; k++)
        i--;
    return i;
}

/* A line, cut to CUBICLE_SEARCH_LINE_BYTES around `at` (where the match
 * starts), each cut marked with an ellipsis. */
static void put_line(const char *line, size_t len, size_t at)
{
    if (len > 0 && line[len - 1] == '\r')
        len--;   /* a CRLF file's lines read like any other's */
    size_t start = 0, end = len;
    if (len > CUBICLE_SEARCH_LINE_BYTES) {
        if (at + 100 > CUBICLE_SEARCH_LINE_BYTES)
            start = char_start(line, at > 100 ? at - 100 : 0);
        end = start + CUBICLE_SEARCH_LINE_BYTES;
        if (end > len)
            end = len;
        else
            end = char_start(line, end);
    }
    if (start > 0)
        put_bytes(ellipsis, 3);
    put_bytes(line + start, end - start);
    if (end < len)
        put_bytes(ellipsis, 3);
    putchar('\0');
    written_bytes++;
}

/* ---- matching -------------------------------------------------------- */

/* ASCII case folding without a call per byte */
static unsigned char folded[256];

static const char *find_folded(const char *hay, size_t n, const char *needle, size_t m)
{
    if (m > n)
        return NULL;
    const unsigned char *h = (const unsigned char *)hay, *k = (const unsigned char *)needle;
    unsigned char first = folded[k[0]];
    for (size_t i = 0; i + m <= n; i++) {
        if (folded[h[i]] != first)
            continue;
        size_t j = 1;
        while (j < m && folded[h[i + j]] == folded[k[j]])
            j++;
        if (j == m)
            return hay + i;
    }
    return NULL;
}

static const char *find_literal(const char *hay, size_t n)
{
    return ignore_case ? find_folded(hay, n, literal, literal_len) : memmem(hay, n, literal, literal_len);
}

/* Where the pattern first matches in [from, to) of buf: 0 and *at set, or -1. */
static int regex_in(const char *buf, size_t from, size_t to, size_t *at)
{
    regmatch_t m[1];
    m[0].rm_so = (regoff_t)from;
    m[0].rm_eo = (regoff_t)to;
    if (regexec(&regex, buf, 1, m, REG_STARTEND) != 0)
        return -1;
    *at = (size_t)m[0].rm_so;
    return 0;
}

static size_t line_end(const char *buf, size_t len, size_t from)
{
    const char *nl = memchr(buf + from, '\n', len - from);
    return nl ? (size_t)(nl - buf) : len;
}

static size_t line_start(const char *buf, size_t floor, size_t at)
{
    const char *nl = memrchr(buf + floor, '\n', at - floor);
    return nl ? (size_t)(nl - buf) + 1 : floor;
}

static void report(const char *path, const char *buf, size_t len, size_t start, size_t end,
                   unsigned long line, size_t at)
{
    total++;
    if (written >= max_written || written_bytes >= budget) {
        cut = 1;
        return;
    }
    written++;
    put_field("m", 1);
    put_field(path, strlen(path));
    put_number(line);
    put_number(at - start + 1);
    put_line(buf + start, end - start, at - start);

    size_t before[MAX_CONTEXT], before_end[MAX_CONTEXT];
    int nbefore = 0;
    for (size_t s = start; nbefore < context && s > 0; nbefore++) {
        before_end[nbefore] = s - 1;
        s = line_start(buf, 0, s - 1);
        before[nbefore] = s;
    }
    put_number((unsigned long)nbefore);
    for (int i = nbefore; i-- > 0;)
        put_line(buf + before[i], before_end[i] - before[i], 0);

    size_t after[MAX_CONTEXT], after_end[MAX_CONTEXT];
    int nafter = 0;
    for (size_t s = end + 1; nafter < context && s < len; nafter++) {
        after[nafter] = s;
        after_end[nafter] = line_end(buf, len, s);
        s = after_end[nafter] + 1;
    }
    put_number((unsigned long)nafter);
    for (int i = 0; i < nafter; i++)
        put_line(buf + after[i], after_end[i] - after[i], 0);
}

/* Every matching line of a file's text, one report each. */
static void scan(const char *path, const char *buf, size_t len)
{
    unsigned long line = 1;
    size_t counted = 0;   /* newlines before here are in `line` */
    for (size_t pos = 0; pos < len;) {
        size_t at, start, end;
        if (literal_len) {
            const char *hit = find_literal(buf + pos, len - pos);
            if (!hit)
                return;
            at = (size_t)(hit - buf);
            start = line_start(buf, pos, at);
            end = line_end(buf, len, at);
            if (use_regex && regex_in(buf, start, end, &at) < 0) {
                pos = end + 1;
                continue;
            }
        } else {
            if (regex_in(buf, pos, len, &at) < 0)
                return;
            start = line_start(buf, pos, at < len ? at : len);
            end = line_end(buf, len, at < len ? at : len);
            if (start >= len)
                return;   /* an empty match after the last newline: no line there */
            /* \s and the like cross newlines; matches stay within a line */
            if (regex_in(buf, start, end, &at) < 0) {
                pos = end + 1;
                continue;
            }
        }
        for (const char *nl; counted < start && (nl = memchr(buf + counted, '\n', start - counted));
             counted = (size_t)(nl - buf) + 1)
            line++;
        counted = start;
        report(path, buf, len, start, end, line, at);
        pos = end + 1;
    }
}

static char *read_buf;
static size_t read_cap;

/* Searches the open file fd (closed here) if it is a regular text file. */
static void search_fd(int fd, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    size_t size = (size_t)st.st_size, len = 0;
    char *buf = NULL;
    int mapped = size > READ_MAX_BYTES;
    if (mapped) {
        buf = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (buf == MAP_FAILED) {
            close(fd);
            return;
        }
        len = size;
    } else {
        if (size + 1 > read_cap) {
            free(read_buf);
            read_cap = READ_MAX_BYTES + 1;
            read_buf = malloc(read_cap);
            if (!read_buf) {
                read_cap = 0;
                close(fd);
                return;
            }
        }
        buf = read_buf;
        for (ssize_t n; len < size && (n = read(fd, buf + len, size - len)) > 0;)
            len += (size_t)n;
    }
    close(fd);
    if (!memchr(buf, '\0', len < BINARY_PROBE_BYTES ? len : BINARY_PROBE_BYTES)) {
        files_searched++;
        scan(path, buf, len);
    }
    if (mapped)
        munmap(buf, size);
}

/* ---- the walk -------------------------------------------------------- */

/* Reads dir's .gitignore into the next stack entry, for paths below rel[0..rel_len). */
static void push_ignore(int dir, size_t rel_len)
{
    int fd = openat(dir, ".gitignore", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    char *text = NULL;
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < (1 << 20) && ignore_depth < MAX_IGNORE_DEPTH &&
        (text = malloc((size_t)st.st_size + 1)))
        n = read(fd, text, (size_t)st.st_size);
    close(fd);
    if (n >= 0 && ignore_parse(&ignores[ignore_depth].list, text, (size_t)n) == 0)
        ignores[ignore_depth++].base_len = rel_len;
    free(text);
}

static void pop_ignore(size_t rel_len)
{
    if (ignore_depth > 0 && ignores[ignore_depth - 1].base_len == rel_len)
        ignore_free(&ignores[--ignore_depth].list);
}

/* rel is what the deepest .gitignore that has a rule for it says. */
static int ignored(int is_dir)
{
    for (size_t i = ignore_depth; i-- > 0;) {
        int verdict = ignore_match(&ignores[i].list, rel + ignores[i].base_len, is_dir);
        if (verdict >= 0)
            return verdict;
    }
    return 0;
}

static int glob_wanted(const char *name)
{
    if (glob_count == 0)
        return 1;
    /* a glob with a '/' is a path below the workspace or below the directory searched */
    for (size_t i = 0; i < glob_count; i++)
        if (strchr(globs[i], '/') ? ignore_glob(globs[i], rel) || ignore_glob(globs[i], rel + root_len)
                                  : ignore_glob(globs[i], name))
            return 1;
    return 0;
}

static int not_dot(const struct dirent *entry)
{
    return strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0;
}

/* Searches the directory dir (its path rel[0..rel_len), "" or ending in '/'). */
static void walk(int dir, size_t rel_len)
{
    struct dirent **entries;
    int n = scandirat(dir, ".", &entries, not_dot, alphasort);
    if (n < 0)
        return;
    push_ignore(dir, rel_len);
    for (int i = 0; i < n; i++) {
        const char *name = entries[i]->d_name;
        size_t name_len = strlen(name);
        unsigned char type = entries[i]->d_type;
        if (type == DT_UNKNOWN) {
            struct stat st;
            type = fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ? DT_UNKNOWN
                   : S_ISDIR(st.st_mode)                           ? DT_DIR
                   : S_ISREG(st.st_mode)                           ? DT_REG
                                                                   : DT_UNKNOWN;
        }
        /* the workspace's .cubicle holds saved output of runs, not the project */
        int skipped = strcmp(name, ".git") == 0 || (rel_len == 0 && strcmp(name, ".cubicle") == 0);
        if ((type != DT_DIR && type != DT_REG) || skipped || rel_len + name_len + 2 > sizeof rel) {
            free(entries[i]);
            continue;
        }
        memcpy(rel + rel_len, name, name_len + 1);
        if (type == DT_DIR && !ignored(1)) {
            int sub = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                rel[rel_len + name_len] = '/';
                rel[rel_len + name_len + 1] = '\0';
                walk(sub, rel_len + name_len + 1);
                close(sub);
            }
        } else if (type == DT_REG && !ignored(0) && glob_wanted(name)) {
            int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            if (fd >= 0)
                search_fd(fd, rel);
        }
        rel[rel_len] = '\0';
        free(entries[i]);
    }
    free(entries);
    pop_ignore(rel_len);
}

/* ---- arguments ------------------------------------------------------- */

/* Adds glob, with its first {a,b} group expanded (recursively). */
static void add_glob(const char *glob, size_t len)
{
    if (glob_count >= MAX_GLOBS)   /* no more room: expanding further only burns time */
        return;
    const char *open = memchr(glob, '{', len);
    const char *close = open ? memchr(open, '}', len - (size_t)(open - glob)) : NULL;
    if (!close) {
        if (len && glob_count < MAX_GLOBS)
            globs[glob_count++] = strndup(glob, len);
        return;
    }
    for (const char *alt = open + 1;;) {
        const char *comma = memchr(alt, ',', (size_t)(close - alt));
        const char *alt_end = comma ? comma : close;
        char expanded[PATH_MAX];
        int n = snprintf(expanded, sizeof expanded, "%.*s%.*s%.*s", (int)(open - glob), glob, (int)(alt_end - alt), alt,
                         (int)(glob + len - close - 1), close + 1);
        if (n > 0 && (size_t)n < sizeof expanded)
            add_glob(expanded, (size_t)n);
        if (!comma)
            return;
        alt = comma + 1;
    }
}

/* "*.c,*.{h,hpp}": split at the commas outside braces. */
static void parse_globs(const char *list)
{
    int depth = 0;
    const char *start = list;
    for (const char *p = list;; p++) {
        if (*p == '{')
            depth++;
        else if (*p == '}' && depth > 0)
            depth--;
        else if ((*p == ',' && depth == 0) || *p == '\0') {
            while (start < p && *start == ' ')
                start++;
            if (p - start >= 2 && start[0] == '.' && start[1] == '/')
                start += 2;
            add_glob(start, (size_t)(p - start));
            start = p + 1;
        }
        if (!*p)
            return;
    }
}

static int compile(const char *pattern, int fixed)
{
    for (int c = 0; c < 256; c++)
        folded[c] = (unsigned char)tolower(c);
    if (fixed) {
        literal = strdup(pattern);
        literal_len = strlen(pattern);
        return literal ? 0 : -1;
    }
    const char *error = NULL;
    char *ere = pattern_to_ere(pattern, &ignore_case, &error);
    if (!ere) {
        fprintf(stderr, "bad pattern: %s\n", error);
        return -1;
    }
    int rc = regcomp(&regex, ere, REG_EXTENDED | REG_NEWLINE | (ignore_case ? REG_ICASE : 0));
    if (rc != 0) {
        char why[256];
        regerror(rc, &regex, why, sizeof why);
        fprintf(stderr, "bad pattern: %s\n", why);
        free(ere);
        return -1;
    }
    use_regex = 1;
    literal = malloc(strlen(ere) + 1);
    if (literal)
        literal_len = pattern_required_literal(ere, literal);
    free(ere);
    return 0;
}

/* Opens path below the workspace (ws), refusing links on the way, and loads
 * the .gitignore files above it.  Returns the descriptor; *is_dir says what it is. */
static int open_below(int ws, const char *path, int *is_dir)
{
    char copy[PATH_MAX];
    if (strlen(path) >= sizeof copy)
        return -1;
    strcpy(copy, path);
    int dir = dup(ws);
    size_t rel_len = 0;
    *is_dir = 1;
    char *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (strcmp(part, ".") == 0)
            continue;
        if (!*is_dir) {
            fprintf(stderr, "%s is not a directory\n", rel);
            close(dir);
            return -1;
        }
        push_ignore(dir, rel_len);
        int next = openat(dir, part, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (next < 0) {
            if (errno == ELOOP)
                fprintf(stderr, "%s%s is a symbolic link; search_files never follows one\n", rel, part);
            else
                fprintf(stderr, "no such file or directory in the workspace: %s%s\n", rel, part);
            close(dir);
            return -1;
        }
        struct stat st;
        if (fstat(next, &st) < 0 || (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))) {
            fprintf(stderr, "%s%s is not a regular file or directory\n", rel, part);
            close(next);
            close(dir);
            return -1;
        }
        *is_dir = S_ISDIR(st.st_mode);
        rel_len += (size_t)snprintf(rel + rel_len, sizeof rel - rel_len, *is_dir ? "%s/" : "%s", part);
        close(dir);
        dir = next;
    }
    return dir;
}

int search_main(int argc, char **argv)
{
    char *end;
    if (argc != 9)
        return 2;
    const char *workspace = argv[1], *path = argv[2], *pattern = argv[3], *flags = argv[4];
    context = (int)strtol(argv[5], &end, 10);
    if (*end || context < 0 || context > MAX_CONTEXT)
        return 2;
    max_written = strtoul(argv[6], &end, 10);
    if (*end)
        return 2;
    budget = strtoul(argv[7], &end, 10);
    if (*end)
        return 2;
    ignore_case = strchr(flags, 'i') != NULL;
    if (compile(pattern, strchr(flags, 'F') != NULL) < 0)
        return 2;
    parse_globs(argv[8]);
    static char out_buf[1 << 16];
    setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);

    /* From the workspace's mount point, not through the image's layers
     * (paths.h), while its descriptor is open; every later lookup starts at ws. */
    int ws = open_at(workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (ws < 0 && errno == EBADF)
        ws = open(workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ws < 0) {
        fprintf(stderr, "cannot open the workspace %s: %s\n", workspace, strerror(errno));
        return 2;
    }
    int is_dir;
    int start = open_below(ws, path, &is_dir);
    if (start < 0)
        return 2;
    if (is_dir) {
        root_len = strlen(rel);
        walk(start, root_len);
        close(start);
    } else {
        search_fd(start, rel);   /* a file named on purpose: whatever the ignore files say */
    }
    put_field("s", 1);
    put_number(total);
    put_number(files_searched);
    put_number((unsigned long)cut);
    return fflush(stdout) == 0 ? 0 : 1;
}
