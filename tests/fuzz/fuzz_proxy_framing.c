/* libFuzzer target: the strict request framing of terminated TLS (src/agent/proxy_framing.c).
 * Whatever the bytes: no crash or overread; an accepted head has one Host line, no Upgrade,
 * no folded line and never both a length and chunked; an accepted chunk size has 1 to 15 hex digits. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy_framing.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size < 1)
        return 0;
    char *buf = malloc(size);   /* exactly size bytes: an overread is caught */
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    if (data[0] & 1) {
        uint64_t n;
        if (!framing_chunk_size(buf, size - 1, &n) && (n >> 60 || memcmp(buf + size - 3, "\r\n", 2)))
            abort();
    } else {
        struct request_framing f;
        if (!framing_check_head(buf, size - 1, "api.example", 443, &f)) {
            if (f.chunked && f.length)
                abort();
            int hosts = 0;
            for (const char *p = buf; (p = memchr(p, '\n', size - 1 - (size_t)(p - buf))) && p + 1 < buf + size - 1; p++) {
                size_t rest = (size_t)(buf + size - 1 - (p + 1));   /* the buffer has no NUL: compare within it */
                if (p[1] == ' ' || p[1] == '\t' || (rest >= 8 && !strncasecmp(p + 1, "upgrade:", 8)))
                    abort();
                hosts += rest >= 5 && !strncasecmp(p + 1, "host:", 5);
            }
            if (hosts != 1)
                abort();
        }
    }
    free(buf);
    return 0;
}
