/* search_files' patterns: see pattern.h. */
#include "pattern.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for a message that names the offending escape. */
static char message[96];

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* \xHH or \x{HH} at p (just past the 'x'): the byte, p moved past it; -1 if malformed. */
static int hex_escape(const char **pp)
{
    const char *p = *pp;
    int braced = *p == '{', value = 0, digits = 0;
    if (braced)
        p++;
    while (digits < 2 && hex_digit(*p) >= 0)
        value = value * 16 + hex_digit(*p++), digits++;
    if (digits == 0 || (braced && *p++ != '}') || value == 0)
        return -1;
    *pp = p;
    return value;
}

/* \t and its kind: the byte, or -1. */
static int control_escape(char c)
{
    switch (c) {
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'e': return 033;
    case 'a': return 007;
    default: return -1;
    }
}

static const char *unsupported(char c)
{
    snprintf(message, sizeof message, "\\%c is not supported in search patterns", c);
    return message;
}

static void put(char **o, const char *s)
{
    size_t n = strlen(s);
    memcpy(*o, s, n);
    *o += n;
}

/* A literal byte outside brackets, escaped where ERE gives it a meaning. */
static void put_literal(char **o, unsigned char c)
{
    if (strchr(".[]()*+?{}|^$\\", c))
        *(*o)++ = '\\';
    *(*o)++ = (char)c;
}

/* One character inside [...] at *pp: its byte, or -2 for \d \w \s (their
 * members appended to *items instead), or -1 with *error set. */
static int bracket_char(const char **pp, char **items, const char **error)
{
    const char *p = *pp;
    if (*p != '\\' || !p[1]) {
        *pp = p + 1;
        return (unsigned char)*p;
    }
    char c = p[1];
    *pp = p + 2;
    if (c == 'd' || c == 'w' || c == 's') {
        put(items, c == 'd' ? "0-9" : c == 'w' ? "[:alnum:]_" : "[:space:]");
        return -2;
    }
    if (c == 'D' || c == 'W' || c == 'S') {
        *error = "\\D, \\W and \\S are not supported inside [...]; write [^0-9] and the like";
        return -1;
    }
    if (c == 'x') {
        int value = hex_escape(pp);
        if (value < 0)
            *error = "\\x needs one or two hex digits (\\x41 or \\x{41})";
        return value;
    }
    if (c == 'n')
        return '\n';
    if (c == 'b')
        return '\b';
    int control = control_escape(c);
    if (control >= 0)
        return control;
    if (isalnum((unsigned char)c)) {
        *error = unsupported(c);
        return -1;
    }
    return (unsigned char)c;
}

/* The members of a bracket expression that POSIX lets stand only in certain
 * places (']' first, '-' last, '^' anywhere but first, '[' where no '.', ':'
 * or '=' follows it), kept apart and written where they are literal. */
struct bracket_specials {
    int close, dash, caret, open;
};

static int bracket_special(struct bracket_specials *s, int c)
{
    int *flag = c == ']' ? &s->close : c == '-' ? &s->dash : c == '^' ? &s->caret : c == '[' ? &s->open : NULL;
    if (flag)
        *flag = 1;
    return flag != NULL;
}

/* The range low-high, its ends moved inwards past the special members (kept
 * apart): "a-]" is "a-\\" and ']', which regcomp would read as "[a-]" and
 * what follows it outside the brackets. */
static void bracket_range(struct bracket_specials *s, int low, int high, char **items)
{
    while (low <= high && bracket_special(s, low))
        low++;
    while (low <= high && bracket_special(s, high))
        high--;
    if (low > high)
        return;
    *(*items)++ = (char)low;
    if (high > low) {
        *(*items)++ = '-';
        *(*items)++ = (char)high;
    }
}

/* A bracket expression at *pp (just past its '['), rewritten for POSIX, where
 * a backslash inside brackets is literal and ']', '^', '-' and '[' are literal
 * only in certain places. */
static int translate_bracket(const char **pp, char **o, const char **error)
{
    const char *p = *pp;
    int negated = *p == '^';
    struct bracket_specials special = {0};
    if (negated)
        p++;
    char items_buf[4096], *items = items_buf;
    for (int first = 1; *p && (first || *p != ']'); first = 0) {
        if (items - items_buf > (long)sizeof items_buf - 40) {   /* room for a [: class :] of 34 */
            *error = "a [...] in the pattern is too long";
            return -1;
        }
        if (p[0] == '[' && (p[1] == ':' || p[1] == '.' || p[1] == '=')) {
            char close[3] = { p[1], ']', 0 };
            const char *end = strstr(p + 2, close);
            if (!end || end - p > 32) {
                *error = "a [: class :] in the pattern is not closed";
                return -1;
            }
            memcpy(items, p, (size_t)(end + 2 - p));
            items += end + 2 - p;
            p = end + 2;
            continue;
        }
        int low = bracket_char(&p, &items, error);
        if (low == -1)
            return -1;
        if (low == -2)
            continue;
        int high = low;
        if (p[0] == '-' && p[1] && p[1] != ']') {
            p++;
            high = bracket_char(&p, &items, error);
            if (high == -1)
                return -1;
            if (high == -2) {
                *error = "a range in [...] ends in a class such as \\d";
                return -1;
            }
            if (high < low) {
                *error = "a range in [...] runs backwards (such as z-a)";
                return -1;
            }
        }
        bracket_range(&special, low, high, &items);
    }
    if (*p != ']') {
        *error = "a [ in the pattern is not closed";
        return -1;
    }
    *pp = p + 1;
    int caret_only = items == items_buf && !special.close && !special.open;
    if (special.caret && caret_only && !negated && !special.dash) {
        put(o, "\\^");
        return 0;
    }
    *(*o)++ = '[';
    if (negated)
        *(*o)++ = '^';
    if (special.close)
        *(*o)++ = ']';
    if (special.caret && caret_only) {   /* '^' must not come first: the dash goes before it */
        put(o, "-^]");
        return 0;
    }
    memcpy(*o, items_buf, (size_t)(items - items_buf));
    *o += items - items_buf;
    if (special.open)
        *(*o)++ = '[';
    if (special.caret)
        *(*o)++ = '^';
    if (special.dash)
        *(*o)++ = '-';
    *(*o)++ = ']';
    return 0;
}

/* Whether p (at a '{') starts an interval: {n}, {n,}, {n,m} or {,m}. */
static int interval_at(const char *p)
{
    p++;
    int digits = 0;
    while (isdigit((unsigned char)*p))
        p++, digits++;
    if (*p == ',') {
        p++;
        while (isdigit((unsigned char)*p))
            p++, digits++;
    }
    return digits > 0 && *p == '}';
}

/* A '.' the way a model means it: one character, of one byte or a whole
 * UTF-8 sequence (regcomp runs in the C locale, where '.' is one byte, so
 * that Latin-1 and other bytes match too). */
static const char any_character[] = "(.|[\xC0-\xFF][\x80-\xBF]+)";

/* Whether the pattern refers back to a group (\1): its groups must then keep their numbers. */
static int has_back_reference(const char *p)
{
    for (; *p; p++)
        if (*p == '\\' && p[1]) {
            if (p[1] >= '1' && p[1] <= '9')
                return 1;
            p++;
        }
    return 0;
}

/* What regcomp will copy of the pattern: an atom counts once, a group the sum
 * of what it holds, and {n,m} adds m copies of the atom or group before it.
 * Copies of something that can match the empty string (a?, (a*b*), ^) cost
 * more: regcomp's epsilon closures chain through all of them, so its memory
 * grows with the square of their number ((a?){1999} takes 316 MB, a{2,1999}
 * 33 MB); they count `nullable_cost` times.  A group and a '|' are nodes of
 * their own ((){1999} inside {1999} took 1.9 GB when they counted nothing). */
enum { most_copies = 2000, deepest_group = 64, nullable_cost = 4 };
struct repetition_level {
    double sum;           /* the copies counted so far in this group */
    int solid;            /* atoms of the current alternative that cannot match empty */
    int empty_branch;     /* an earlier alternative can match empty */
};
struct repetition_count {
    struct repetition_level level[deepest_group];   /* [0] outside any group */
    int depth;
    double last;         /* the atom or group just counted */
    int last_nullable;   /* ...and whether it can match empty */
};

static void count_atom(struct repetition_count *c, double weight, int nullable)
{
    c->last = weight;
    c->last_nullable = nullable;
    c->level[c->depth].sum += weight;
    c->level[c->depth].solid += !nullable;
}

/* A quantifier that allows zero copies (?, *, {0,m}) follows the last atom. */
static void count_optional(struct repetition_count *c)
{
    if (!c->last_nullable && c->level[c->depth].solid > 0) {
        c->last_nullable = 1;
        c->level[c->depth].solid--;
    }
}

/* A '|': a node of its own; the alternative after it starts empty. */
static void count_alternative(struct repetition_count *c)
{
    struct repetition_level *l = &c->level[c->depth];
    l->sum += 1;
    l->empty_branch |= l->solid <= 0;
    l->solid = 0;
}

static int count_open(struct repetition_count *c)
{
    if (c->depth + 1 >= deepest_group)
        return -1;
    c->level[++c->depth] = (struct repetition_level){0};
    return 0;
}

static void count_close(struct repetition_count *c)
{
    if (c->depth == 0) {   /* an unmatched ')' is a literal */
        count_atom(c, 1, 0);
        return;
    }
    /* the group's own nodes count too: an empty one is not free */
    struct repetition_level group = c->level[c->depth--];
    count_atom(c, group.sum + 1, group.empty_branch || group.solid <= 0);
}

static int count_repeat(struct repetition_count *c, unsigned long least, unsigned long most)
{
    double cost = c->last * (c->last_nullable ? nullable_cost : 1);
    c->level[c->depth].sum += cost * (double)most;
    c->last = cost * ((double)most + 1);
    if (least == 0)
        count_optional(c);
    double total = 0;
    for (int d = 0; d <= c->depth; d++)
        total += c->level[d].sum;
    return total > most_copies ? -1 : 0;
}

char *pattern_to_ere(const char *pattern, int *ignore_case, const char **error)
{
    char *ere = malloc(strlen(pattern) * sizeof any_character + 16);
    if (!ere) {
        *error = "out of memory";
        return NULL;
    }
    char *o = ere;
    const char *p = pattern;
    /* after_quantifier: 1 right after one, 2 after its lazy '?' or possessive '+' */
    int after_quantifier = 0, widen_dots = !has_back_reference(pattern);
    /* regcomp copies an atom under {n,m} m times, and its memory grows with the
     * square of the copies (a{2,5000} takes 200 MB, a{2,17778} 2.5 GB): the
     * copies are counted, summed over an atom's neighbours and multiplied by
     * the groups around it, and bounded. */
    struct repetition_count count = {0};
    if (strncmp(p, "(?i)", 4) == 0) {
        *ignore_case = 1;
        p += 4;
    }
    while (*p) {
        char c = *p;
        int quantifier = 0, matches_empty = 0;
        if (after_quantifier == 1 && (c == '?' || c == '+')) {
            p++;   /* lazy or possessive: the same lines match */
            after_quantifier = 2;
            continue;
        }
        if (after_quantifier && (c == '*' || c == '+' || c == '?' || (c == '{' && interval_at(p)))) {
            *error = "a quantifier follows another (such as a** or a+{2})";
            goto fail;
        }
        if (c == '\\' && p[1]) {
            char e = p[1];
            p += 2;
            if (e == 'd' || e == 'D') {
                put(&o, e == 'd' ? "[0-9]" : "[^0-9]");
            } else if (strchr("wWsSbB<>`'", e) || (e >= '1' && e <= '9')) {
                *o++ = '\\';
                *o++ = e;
                matches_empty = strchr("bB<>`'", e) || isdigit((unsigned char)e);   /* an anchor, or a back-reference to an empty group */
            } else if (e == 'A') {
                *o++ = '^';
                matches_empty = 1;
            } else if (e == 'z' || e == 'Z') {
                *o++ = '$';
                matches_empty = 1;
            } else if (e == 'x') {
                int value = hex_escape(&p);
                if (value < 0) {
                    *error = "\\x needs one or two hex digits (\\x41 or \\x{41})";
                    goto fail;
                }
                put_literal(&o, (unsigned char)value);
            } else if (e == 'n') {
                *error = "a match never spans lines, so \\n is not supported; use $ for the end of a line";
                goto fail;
            } else if (control_escape(e) >= 0) {
                *o++ = (char)control_escape(e);
            } else if (isalnum((unsigned char)e)) {
                *error = unsupported(e);
                goto fail;
            } else {
                put_literal(&o, (unsigned char)e);
            }
        } else if (c == '[') {
            p++;
            if (translate_bracket(&p, &o, error) < 0)
                goto fail;
        } else if (c == '(' && p[1] == '?') {
            if (p[2] != ':') {
                *error = "(?...) groups (lookaround, named groups, flags other than a leading (?i)) are not supported";
                goto fail;
            }
            *o++ = '(';
            p += 3;
        } else if (c == '{') {
            if (interval_at(p)) {
                const char *comma = strchr(p, ',');
                unsigned long least = strtoul(p + 1, NULL, 10), upper = 0;
                if (comma && comma < strchr(p, '}'))
                    upper = strtoul(comma + 1, NULL, 10);
                if (count_repeat(&count, least, upper > least ? upper : least) < 0) {
                    *error = "the pattern's {n,m} repetitions are too large (at most 2000 copies in all; copies of a part that can match nothing count four times)";
                    goto fail;
                }
                while (*p != '}')
                    *o++ = *p++;
                *o++ = *p++;
                quantifier = 1;
            } else {
                put(&o, "\\{");
                p++;
            }
        } else if (c == '.' && widen_dots && p[1] != '*' && p[1] != '+') {
            put(&o, any_character);   /* ".*" and ".+" take whole characters already */
            p++;
        } else {
            quantifier = c == '*' || c == '+' || c == '?';
            matches_empty = c == '^' || c == '$';
            *o++ = c;
            p++;
        }
        if (quantifier && c != '{') {
            if (c != '+')
                count_optional(&count);
        } else if (!quantifier) {
            if (c == '(') {
                if (count_open(&count) < 0) {
                    *error = "groups are nested too deeply (at most 63)";
                    goto fail;
                }
            } else if (c == ')') {
                count_close(&count);
            } else if (c == '|') {
                count_alternative(&count);
            } else {
                /* a widened '.' is a group of four */
                count_atom(&count, c == '.' ? 4 : 1, matches_empty);
            }
        }
        after_quantifier = quantifier;
    }
    *o = '\0';
    return ere;
fail:
    free(ere);
    return NULL;
}

/* Past the bracket expression at p (at its '['). */
static const char *skip_bracket(const char *p)
{
    p++;
    if (*p == '^')
        p++;
    if (*p == ']')
        p++;
    while (*p && *p != ']') {
        if (p[0] == '[' && (p[1] == ':' || p[1] == '.' || p[1] == '=')) {
            char close[3] = { p[1], ']', 0 };
            const char *end = strstr(p + 2, close);
            p = end ? end + 2 : p + 1;
        } else {
            p++;
        }
    }
    return *p ? p + 1 : p;
}

/* Past the group at p (at its '('). */
static const char *skip_group(const char *p)
{
    int depth = 0;
    while (*p) {
        if (*p == '\\' && p[1]) {
            p += 2;
            continue;
        }
        if (*p == '[') {
            p = skip_bracket(p);
            continue;
        }
        if (*p == '(')
            depth++;
        else if (*p == ')' && --depth == 0)
            return p + 1;
        p++;
    }
    return p;
}

size_t pattern_required_literal(const char *ere, char *out)
{
    out[0] = '\0';
    /* An alternation anywhere: no single literal is required. */
    for (const char *p = ere; *p;) {
        if (*p == '\\' && p[1])
            p += 2;
        else if (*p == '[')
            p = skip_bracket(p);
        else if (*p++ == '|')
            return 0;
    }
    size_t best = 0, run = 0;
    char *current = malloc(strlen(ere) + 1);
    if (!current)
        return 0;
    const char *p = ere;
    for (;;) {
        int literal = -1;
        const char *next;
        if (*p == '\\' && p[1]) {
            if (!isalnum((unsigned char)p[1]) && p[1] != '<' && p[1] != '>' && p[1] != '`' && p[1] != '\'')
                literal = (unsigned char)p[1];
            next = p + 2;
        } else if (*p == '[') {
            next = skip_bracket(p);
        } else if (*p == '(') {
            next = skip_group(p);
        } else if (*p && !strchr(".^$*+?{})", *p)) {
            literal = (unsigned char)*p;
            next = p + 1;
        } else {
            next = *p ? p + 1 : p;
        }
        /* quantifiers after the atom (stacked ones too: "a+?" is "(a+)?"):
         * '+' alone keeps it once, any other may drop it */
        int quantified = 0, optional = 0;
        const char *after = next;
        while (*after == '*' || *after == '+' || *after == '?' || *after == '{') {
            quantified = 1;
            optional |= *after != '+';
            if (*after == '{') {
                while (*after && *after != '}')
                    after++;
                if (*after)
                    after++;
            } else {
                after++;
            }
        }
        if (literal >= 0 && !optional)
            current[run++] = (char)literal;
        if (literal < 0 || quantified || !*p) {
            if (run > best) {
                memcpy(out, current, run);
                best = run;
            }
            run = 0;
        }
        if (!*p)
            break;
        p = after;
    }
    free(current);
    out[best] = '\0';
    return best;
}
