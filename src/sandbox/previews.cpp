#include "sandbox/previews.hpp"

#include <optional>
#include <set>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "mcp/preview_http.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::sandbox {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using http_request_parser = boost::beast::http::request_parser<boost::beast::http::empty_body>;
using namespace asio::experimental::awaitable_operators;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// Acknowledging at once (set again after every read: the kernel clears it) keeps a client
// that writes a request in two pieces from waiting out a delayed ACK under Nagle's rule.
using quick_ack = asio::detail::socket_option::boolean<IPPROTO_TCP, TCP_QUICKACK>;
constexpr std::size_t relay_buffer = CUBICLE_STREAM_CHUNK;
// How long a client may take to send its first request's head.
constexpr auto first_head_timeout = std::chrono::seconds(30);
// Connections at once per exposed port; the agent holds a socket for each.
constexpr std::size_t max_connections = 256;
// How long a refused client may take to read its 502 before the socket closes.
constexpr auto refusal_linger = std::chrono::seconds(2);

void log_failure(std::exception_ptr e) {
    if (!e) return;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& error) {
        log::warning("port relay: {}", error.what());
    }
}

} // namespace

// One client connection and the stream it is relayed to.
namespace {
struct Connection {
    explicit Connection(tcp::socket s) : socket(std::move(s)) {}
    tcp::socket socket;
    std::shared_ptr<AgentStream> stream;
    bool closed = false;
    void close() {
        closed = true;
        boost::system::error_code ec;
        socket.close(ec);
        if (stream) stream->abort("the port was closed");
    }
};

} // namespace

struct Previews::Listener {
    explicit Listener(asio::any_io_executor executor) : acceptor(executor) {}
    tcp::acceptor acceptor;
    unsigned short port = 0;
    std::weak_ptr<Sandbox> box;
    std::set<std::shared_ptr<Connection>> connections;
    bool closed = false;
    void close() {
        closed = true;
        boost::system::error_code ec;
        acceptor.close(ec);
        auto open = std::move(connections);
        connections.clear();
        for (const auto& connection : open) connection->close();
    }
};

namespace {

// Client → program, until the client's end (passed on as a half-close).
asio::awaitable<void> upstream(std::shared_ptr<Connection> connection, std::string already_read) {
    if (!co_await connection->stream->write(already_read)) co_return;
    std::string buffer(relay_buffer, '\0');
    for (;;) {
        auto [ec, n] = co_await connection->socket.async_read_some(asio::buffer(buffer), use_tuple);
        if (ec == asio::error::eof) {
            connection->stream->shutdown_write();
            co_return;
        }
        if (ec) {
            connection->stream->abort("the client's connection broke");
            co_return;
        }
        boost::system::error_code ignored;
        connection->socket.set_option(quick_ack(true), ignored);
        bool written = co_await connection->stream->write(std::string_view(buffer.data(), n));
        if (!written) co_return;
    }
}

// Program → client, until the program's end; a broken stream breaks the connection.
asio::awaitable<void> downstream(std::shared_ptr<Connection> connection) {
    std::string buffer(relay_buffer, '\0');
    boost::system::error_code ignored;
    for (;;) {
        std::size_t n = co_await connection->stream->read_some(buffer.data(), buffer.size());
        if (n == 0) {
            if (connection->stream->error().empty()) {
                connection->socket.shutdown(tcp::socket::shutdown_send, ignored);
            } else {
                connection->socket.close(ignored);
            }
            co_return;
        }
        auto [ec, written] = co_await asio::async_write(connection->socket, asio::buffer(buffer.data(), n), use_tuple);
        if (ec) {
            connection->stream->abort("the client went away");
            co_return;
        }
    }
}

// A short answer the client can read before the socket closes.
asio::awaitable<void> answer_and_close(std::shared_ptr<Connection> connection, std::string status, std::string body) {
    auto response = fmt::format("HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
                                status, body.size(), body);
    co_await asio::async_write(connection->socket, asio::buffer(response), use_tuple);
    boost::system::error_code ignored;
    connection->socket.shutdown(tcp::socket::shutdown_send, ignored);
    // Read what the client still sends: closing with unread bytes would reset the
    // connection and could discard the answer before the client read it.
    asio::steady_timer linger(connection->socket.get_executor());
    linger.expires_after(refusal_linger);
    std::string sink(4096, '\0');
    for (;;) {
        auto outcome = co_await (connection->socket.async_read_some(asio::buffer(sink), use_tuple) || linger.async_wait(use_tuple));
        if (outcome.index() == 1 || std::get<0>(std::get<0>(outcome))) break;
    }
    connection->socket.close(ignored);
}

// Nothing to relay to: a short 502 the client can read before the socket closes.
asio::awaitable<void> refuse(std::shared_ptr<Connection> connection, std::string why) {
    co_await answer_and_close(connection, "502 Bad Gateway", mcp::preview_unreachable(why));
}

// Whether the client's first bytes start an HTTP request line ("GET /"): yes, no,
// or not known yet. Browsers (a DNS-rebinding page) speak nothing else.
std::optional<bool> starts_http_request(std::string_view bytes) {
    constexpr std::size_t longest_method = 20;
    for (std::size_t i = 0; i < bytes.size() && i <= longest_method; ++i) {
        if (bytes[i] == ' ') return i > 0;
        if (bytes[i] < 'A' || bytes[i] > 'Z') return false;
    }
    if (bytes.size() > longest_method) return false;
    return std::nullopt;
}

// What the client sent first, read before anything is relayed: an HTTP request
// whole up to its head's end, whose Host must name this listener (DNS
// rebinding); any other protocol as its first bytes. Empty (refused) when the
// client sent nothing in time, or an HTTP head too long, broken or for another Host.
asio::awaitable<std::string> first_bytes(std::shared_ptr<Connection> connection, unsigned short host_port) {
    asio::steady_timer deadline(connection->socket.get_executor());
    deadline.expires_after(first_head_timeout);
    std::string head;
    std::string buffer(4096, '\0');
    for (;;) {
        auto http = starts_http_request(head);
        if (http && !*http) co_return head;
        if (http && head.find("\r\n\r\n") != std::string::npos) break;
        if (head.size() > mcp::preview_head_limit) co_return std::string();
        auto outcome = co_await (connection->socket.async_read_some(asio::buffer(buffer), use_tuple) || deadline.async_wait(use_tuple));
        if (outcome.index() == 1) co_return std::string();
        auto [ec, n] = std::get<0>(outcome);
        if (ec) co_return std::string();
        head.append(buffer.data(), n);
    }
    http_request_parser parser;
    parser.header_limit(static_cast<std::uint32_t>(mcp::preview_head_limit));
    parser.eager(false);
    parser.body_limit(boost::none);  // only the head is read here
    boost::beast::error_code ec;
    parser.put(asio::buffer(head), ec);
    if (!parser.is_header_done() || !mcp::preview_host_allowed(parser.get()[boost::beast::http::field::host], host_port)) {
        co_return std::string();
    }
    co_return head;
}

asio::awaitable<void> relay(std::shared_ptr<Previews::Listener> listener, std::shared_ptr<Connection> connection) {
    std::shared_ptr<AgentStream> stream;
    std::string refusal = "the sandbox stopped";
    boost::system::error_code closed;
    auto head = co_await first_bytes(connection, listener->acceptor.local_endpoint(closed).port());
    if (head.empty()) {
        if (!connection->closed) {
            co_await answer_and_close(connection, "421 Misdirected Request",
                                      "cubicle: a preview answers requests whose Host is 127.0.0.1:PORT or localhost:PORT\n");
        }
        listener->connections.erase(connection);
        co_return;
    }
    if (auto box = listener->box.lock()) {
        try {
            stream = co_await box->open_stream(listener->port);
        } catch (const ToolError& e) {
            refusal = e.what();
        }
    }
    if (!connection->closed) {
        if (!stream) {
            co_await refuse(connection, refusal);
        } else {
            connection->stream = stream;
            co_await (upstream(connection, std::move(head)) && downstream(connection));
            connection->close();
        }
    }
    listener->connections.erase(connection);
}

asio::awaitable<void> accept_loop(std::shared_ptr<Previews::Listener> listener) {
    auto executor = co_await asio::this_coro::executor;
    while (!listener->closed) {
        auto [ec, socket] = co_await listener->acceptor.async_accept(use_tuple);
        if (listener->closed) co_return;
        if (ec) {  // out of descriptors, say: try again shortly
            asio::steady_timer pause(executor, std::chrono::milliseconds(100));
            co_await pause.async_wait(use_tuple);
            continue;
        }
        if (listener->connections.size() >= max_connections) continue;  // the socket closes as it goes
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto connection = std::make_shared<Connection>(std::move(socket));
        listener->connections.insert(connection);
        asio::co_spawn(executor, relay(listener, connection), log_failure);
    }
}

} // namespace

Previews::~Previews() { close_all(); }

unsigned short Previews::expose(std::weak_ptr<Sandbox> box, unsigned short port, std::size_t limit, bool listen) {
    if (auto it = listeners_.find(port); it != listeners_.end()) return exposed()[port];
    if (listeners_.size() >= limit) {
        std::string ports;
        for (const auto& [exposed, listener] : listeners_) ports += (ports.empty() ? "" : ", ") + std::to_string(exposed);
        throw ToolError(fmt::format("this sandbox already exposes its maximum of {} ports ({}); close one with unexpose_port first",
                                    limit, ports));
    }
    auto listener = std::make_shared<Listener>(executor_);
    listener->port = port;
    listener->box = std::move(box);
    if (!listen) {
        listeners_[port] = listener;
        return 0;
    }
    boost::system::error_code ec;
    // Loopback only, never 0.0.0.0: other machines must not reach a sandbox's servers.
    tcp::endpoint endpoint(asio::ip::address_v4::loopback(), 0);
    listener->acceptor.open(endpoint.protocol(), ec);
    if (!ec) listener->acceptor.bind(endpoint, ec);
    if (!ec) listener->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw ToolError(fmt::format("cannot listen on the host's loopback for port {}: {}", port, ec.message()));
    listeners_[port] = listener;
    asio::co_spawn(executor_, accept_loop(listener), log_failure);
    return listener->acceptor.local_endpoint().port();
}

bool Previews::unexpose(unsigned short port) {
    auto it = listeners_.find(port);
    if (it == listeners_.end()) return false;
    it->second->close();
    listeners_.erase(it);
    return true;
}

std::map<unsigned short, unsigned short> Previews::exposed() const {
    std::map<unsigned short, unsigned short> ports;
    boost::system::error_code ec;
    for (const auto& [port, listener] : listeners_) {
        ports[port] = listener->acceptor.is_open() ? listener->acceptor.local_endpoint(ec).port() : 0;
    }
    return ports;
}

void Previews::close_all() {
    auto listeners = std::move(listeners_);
    listeners_.clear();
    for (auto& [port, listener] : listeners) listener->close();
}

} // namespace cubicle::sandbox
