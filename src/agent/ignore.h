/*
 * .gitignore rules, as git reads them (gitignore(5)): blank lines and '#'
 * comments skipped, '!' negates, a trailing '/' matches directories only, a
 * '/' at the start or in the middle anchors the pattern to the directory of
 * the .gitignore file (else it matches a name at any depth below it), and the
 * globs '*', '?', '[...]' and '**'.  Pure logic, no I/O: search.c loads the
 * files, tests/unit/test_ignore.cpp exercises the matching.
 */
#ifndef CUBICLE_AGENT_IGNORE_H
#define CUBICLE_AGENT_IGNORE_H

#include <stddef.h>

struct ignore_rule {
    char *pattern;      /* without '!', the leading and trailing '/' */
    unsigned char negated, dir_only, anchored;
};

/* The rules of one .gitignore file, in file order. */
struct ignore_list {
    struct ignore_rule *rules;
    size_t count;
};

/* Parses a .gitignore's text (len bytes, not NUL-terminated) into rules.
 * Returns 0, or -1 when out of memory. */
int ignore_parse(struct ignore_list *list, const char *text, size_t len);
void ignore_free(struct ignore_list *list);

/* What the list says of `path` (relative to the .gitignore's directory,
 * '/'-separated, no leading "./"): 1 ignored, 0 re-included by a '!' rule,
 * -1 no rule matches (the next list up decides).  The last matching rule
 * wins, as in git. */
int ignore_match(const struct ignore_list *list, const char *path, int is_dir);

/* A gitignore glob against a '/'-separated path: '*' and '?' never match
 * '/', '**' as a whole component matches any number of components.  A glob
 * that would take more than 100,000 steps on one path (stars against stars)
 * does not match it. */
int ignore_glob(const char *pattern, const char *path);

#endif
