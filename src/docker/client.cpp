#include "docker/client.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cctype>
#include <charconv>
#include <cstring>
#include <deque>
#include <functional>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "docker/transport.hpp"
#include "docker/watchdog.hpp"
#include "common/log.hpp"

namespace cubicle::docker {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using Socket = asio::generic::stream_protocol::socket;
using asio::use_awaitable;
constexpr auto use_tuple = asio::as_tuple(use_awaitable);

constexpr std::string_view min_api = "1.41";
constexpr std::string_view max_api = "1.45";
constexpr std::size_t max_idle_connections = 8;

// Compares "1.41"-style versions numerically.
int compare_versions(std::string_view a, std::string_view b) {
    auto split = [](std::string_view v) {
        int major = 0, minor = 0;
        auto dot = v.find('.');
        std::from_chars(v.data(), v.data() + (dot == v.npos ? v.size() : dot), major);
        if (dot != v.npos) std::from_chars(v.data() + dot + 1, v.data() + v.size(), minor);
        return std::pair{major, minor};
    };
    auto pa = split(a), pb = split(b);
    return pa < pb ? -1 : pa > pb ? 1 : 0;
}

// The daemon's {"message": "..."} on errors, or the raw body.
std::string daemon_message(const std::string& body) {
    json::Document doc;
    if (!doc.parse(body)) {
        std::string_view message;
        if (doc.root()["message"].get(message) == simdjson::SUCCESS) return std::string(message);
    }
    auto text = body.substr(0, 500);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
}

std::map<std::string, std::string> read_labels(simdjson::dom::element item) {
    std::map<std::string, std::string> labels;
    simdjson::dom::object object;
    if (item["Labels"].get(object) != simdjson::SUCCESS) return labels;
    for (auto [key, value] : object) {
        std::string_view text;
        if (value.get(text) == simdjson::SUCCESS) labels[std::string(key)] = text;
    }
    return labels;
}

// The items of a list answer (networks, volumes), each as its `id_key` and its labels.
std::vector<ContainerSummary> named_items(simdjson::simdjson_result<simdjson::dom::element> list, std::string_view id_key) {
    std::vector<ContainerSummary> out;
    simdjson::dom::array items;
    if (list.get(items) != simdjson::SUCCESS) return out;
    for (auto item : items) {
        ContainerSummary summary;
        std::string_view text;
        if (item[id_key].get(text) == simdjson::SUCCESS) summary.id = text;
        summary.labels = read_labels(item);
        out.push_back(std::move(summary));
    }
    return out;
}

// The `filters` query value of a list call that keeps what carries `label_filter`.
std::string label_filters(std::string_view label_filter) {
    json::Writer filters;
    filters.begin_object().key("label").begin_array().value(label_filter).end_array().end_object();
    return url_encode(filters.str());
}

Client::Response check(Client::Response response, std::string_view what) {
    if (response.status >= 400) {
        throw Error(response.status, fmt::format("{}: {} (HTTP {})", what, daemon_message(response.body), response.status));
    }
    return response;
}

// "2 s" or "1500 ms", for messages.
std::string describe(std::chrono::milliseconds duration) {
    if (duration.count() % 1000 == 0) return fmt::format("{} s", duration.count() / 1000);
    return fmt::format("{} ms", duration.count());
}

void cancel_io(Socket& socket) {
    boost::system::error_code ignored;
    socket.cancel(ignored);
}

// A connection handed over after the HTTP upgrade (or an agent's channel); writes
// are queued so that concurrent senders never interleave.
class HijackedStream final : public RawStream {
public:
    HijackedStream(Socket socket, std::string leftover)
        : socket_(std::move(socket)), leftover_(std::move(leftover)) {}

    asio::awaitable<std::size_t> read_some(char* data, std::size_t size) override {
        if (offset_ < leftover_.size()) {
            std::size_t n = std::min(size, leftover_.size() - offset_);
            std::memcpy(data, leftover_.data() + offset_, n);
            offset_ += n;
            co_return n;
        }
        auto [ec, n] = co_await socket_.async_read_some(asio::buffer(data, size), use_tuple);
        co_return ec ? 0 : n;
    }

    void send(std::string data) override {
        queue_.push_back(std::move(data));
        if (writing_) return;
        writing_ = true;
        asio::co_spawn(socket_.get_executor(), drain(), asio::detached);
    }

    void close_write() override {
        queue_.push_back(std::string(end_of_input));
        if (writing_) return;
        writing_ = true;
        asio::co_spawn(socket_.get_executor(), drain(), asio::detached);
    }

    void close() override {
        boost::system::error_code ignored;
        socket_.shutdown(Socket::shutdown_both, ignored);
        socket_.close(ignored);
    }

private:
    asio::awaitable<void> drain() {
        while (!queue_.empty()) {
            std::string data = std::move(queue_.front());
            queue_.pop_front();
            if (data == end_of_input) {
                boost::system::error_code ignored;
                socket_.shutdown(Socket::shutdown_send, ignored);
                continue;
            }
            auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(data), use_tuple);
            if (ec) {
                queue_.clear();
                close();
            }
        }
        writing_ = false;
    }

    // Queued in place of data to mark where the sending side ends.
    static constexpr std::string_view end_of_input{"\0cubicle-end-of-input\0", 23};

    Socket socket_;
    std::string leftover_;
    std::size_t offset_ = 0;
    std::deque<std::string> queue_;
    bool writing_ = false;
};

} // namespace

std::unique_ptr<RawStream> raw_stream(Socket socket, std::string leftover) {
    return std::make_unique<HijackedStream>(std::move(socket), std::move(leftover));
}

std::string url_encode(std::string_view text) {
    std::string out;
    for (unsigned char c : text) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
            out += static_cast<char>(c);
        } else {
            out += fmt::format("%{:02X}", c);
        }
    }
    return out;
}

bool DaemonInfo::nvidia_runtime() const {
    return std::find(runtimes.begin(), runtimes.end(), "nvidia") != runtimes.end();
}

struct Client::Impl {
    asio::any_io_executor executor;
    Endpoint endpoint;
    Deadlines deadlines;
    std::unique_ptr<Transport> transport;  // before `idle`: idle connections close first
    std::string api_version{min_api};
    Engine engine;
    std::optional<DaemonInfo> info;  // what /info said at connect()
    std::vector<Socket> idle;

    // One request and its answer on an open connection.
    struct Exchange {
        Socket socket;
        boost::system::error_code error;  // a failure other than a deadline
        http::response<http::string_body> response;
        bool reusable = false;  // the answer was read whole and nothing trails it
    };

    std::string timed_out(std::string_view what, std::string_view step, std::chrono::milliseconds limit) const {
        return fmt::format("{}: the Docker daemon at {} {} within {} (timed out; the daemon may be overloaded or stalled)",
                           what, endpoint.describe(), step, describe(limit));
    }

    asio::awaitable<Socket> open() { co_return co_await transport->open(deadlines.connect); }

    // ec's message, with what the transport knows of the broken connection (ssh's stderr).
    asio::awaitable<std::string> why(int connection, boost::system::error_code ec) {
        auto note = co_await transport->explain(connection);
        co_return note.empty() ? ec.message() : note + " (" + ec.message() + ")";
    }

    // Sends `req` and reads the answer, each step within the deadline (the body's
    // deadline restarts with every piece that arrives). Throws Error on a deadline.
    asio::awaitable<Exchange> exchange(Socket socket, http::request<http::string_body> req, std::uint64_t max_body,
                                       std::string what) {
        Exchange out{std::move(socket)};
        Socket& stream = out.socket;
        Watchdog watchdog(executor, [&stream] { cancel_io(stream); });
        beast::flat_buffer buffer;
        http::response_parser<http::string_body> parser;
        parser.body_limit(max_body);
        std::string_view step = "did not take the request";
        watchdog.arm(deadlines.step);
        auto [ec, n] = co_await http::async_write(stream, req, use_tuple);
        if (!ec) {
            step = "did not answer";
            watchdog.arm(deadlines.step);
            std::tie(ec, n) = co_await http::async_read_header(stream, buffer, parser, use_tuple);
        }
        while (!ec && !parser.is_done()) {
            step = "stopped sending its answer";
            watchdog.arm(deadlines.step);
            std::tie(ec, n) = co_await http::async_read_some(stream, buffer, parser, use_tuple);
        }
        if (watchdog.expired()) throw Error(0, timed_out(what, step, deadlines.step));
        out.error = ec;
        if (!ec) {
            out.response = parser.release();
            out.reusable = out.response.keep_alive() && buffer.size() == 0;
        }
        co_return out;
    }

    http::request<http::string_body> make_request(http::verb verb, std::string target) const {
        http::request<http::string_body> req{verb, std::move(target), 11};
        req.set(http::field::host, "docker");
        req.set(http::field::user_agent, "cubicle/" CUBICLE_VERSION);
        return req;
    }
};

Client::Client(asio::any_io_executor executor, Endpoint endpoint, Deadlines deadlines)
    : impl_(std::make_unique<Impl>(Impl{executor, endpoint, deadlines, Transport::make(executor, endpoint)})) {}

Client::~Client() = default;

const std::string& Client::api_version() const { return impl_->api_version; }

const Endpoint& Client::endpoint() const { return impl_->endpoint; }

asio::awaitable<void> Client::connect() {
    auto socket = co_await impl_->open();
    auto req = impl_->make_request(http::verb::get, "/_ping");
    std::string what = "GET /_ping";
    auto exchange = co_await impl_->exchange(std::move(socket), std::move(req), 1 << 20, std::move(what));
    const auto& res = exchange.response;
    if (exchange.error) {
        auto why = co_await impl_->why(exchange.socket.native_handle(), exchange.error);
        throw Error(0, fmt::format("the Docker daemon at {} ({}) did not answer /_ping: {}", impl_->endpoint.describe(), impl_->endpoint.source, why));
    }
    if (res.result_int() != 200) throw Error(res.result_int(), fmt::format("the Docker daemon at {} answered /_ping with HTTP {}", impl_->endpoint.describe(), res.result_int()));
    std::string version(res["Api-Version"]);
    if (version.empty()) version = std::string(min_api);
    if (compare_versions(version, min_api) < 0) {
        throw Error(0, fmt::format("the Docker daemon speaks API {}, cubicle needs {} or newer (Docker 20.10+)", version, min_api));
    }
    impl_->api_version = compare_versions(version, max_api) > 0 ? std::string(max_api) : version;
    // Kept for the next request: over ssh a new connection costs a handshake.
    if (exchange.reusable && impl_->idle.size() < max_idle_connections) impl_->idle.push_back(std::move(exchange.socket));
    // Which engine this is decides how its answers read (engine.hpp); an engine
    // that cannot say is taken for Docker.
    // Both at once: a server's first sandbox waits for them.
    using namespace asio::experimental::awaitable_operators;
    // Neither throws, so that one's failure cancels the other and the error said is
    // the failure, not the other's "Operation canceled" (nor Asio's "multiple exceptions").
    using Answer = std::pair<Response, std::exception_ptr>;
    auto get = [this](std::string target) -> asio::awaitable<Answer> {
        try {
            co_return Answer{co_await request("GET", std::move(target)), nullptr};
        } catch (...) {
            co_return Answer{Response{}, std::current_exception()};
        }
    };
    auto [version_got, info_got] = co_await (get("/version") && get("/info"));
    for (const auto& failure : {version_got.second, info_got.second}) {
        if (failure) std::rethrow_exception(failure);
    }
    auto& version_answer = version_got.first;
    auto& info_answer = info_got.first;
    impl_->engine = parse_engine(version_answer.status == 200 ? version_answer.body : std::string(),
                                 info_answer.status == 200 ? info_answer.body : std::string());
    impl_->info.reset();
    if (info_answer.status == 200) {
        impl_->info = parse_daemon_info(info_answer.body);
        impl_->info->api_version = impl_->api_version;
    }
}

const Engine& Client::engine() const { return impl_->engine; }

asio::awaitable<Client::Response> Client::request(std::string method, std::string target, std::string body, std::string content_type,
                                                  std::uint64_t max_body) {
    auto verb = http::string_to_verb(method);
    auto started = std::chrono::steady_clock::now();
    for (int attempt = 0;; ++attempt) {
        // No co_await inside ?: here: GCC 12 miscompiles it (the socket is destroyed).
        // A retry always goes out on a fresh connection: the other idle ones
        // are as old as the one that failed.
        bool reused = attempt == 0 && !impl_->idle.empty();
        std::optional<Socket> connection;
        if (reused) {
            connection.emplace(std::move(impl_->idle.back()));
            impl_->idle.pop_back();
        } else {
            connection.emplace(co_await impl_->open());
        }
        auto req = impl_->make_request(verb, "/v" + impl_->api_version + target);
        req.keep_alive(true);
        if (!body.empty() || verb == http::verb::post || verb == http::verb::put) {
            req.set(http::field::content_type, content_type);
            // Kept for a retry: the request may go out twice.
            req.body() = reused && attempt == 0 ? body : std::move(body);
        }
        req.prepare_payload();
        std::string what = method + " " + target;
        auto exchange = co_await impl_->exchange(std::move(*connection), std::move(req), max_body, std::move(what));
        auto ec = exchange.error;
        if (ec == http::error::body_limit) {
            throw Error(413, fmt::format("{} {}: the answer is larger than {} bytes", method, target, max_body));
        }
        if (ec) {
            // An idle keep-alive connection the daemon closed (say, after minutes
            // of an image import): the others most likely are closed too.
            if (reused) {
                impl_->idle.clear();
                continue;
            }
            auto why = co_await impl_->why(exchange.socket.native_handle(), ec);
            throw Error(0, fmt::format("{} {}: connection to the Docker daemon at {} failed: {}", method, target,
                                       impl_->endpoint.describe(), why));
        }
        if (exchange.reusable && impl_->idle.size() < max_idle_connections) {
            impl_->idle.push_back(std::move(exchange.socket));
        }
        log::debug("docker {} {}: HTTP {} in {:.1f} ms", method, target, exchange.response.result_int(),
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
        co_return Response{exchange.response.result_int(), std::move(exchange.response.body())};
    }
}

asio::awaitable<std::string> Client::create_container(std::string config_json, std::string name) {
    std::string target = "/containers/create";
    if (!name.empty()) target += "?name=" + url_encode(name);
    auto res = check(co_await request("POST", target, std::move(config_json)), "creating the container failed");
    json::Document doc;
    std::string_view id;
    if (doc.parse(res.body) || doc.root()["Id"].get(id) != simdjson::SUCCESS) {
        throw Error(res.status, "the Docker daemon returned no container id");
    }
    co_return std::string(id);
}

asio::awaitable<void> Client::start_container(std::string id) {
    check(co_await request("POST", "/containers/" + id + "/start"), "starting the container failed");
}

asio::awaitable<void> Client::kill_container(std::string id, std::string signal) {
    log::debug("killing container {} with {}", id.substr(0, 12), signal);
    auto res = co_await request("POST", "/containers/" + id + "/kill?signal=" + url_encode(signal));
    if (res.status != 404 && !impl_->engine.kill_found_not_running(res.status, daemon_message(res.body))) {
        check(res, "killing the container failed");
    }
}

asio::awaitable<void> Client::pause_container(std::string id) {
    check(co_await request("POST", "/containers/" + id + "/pause"), "pausing the container failed");
}

asio::awaitable<void> Client::unpause_container(std::string id) {
    check(co_await request("POST", "/containers/" + id + "/unpause"), "resuming the paused container failed");
}

asio::awaitable<void> Client::remove_container(std::string id) {
    auto res = co_await request("DELETE", "/containers/" + id + "?force=1&v=1");
    // Podman (seen under gVisor) answers 500 "container state improper" when the container
    // stopped while it was being killed for removal; asked again, it removes it.
    if (res.status == 500 && impl_->engine.kill_found_not_running(res.status, daemon_message(res.body))) {
        res = co_await request("DELETE", "/containers/" + id + "?force=1&v=1");
    }
    // 404: already gone; 409: a removal is already under way.
    if (res.status != 404 && res.status != 409) check(res, "removing the container failed");
}

asio::awaitable<std::vector<ContainerSummary>> Client::list_containers(std::string label_filter) {
    auto res = check(co_await request("GET", "/containers/json?all=1&filters=" + label_filters(label_filter)),
                     "listing containers failed");
    json::Document doc;
    if (auto error = doc.parse(res.body)) throw Error(res.status, "unreadable container list: " + *error);
    std::vector<ContainerSummary> out;
    simdjson::dom::array items;
    if (doc.root().get(items) != simdjson::SUCCESS) co_return out;
    for (auto item : items) {
        ContainerSummary summary;
        std::string_view text;
        if (item["Id"].get(text) == simdjson::SUCCESS) summary.id = text;
        if (item["State"].get(text) == simdjson::SUCCESS) summary.state = text;
        if (item["Created"].get(summary.created) != simdjson::SUCCESS) summary.created = 0;
        summary.labels = read_labels(item);
        out.push_back(std::move(summary));
    }
    co_return out;
}

asio::awaitable<void> Client::put_archive(std::string id, std::string path, std::string tar) {
    check(co_await request("PUT", "/containers/" + id + "/archive?path=" + url_encode(path), std::move(tar), "application/x-tar"),
          fmt::format("copying files into the container at {} failed", path));
}

asio::awaitable<std::string> Client::get_archive(std::string id, std::string path, std::uint64_t max_bytes) {
    co_return check(co_await request("GET", "/containers/" + id + "/archive?path=" + url_encode(path), {}, "application/json", max_bytes),
                    fmt::format("copying {} out of the container failed", path))
        .body;
}

asio::awaitable<std::unique_ptr<RawStream>> Client::hijack(std::string target, std::string body, std::string what) {
    Socket socket = co_await impl_->open();
    auto req = impl_->make_request(http::verb::post, "/v" + impl_->api_version + target);
    req.set(http::field::connection, "Upgrade");
    req.set(http::field::upgrade, "tcp");
    if (!body.empty()) {
        req.set(http::field::content_type, "application/json");
        req.body() = std::move(body);
    }
    req.prepare_payload();
    // Deadlines up to the upgrade; the stream itself may stay quiet for as long as its program runs.
    Watchdog watchdog(impl_->executor, [&socket] { cancel_io(socket); });
    watchdog.arm(impl_->deadlines.step);
    auto [wec, wn] = co_await http::async_write(socket, req, use_tuple);
    if (watchdog.expired()) throw Error(0, impl_->timed_out(what, "did not take the request", impl_->deadlines.step));
    if (wec) {
        auto why = co_await impl_->why(socket.native_handle(), wec);
        throw Error(0, fmt::format("{} failed: {}", what, why));
    }
    beast::flat_buffer buffer;
    http::response_parser<http::empty_body> parser;
    watchdog.arm(impl_->deadlines.step);
    auto [rec, rn] = co_await http::async_read_header(socket, buffer, parser, use_tuple);
    if (watchdog.expired()) throw Error(0, impl_->timed_out(what, "did not answer", impl_->deadlines.step));
    if (rec) {
        auto why = co_await impl_->why(socket.native_handle(), rec);
        throw Error(0, fmt::format("{} failed: {}", what, why));
    }
    unsigned status = parser.get().result_int();
    if (status != 101 && status != 200) throw Error(status, fmt::format("{} failed (HTTP {})", what, status));
    // Bytes of the raw stream may already sit behind the header in the buffer.
    auto data = buffer.data();
    std::string leftover(static_cast<const char*>(data.data()), data.size());
    co_return raw_stream(std::move(socket), std::move(leftover));
}

asio::awaitable<std::unique_ptr<RawStream>> Client::attach(std::string id) {
    co_return co_await hijack("/containers/" + id + "/attach?stream=1&stdin=1&stdout=1&stderr=1", {},
                              "attaching to the container");
}

asio::awaitable<std::string> Client::create_network(std::string config_json) {
    auto res = check(co_await request("POST", "/networks/create", std::move(config_json)), "creating a network failed");
    json::Document doc;
    std::string_view id;
    if (doc.parse(res.body) || doc.root()["Id"].get(id) != simdjson::SUCCESS) {
        throw Error(res.status, "the Docker daemon returned no network id");
    }
    co_return std::string(id);
}

asio::awaitable<void> Client::connect_network(std::string network, std::string container_id, std::vector<std::string> aliases,
                                              std::string address) {
    json::Writer w;
    w.begin_object().field("Container", container_id);
    w.key("EndpointConfig").begin_object().key("Aliases").begin_array();
    for (const auto& alias : aliases) w.value(alias);
    w.end_array();
    if (!address.empty()) w.key("IPAMConfig").begin_object().field("IPv4Address", address).end_object();
    w.end_object().end_object();
    check(co_await request("POST", "/networks/" + url_encode(network) + "/connect", w.take()),
          fmt::format("connecting the container to network {} failed", network));
}

asio::awaitable<void> Client::disconnect_network(std::string network, std::string container_id) {
    json::Writer w;
    w.begin_object().field("Container", container_id).field("Force", true).end_object();
    auto res = co_await request("POST", "/networks/" + url_encode(network) + "/disconnect", w.take());
    if (res.status != 404) check(res, fmt::format("disconnecting the container from network {} failed", network));
}

asio::awaitable<std::string> Client::create_service(std::string spec_json) {
    auto res = check(co_await request("POST", "/services/create", std::move(spec_json)), "creating a Swarm service failed");
    json::Document doc;
    std::string_view id;
    if (doc.parse(res.body) || doc.root()["ID"].get(id) != simdjson::SUCCESS) throw Error(res.status, "the Swarm manager returned no service id");
    co_return std::string(id);
}

asio::awaitable<void> Client::remove_service(std::string id) {
    auto res = co_await request("DELETE", "/services/" + url_encode(id));
    if (res.status != 404) check(res, fmt::format("removing service {} failed", id));
}

asio::awaitable<std::vector<ContainerSummary>> Client::list_services(std::string label_filter) {
    auto res = check(co_await request("GET", "/services?filters=" + label_filters(label_filter)), "listing Swarm services failed");
    json::Document doc;
    if (auto error = doc.parse(res.body)) throw Error(res.status, "unreadable service list: " + *error);
    std::vector<ContainerSummary> out;
    simdjson::dom::array items;
    if (doc.root().get(items) != simdjson::SUCCESS) co_return out;
    for (auto item : items) {
        ContainerSummary summary;
        std::string_view text;
        if (item["ID"].get(text) == simdjson::SUCCESS) summary.id = text;
        simdjson::dom::element spec;
        if (item["Spec"].get(spec) == simdjson::SUCCESS) summary.labels = read_labels(spec);
        out.push_back(std::move(summary));
    }
    co_return out;
}

asio::awaitable<std::vector<SwarmTask>> Client::list_tasks(std::vector<std::string> services) {
    std::vector<SwarmTask> out;
    if (services.empty()) co_return out;
    json::Writer filters;
    filters.begin_object().key("service").begin_array();
    for (const auto& service : services) filters.value(service);
    filters.end_array().end_object();
    auto res = check(co_await request("GET", "/tasks?filters=" + url_encode(filters.str())), "listing Swarm tasks failed");
    json::Document doc;
    if (auto error = doc.parse(res.body)) throw Error(res.status, "unreadable task list: " + *error);
    simdjson::dom::array items;
    if (doc.root().get(items) != simdjson::SUCCESS) co_return out;
    for (auto item : items) {
        SwarmTask task;
        std::string_view text;
        if (item["ID"].get(text) == simdjson::SUCCESS) task.id = text;
        if (item["ServiceID"].get(text) == simdjson::SUCCESS) task.service_id = text;
        if (item["NodeID"].get(text) == simdjson::SUCCESS) task.node_id = text;
        if (item["DesiredState"].get(text) == simdjson::SUCCESS) task.desired_state = text;
        if (item["CreatedAt"].get(text) == simdjson::SUCCESS) task.created_at = text;
        if (item["Status"]["State"].get(text) == simdjson::SUCCESS) task.state = text;
        if (item["Status"]["Err"].get(text) == simdjson::SUCCESS) task.error = text;
        simdjson::dom::array attachments;
        if (item["NetworksAttachments"].get(attachments) == simdjson::SUCCESS) {
            for (auto attachment : attachments) {
                std::string_view network;
                if (attachment["Network"]["ID"].get(network) != simdjson::SUCCESS) continue;
                auto& addresses = task.addresses[std::string(network)];
                simdjson::dom::array list;
                if (attachment["Addresses"].get(list) != simdjson::SUCCESS) continue;
                for (auto address : list) {
                    if (address.get(text) == simdjson::SUCCESS) addresses.emplace_back(text);
                }
            }
        }
        out.push_back(std::move(task));
    }
    std::stable_sort(out.begin(), out.end(), [](const SwarmTask& a, const SwarmTask& b) {
        return a.service_id != b.service_id ? a.service_id < b.service_id : a.created_at > b.created_at;
    });
    co_return out;
}

asio::awaitable<std::vector<std::string>> Client::nodes_lost() {
    auto res = check(co_await request("GET", "/nodes"), "listing Swarm nodes failed");
    json::Document doc;
    if (auto error = doc.parse(res.body)) throw Error(res.status, "unreadable node list: " + *error);
    std::vector<std::string> out;
    simdjson::dom::array items;
    if (doc.root().get(items) != simdjson::SUCCESS) co_return out;
    for (auto item : items) {
        std::string_view id, state;
        if (item["ID"].get(id) != simdjson::SUCCESS || item["Status"]["State"].get(state) != simdjson::SUCCESS) continue;
        // "unknown" is every node just after a manager restarts or a leader changes: not a loss.
        if (state == "down" || state == "disconnected") out.emplace_back(id);
    }
    co_return out;
}

asio::awaitable<void> Client::build_image(std::string context_tar, std::string tag) {
    auto res = check(co_await request("POST", "/build?rm=1&forcerm=1&networkmode=none&t=" + url_encode(tag), std::move(context_tar), "application/x-tar"),
                     fmt::format("building image {} failed", tag));
    // The builder answers 200 and says in its stream of JSON lines when a step failed.
    std::string_view body(res.body);
    for (std::size_t start = 0; start < body.size();) {
        auto end = std::min(body.find('\n', start), body.size());
        auto line = body.substr(start, end - start);
        start = end + 1;
        json::Document doc;
        std::string_view message;
        if (line.empty() || doc.parse(line) || doc.root()["error"].get(message) != simdjson::SUCCESS) continue;
        throw Error(res.status, fmt::format("building image {} failed: {}", tag, message));
    }
}

asio::awaitable<void> Client::remove_network(std::string network) {
    auto res = co_await request("DELETE", "/networks/" + url_encode(network));
    // A Swarm manager answers 500 "network ... not found" for an overlay network removed meanwhile.
    bool gone = res.status == 404 || (res.status == 500 && daemon_message(res.body).find("not found") != std::string::npos);
    if (!gone) check(res, fmt::format("removing network {} failed", network));
}

asio::awaitable<std::string> Client::network_gateway(std::string network) {
    auto res = check(co_await request("GET", "/networks/" + url_encode(network)), fmt::format("inspecting network {} failed", network));
    json::Document doc;
    simdjson::dom::array entries;
    std::string_view gateway;
    if (doc.parse(res.body) || doc.root()["IPAM"]["Config"].get(entries) != simdjson::SUCCESS) co_return std::string();
    for (auto entry : entries) {
        if (entry["Gateway"].get(gateway) == simdjson::SUCCESS && !gateway.empty()) co_return std::string(gateway);
    }
    co_return std::string();
}

asio::awaitable<std::vector<ContainerSummary>> Client::list_networks(std::string label_filter) {
    auto res = check(co_await request("GET", "/networks?filters=" + label_filters(label_filter)), "listing networks failed");
    json::Document doc;
    if (doc.parse(res.body)) co_return std::vector<ContainerSummary>{};
    co_return named_items(doc.root(), "Id");
}

asio::awaitable<void> Client::create_volume(std::string config_json) {
    check(co_await request("POST", "/volumes/create", std::move(config_json)), "creating a volume failed");
}

asio::awaitable<void> Client::remove_volume(std::string name) {
    auto res = co_await request("DELETE", "/volumes/" + url_encode(name));
    if (res.status != 404) check(res, fmt::format("removing volume {} failed", name));
}

asio::awaitable<std::optional<ContainerSummary>> Client::inspect_volume(std::string name) {
    auto res = co_await request("GET", "/volumes/" + url_encode(name));
    if (res.status == 404) co_return std::nullopt;
    check(res, fmt::format("inspecting volume {} failed", name));
    json::Document doc;
    if (auto error = doc.parse(res.body)) throw Error(res.status, "unreadable volume: " + *error);
    co_return ContainerSummary{.id = name, .labels = read_labels(doc.root())};
}

asio::awaitable<std::vector<ContainerSummary>> Client::list_volumes(std::string label_filter) {
    auto res = check(co_await request("GET", "/volumes?filters=" + label_filters(label_filter)), "listing volumes failed");
    json::Document doc;
    if (doc.parse(res.body)) co_return std::vector<ContainerSummary>{};
    co_return named_items(doc.root()["Volumes"], "Name");
}

asio::awaitable<std::string> Client::exec_create(std::string id, std::string config_json) {
    auto res = check(co_await request("POST", "/containers/" + id + "/exec", std::move(config_json)), "creating an exec failed");
    json::Document doc;
    std::string_view exec_id;
    if (doc.parse(res.body) || doc.root()["Id"].get(exec_id) != simdjson::SUCCESS) {
        throw Error(res.status, "the Docker daemon returned no exec id");
    }
    co_return std::string(exec_id);
}

asio::awaitable<std::unique_ptr<RawStream>> Client::exec_start(std::string exec_id) {
    co_return co_await hijack("/exec/" + exec_id + "/start", R"({"Detach": false, "Tty": false})", "starting an exec");
}

asio::awaitable<int> Client::exec_exit_code(std::string exec_id) {
    auto res = check(co_await request("GET", "/exec/" + exec_id + "/json"), "inspecting an exec failed");
    json::Document doc;
    std::int64_t code = -1;
    if (doc.parse(res.body) || doc.root()["ExitCode"].get(code) != simdjson::SUCCESS) code = -1;
    co_return static_cast<int>(code);
}

asio::awaitable<std::vector<std::string>> Client::list_images(std::string label_filter) {
    auto res = check(co_await request("GET", "/images/json?filters=" + label_filters(label_filter)), "listing images failed");
    json::Document doc;
    if (auto error = doc.parse(res.body)) throw Error(res.status, "unreadable image list: " + *error);
    std::vector<std::string> names;
    simdjson::dom::array items;
    if (doc.root().get(items) != simdjson::SUCCESS) co_return names;
    for (auto item : items) {
        simdjson::dom::array tags;
        if (item["RepoTags"].get(tags) != simdjson::SUCCESS) continue;  // null for an untagged image
        for (auto tag : tags) {
            std::string_view name;
            if (tag.get(name) == simdjson::SUCCESS && name != "<none>:<none>") names.emplace_back(name);
        }
    }
    std::sort(names.begin(), names.end());
    co_return names;
}

asio::awaitable<std::optional<ImageInfo>> Client::inspect_image(std::string image) {
    auto res = co_await request("GET", "/images/" + url_encode(image) + "/json");
    if (res.status == 404) co_return std::nullopt;
    check(res, fmt::format("inspecting image {} failed", image));
    json::Document doc;
    ImageInfo info;
    if (!doc.parse(res.body)) {
        std::string_view text;
        if (doc.root()["Id"].get(text) == simdjson::SUCCESS) info.id = text;
        if (doc.root()["Architecture"].get(text) == simdjson::SUCCESS) info.architecture = text;
        if (doc.root()["Size"].get(info.size) != simdjson::SUCCESS) info.size = 0;
        simdjson::dom::element config;
        if (doc.root()["Config"].get(config) == simdjson::SUCCESS) info.labels = read_labels(config);
    }
    co_return info;
}

DaemonInfo parse_daemon_info(std::string_view info_json) {
    DaemonInfo out;
    json::Document doc;
    simdjson::dom::object runtimes;
    if (doc.parse(std::string(info_json))) return out;
    if (doc.root()["Runtimes"].get(runtimes) == simdjson::SUCCESS) {
        for (auto [key, value] : runtimes) out.runtimes.emplace_back(key);
    }
    std::string_view id;
    if (doc.root()["ID"].get(id) == simdjson::SUCCESS) out.id = id;
    return out;
}

asio::awaitable<DaemonInfo> Client::info() {
    // connect() asked already: start-up needs it once, not twice.
    if (impl_->info) co_return *impl_->info;
    auto res = check(co_await request("GET", "/info"), "reading daemon info failed");
    auto out = parse_daemon_info(res.body);
    out.api_version = impl_->api_version;
    co_return out;
}

// ---- images -----------------------------------------------------------------
// Pulls and imports answer with a stream of JSON lines ({"status", "progress"...} or
// {"error"}) over one long response, read here as it arrives.

namespace {

struct ImageReference {
    std::string repository;
    std::string tag;
};

ImageReference split_reference(const std::string& image) {
    auto slash = image.rfind('/');
    auto colon = image.rfind(':');
    if (image.find('@') == std::string::npos && colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
        return {image.substr(0, colon), image.substr(colon + 1)};
    }
    return {image, image.find('@') == std::string::npos ? "latest" : ""};
}

// Reads a JSON-lines answer to the end, handing each line to `on_line`; returns the
// HTTP status and the daemon's error (from an error status or an {"error"} line).
asio::awaitable<std::pair<unsigned, std::string>> read_json_lines(Socket socket, std::function<void(simdjson::dom::element)> on_line) {
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);
    auto [ec, n] = co_await http::async_read_header(socket, buffer, parser, use_tuple);
    if (ec) co_return std::pair{0u, "the Docker daemon closed the connection: " + ec.message()};
    unsigned status = parser.get().result_int();
    std::string error;
    std::string pending;
    while (!parser.is_done()) {
        std::tie(ec, n) = co_await http::async_read_some(socket, buffer, parser, use_tuple);
        if (ec) {
            if (error.empty()) error = "the connection to the Docker daemon broke: " + ec.message();
            break;
        }
        if (status >= 400) continue;  // an error answer is one JSON message, read whole
        pending += parser.get().body();
        parser.get().body().clear();
        for (std::size_t end; (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1)) {
            json::Document doc;
            if (doc.parse(pending.substr(0, end))) continue;
            std::string_view text;
            if (doc.root()["error"].get(text) == simdjson::SUCCESS) error = text;
            else if (on_line) on_line(doc.root());
        }
    }
    if (status >= 400) error = daemon_message(parser.get().body());
    co_return std::pair{status, std::move(error)};
}

std::string megabytes(std::int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

// Folds the per-layer lines of a pull or a push into one readable line at most every half second.
class ImageProgress {
public:
    explicit ImageProgress(ProgressSink sink) : sink_(std::move(sink)) {}

    void line(simdjson::dom::element item) {
        std::string_view status, id;
        if (item["status"].get(status) != simdjson::SUCCESS) return;
        if (item["id"].get(id) != simdjson::SUCCESS) id = {};
        std::int64_t current = 0, total = 0;
        bool moving = status == "Downloading" || status == "Pushing";
        if (status == "Pushing") verb_ = "uploading";
        if (moving && item["progressDetail"]["current"].get(current) == simdjson::SUCCESS &&
            item["progressDetail"]["total"].get(total) == simdjson::SUCCESS) {
            layers_[std::string(id)] = {current, total};
            emit(false);
        } else if (status == "Download complete" || status == "Pull complete" || status == "Already exists" || status == "Pushed" ||
                   status == "Layer already exists") {
            if (auto it = layers_.find(std::string(id)); it != layers_.end()) it->second.first = it->second.second;
            emit(false);
        } else if (id.empty() || status.starts_with("Pulling from")) {
            say(std::string(status));
        }
    }

private:
    void emit(bool force) {
        auto now = std::chrono::steady_clock::now();
        if (!force && now - last_ < std::chrono::milliseconds(500)) return;
        std::int64_t current = 0, total = 0;
        for (auto& [id, layer] : layers_) {
            current += layer.first;
            total += layer.second;
        }
        say(fmt::format("{} {} of {} ({} layers)", verb_, megabytes(current), megabytes(total), layers_.size()));
    }
    void say(std::string text) {
        last_ = std::chrono::steady_clock::now();
        if (sink_) sink_(text);
    }

    ProgressSink sink_;
    const char* verb_ = "downloading";
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> layers_;
    std::chrono::steady_clock::time_point last_{};
};

} // namespace

// A pull or a push: one POST answered by a stream of JSON lines, reported as they come.
asio::awaitable<void> Client::stream_image_operation(std::string target, std::string what, ProgressSink progress) {
    Socket socket = co_await impl_->open();
    auto req = impl_->make_request(http::verb::post, "/v" + impl_->api_version + target);
    // No credentials: the registry is one the nodes reach as they are ("{}", base64url).
    req.set("X-Registry-Auth", "e30=");
    req.prepare_payload();
    auto [ec, n] = co_await http::async_write(socket, req, use_tuple);
    if (ec) throw Error(0, fmt::format("{} failed: {}", what, ec.message()));
    auto report = std::make_shared<ImageProgress>(std::move(progress));
    // Named, not a temporary in the co_await expression (a GCC 12 coroutine bug).
    std::function<void(simdjson::dom::element)> on_line = [report](simdjson::dom::element item) { report->line(item); };
    auto [status, error] = co_await read_json_lines(std::move(socket), std::move(on_line));
    if (!error.empty()) throw Error(status >= 400 ? status : 500, fmt::format("{} failed: {}", what, error));
}

asio::awaitable<void> Client::pull_image(std::string image, ProgressSink progress) {
    auto reference = split_reference(image);
    co_await stream_image_operation(
        fmt::format("/images/create?fromImage={}&tag={}", url_encode(reference.repository), url_encode(reference.tag)),
        fmt::format("pulling image {}", image), std::move(progress));
}

asio::awaitable<void> Client::push_image(std::string image, ProgressSink progress) {
    auto reference = split_reference(image);
    co_await stream_image_operation(fmt::format("/images/{}/push?tag={}", url_encode(reference.repository), url_encode(reference.tag)),
                                    fmt::format("pushing image {}", image), std::move(progress));
}

asio::awaitable<std::string> Client::import_image(std::shared_ptr<ByteSource> tarball, std::vector<std::string> changes, std::string message) {
    std::string target = fmt::format("/v{}/images/create?fromSrc=-&message={}", impl_->api_version, url_encode(message));
    for (const auto& change : changes) target += "&changes=" + url_encode(change);
    Socket socket = co_await impl_->open();
    // The tarball is hundreds of megabytes: sent as it is made, in chunks, never held whole.
    std::string head = fmt::format("POST {} HTTP/1.1\r\nHost: docker\r\nUser-Agent: cubicle/" CUBICLE_VERSION
                                   "\r\nContent-Type: application/x-tar\r\nTransfer-Encoding: chunked\r\n\r\n",
                                   target);
    auto [ec, n] = co_await asio::async_write(socket, asio::buffer(head), use_tuple);
    std::string chunk(1 << 20, '\0');
    while (!ec) {
        std::size_t filled = 0;
        while (filled < chunk.size()) {
            auto got = co_await tarball->read_some(chunk.data() + filled, chunk.size() - filled);
            if (got == 0) break;
            filled += got;
        }
        auto size_line = fmt::format("{:x}\r\n", filled);
        std::array<asio::const_buffer, 3> pieces{asio::buffer(size_line), asio::buffer(chunk.data(), filled), asio::buffer("\r\n", 2)};
        std::tie(ec, n) = co_await asio::async_write(socket, pieces, use_tuple);
        if (filled == 0) break;  // that was the last, empty chunk
    }
    // On a write error the daemon may still have said why (a bad change): read its answer.
    std::string id;
    std::function<void(simdjson::dom::element)> on_line = [&id](simdjson::dom::element item) {
        std::string_view text;
        if (item["status"].get(text) == simdjson::SUCCESS && text.starts_with("sha256:")) id = text;
    };
    auto [status, error] = co_await read_json_lines(std::move(socket), std::move(on_line));
    if (!error.empty()) throw Error(status >= 400 ? status : 500, "importing the image failed: " + error);
    if (ec) throw Error(0, "importing the image failed: " + ec.message());
    if (id.empty()) throw Error(status, "importing the image failed: the Docker daemon returned no image id");
    co_return id;
}

asio::awaitable<void> Client::tag_image(std::string image, std::string repository, std::string tag) {
    check(co_await request("POST", fmt::format("/images/{}/tag?repo={}&tag={}", url_encode(image), url_encode(repository), url_encode(tag))),
          fmt::format("tagging image {} as {}:{} failed", image, repository, tag));
}

asio::awaitable<void> Client::remove_image(std::string image) {
    auto res = co_await request("DELETE", "/images/" + url_encode(image));
    if (res.status != 404 && res.status != 409) check(res, fmt::format("removing image {} failed", image));
}

} // namespace cubicle::docker
