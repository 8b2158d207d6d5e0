// HTTP as a port preview speaks it, defined once: the path that reaches a
// sandbox's port over the HTTP transport, the answer when the port cannot be
// reached, and the program's response head made safe to serve from the
// server's own origin (or from a loopback listener).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cubicle::mcp {

// "{http_path}/preview/{sandbox_id}/{port}/" and its parts back from what follows "/preview/".
std::string preview_path(std::string_view http_path, std::string_view sandbox_id, unsigned port);
struct PreviewTarget {
    std::string sandbox_id;
    unsigned short port = 0;
    std::string rest;  // the program's target, "/" at least
};
std::optional<PreviewTarget> parse_preview_target(std::string_view after_preview);

// The 502 body when the sandbox's port cannot be reached.
std::string preview_unreachable(std::string_view why);

// The program's response head, re-emitted: `Content-Security-Policy: sandbox`
// added (the page's origin becomes "null", which the server's Origin check
// refuses), cookies, service-worker scope and hop-by-hop fields removed,
// "Connection: close" forced so nothing after the message can pass for a
// second response.
struct PreviewHead {
    enum class Outcome { need_more, done, malformed } outcome = Outcome::need_more;
    std::string head;                        // when done
    std::size_t consumed = 0;                // bytes of the program's head
    unsigned status = 0;
    std::optional<std::uint64_t> body_bytes;  // what follows the head; none: until the program closes
};
// `bytes` starts with the head; `head_request`: the body is absent whatever the head says.
PreviewHead parse_preview_head(std::string_view bytes, bool head_request);
// Heads are at most this long.
constexpr std::size_t preview_head_limit = 64 * 1024;

// The Host a loopback listener on `port` answers to (DNS rebinding): 127.0.0.1:PORT or localhost:PORT.
bool preview_host_allowed(std::string_view host, unsigned short port);

} // namespace cubicle::mcp
