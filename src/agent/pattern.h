/*
 * search_files' patterns: what a model writes (Perl/PCRE habits) made into a
 * POSIX extended regular expression glibc's regcomp compiles, and the
 * literal text every match must contain, which search.c finds with a plain
 * byte search before it asks the regex engine.  Pure logic, no I/O
 * (tests/unit/test_search_pattern.cpp).
 */
#ifndef CUBICLE_AGENT_PATTERN_H
#define CUBICLE_AGENT_PATTERN_H

#include <stddef.h>

/* Rewrites a pattern for regcomp(REG_EXTENDED): \d \D (also inside [...]),
 * \w \s inside [...], \t \r \f \v \e \xHH, escaped punctuation inside
 * [...], (?:...) groups, a leading (?i) (sets *ignore_case), lazy and
 * possessive quantifiers (the same lines match), and a '{' that starts no
 * interval (a literal, as in Perl); a '.' matches a whole UTF-8 character
 * as well as a single byte.  glibc itself understands \w \W \s \S
 * \b \B \< \> and back-references.  Returns a malloc'd string, or NULL with
 * *error a static message naming what is not supported. */
char *pattern_to_ere(const char *pattern, int *ignore_case, const char **error);

/* The longest literal every match of `ere` (a pattern_to_ere result)
 * contains, copied to out (room for strlen(ere) + 1 bytes); returns its
 * length, 0 when there is none (an alternation, say). */
size_t pattern_required_literal(const char *ere, char *out);

#endif
