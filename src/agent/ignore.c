/* .gitignore rules: see ignore.h. */
#include "ignore.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* A POSIX class name inside a bracket expression ("alpha" of [:alpha:]). */
static int in_class(const char *name, size_t len, unsigned char c)
{
    static const struct { const char *name; int (*test)(int); } classes[] = {
        { "alnum", isalnum }, { "alpha", isalpha }, { "blank", isblank }, { "cntrl", iscntrl },
        { "digit", isdigit }, { "graph", isgraph }, { "lower", islower }, { "print", isprint },
        { "punct", ispunct }, { "space", isspace }, { "upper", isupper }, { "xdigit", isxdigit },
    };
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        if (strlen(classes[i].name) == len && memcmp(classes[i].name, name, len) == 0)
            return classes[i].test(c) != 0;
    return 0;
}

/* A bracket expression at *pp (just past its '['): whether c is in it, and
 * *pp moved past its ']'.  -1 when it never closes ('[' is then literal). */
static int bracket(const char **pp, unsigned char c)
{
    const char *p = *pp;
    int negated = *p == '!' || *p == '^', found = 0;
    if (negated)
        p++;
    for (int first = 1; *p && (first || *p != ']'); first = 0) {
        if (p[0] == '[' && p[1] == ':') {
            const char *end = strstr(p + 2, ":]");
            if (end) {
                found |= in_class(p + 2, (size_t)(end - p - 2), c);
                p = end + 2;
                continue;
            }
        }
        unsigned char low = (unsigned char)(*p == '\\' && p[1] ? *++p : *p);
        p++;
        unsigned char high = low;
        if (p[0] == '-' && p[1] && p[1] != ']') {
            p++;
            high = (unsigned char)(*p == '\\' && p[1] ? *++p : *p);
            p++;
        }
        found |= c >= low && c <= high;
    }
    if (*p != ']')
        return -1;
    *pp = p + 1;
    return found != negated;
}

/* Backtracking over many stars can take exponential time ("*a*a*a*a*b"); a
 * glob that needs more steps than this for one path does not match it. */
#define GLOB_MAX_STEPS 100000
static unsigned long glob_steps;

static int glob_from(const char *start, const char *p, const char *s)
{
    if (++glob_steps > GLOB_MAX_STEPS)
        return 0;
    for (;;) {
        if (p[0] == '*' && p[1] == '*' && (p == start || p[-1] == '/') && (p[2] == '/' || p[2] == '\0')) {
            if (p[2] == '\0')
                return 1;   /* a trailing double star: everything below */
            const char *rest = p + 3;   /* "**" + "/": zero or more whole components */
            if (glob_from(start, rest, s))
                return 1;
            for (const char *t = s; *t; t++)
                if (*t == '/' && glob_from(start, rest, t + 1))
                    return 1;
            return 0;
        }
        switch (*p) {
        case '\0':
            return *s == '\0';
        case '*':
            while (*p == '*')
                p++;
            for (const char *t = s;; t++) {
                if (glob_from(start, p, t))
                    return 1;
                if (*t == '\0' || *t == '/')
                    return 0;
            }
        case '?':
            if (*s == '\0' || *s == '/')
                return 0;
            p++, s++;
            continue;
        case '[': {
            const char *q = p + 1;
            int in = bracket(&q, (unsigned char)*s);
            if (in < 0)
                goto literal;   /* never closed: a '[' like any other */
            if (*s == '\0' || *s == '/' || !in)
                return 0;
            p = q, s++;
            continue;
        }
        case '\\':
            if (p[1])
                p++;
            /* fall through */
        default:
        literal:
            if (*p != *s)
                return 0;
            p++, s++;
        }
    }
}

int ignore_glob(const char *pattern, const char *path)
{
    glob_steps = 0;
    return glob_from(pattern, pattern, path);
}

int ignore_parse(struct ignore_list *list, const char *text, size_t len)
{
    list->rules = NULL;
    list->count = 0;
    size_t capacity = 0;
    const char *end = text + len;
    for (const char *line = text; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            eol = end;
        const char *b = line, *e = eol;
        line = eol + 1;
        if (e > b && e[-1] == '\r')
            e--;
        /* trailing spaces go unless escaped */
        while (e > b && e[-1] == ' ' && !(e - 1 > b && e[-2] == '\\'))
            e--;
        if (b == e || *b == '#')
            continue;
        struct ignore_rule rule = { 0 };
        if (*b == '!') {
            rule.negated = 1;
            b++;
        }
        while (e > b && e[-1] == '/') {
            rule.dir_only = 1;
            e--;
        }
        if (b == e)
            continue;
        if (memchr(b, '/', (size_t)(e - b)))
            rule.anchored = 1;
        if (*b == '/' && ++b == e)
            continue;
        if (list->count == capacity) {
            capacity = capacity ? capacity * 2 : 16;
            struct ignore_rule *grown = realloc(list->rules, capacity * sizeof *grown);
            if (!grown)
                return -1;
            list->rules = grown;
        }
        /* not strndup: the text need not end in a NUL, and strndup may look for one past e */
        rule.pattern = malloc((size_t)(e - b) + 1);
        if (!rule.pattern)
            return -1;
        memcpy(rule.pattern, b, (size_t)(e - b));
        rule.pattern[e - b] = '\0';
        list->rules[list->count++] = rule;
    }
    return 0;
}

void ignore_free(struct ignore_list *list)
{
    for (size_t i = 0; i < list->count; i++)
        free(list->rules[i].pattern);
    free(list->rules);
    list->rules = NULL;
    list->count = 0;
}

int ignore_match(const struct ignore_list *list, const char *path, int is_dir)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    for (size_t i = list->count; i-- > 0;) {
        const struct ignore_rule *rule = &list->rules[i];
        if (rule->dir_only && !is_dir)
            continue;
        if (ignore_glob(rule->pattern, rule->anchored ? path : name))
            return !rule->negated;
    }
    return -1;
}
