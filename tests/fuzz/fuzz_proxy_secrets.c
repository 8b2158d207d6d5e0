/* libFuzzer target: the egress proxy's secret injection (src/agent/proxy_secrets.c),
 * given request heads as proxy.c and proxy_tls.c hand them over (up to the first
 * empty line, at most HEAD_MAX bytes) for a sandbox holding a header secret.  The first input byte picks the host: one of the secrets' or another.
 * Whatever the head, the rewrite keeps a head (ends in the empty line, fits), never
 * leaves a placeholder on the secrets' host unflagged, names the secret exactly when it
 * put the value in, puts it only in the declared header and never anywhere else. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy_secrets.h"

#define HEAD_MAX (16 * 1024)
#define CAP      (HEAD_MAX + 40 * 1024)

static const char placeholder[] = "cubicle-secret-KEY-0123456789abcdef0123456789abcdef";
static const char value[] = "VALUE-of-the-secret";

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static int ready;
    static char head[CAP];
    if (!ready) {
        /* Authorization: Bearer VALUE-of-the-secret, for api.example:443 (hex as the server sends it) */
        if (secrets_command("secret 10.0.0.2 KEY cubicle-secret-KEY-0123456789abcdef0123456789abcdef "
                            "api.example:443 header 417574686f72697a6174696f6e 56414c55452d6f662d7468652d736563726574 "
                            "4265617265722056414c55452d6f662d7468652d736563726574"))
            abort();
        ready = 1;
    }
    if (size < 1)
        return 0;
    int mine = data[0] & 1;
    data++;
    size--;
    const unsigned char *end = memmem(data, size, "\r\n\r\n", 4);
    if (!end || (size_t)(end + 4 - data) > HEAD_MAX || memmem(data, size, value, sizeof value - 1))
        return 0;
    size_t len = (size_t)(end + 4 - data);
    memcpy(head, data, len);
    char injected[256], flagged[256];
    int had = memmem(head, len, placeholder, sizeof placeholder - 1) != NULL;
    if (secrets_rewrite("10.0.0.2", mine ? "api.example" : "other.example", 443, 1, head, &len, sizeof head, injected,
                        sizeof injected, flagged, sizeof flagged))
        return 0;
    if (len < 4 || len > sizeof head || memcmp(head + len - 4, "\r\n\r\n", 4))
        abort();
    int has_value = memmem(head, len, value, sizeof value - 1) != NULL;
    int has_placeholder = memmem(head, len, placeholder, sizeof placeholder - 1) != NULL;
    /* on the secret's host the value goes only into the Authorization header; a placeholder
     * left anywhere else is flagged */
    if (mine && (has_value != !strcmp(injected, "KEY") || (has_placeholder && strcmp(flagged, "KEY"))))
        abort();
    for (const char *v = head; mine && (v = memmem(v, len - (size_t)(v - head), value, sizeof value - 1)); v++) {
        const char *ls = v;
        while (ls > head && ls[-1] != '\n')
            ls--;
        if (ls == head || strncasecmp(ls, "Authorization:", 14))
            abort();
    }
    if (!mine && (has_value || injected[0] || (had && strcmp(flagged, "KEY")) || has_placeholder != had))
        abort();
    return 0;
}
