#include "mcp/http.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <deque>
#include <map>
#include <sstream>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>

#include "agent/protocol.h"
#include "auth/quotas.hpp"
#include "common/base64.hpp"
#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "mcp/preview_http.hpp"

namespace cubicle::mcp {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
constexpr std::string_view stateless_version = "2026-07-28";
constexpr std::string_view anonymous_principal = "anonymous";
constexpr auto write_timeout = std::chrono::seconds(30);
constexpr auto body_timeout = std::chrono::seconds(60);

// JSON-RPC codes the transport answers with itself.
constexpr int header_mismatch = -32020;
constexpr int unsupported_version = -32022;

std::string rpc_error(int code, std::string_view message, std::string_view data_json = {}) {
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").key("id").null();
    w.key("error").begin_object().field("code", code).field("message", message);
    if (!data_json.empty()) w.key("data").raw(data_json);
    w.end_object().end_object();
    return w.take();
}

bool contains_token(std::string_view list, std::string_view token) {
    // Media ranges in Accept: a substring test is enough to tell json from event-stream.
    return list.find(token) != std::string_view::npos;
}

std::string lower(std::string_view text) {
    std::string out(text);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
}

// "host:port" or "[v6]:port" → host, lower-cased, without brackets.
std::string host_of(std::string_view authority) {
    if (!authority.empty() && authority.front() == '[') {
        auto end = authority.find(']');
        return lower(authority.substr(1, end == authority.npos ? authority.npos : end - 1));
    }
    return lower(authority.substr(0, authority.rfind(':')));
}

// The value of an Mcp-Name header: verbatim, or "=?base64?...?=" for what a header cannot carry.
std::optional<std::string> decode_header_value(std::string_view value) {
    constexpr std::string_view open = "=?base64?", close = "?=";
    if (value.size() < open.size() + close.size() || value.substr(0, open.size()) != open ||
        value.substr(value.size() - close.size()) != close) {
        return std::string(value);
    }
    return base64::decode(value.substr(open.size(), value.size() - open.size() - close.size()));
}

// One POST's answer: the messages the Session sends for it, in order, until it is finished.
struct Exchange {
    explicit Exchange(asio::any_io_executor executor) : wake(executor) {}
    std::deque<std::string> messages;
    bool finished = false;
    asio::steady_timer wake;
    std::shared_ptr<Cancellation> gone = std::make_shared<Cancellation>();

    void push(std::string message) {
        messages.push_back(std::move(message));
        wake.cancel();
    }
    void finish() {
        finished = true;
        wake.cancel();
    }
};

Peer peer_for(const std::shared_ptr<Exchange>& exchange, std::string principal, std::string scope) {
    std::weak_ptr<Exchange> weak = exchange;
    return Peer{.send = [weak](std::string message) {
                    if (auto alive = weak.lock()) alive->push(std::move(message));
                },
                .finished = [weak] {
                    if (auto alive = weak.lock()) alive->finish();
                },
                .principal = std::move(principal),
                .scope = std::move(scope),
                .gone = exchange->gone};
}

asio::awaitable<ToolResult> metered_call(ToolHandler inner, bool execution, std::shared_ptr<auth::Quotas> quotas,
                                         std::shared_ptr<Metrics> metrics, simdjson::dom::element arguments,
                                         std::shared_ptr<RequestContext> context) {
    ++metrics->tool_calls;
    auto refusal = quotas->admit_call(context->principal());
    if (!refusal && execution) refusal = quotas->start_execution(context->principal());
    if (refusal) {
        ++metrics->quota_refusals;
        throw ToolError(*refusal);
    }
    auto started = std::chrono::steady_clock::now();
    std::exception_ptr failure;
    ToolResult result;
    try {
        result = co_await inner(arguments, context);
    } catch (...) {
        failure = std::current_exception();
    }
    if (execution) quotas->end_execution(context->principal());
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    metrics->tool_seconds += seconds;
    for (std::size_t i = 0; i < std::size(Metrics::latency_bounds); ++i) {
        if (seconds <= Metrics::latency_bounds[i]) ++metrics->latency_buckets[i];
    }
    if (failure || result.is_error) ++metrics->tool_errors;
    if (failure) std::rethrow_exception(failure);
    co_return result;
}

void log_failure(std::string_view what, std::exception_ptr e) {
    if (!e) return;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        log::error("{}: {}", what, ex.what());
    }
}

} // namespace

std::vector<Tool> metered_tools(std::vector<Tool> tools, std::shared_ptr<auth::Quotas> quotas, std::shared_ptr<Metrics> metrics) {
    for (auto& tool : tools) {
        bool execution = tool.name == "execute_code" || tool.name == "run_command" || tool.name == "install_package";
        // Not a coroutine itself: it forwards to one, so nothing it captures dangles.
        tool.handler = [inner = std::move(tool.handler), execution, quotas, metrics](simdjson::dom::element arguments,
                                                                                     std::shared_ptr<RequestContext> context) {
            return metered_call(inner, execution, quotas, metrics, arguments, std::move(context));
        };
    }
    return tools;
}

bool is_loopback_host(std::string_view host) {
    auto name = lower(host);
    if (name == "localhost") return true;
    boost::system::error_code ec;
    auto address = asio::ip::make_address(name, ec);
    return !ec && address.is_loopback();
}

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
    struct SessionEntry {
        std::unique_ptr<Session> session;
        std::string principal;
        std::chrono::steady_clock::time_point last_used;
        int exchanges = 0;  // POSTs of it being answered now
    };

    Impl(asio::any_io_executor executor, HttpSettings settings, SessionFactory make_session, HttpAuth auth,
         std::shared_ptr<Metrics> metrics, std::function<std::string()> more_metrics)
        : executor(executor), settings(std::move(settings)), make_session(std::move(make_session)), auth(std::move(auth)),
          metrics(std::move(metrics)), more_metrics(std::move(more_metrics)), acceptor(executor), sweeper(executor) {}

    asio::any_io_executor executor;
    HttpSettings settings;
    SessionFactory make_session;
    HttpAuth auth;
    std::shared_ptr<Metrics> metrics;
    std::function<std::string()> more_metrics;
    tcp::acceptor acceptor;
    std::unique_ptr<ssl::context> tls;
    asio::steady_timer sweeper;
    std::map<std::string, SessionEntry> sessions;
    std::unique_ptr<Session> stateless;  // answers every 2026-07-28 request
    std::uint64_t next_scope = 0;
    std::map<std::uint64_t, beast::tcp_stream*> connections;  // open ones, by number
    std::map<std::uint64_t, bool> busy;                      // connections answering a request now
    std::uint64_t next_connection = 0;
    std::size_t exchanges = 0;
    std::map<unsigned, std::uint64_t> responses;  // by status
    std::uint64_t connections_refused = 0;
    bool stopping = false;
    std::vector<std::string> allowed_hosts;
    std::vector<std::string> allowed_origins;
    PreviewOpener preview;

    void start();
    asio::awaitable<void> accept_loop();
    asio::awaitable<void> sweep_sessions();
    asio::awaitable<void> refuse(tcp::socket socket);
    void serve_plain(tcp::socket socket);
    asio::awaitable<void> serve_tls(tcp::socket socket);
    template <class Stream>
    asio::awaitable<void> serve(Stream& stream);
    template <class Stream>
    asio::awaitable<bool> answer(Stream& stream, Request request);
    template <class Stream>
    asio::awaitable<bool> post(Stream& stream, Request request, std::string principal);
    template <class Stream>
    asio::awaitable<bool> stream_exchange(Stream& stream, Request request, std::shared_ptr<Exchange> exchange, bool sse,
                                          std::string session_id);
    template <class Stream>
    asio::awaitable<bool> send(Stream& stream, Response response);
    template <class Stream>
    asio::awaitable<bool> proxy_preview(Stream& stream, Request request, std::string principal, std::string rest);
    template <class Stream>
    asio::awaitable<void> relay_preview_response(Stream& stream, std::unique_ptr<PreviewStream> upstream, bool head_request,
                                                 unsigned version);
    template <class Stream>
    asio::awaitable<void> client_gone(Stream& stream);
    Response preview_failure(const Request& request, std::string_view why);
    Response make(const Request& request, http::status status, std::string body, std::string_view type = "application/json");
    std::string sse_header(const Request& request, const std::string& session_id);
    std::optional<Response> check_origin(const Request& request);
    std::string metrics_text();
    asio::awaitable<void> retire(std::unique_ptr<Session> session);
};

void HttpServer::Impl::start() {
    boost::system::error_code ec;
    auto address = asio::ip::make_address(settings.host == "localhost" ? "127.0.0.1" : settings.host, ec);
    if (ec) throw std::runtime_error(fmt::format("--host {} is not an IP address", settings.host));
    if (!settings.tls_cert.empty() || !settings.tls_key.empty()) {
        if (settings.tls_cert.empty() || settings.tls_key.empty()) throw std::runtime_error("TLS needs both --tls-cert and --tls-key");
        tls = std::make_unique<ssl::context>(ssl::context::tls_server);
        tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                         ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
        tls->use_certificate_chain_file(settings.tls_cert, ec);
        if (ec) throw std::runtime_error(fmt::format("--tls-cert {}: {}", settings.tls_cert, ec.message()));
        tls->use_private_key_file(settings.tls_key, ssl::context::pem, ec);
        if (ec) throw std::runtime_error(fmt::format("--tls-key {}: {}", settings.tls_key, ec.message()));
    }
    tcp::endpoint endpoint(address, settings.port);
    if (settings.listen_fd >= 0) {
        // Already bound and listening (systemd socket activation).
        acceptor.assign(endpoint.protocol(), settings.listen_fd, ec);
        if (ec) throw std::runtime_error(fmt::format("cannot adopt the listening socket (fd {}): {}", settings.listen_fd, ec.message()));
    } else {
        acceptor.open(endpoint.protocol(), ec);
        if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
        if (!ec) acceptor.bind(endpoint, ec);
        if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
        if (ec) throw std::runtime_error(fmt::format("cannot listen on {}:{}: {}", settings.host, settings.port, ec.message()));
    }

    // DNS rebinding: a browser page may resolve its own name to 127.0.0.1,
    // but it cannot make its requests carry one of our names in Host.
    allowed_hosts = {lower(settings.host)};
    if (is_loopback_host(settings.host)) allowed_hosts.insert(allowed_hosts.end(), {"localhost", "127.0.0.1", "::1"});
    for (const auto& host : settings.allow_hosts) allowed_hosts.push_back(lower(host));
    for (const auto& host : allowed_hosts) {
        for (std::string_view scheme : {"http://", "https://"}) {
            auto name = host.find(':') != std::string::npos ? "[" + host + "]" : host;
            allowed_origins.push_back(fmt::format("{}{}", scheme, name));
            allowed_origins.push_back(fmt::format("{}{}:{}", scheme, name, acceptor.local_endpoint().port()));
        }
    }
    for (const auto& origin : settings.allow_origins) allowed_origins.push_back(lower(origin));

    stateless = make_session();
    auto self = shared_from_this();
    asio::co_spawn(executor, accept_loop(), [self](std::exception_ptr e) { log_failure("HTTP listener", e); });
    asio::co_spawn(executor, sweep_sessions(), [self](std::exception_ptr e) { log_failure("HTTP session sweeper", e); });
    log::info("serving MCP on {}://{}:{}{}", tls ? "https" : "http", settings.host, acceptor.local_endpoint().port(), settings.path);
}

asio::awaitable<void> HttpServer::Impl::accept_loop() {
    auto self = shared_from_this();
    asio::steady_timer pause(executor);
    while (!stopping) {
        auto [ec, socket] = co_await acceptor.async_accept(use_tuple);
        if (stopping) break;
        if (ec) {
            // Out of descriptors: give connections a moment to close instead of spinning.
            log::warning("accepting a connection: {}", ec.message());
            pause.expires_after(std::chrono::milliseconds(100));
            co_await pause.async_wait(use_tuple);
            continue;
        }
        socket.set_option(tcp::no_delay(true), ec);
        if (connections.size() >= settings.max_connections) {
            ++connections_refused;
            asio::co_spawn(executor, refuse(std::move(socket)), [self](std::exception_ptr e) { log_failure("HTTP refusal", e); });
            continue;
        }
        if (tls) {
            asio::co_spawn(executor, serve_tls(std::move(socket)), [self](std::exception_ptr e) { log_failure("HTTPS connection", e); });
        } else {
            serve_plain(std::move(socket));
        }
    }
}

void HttpServer::Impl::serve_plain(tcp::socket socket) {
    auto plain = [](std::shared_ptr<Impl> impl, tcp::socket socket) -> asio::awaitable<void> {
        beast::tcp_stream stream(std::move(socket));
        co_await impl->serve(stream);
    };
    auto self = shared_from_this();
    asio::co_spawn(executor, plain(self, std::move(socket)), [self](std::exception_ptr e) { log_failure("HTTP connection", e); });
}

asio::awaitable<void> HttpServer::Impl::refuse(tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    Response response{http::status::service_unavailable, 11};
    response.set(http::field::content_type, "application/json");
    response.set(http::field::retry_after, "1");
    response.keep_alive(false);
    response.body() = rpc_error(-32000, "Service Unavailable: too many connections");
    response.prepare_payload();
    ++responses[503];
    stream.expires_after(std::chrono::seconds(2));
    co_await http::async_write(stream, response, use_tuple);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

asio::awaitable<void> HttpServer::Impl::serve_tls(tcp::socket socket) {
    auto self = shared_from_this();
    beast::ssl_stream<beast::tcp_stream> stream(beast::tcp_stream(std::move(socket)), *tls);
    beast::get_lowest_layer(stream).expires_after(settings.header_timeout);
    auto [ec] = co_await stream.async_handshake(ssl::stream_base::server, use_tuple);
    if (ec) co_return;
    co_await serve(stream);
}

template <class Stream>
asio::awaitable<void> HttpServer::Impl::serve(Stream& stream) {
    auto self = shared_from_this();
    auto& lowest = beast::get_lowest_layer(stream);
    auto number = next_connection++;
    connections[number] = &lowest;
    beast::flat_buffer buffer;
    bool first = true;
    while (!stopping) {
        http::request_parser<http::string_body> parser;
        parser.header_limit(static_cast<std::uint32_t>(settings.max_header_bytes));
        parser.body_limit(settings.max_body_bytes);
        // Slow clients: the whole header must arrive within the timeout.
        lowest.expires_after(first ? settings.header_timeout : settings.idle_timeout);
        auto [ec, header_bytes] = co_await http::async_read_header(stream, buffer, parser, use_tuple);
        if (ec == http::error::header_limit) {
            Response response{http::status::request_header_fields_too_large, 11};
            response.set(http::field::content_type, "application/json");
            response.body() = rpc_error(-32600, "Request Header Fields Too Large");
            response.keep_alive(false);
            co_await send(stream, std::move(response));
            break;
        }
        if (ec == http::error::body_limit) {  // told by Content-Length
            Response response{http::status::payload_too_large, 11};
            response.set(http::field::content_type, "application/json");
            response.body() = rpc_error(-32600, fmt::format("Payload Too Large: the limit is {} bytes", settings.max_body_bytes));
            response.keep_alive(false);
            co_await send(stream, std::move(response));
            break;
        }
        if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
            ec == asio::error::eof || ec == asio::error::connection_reset || stopping) {
            break;
        }
        if (ec) {
            Response response{http::status::bad_request, 11};
            response.set(http::field::content_type, "application/json");
            response.body() = rpc_error(-32600, "Bad Request: malformed HTTP");
            response.keep_alive(false);
            co_await send(stream, std::move(response));
            break;
        }
        first = false;
        if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
            http::response<http::empty_body> go_on{http::status::continue_, 11};
            lowest.expires_after(write_timeout);
            auto [write_ec, n] = co_await http::async_write(stream, go_on, use_tuple);
            if (write_ec) break;
        }
        lowest.expires_after(body_timeout);
        auto [body_ec, body_bytes] = co_await http::async_read(stream, buffer, parser, use_tuple);
        if (body_ec) {
            if (body_ec == http::error::body_limit) {
                auto response = make(parser.get(), http::status::payload_too_large,
                                     rpc_error(-32600, fmt::format("Payload Too Large: the limit is {} bytes", settings.max_body_bytes)));
                response.keep_alive(false);
                co_await send(stream, std::move(response));
            } else if (body_ec != beast::error::timeout && body_ec != http::error::end_of_stream && body_ec != asio::error::eof &&
                       body_ec != asio::error::connection_reset && body_ec != asio::error::operation_aborted) {
                auto response = make(parser.get(), http::status::bad_request, rpc_error(-32600, "Bad Request: malformed body"));
                response.keep_alive(false);
                co_await send(stream, std::move(response));
            }
            break;
        }
        busy[number] = true;
        bool keep_alive = co_await answer(stream, parser.release());
        busy.erase(number);
        if (!keep_alive) break;
    }
    connections.erase(number);
    busy.erase(number);
    beast::error_code ec;
    lowest.socket().shutdown(tcp::socket::shutdown_send, ec);
}

Response HttpServer::Impl::make(const Request& request, http::status status, std::string body, std::string_view type) {
    Response response{status, request.version()};
    response.set(http::field::content_type, type);
    response.keep_alive(request.keep_alive() && !stopping);
    response.body() = std::move(body);
    return response;
}

// The header of an answer streamed as server-sent events, as text: it goes out with the first events.
std::string HttpServer::Impl::sse_header(const Request& request, const std::string& session_id) {
    http::response<http::empty_body> header{http::status::ok, request.version()};
    header.set(http::field::content_type, "text/event-stream");
    header.set(http::field::cache_control, "no-cache, no-transform");
    if (!session_id.empty()) header.set("Mcp-Session-Id", session_id);
    header.keep_alive(request.keep_alive());
    header.chunked(true);
    std::ostringstream text;
    text << header.base();
    return std::move(text).str();
}

// {path}/preview/{sandbox_id}/{port}/REST: the request goes to the program as REST,
// without the caller's credentials, with "Connection: close" and without
// Expect or Upgrade (websockets go through the loopback listener). Its answer
// comes back with its head made safe (preview_http.hpp) and its body as the
// program writes it (chunked, SSE), ended by its length or the program's close;
// then the connection closes.
template <class Stream>
asio::awaitable<bool> HttpServer::Impl::proxy_preview(Stream& stream, Request request, std::string principal, std::string rest) {
    auto target = parse_preview_target(rest);
    if (!target) co_return co_await send(stream, make(request, http::status::not_found, rpc_error(-32600, "Not Found")));
    std::unique_ptr<PreviewStream> upstream;
    std::string failure;
    try {
        upstream = co_await preview(std::move(principal), target->sandbox_id, target->port);
    } catch (const std::exception& e) {
        failure = e.what();
    }
    if (!upstream && failure.empty()) {  // another principal's preview is as unknown as none
        co_return co_await send(stream, make(request, http::status::not_found, rpc_error(-32600, "Not Found")));
    }
    if (!upstream) co_return co_await send(stream, preview_failure(request, failure));
    bool head_request = request.method() == http::verb::head;
    request.target(target->rest);
    request.erase(http::field::authorization);  // the server's credential, not the program's
    for (auto field : {http::field::connection, http::field::keep_alive, http::field::expect, http::field::upgrade,
                       http::field::proxy_authorization}) {
        request.erase(field);
    }
    auto prefix = preview_path(settings.path, target->sandbox_id, target->port);
    prefix.pop_back();
    request.set("X-Forwarded-Prefix", prefix);
    request.keep_alive(false);
    request.prepare_payload();
    std::ostringstream head;
    head << request;
    auto request_bytes = std::move(head).str();
    bool sent = co_await upstream->write(request_bytes);
    if (!sent) co_return co_await send(stream, preview_failure(request, "the program's connection broke"));
    beast::get_lowest_layer(stream).expires_never();  // an event stream may stay quiet for long
    // The program's answer against the client leaving: a client gone from a quiet
    // stream must not hold the stream open.
    auto relayed = relay_preview_response(stream, std::move(upstream), head_request, request.version());
    auto gone = client_gone(stream);
    try {
        co_await (std::move(relayed) || std::move(gone));
    } catch (const std::exception&) {
    }
    co_return false;
}

Response HttpServer::Impl::preview_failure(const Request& request, std::string_view why) {
    auto response = make(request, http::status::bad_gateway, preview_unreachable(why), "text/plain; charset=utf-8");
    response.keep_alive(false);
    return response;
}

// Ends when the client closes its connection (or sends more than the one request it may).
template <class Stream>
asio::awaitable<void> HttpServer::Impl::client_gone(Stream& stream) {
    std::array<char, 512> sink{};
    for (;;) {
        auto [ec, n] = co_await stream.async_read_some(asio::buffer(sink), use_tuple);
        if (ec) co_return;
    }
}

template <class Stream>
asio::awaitable<void> HttpServer::Impl::relay_preview_response(Stream& stream, std::unique_ptr<PreviewStream> upstream, bool head_request,
                                                               unsigned version) {
    // However it ends, the client's socket stops being watched (client_gone).
    struct StopWatching {
        Stream& stream;
        ~StopWatching() {
            boost::system::error_code ignored;
            beast::get_lowest_layer(stream).socket().cancel(ignored);
        }
    } stop_watching{stream};
    std::string buffer(CUBICLE_STREAM_CHUNK, '\0');
    std::string pending;
    PreviewHead parsed;
    bool head_sent = false;
    for (;;) {  // the head, after any interim (1xx) heads
        parsed = parse_preview_head(pending, head_request);
        if (parsed.outcome == PreviewHead::Outcome::done) {
            if (parsed.status >= 100 && parsed.status <= 599) ++responses[parsed.status];
            auto [ec, n] = co_await asio::async_write(stream, asio::buffer(parsed.head), use_tuple);
            if (ec) co_return;
            head_sent = true;
            pending.erase(0, parsed.consumed);
            if (parsed.status >= 200) break;
            continue;
        }
        std::size_t n = parsed.outcome == PreviewHead::Outcome::malformed ? 0 : co_await upstream->read_some(buffer.data(), buffer.size());
        if (n == 0) {
            if (!head_sent) {
                Request request{http::verb::get, "/", version};
                auto why = parsed.outcome == PreviewHead::Outcome::malformed ? "the program's answer is not an HTTP response head"
                                                                             : "the program closed without an answer";
                auto response = preview_failure(request, why);
                response.set(http::field::cache_control, "no-store");
                response.prepare_payload();
                ++responses[response.result_int()];
                co_await http::async_write(stream, response, use_tuple);
            }
            co_return;
        }
        pending.append(buffer.data(), n);
    }
    // The body: its length, or until the program closes.
    auto left = parsed.body_bytes;
    auto relay = [&](std::string_view bytes) {
        if (left) bytes = bytes.substr(0, static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), *left)));
        if (left) *left -= bytes.size();
        return bytes;
    };
    auto first = relay(pending);
    if (!first.empty()) {
        auto [ec, n] = co_await asio::async_write(stream, asio::buffer(first.data(), first.size()), use_tuple);
        if (ec) co_return;
    }
    while (!left || *left > 0) {
        std::size_t n = co_await upstream->read_some(buffer.data(), buffer.size());
        if (n == 0) break;
        auto bytes = relay(std::string_view(buffer.data(), n));
        auto [ec, written] = co_await asio::async_write(stream, asio::buffer(bytes.data(), bytes.size()), use_tuple);
        if (ec) break;
    }
    boost::system::error_code ignored;
    beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_send, ignored);
}

template <class Stream>
asio::awaitable<bool> HttpServer::Impl::send(Stream& stream, Response response) {
    ++responses[response.result_int()];
    response.set(http::field::cache_control, "no-store");
    response.prepare_payload();
    beast::get_lowest_layer(stream).expires_after(write_timeout);
    auto [ec, n] = co_await http::async_write(stream, response, use_tuple);
    co_return !ec && response.keep_alive();
}

std::optional<Response> HttpServer::Impl::check_origin(const Request& request) {
    auto host = request[http::field::host];
    if (host.empty() || std::find(allowed_hosts.begin(), allowed_hosts.end(), host_of(host)) == allowed_hosts.end()) {
        return make(request, http::status::misdirected_request, rpc_error(-32600, "Misdirected Request: unknown Host"));
    }
    auto origin = request[http::field::origin];
    if (!origin.empty() && std::find(allowed_origins.begin(), allowed_origins.end(), lower(origin)) == allowed_origins.end()) {
        return make(request, http::status::forbidden, rpc_error(-32600, "Forbidden: this Origin may not use the server"));
    }
    return std::nullopt;
}

template <class Stream>
asio::awaitable<bool> HttpServer::Impl::answer(Stream& stream, Request request) {
    auto target = std::string_view(request.target());
    auto path = target.substr(0, target.find('?'));
    if (auto refusal = check_origin(request)) co_return co_await send(stream, std::move(*refusal));
    if (path == "/healthz") {
        co_return co_await send(stream, make(request, http::status::ok, "ok\n", "text/plain"));
    }
    constexpr std::string_view metadata_path = "/.well-known/oauth-protected-resource";  // RFC 9728, path may follow
    if (path.substr(0, metadata_path.size()) == metadata_path &&
        (path.size() == metadata_path.size() || path[metadata_path.size()] == '/') && !settings.resource_metadata.empty()) {
        co_return co_await send(stream, make(request, http::status::ok, settings.resource_metadata));
    }
    auto preview_prefix = settings.path + "/preview/";
    bool preview_path = preview && path.starts_with(preview_prefix);
    if (path != settings.path && path != "/metrics" && !preview_path) {
        co_return co_await send(stream, make(request, http::status::not_found, rpc_error(-32600, "Not Found")));
    }
    std::string principal(anonymous_principal);
    if (auth.authenticate) {
        auto who = auth.authenticate(request[http::field::authorization]);
        if (!who) {
            auto response = make(request, http::status::unauthorized, rpc_error(-32001, "Unauthorized: a valid bearer token is required"));
            response.set(http::field::www_authenticate, auth.challenge);
            co_return co_await send(stream, std::move(response));
        }
        principal = std::move(*who);
    }
    if (preview_path) {
        auto rest = std::string(target.substr(preview_prefix.size()));
        co_return co_await proxy_preview(stream, std::move(request), std::move(principal), std::move(rest));
    }
    if (path == "/metrics") {
        co_return co_await send(stream, make(request, http::status::ok, metrics_text(), "text/plain; version=0.0.4"));
    }
    auto version = request["MCP-Protocol-Version"];
    bool stateless_request = version == stateless_version;
    if (request.method() == http::verb::post) co_return co_await post(stream, std::move(request), std::move(principal));
    if (request.method() == http::verb::delete_ && !stateless_request) {
        auto id = std::string(request["Mcp-Session-Id"]);
        if (id.empty()) co_return co_await send(stream, make(request, http::status::bad_request, rpc_error(-32600, "Bad Request: Mcp-Session-Id header is required")));
        auto it = sessions.find(id);
        if (it == sessions.end() || it->second.principal != principal) {
            co_return co_await send(stream, make(request, http::status::not_found, rpc_error(-32600, "Not Found: no such session")));
        }
        auto session = std::move(it->second.session);
        sessions.erase(it);
        asio::co_spawn(executor, retire(std::move(session)), [self = shared_from_this()](std::exception_ptr e) { log_failure("ending a session", e); });
        co_return co_await send(stream, make(request, http::status::no_content, ""));
    }
    // No server-initiated stream: this server sends nothing outside a request's answer.
    auto response = make(request, http::status::method_not_allowed, rpc_error(-32600, "Method Not Allowed"));
    response.set(http::field::allow, stateless_request ? "POST" : "POST, DELETE");
    co_return co_await send(stream, std::move(response));
}

template <class Stream>
asio::awaitable<bool> HttpServer::Impl::post(Stream& stream, Request request, std::string principal) {
    auto accept = request[http::field::accept];
    bool accepts_sse = contains_token(accept, "text/event-stream") || contains_token(accept, "*/*");
    bool accepts_json = contains_token(accept, "application/json") || contains_token(accept, "*/*");
    if (!accepts_json && !accepts_sse) {
        co_return co_await send(stream, make(request, http::status::not_acceptable,
                                             rpc_error(-32600, "Not Acceptable: accept application/json and text/event-stream")));
    }
    if (!contains_token(lower(request[http::field::content_type]), "application/json")) {
        co_return co_await send(stream, make(request, http::status::unsupported_media_type,
                                             rpc_error(-32600, "Unsupported Media Type: send application/json")));
    }
    auto bad_request = [&](int code, std::string_view message, std::string_view data = {}) {
        return make(request, http::status::bad_request, rpc_error(code, message, data));
    };
    // Read what the transport needs (the method, the id); the Session parses it again.
    json::Document document;
    if (auto error = document.parse(request.body())) {
        co_return co_await send(stream, bad_request(-32700, fmt::format("Parse error: {}", *error)));
    }
    simdjson::dom::object message;
    if (document.root().get(message) != simdjson::SUCCESS) {
        co_return co_await send(stream, bad_request(-32600, "Invalid Request: the body must be one JSON-RPC message (no batches)"));
    }
    std::string_view method;
    bool has_method = message["method"].get(method) == simdjson::SUCCESS;
    bool is_request = has_method && message["id"].error() == simdjson::SUCCESS;

    auto version = std::string(request["MCP-Protocol-Version"]);
    const auto& versions = supported_versions();
    if (!version.empty() && std::find(versions.begin(), versions.end(), version) == versions.end()) {
        json::Writer data;
        data.begin_object().key("supported").begin_array();
        for (const auto& v : versions) data.value(v);
        data.end_array().field("requested", version).end_object();
        co_return co_await send(stream, bad_request(unsupported_version, "Unsupported protocol version", data.str()));
    }

    std::shared_ptr<Exchange> exchange = std::make_shared<Exchange>(executor);
    Session* session = nullptr;
    std::string scope;
    std::string new_session_id;
    if (version == stateless_version) {
        // The headers repeat the body so that intermediaries can route; they must agree.
        for (std::string_view name : {"MCP-Protocol-Version", "Mcp-Method", "Mcp-Name"}) {
            auto range = request.equal_range(name);
            if (range.first != range.second && std::next(range.first) != range.second) {
                co_return co_await send(stream, bad_request(header_mismatch, fmt::format("{} header appears more than once", name)));
            }
        }
        if (!is_request) {
            // The stateless revision has no client notifications over HTTP; accept and drop them.
            co_return co_await send(stream, make(request, http::status::accepted, ""));
        }
        if (request["Mcp-Method"] != method) {
            co_return co_await send(stream, bad_request(header_mismatch, "Mcp-Method header does not match the request body's method"));
        }
        std::string_view meta_version;
        if (message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"].get(meta_version) != simdjson::SUCCESS) {
            co_return co_await send(stream, bad_request(-32602, "Invalid params: params._meta must carry io.modelcontextprotocol/protocolVersion"));
        }
        if (meta_version != version) {
            co_return co_await send(stream, bad_request(header_mismatch, "MCP-Protocol-Version header does not match params._meta"));
        }
        if (method == "tools/call") {
            std::string_view name;
            auto header = decode_header_value(request["Mcp-Name"]);
            if (message["params"]["name"].get(name) == simdjson::SUCCESS && (!header || *header != name)) {
                co_return co_await send(stream, bad_request(header_mismatch, "Mcp-Name header does not match the request body's name"));
            }
        }
        session = stateless.get();
        scope = fmt::format("{}|", next_scope++);
    } else {
        auto id = std::string(request["Mcp-Session-Id"]);
        if (id.empty()) {
            if (method != "initialize") {
                co_return co_await send(stream, bad_request(-32600, "Bad Request: Mcp-Session-Id header is required (initialize first)"));
            }
            if (sessions.size() >= settings.max_sessions) {
                co_return co_await send(stream, make(request, http::status::service_unavailable,
                                                     rpc_error(-32000, "Service Unavailable: too many sessions")));
            }
            new_session_id = random_hex(16);
            auto created = make_session();
            session = created.get();
            sessions[new_session_id] = SessionEntry{std::move(created), principal, std::chrono::steady_clock::now(), 0};
            id = new_session_id;
        } else {
            auto it = sessions.find(id);
            // Another principal's session is as unknown as one that never existed.
            if (it == sessions.end() || it->second.principal != principal) {
                co_return co_await send(stream, make(request, http::status::not_found, rpc_error(-32600, "Not Found: no such session (start a new one)")));
            }
            it->second.last_used = std::chrono::steady_clock::now();
            session = it->second.session.get();
        }
        if (!is_request) {
            session->handle_message(std::move(request.body()), Peer{.send = [](std::string) {}, .principal = principal});
            co_return co_await send(stream, make(request, http::status::accepted, ""));
        }
        auto& entry = sessions[id];
        ++entry.exchanges;
        bool sse = accepts_sse && method == "tools/call";
        session->handle_message(std::move(request.body()), peer_for(exchange, principal, scope));
        bool keep_alive = co_await stream_exchange(stream, std::move(request), exchange, sse, new_session_id);
        if (auto it = sessions.find(id); it != sessions.end()) {
            --it->second.exchanges;
            it->second.last_used = std::chrono::steady_clock::now();
        }
        co_return keep_alive;
    }
    bool sse = accepts_sse && method == "tools/call";
    session->handle_message(std::move(request.body()), peer_for(exchange, principal, scope));
    co_return co_await stream_exchange(stream, std::move(request), exchange, sse, {});
}

template <class Stream>
asio::awaitable<bool> HttpServer::Impl::stream_exchange(Stream& stream, Request request, std::shared_ptr<Exchange> exchange, bool sse,
                                                         std::string session_id) {
    ++exchanges;
    auto& lowest = beast::get_lowest_layer(stream);
    bool watching = true;  // for the client going away
    bool client_gone = false;
    bool header_sent = false;
    bool ended = false;  // SSE: the last chunk is sent
    std::string last;    // JSON mode: the answer is the last message
    for (;;) {
        std::string events;  // SSE: the messages waiting now
        while (!exchange->messages.empty()) {
            auto message = std::move(exchange->messages.front());
            exchange->messages.pop_front();
            if (!sse) {
                last = std::move(message);
                continue;
            }
            events += "event: message\ndata: ";
            events += message;
            events += "\n\n";
        }
        if (!events.empty()) {
            // One write for all that is ready: the header the first time, the events, and the
            // end of the stream once the call is over. A call without notifications is then one
            // segment, as its JSON answer would be, not three the client wakes up for one by one.
            std::string out;
            if (!header_sent) {
                out = sse_header(request, session_id);
                ++responses[200];
                header_sent = true;
            }
            out += beast::buffers_to_string(http::make_chunk(asio::buffer(events)));
            if (exchange->finished) {
                out += beast::buffers_to_string(http::make_chunk_last());
                ended = true;
            }
            lowest.expires_after(write_timeout);
            auto [ec, n] = co_await asio::async_write(stream, asio::buffer(out), use_tuple);
            if (ec) {
                client_gone = true;
                break;
            }
        }
        if (client_gone || exchange->finished) break;
        exchange->wake.expires_at(asio::steady_timer::time_point::max());
        if (watching) {
            auto& socket = lowest.socket();
            lowest.expires_never();
            auto woken = co_await (exchange->wake.async_wait(use_tuple) || socket.async_wait(tcp::socket::wait_read, use_tuple));
            if (woken.index() == 1) {
                // Readable while we owe an answer: the client closed (EOF), or pipelined its next request.
                char byte;
                auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                    client_gone = true;
                    break;
                }
                watching = false;
            }
        } else {
            co_await exchange->wake.async_wait(use_tuple);
        }
    }
    --exchanges;
    if (client_gone) {
        // As on stdio: a client that stops listening cancels its call (the process in the sandbox dies).
        exchange->gone->cancel();
        co_return false;
    }
    if (sse && header_sent) {
        if (!ended) {
            lowest.expires_after(write_timeout);
            auto [ec, n] = co_await asio::async_write(stream, http::make_chunk_last(), use_tuple);
            if (ec) co_return false;
        }
        co_return request.keep_alive() && !stopping;
    }
    Response response = last.empty() ? make(request, http::status::accepted, "") : make(request, http::status::ok, std::move(last));
    if (!session_id.empty()) response.set("Mcp-Session-Id", session_id);
    co_return co_await send(stream, std::move(response));
}

asio::awaitable<void> HttpServer::Impl::sweep_sessions() {
    auto self = shared_from_this();
    while (!stopping) {
        sweeper.expires_after(std::min<std::chrono::steady_clock::duration>(settings.session_idle / 4 + std::chrono::seconds(1),
                                                                            std::chrono::seconds(60)));
        co_await sweeper.async_wait(use_tuple);
        auto now = std::chrono::steady_clock::now();
        for (auto it = sessions.begin(); it != sessions.end();) {
            auto& entry = it->second;
            if (!stopping && entry.exchanges == 0 && entry.session->in_flight() == 0 && now - entry.last_used > settings.session_idle) {
                log::debug("HTTP session expired after {} s idle", settings.session_idle.count());
                asio::co_spawn(executor, retire(std::move(entry.session)), [self](std::exception_ptr e) { log_failure("ending a session", e); });
                it = sessions.erase(it);
            } else {
                ++it;
            }
        }
    }
}

asio::awaitable<void> HttpServer::Impl::retire(std::unique_ptr<Session> session) {
    // Its calls are cancelled; it lives until their coroutines, which use it, have ended.
    co_await session->shutdown();
    asio::steady_timer timer(executor);
    while (session->in_flight() > 0) {
        timer.expires_after(std::chrono::milliseconds(100));
        co_await timer.async_wait(use_tuple);
    }
}

std::string HttpServer::Impl::metrics_text() {
    std::string out;
    auto counter = [&](std::string_view name, std::string_view help, auto value) {
        out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, value);
    };
    auto gauge = [&](std::string_view name, std::string_view help, auto value) {
        out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0} {2}\n", name, help, value);
    };
    gauge("cubicle_http_connections", "Open HTTP connections", connections.size());
    gauge("cubicle_http_sessions", "Live MCP sessions (2025 protocol era)", sessions.size());
    counter("cubicle_http_connections_refused_total", "Connections refused at the connection limit", connections_refused);
    out += "# HELP cubicle_http_responses_total HTTP responses by status\n# TYPE cubicle_http_responses_total counter\n";
    for (const auto& [status, count] : responses) out += fmt::format("cubicle_http_responses_total{{code=\"{}\"}} {}\n", status, count);
    counter("cubicle_tool_calls_total", "Tool calls", metrics->tool_calls);
    counter("cubicle_tool_errors_total", "Tool calls that failed", metrics->tool_errors);
    counter("cubicle_quota_refusals_total", "Tool calls refused by a per-client quota", metrics->quota_refusals);
    out += "# HELP cubicle_tool_call_seconds Tool call latency\n# TYPE cubicle_tool_call_seconds histogram\n";
    for (std::size_t i = 0; i < std::size(Metrics::latency_bounds); ++i) {
        out += fmt::format("cubicle_tool_call_seconds_bucket{{le=\"{}\"}} {}\n", Metrics::latency_bounds[i], metrics->latency_buckets[i]);
    }
    out += fmt::format("cubicle_tool_call_seconds_bucket{{le=\"+Inf\"}} {}\n", metrics->tool_calls - metrics->quota_refusals);
    out += fmt::format("cubicle_tool_call_seconds_sum {}\ncubicle_tool_call_seconds_count {}\n", metrics->tool_seconds,
                       metrics->tool_calls - metrics->quota_refusals);
    if (more_metrics) out += more_metrics();
    return out;
}

HttpServer::HttpServer(asio::any_io_executor executor, HttpSettings settings, SessionFactory make_session, HttpAuth auth,
                       std::shared_ptr<Metrics> metrics, std::function<std::string()> more_metrics)
    : impl_(std::make_shared<Impl>(executor, std::move(settings), std::move(make_session), std::move(auth), std::move(metrics),
                                   std::move(more_metrics))) {}

HttpServer::~HttpServer() = default;

void HttpServer::start() { impl_->start(); }

void HttpServer::set_preview(PreviewOpener opener) { impl_->preview = std::move(opener); }

unsigned short HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpServer::serve_connected(int fd) {
    tcp::socket socket(impl_->executor);
    boost::system::error_code ec;
    socket.assign(tcp::v4(), fd, ec);  // the protocol object is not checked against the descriptor
    if (ec) {
        ::close(fd);
        throw std::runtime_error(fmt::format("cannot serve fd {}: {}", fd, ec.message()));
    }
    impl_->serve_plain(std::move(socket));
}

asio::awaitable<void> HttpServer::shutdown() {
    auto impl = impl_;
    impl->stopping = true;
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->sweeper.cancel();
    // Idle connections go now; those answering a call get the drain period.
    for (auto& [number, stream] : impl->connections) {
        if (!impl->busy.count(number)) stream->socket().close(ec);
    }
    asio::steady_timer timer(impl->executor);
    auto deadline = std::chrono::steady_clock::now() + impl->settings.drain;
    while (impl->exchanges > 0 && std::chrono::steady_clock::now() < deadline) {
        timer.expires_after(std::chrono::milliseconds(50));
        co_await timer.async_wait(use_tuple);
    }
    for (auto& [id, entry] : impl->sessions) co_await entry.session->shutdown();
    co_await impl->stateless->shutdown();
    // Whatever still streams (an SSE answer) is cut.
    for (auto& [number, stream] : impl->connections) stream->socket().close(ec);
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!impl->connections.empty() && std::chrono::steady_clock::now() < deadline) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(use_tuple);
    }
}

} // namespace cubicle::mcp
