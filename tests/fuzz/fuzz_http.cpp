// libFuzzer target: the streamable HTTP server (mcp::HttpServer) reading one
// client's bytes: Beast's request parser with the server's limits, the Host
// and Origin checks, bearer-token authentication, session ids, both protocol
// eras' header rules and the MCP dispatch behind them, pipelined requests.
// No network: the input is written into one end of a socketpair whose other
// end the server serves as an accepted connection. Checks that what comes
// back is a sequence of well-formed HTTP/1.1 responses and that the server
// holds no connection, exchange or call once the client is gone.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <simdjson.h>

#include "auth/authenticator.hpp"
#include "auth/quotas.hpp"
#include "common/errors.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "mcp/http.hpp"
#include "mcp/session.hpp"
#include "mcp/tool.hpp"
#include "fuzz_tools.hpp"

namespace asio = boost::asio;
namespace http = boost::beast::http;
using namespace cubicle;
using namespace cubicle::mcp;

namespace {

// Two principals with static tokens ("Bearer token-alice-0123456789", "Bearer token-bob-0123456789ab").
std::unique_ptr<auth::Authenticator> make_authenticator() {
    char path[] = "/tmp/cubicle-fuzz-http-tokens.XXXXXX";
    int fd = ::mkstemp(path);
    if (fd < 0) std::abort();
    std::string_view tokens = "alice token-alice-0123456789\nbob token-bob-0123456789ab\n";
    if (::write(fd, tokens.data(), tokens.size()) != static_cast<ssize_t>(tokens.size())) std::abort();
    ::close(fd);
    auto authenticator = std::make_unique<auth::Authenticator>(auth::AuthSettings{.tokens_file = path});
    ::unlink(path);
    return authenticator;
}

const auth::Authenticator& authenticator() {
    static const auto instance = make_authenticator();
    return *instance;
}

// What the server wrote must be whole responses, one after another.
void check_responses(std::string_view bytes) {
    boost::beast::error_code ec;
    while (!bytes.empty()) {
        http::response_parser<http::string_body> parser;
        parser.eager(true);
        parser.body_limit(1u << 30);
        auto used = parser.put(asio::buffer(bytes.data(), bytes.size()), ec);
        // Never a torn header. A body may end early only in the last response:
        // an SSE stream the server stopped because the client half-closed (a
        // client that leaves cancels its call).
        if (ec == http::error::need_more && !parser.is_header_done()) std::abort();
        if (ec == http::error::need_more) return;
        if (ec || !parser.is_done()) std::abort();
        auto status = parser.get().result_int();
        if (status < 100 || status > 599) std::abort();
        bytes.remove_prefix(used);
    }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    log::set_stderr_level(log::Level::error);
    authenticator();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    asio::io_context io;
    auto metrics = std::make_shared<Metrics>();
    auto quotas = std::make_shared<auth::Quotas>(auth::QuotaSettings{1000000, 1000});
    auto metered = metered_tools(fuzz::tools(), quotas, metrics);
    auto make_session = [&io, metered] {
        auto session = std::make_unique<Session>(io.get_executor(), ServerInfo{"cubicle-fuzz", "0", "fuzzing"}, metered, [](std::string) {});
        session->set_forward_logs(false);
        return session;
    };
    HttpAuth auth{.authenticate = [](std::string_view header) { return authenticator().authenticate(header); },
                  .challenge = authenticator().challenge()};
    HttpSettings settings{.host = "127.0.0.1",
                          .port = 0,
                          .allow_origins = {"https://app.example"},
                          .max_body_bytes = 1u << 16,
                          .max_header_bytes = 4096,
                          .resource_metadata = R"({"resource":"http://127.0.0.1/mcp"})"};
    HttpServer server(io.get_executor(), settings, make_session, auth, metrics, [] { return std::string("cubicle_fuzz 1\n"); });
    server.start();  // binds 127.0.0.1:0; nothing connects to it

    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) std::abort();
    ::fcntl(pair[1], F_SETFL, O_NONBLOCK);
    server.serve_connected(pair[0]);

    std::string_view input(reinterpret_cast<const char*>(data), size);
    std::string output;
    bool shut = false, closed = false;
    char buffer[65536];
    // Bounded: every request is answered at once (the tools never wait), and
    // EOF after the input ends the connection.
    for (int round = 0; round < 100000 && !closed; ++round) {
        if (!input.empty()) {
            auto n = ::send(pair[1], input.data(), input.size(), MSG_NOSIGNAL);
            if (n > 0) input.remove_prefix(static_cast<std::size_t>(n));
            else if (errno != EAGAIN && errno != EWOULDBLOCK) input = {};  // the server closed: it read enough
        }
        if (input.empty() && !shut) {
            ::shutdown(pair[1], SHUT_WR);
            shut = true;
        }
        io.restart();
        if (io.poll() == 0) io.run_one_for(std::chrono::milliseconds(1));
        for (;;) {
            auto n = ::recv(pair[1], buffer, sizeof buffer, 0);
            if (n > 0) {
                output.append(buffer, static_cast<std::size_t>(n));
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
            break;
        }
    }
    if (!closed) std::abort();  // the server never finished with a client that had left
    ::close(pair[1]);
    check_responses(output);

    bool done = false;
    asio::co_spawn(io, server.shutdown(), [&](std::exception_ptr e) {
        if (e) std::abort();
        done = true;
    });
    io.restart();
    io.run();
    if (!done) std::abort();
    return 0;
}
