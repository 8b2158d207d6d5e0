/* libFuzzer target: the agent's side of the wire protocol (src/agent/wire.c),
 * fed a byte stream from the server the way agent.c's read loop splits it:
 * frame headers, then RUN/OPEN payloads parsed into a run request, and the
 * numbers of stream frames (CONNECT's port, WINDOW's credit). */
#include <stdlib.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    size_t off = 0;
    struct frame_header h;

    while (size - off >= CUBICLE_FRAME_HEADER_SIZE) {
        if (wire_get_header(data + off, &h))
            return 0;   /* the agent stops reading here */
        if (size - off - CUBICLE_FRAME_HEADER_SIZE < h.len)
            return 0;   /* incomplete frame: the agent waits for more */
        if (h.type == CUBICLE_FRAME_RUN || h.type == CUBICLE_FRAME_OPEN) {
            /* an exact-size copy so that any read past the payload is caught */
            char *payload = malloc(h.len ? h.len : 1);
            if (!payload)
                abort();
            memcpy(payload, data + off + CUBICLE_FRAME_HEADER_SIZE, h.len);
            struct run_req r;
            const char *bad = wire_parse_run(payload, h.len, &r);
            if (!bad) {
                /* what the agent relies on before it execs */
                if (!r.argv || !r.argv[0] || !r.argv[0][0] || !r.env || r.env[r.envc] ||
                    r.in + r.in_len != payload + h.len)
                    abort();
                for (size_t i = 0; i < r.envc; i++)
                    if (r.env[i][0] == '=' || !strchr(r.env[i], '='))
                        abort();
            }
            wire_free_run(&r);
            free(payload);
        } else if (h.type == CUBICLE_FRAME_CONNECT || h.type == CUBICLE_FRAME_WINDOW) {
            unsigned char *payload = malloc(h.len ? h.len : 1);
            uint64_t value = 0;
            if (!payload)
                abort();
            memcpy(payload, data + off + CUBICLE_FRAME_HEADER_SIZE, h.len);
            uint64_t max = h.type == CUBICLE_FRAME_CONNECT ? 65535 : CUBICLE_STREAM_WINDOW;
            if (wire_parse_decimal(payload, h.len, max, &value) == 0 && value > max)
                abort();
            free(payload);
        }
        off += CUBICLE_FRAME_HEADER_SIZE + h.len;
    }
    return 0;
}
