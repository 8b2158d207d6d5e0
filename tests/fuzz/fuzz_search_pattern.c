/* libFuzzer target: what search_files' agent code makes of untrusted text
 * (src/agent/pattern.c, src/agent/ignore.c).  The input up to its first NUL
 * is a search pattern: translated, compiled with regcomp exactly as search.c
 * does, its required literal taken; the rest is a .gitignore file, parsed and
 * matched against a few paths. */
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "ignore.h"
#include "pattern.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    const unsigned char *nul = memchr(data, '\0', size);
    size_t pattern_len = nul ? (size_t)(nul - data) : size;
    char *pattern = malloc(pattern_len + 1);
    if (!pattern)
        abort();
    memcpy(pattern, data, pattern_len);
    pattern[pattern_len] = '\0';

    int ignore_case = 0;
    const char *error = NULL;
    char *ere = pattern_to_ere(pattern, &ignore_case, &error);
    if (!ere && !error)
        abort();
    if (ere) {
        char *literal = malloc(strlen(ere) + 1);
        if (!literal)
            abort();
        size_t len = pattern_required_literal(ere, literal);
        if (len > strlen(ere) || strlen(literal) > len)
            abort();
        regex_t re;
        if (regcomp(&re, ere, REG_EXTENDED | REG_NEWLINE | (ignore_case ? REG_ICASE : 0)) == 0) {
            /* a line the pattern matches must contain the literal */
            if (regexec(&re, pattern, 0, NULL, 0) == 0 && len && !ignore_case && !strchr(pattern, '\n') &&
                !strstr(pattern, literal))
                abort();
            regfree(&re);
        }
        free(literal);
        free(ere);
    }
    free(pattern);

    if (nul) {
        struct ignore_list list;
        if (ignore_parse(&list, (const char *)nul + 1, size - pattern_len - 1) == 0) {
            static const char *const paths[] = { "a", "src/a.c", "a/b/c/d.log", "[x]", "build", ".hidden/x" };
            for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
                int verdict = ignore_match(&list, paths[i], (int)(i & 1));
                if (verdict < -1 || verdict > 1)
                    abort();
            }
        }
        ignore_free(&list);
    }
    return 0;
}
