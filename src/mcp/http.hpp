// Streamable HTTP: MCP over HTTP/1.1 (Beast), both protocol eras.
//   2025-03-26 … 2025-11-25: sessions (Mcp-Session-Id), POST answered with JSON
//   or an SSE stream (a tool call's progress streams while it runs), DELETE.
//   2026-07-28: stateless POSTs carrying their version in headers and _meta.
// Every request is authenticated into a principal; Host and Origin are checked;
// sizes, connections and time are bounded.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "mcp/session.hpp"
#include "mcp/tool.hpp"

namespace cubicle::auth {
class Quotas;
}

namespace cubicle::mcp {

struct HttpSettings {
    std::string host = "127.0.0.1";
    unsigned short port = 8080;
    int listen_fd = -1;  // a listening socket to adopt (systemd socket activation) instead of binding host:port
    std::string path = "/mcp";
    std::vector<std::string> allow_origins;  // beyond the server's own
    std::vector<std::string> allow_hosts;    // Host names beyond the bound one
    std::size_t max_body_bytes = 64u << 20;
    std::size_t max_header_bytes = 16u << 10;
    std::size_t max_connections = 4096;
    std::size_t max_sessions = 10000;
    std::chrono::seconds header_timeout{10};
    std::chrono::seconds idle_timeout{120};
    std::chrono::seconds session_idle{3600};
    std::chrono::seconds drain{10};
    std::string tls_cert;  // PEM files; both empty: plain HTTP
    std::string tls_key;
    std::string resource_metadata;  // RFC 9728 document; empty: not served
};

// Who may call: `authenticate` maps an Authorization header to a principal.
// Without it every caller is the same anonymous principal.
struct HttpAuth {
    std::function<std::optional<std::string>(std::string_view authorization)> authenticate;
    std::string challenge;  // WWW-Authenticate of a 401
};

// Counters for /metrics, shared by the server and the tool wrapper.
struct Metrics {
    std::uint64_t tool_calls = 0;
    std::uint64_t tool_errors = 0;
    std::uint64_t quota_refusals = 0;
    double tool_seconds = 0;
    static constexpr double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    std::uint64_t latency_buckets[std::size(latency_bounds)] = {};
};

// Wraps each tool's handler with the per-principal rate and execution limits
// (refusals are tool errors) and counts calls and latencies.
std::vector<Tool> metered_tools(std::vector<Tool> tools, std::shared_ptr<auth::Quotas> quotas, std::shared_ptr<Metrics> metrics);

// A byte stream to a program's port: what {path}/preview/{sandbox_id}/{port}/
// proxies to. The tools wire it to a sandbox's exposed port (mcp/ knows no sandboxes).
class PreviewStream {
public:
    virtual ~PreviewStream() = default;
    // At least one byte; 0 at the program's end.
    virtual boost::asio::awaitable<std::size_t> read_some(char* data, std::size_t size) = 0;
    // False once the stream broke.
    virtual boost::asio::awaitable<bool> write(std::string_view data) = 0;
};
// `principal`'s exposed port, connected; nullptr when there is no such preview of
// theirs (404, like any unknown path); throws when nothing answers there (502).
using PreviewOpener = std::function<boost::asio::awaitable<std::unique_ptr<PreviewStream>>(
    std::string principal, std::string sandbox_id, unsigned short port)>;

class HttpServer {
public:
    using SessionFactory = std::function<std::unique_ptr<Session>()>;

    HttpServer(boost::asio::any_io_executor executor, HttpSettings settings, SessionFactory make_session, HttpAuth auth,
               std::shared_ptr<Metrics> metrics, std::function<std::string()> more_metrics);
    ~HttpServer();

    // Serves previews under {path}/preview/ (set before start).
    void set_preview(PreviewOpener opener);
    // Binds and starts accepting. Throws std::runtime_error when it cannot.
    void start();
    unsigned short port() const;
    // Serves one already-connected stream socket as if it had been accepted
    // (takes ownership of `fd`). The HTTP fuzz target feeds one end of a socketpair.
    void serve_connected(int fd);
    // Stops accepting, lets running calls finish for `drain`, cancels the
    // rest, closes every connection and stream.
    boost::asio::awaitable<void> shutdown();

private:
    struct Impl;
    std::shared_ptr<Impl> impl_;
};

// Whether `host` names only this machine (a loopback address or localhost).
bool is_loopback_host(std::string_view host);

} // namespace cubicle::mcp
