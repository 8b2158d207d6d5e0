#include "mcp/session.hpp"

#include <algorithm>
#include <chrono>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "mcp/tasks.hpp"

namespace cubicle::mcp {
namespace {

// The stateless revision: no initialize; version, capabilities and log level come in each request's _meta.
constexpr std::string_view stateless_version = "2026-07-28";
constexpr std::string_view batch_version = "2025-03-26";  // the one revision with JSON-RPC batches
constexpr std::string_view meta_version_key = "io.modelcontextprotocol/protocolVersion";
constexpr std::string_view meta_capabilities_key = "io.modelcontextprotocol/clientCapabilities";
constexpr std::string_view meta_log_level_key = "io.modelcontextprotocol/logLevel";
constexpr std::string_view meta_server_info_key = "io.modelcontextprotocol/serverInfo";
constexpr std::string_view meta_subscription_key = "io.modelcontextprotocol/subscriptionId";
constexpr std::string_view tasks_extension = "io.modelcontextprotocol/tasks";
constexpr std::string_view meta_related_task_key = "io.modelcontextprotocol/related-task";
constexpr std::string_view meta_immediate_response_key = "io.modelcontextprotocol/model-immediate-response";
constexpr std::string_view tasks_version = "2025-11-25";  // the first handshake revision with tasks
// Under the extension the server decides which calls become tasks: those still
// running after this long (quick ones answer plainly, at no extra round trip).
constexpr auto task_promotion_delay = std::chrono::seconds(1);
// The tool list and the server's identity are fixed for the life of the process
// and the same for every caller; an hour bounds how long a client keeps them
// across a server upgrade.
constexpr std::int64_t cache_ttl_ms = 3'600'000;
constexpr std::string_view cache_scope = "public";
constexpr auto shutdown_grace = std::chrono::seconds(5);

// Stands in for omitted tool arguments; parsed once and never reparsed, so it stays valid.
simdjson::dom::element empty_object() {
    static json::Document document;
    static const bool parsed = !document.parse("{}");
    (void)parsed;
    return document.root();
}

// Completion of a request's coroutine: they catch what they expect, so anything
// arriving here is a bug worth a log line, never a reason to stop the server.
void report_failure(std::exception_ptr failure) {
    if (!failure) return;
    try {
        std::rethrow_exception(failure);
    } catch (const std::exception& e) {
        log::error("request coroutine failed: {}", e.what());
    }
}

bool is_handshake_version(std::string_view version) {
    const auto& versions = supported_versions();
    return version != stateless_version && std::find(versions.begin(), versions.end(), version) != versions.end();
}

std::string log_notification(log::Level level, std::string_view message) {
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").field("method", "notifications/message");
    w.key("params").begin_object().field("level", log::level_name(level)).field("logger", "cubicle").field("data", message).end_object();
    w.end_object();
    return w.take();
}

std::string error_message(std::string_view id_json, int code, std::string_view message, std::string_view data_json = {}) {
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").key("id").raw(id_json);
    w.key("error").begin_object().field("code", code).field("message", message);
    if (!data_json.empty()) w.key("data").raw(data_json);
    w.end_object().end_object();
    return w.take();
}

// A JSON number as the grammar has it (RFC 8259), whatever its magnitude.
bool is_json_number(std::string_view token) {
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t' || token.back() == '\n' || token.back() == '\r')) {
        token.remove_suffix(1);
    }
    std::size_t i = 0;
    auto digits = [&] {
        std::size_t from = i;
        while (i < token.size() && token[i] >= '0' && token[i] <= '9') ++i;
        return i - from;
    };
    if (i < token.size() && token[i] == '-') ++i;
    if (i < token.size() && token[i] == '0') {
        ++i;
    } else if (digits() == 0) {
        return false;
    }
    if (i < token.size() && token[i] == '.') {
        ++i;
        if (digits() == 0) return false;
    }
    if (i < token.size() && (token[i] == 'e' || token[i] == 'E')) {
        ++i;
        if (i < token.size() && (token[i] == '+' || token[i] == '-')) ++i;
        if (digits() == 0) return false;
    }
    return i == token.size();
}

// Walks a value lazily: true when it is well-formed JSON, numbers judged by
// their grammar only.
bool well_formed(simdjson::ondemand::value value, int depth) {
    using simdjson::ondemand::json_type;
    json_type type;
    if (depth > 1024 || value.type().get(type)) return false;
    switch (type) {
    case json_type::object: {
        simdjson::ondemand::object object;
        if (value.get_object().get(object)) return false;
        for (auto field : object) {
            std::string_view key;
            simdjson::ondemand::value member;
            if (field.unescaped_key().get(key) || field.value().get(member) || !well_formed(member, depth + 1)) return false;
        }
        return true;
    }
    case json_type::array: {
        simdjson::ondemand::array array;
        if (value.get_array().get(array)) return false;
        for (auto element : array) {
            simdjson::ondemand::value item;
            if (element.get(item) || !well_formed(item, depth + 1)) return false;
        }
        return true;
    }
    case json_type::string: {
        std::string_view text;
        return !value.get_string().get(text);
    }
    case json_type::number: return is_json_number(value.raw_json_token());
    case json_type::boolean: {
        bool flag;
        return !value.get_bool().get(flag);
    }
    case json_type::null: {
        bool null = false;  // a misspelt null ("nul", "nulx") is an error, not an exception
        return !value.is_null().get(null) && null;
    }
    }
    return false;
}

// simdjson refuses a whole document for one number it cannot represent (an
// integer beyond 64 bits, a float beyond double). The rest of such a message
// may be a fine request whose id deserves an answer: when the message is
// well-formed apart from such numbers, read its id, if it has a usable one.
std::optional<std::string> id_despite_number_range(std::string_view text) {
    simdjson::padded_string padded(text);
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document document;
    simdjson::ondemand::value root;
    if (parser.iterate(padded).get(document) || document.get_value().get(root) || !well_formed(root, 0)) return std::nullopt;
    simdjson::ondemand::value id;
    if (parser.iterate(padded).get(document) || document.find_field_unordered("id").get(id)) return std::nullopt;
    std::string_view text_id;
    std::int64_t signed_id;
    std::uint64_t unsigned_id;
    json::Writer w;
    if (!id.get_string().get(text_id)) return w.value(text_id).take();
    if (!id.get_int64().get(signed_id)) return w.value(signed_id).take();
    if (!id.get_uint64().get(unsigned_id)) return w.value(unsigned_id).take();
    return std::nullopt;
}

} // namespace

const std::vector<std::string>& supported_versions() {
    static const std::vector<std::string> versions = {"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};
    return versions;
}

void RequestContext::progress(double progress, std::string_view message) {
    if (progress_token_.empty() || cancelled()) return;
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").field("method", "notifications/progress");
    w.key("params").begin_object().key("progressToken").raw(progress_token_).field("progress", progress);
    if (!message.empty()) w.field("message", message);
    w.end_object().end_object();
    send_(w.take());
}

void RequestContext::log(log::Level level, std::string_view message) {
    if (!logging_.request_scoped) {
        log::write(level, message);  // reaches clients that called logging/setLevel
        return;
    }
    log::write_local(level, message);
    if (logging_.level && level >= *logging_.level && !cancelled()) send_(log_notification(level, message));
}

// The responses to a 2025-03-26 batch, sent together once every element has its outcome.
struct Session::Batch {
    std::vector<std::string> responses;
    std::size_t unsettled = 1;  // elements without an outcome, plus one while the batch is read
};

struct Session::Request {
    std::shared_ptr<json::Document> document;  // shared by the elements of a batch
    std::shared_ptr<Batch> batch;              // null outside a batch
    std::string id;                            // serialized JSON; empty for notifications
    std::string method;
    simdjson::dom::element params;
    bool has_params = false;
    // Sent under the stateless revision, with its log level (if the client asked for log lines).
    bool stateless = false;
    std::optional<log::Level> log_level;
    bool tasks_extension = false;  // a stateless request whose capabilities name io.modelcontextprotocol/tasks
    Peer peer;

    ~Request() {
        if (peer.finished) peer.finished();
    }
};

Session::Session(asio::any_io_executor executor, ServerInfo info, std::vector<Tool> tools, std::function<void(std::string)> send)
    : executor_(std::move(executor)), info_(std::move(info)), tools_(std::move(tools)), send_(std::move(send)) {
    // Schemas are written readably in the source; on the wire they must be
    // compact (a raw newline would break stdio framing) and valid.
    for (auto& tool : tools_) {
        for (auto* schema : {&tool.input_schema, &tool.output_schema}) {
            json::Document document;
            if (auto error = document.parse(*schema)) {
                throw std::logic_error(fmt::format("tool {}: invalid schema: {}", tool.name, *error));
            }
            *schema = json::to_string(document.root());
        }
    }
    json::Writer w;
    w.begin_object().field("name", info_.name).field("title", "cubicle").field("version", info_.version).end_object();
    server_info_json_ = w.take();
    tasks_ = std::make_shared<TaskStore>(executor_);
}

Session::~Session() { close_outbound(); }

void Session::set_tasks(std::shared_ptr<TaskStore> store) {
    tasks_ = std::move(store);
    owns_tasks_ = false;
}

void Session::handle_message(std::string text) {
    handle_message(std::move(text), Peer{.send = send_, .principal = std::string(local_principal)});
}

void Session::handle_message(std::string text, Peer peer) {
    auto message = std::make_shared<Request>();
    message->peer = std::move(peer);
    message->document = std::make_shared<json::Document>();
    if (auto error = message->document->parse(text)) {
        bool number_error = *error == simdjson::error_message(simdjson::NUMBER_ERROR);
        auto id = number_error ? id_despite_number_range(text) : std::nullopt;
        if (id) {
            message->id = *id;
            reply_error(*message, error_code::invalid_params,
                        "Invalid params: a number in this request is outside the range of 64-bit integers and doubles");
        } else {
            message->id = "null";
            reply_error(*message, error_code::parse_error, fmt::format("Parse error: {}", *error));
        }
        return;
    }
    auto root = message->document->root();  // read before `message` is moved from
    if (root.is_array()) {
        handle_batch(std::move(message));
    } else {
        handle_element(std::move(message), root);
    }
}

void Session::handle_batch(std::shared_ptr<Request> message) {
    simdjson::dom::array elements = message->document->root().get_array().value_unsafe();
    message->id = "null";
    if (protocol_version_ != batch_version) {
        reply_error(*message, error_code::invalid_request,
                    fmt::format("Invalid Request: JSON-RPC batches exist only in protocol revision {}{}", batch_version,
                                protocol_version_.empty() ? "" : fmt::format(", not in {}", protocol_version_)));
        return;
    }
    if (elements.size() == 0) {
        reply_error(*message, error_code::invalid_request, "Invalid Request: an empty batch");
        return;
    }
    auto batch = std::make_shared<Batch>();
    batch->unsettled += elements.size();
    for (auto element : elements) {
        auto request = std::make_shared<Request>();
        request->document = message->document;
        request->batch = batch;
        request->peer = message->peer;
        request->peer.finished = nullptr;  // the batch's message ends the exchange
        handle_element(std::move(request), element);
    }
    message->batch = batch;
    settle(*message, {});  // the batch is read: it may complete now
}

void Session::handle_element(std::shared_ptr<Request> request, simdjson::dom::element element) {
    request->id = "null";  // until a valid one is read
    simdjson::dom::object message;
    if (element.get(message) != simdjson::SUCCESS) {
        reply_error(*request, error_code::invalid_request, "Invalid Request: a message must be a JSON object");
        return;
    }
    simdjson::dom::element id;
    bool has_id = message["id"].get(id) == simdjson::SUCCESS;
    if (has_id && !id.is_string() && !id.is_int64() && !id.is_uint64()) {
        reply_error(*request, error_code::invalid_request, "Invalid Request: id must be a string or an integer");
        return;
    }
    if (has_id) request->id = json::to_string(id);
    std::string_view version;
    if (message["jsonrpc"].get(version) != simdjson::SUCCESS || version != "2.0") {
        reply_error(*request, error_code::invalid_request, "Invalid Request: jsonrpc must be \"2.0\"");
        return;
    }
    std::string_view method;
    if (message["method"].get(method) != simdjson::SUCCESS) {
        if (!message["result"].error() || !message["error"].error()) {
            take_response(*request, message);
            settle(*request, {});  // a response to a request of ours: nothing to say back
            return;
        }
        reply_error(*request, error_code::invalid_request, "Invalid Request: method is missing");
        return;
    }
    request->method = method;
    if (message["params"].get(request->params) == simdjson::SUCCESS) {
        if (!request->params.is_object()) {
            if (has_id) {
                reply_error(*request, error_code::invalid_params, "Invalid params: params must be an object");
            } else {
                settle(*request, {});
            }
            return;
        }
        request->has_params = true;
    }
    if (!has_id) {
        request->id.clear();
        handle_notification(*request);
        settle(*request, {});
        return;
    }
    if (!accept_envelope(*request)) return;
    if (request->stateless) {
        handle_stateless_request(std::move(request));
    } else {
        handle_request(std::move(request));
    }
}

// Reads the 2026-07-28 per-request envelope, if the request has one; false when
// the request was refused for it.
bool Session::accept_envelope(Request& request) {
    simdjson::dom::object meta;
    if (!request.has_params || request.params["_meta"].get(meta) != simdjson::SUCCESS) return true;
    simdjson::dom::element version_element;
    // The handshake itself is never stateless, whatever its _meta says.
    if (meta[meta_version_key].get(version_element) != simdjson::SUCCESS || request.method == "initialize") return true;
    if (request.batch) {
        reply_error(request, error_code::invalid_request,
                    fmt::format("Invalid Request: requests of protocol revision {} cannot be batched", stateless_version));
        return false;
    }
    simdjson::dom::object capabilities;
    if (meta[meta_capabilities_key].get(capabilities) != simdjson::SUCCESS) {
        reply_error(request, error_code::invalid_params,
                    fmt::format("Invalid params: params._meta must carry {} (an object) beside {}", meta_capabilities_key,
                                meta_version_key));
        return false;
    }
    std::string_view version;
    if (version_element.get(version) != simdjson::SUCCESS) {
        reply_error(request, error_code::invalid_params, fmt::format("Invalid params: {} must be a string", meta_version_key));
        return false;
    }
    if (version != stateless_version) {
        json::Writer data;
        data.begin_object().key("supported").begin_array();
        for (const auto& supported : supported_versions()) data.value(supported);
        data.end_array().field("requested", version).end_object();
        reply_error(request, error_code::unsupported_protocol_version,
                    fmt::format("Unsupported protocol version {}: requests with {} are served in {}; earlier revisions "
                                "through the initialize handshake",
                                version, meta_version_key, stateless_version),
                    data.str());
        return false;
    }
    simdjson::dom::element level_element;
    if (meta[meta_log_level_key].get(level_element) == simdjson::SUCCESS) {
        std::string_view level;
        request.log_level = level_element.get(level) == simdjson::SUCCESS ? log::parse_level(level) : std::nullopt;
        if (!request.log_level) {
            reply_error(request, error_code::invalid_params,
                        fmt::format("Invalid params: {} must be one of debug, info, notice, warning, error, critical, "
                                    "alert, emergency",
                                    meta_log_level_key));
            return false;
        }
    }
    simdjson::dom::object extensions;
    request.tasks_extension = capabilities["extensions"].get(extensions) == simdjson::SUCCESS && !extensions[tasks_extension].error();
    request.stateless = true;
    return true;
}

void Session::handle_notification(const Request& request) {
    if (request.method == "notifications/cancelled" && request.has_params) {
        simdjson::dom::element id;
        if (request.params["requestId"].get(id) != simdjson::SUCCESS) return;
        auto it = in_flight_.find(request.peer.scope + json::to_string(id));
        if (it == in_flight_.end()) return;  // finished already, or never existed: ignore
        std::string_view reason;
        if (request.params["reason"].get(reason) != simdjson::SUCCESS) reason = {};
        log::debug("request {} cancelled by the client{}{}", it->first, reason.empty() ? "" : ": ", reason);
        it->second->cancellation()->cancel();
    }
    // notifications/initialized, notifications/progress, roots changes: nothing to do.
}

void Session::handle_request(std::shared_ptr<Request> request) {
    const auto& method = request->method;
    if (in_flight_.count(request->peer.scope + request->id)) {
        reply_error(*request, error_code::invalid_request, "Invalid Request: this id is already in use by a running request");
        return;
    }
    if (method == "initialize") {
        initialize(*request);
    } else if (method == "ping") {
        reply(*request, "{}");
    } else if (method == "tools/list") {
        list_tools(*request);
    } else if (method == "tools/call") {
        call_tool(std::move(request));
    } else if (handle_resources(request)) {
    } else if (method.starts_with("tasks/") && tasks_negotiated()) {
        handle_task_request(std::move(request));
    } else if (method == "logging/setLevel") {
        set_log_level(*request);
    } else if (method == "server/discover") {
        reply_error(*request, error_code::invalid_params,
                    fmt::format("Invalid params: server/discover belongs to protocol revision {}: params._meta must carry "
                                "{} and {}",
                                stateless_version, meta_version_key, meta_capabilities_key));
    } else {
        reply_error(*request, error_code::method_not_found, fmt::format("Method not found: {}", method));
    }
}

void Session::handle_stateless_request(std::shared_ptr<Request> request) {
    const auto& method = request->method;
    if (in_flight_.count(request->peer.scope + request->id)) {
        reply_error(*request, error_code::invalid_request, "Invalid Request: this id is already in use by a running request");
    } else if (method == "server/discover") {
        discover(*request);
    } else if (method == "tools/list") {
        list_tools(*request);
    } else if (method == "tools/call") {
        call_tool(std::move(request));
    } else if (handle_resources(request)) {
    } else if (method == "subscriptions/listen") {
        listen(std::move(request));
    } else if (method == "tasks/get" || method == "tasks/update" || method == "tasks/cancel") {
        handle_task_request(std::move(request));
    } else if (method == "ping" || method == "logging/setLevel") {
        reply_error(*request, error_code::method_not_found,
                    fmt::format("Method not found: {} was removed in protocol revision {}{}", method, stateless_version,
                                method == "ping" ? "" : fmt::format(" (send {} in each request's _meta)", meta_log_level_key)));
    } else {
        reply_error(*request, error_code::method_not_found, fmt::format("Method not found: {}", method));
    }
}

void Session::initialize(const Request& request) {
    std::string_view asked;
    if (!request.has_params || request.params["protocolVersion"].get(asked) != simdjson::SUCCESS) {
        reply_error(request, error_code::invalid_params, "Invalid params: initialize needs params.protocolVersion");
        return;
    }
    if (request.batch) {
        reply_error(request, error_code::invalid_request, "Invalid Request: initialize must not be part of a batch");
        return;
    }
    // Answer with the client's revision when we speak it, else our newest handshake one.
    protocol_version_ = is_handshake_version(asked) ? std::string(asked) : supported_versions()[1];
    // Elicitation: {} (form, before 2025-11-25) or {"form": {}, ...}; url mode alone is no form.
    simdjson::dom::object elicitation;
    client_elicits_ = request.params["capabilities"]["elicitation"].get(elicitation) == simdjson::SUCCESS &&
                      (elicitation.size() == 0 || !elicitation["form"].error());
    json::Writer w;
    w.begin_object().field("protocolVersion", protocol_version_);
    w.key("capabilities").begin_object();
    w.key("tools").begin_object().field("listChanged", false).end_object();
    if (resources_) w.key("resources").begin_object().end_object();
    w.key("logging").begin_object().end_object();
    if (tasks_negotiated()) {
        w.key("tasks").begin_object().key("list").begin_object().end_object().key("cancel").begin_object().end_object();
        w.key("requests").begin_object().key("tools").begin_object().key("call").begin_object().end_object().end_object().end_object();
        w.end_object();
    }
    w.end_object();
    w.key("serverInfo").raw(server_info_json_);
    w.field("instructions", info_.instructions);
    w.end_object();
    reply(request, w.take());
}

void Session::discover(const Request& request) {
    json::Writer w;
    w.begin_object().key("supportedVersions").begin_array();
    for (const auto& version : supported_versions()) w.value(version);
    w.end_array();
    w.key("capabilities").begin_object();
    w.key("tools").begin_object().field("listChanged", false).end_object();
    if (resources_) w.key("resources").begin_object().end_object();
    w.key("logging").begin_object().end_object();  // log lines for requests that name a level
    w.key("extensions").begin_object().key(tasks_extension).begin_object().end_object().end_object();
    w.end_object();
    w.field("instructions", info_.instructions);
    w.end_object();
    reply(request, w.take(), Caching::cacheable);
}

void Session::list_tools(const Request& request) {
    // Every tool comes in one page, so no cursor was ever handed out.
    if (request.has_params && !request.params["cursor"].error()) {
        reply_error(request, error_code::invalid_params, "Invalid params: unknown cursor (tools/list returns every tool at once)");
        return;
    }
    reply(request, tools_json(!request.stateless && tasks_negotiated()), Caching::cacheable);
}

void Session::set_log_level(const Request& request) {
    std::string_view name;
    std::optional<log::Level> threshold;
    if (request.has_params && request.params["level"].get(name) == simdjson::SUCCESS) threshold = log::parse_level(name);
    if (!threshold) {
        reply_error(request, error_code::invalid_params,
                    "Invalid params: level must be one of debug, info, notice, warning, error, critical, alert, emergency");
        return;
    }
    log_subscription_.reset();
    if (!forward_logs_) {
        reply(request, "{}");
        return;
    }
    auto send = send_;
    auto level = *threshold;
    log_subscription_ = std::make_unique<log::Subscription>([send, level](log::Level line_level, std::string_view message) {
        if (line_level >= level) send(log_notification(line_level, message));
    });
    reply(request, "{}");
}

std::string Session::tools_json(bool task_support) const {
    json::Writer w;
    w.begin_object().key("tools").begin_array();
    for (const auto& tool : tools_) {
        w.begin_object();
        w.field("name", tool.name).field("title", tool.title).field("description", tool.description);
        w.key("inputSchema").raw(tool.input_schema);
        w.key("outputSchema").raw(tool.output_schema);
        w.key("annotations").begin_object();
        w.field("title", tool.title);
        w.field("readOnlyHint", tool.read_only).field("destructiveHint", tool.destructive);
        w.field("idempotentHint", tool.idempotent).field("openWorldHint", tool.open_world);
        w.end_object();
        if (task_support && tool.task_support) w.key("execution").begin_object().field("taskSupport", "optional").end_object();
        w.end_object();
    }
    w.end_array().end_object();
    return w.take();
}

void Session::call_tool(std::shared_ptr<Request> request) {
    std::string_view name;
    if (!request->has_params || request->params["name"].get(name) != simdjson::SUCCESS) {
        reply_error(*request, error_code::invalid_params, "Invalid params: tools/call needs params.name");
        return;
    }
    auto tool = std::find_if(tools_.begin(), tools_.end(), [&](const Tool& t) { return t.name == name; });
    if (tool == tools_.end()) {
        std::string names;
        for (const auto& t : tools_) names += (names.empty() ? "" : ", ") + t.name;
        reply_error(*request, error_code::invalid_params, fmt::format("Unknown tool: {} (available: {})", name, names));
        return;
    }
    simdjson::dom::element arguments;
    if (request->params["arguments"].get(arguments) == simdjson::SUCCESS && !arguments.is_object()) {
        reply_error(*request, error_code::invalid_params, "Invalid params: arguments must be an object");
        return;
    }
    // 2025-11-25: the client asks for a task with params.task; under the
    // extension the server decides (calls still running after a moment).
    simdjson::dom::element task_params;
    bool task_asked = !request->stateless && tasks_negotiated() && request->params["task"].get(task_params) == simdjson::SUCCESS;
    if (task_asked) {
        if (!tool->task_support) {
            reply_error(*request, error_code::method_not_found,
                        fmt::format("Method not found: {} does not run as a task (execution.taskSupport is forbidden)", tool->name));
            return;
        }
        std::optional<std::int64_t> ttl;
        simdjson::dom::element ttl_element;
        if (task_params.is_object() && task_params["ttl"].get(ttl_element) == simdjson::SUCCESS && ttl_element.is_number()) {
            double asked = 0;
            if (ttl_element.get(asked) == simdjson::SUCCESS) ttl = static_cast<std::int64_t>(std::min(asked, 1e15));
        }
        start_task(std::move(request), *tool, ttl);
        return;
    }
    if (request->stateless && request->tasks_extension && tool->task_support) {
        start_task(std::move(request), *tool, std::nullopt);
        return;
    }
    simdjson::dom::element token;
    std::string token_json;
    if (request->params["_meta"]["progressToken"].get(token) == simdjson::SUCCESS && (token.is_string() || token.is_number())) {
        token_json = json::to_string(token);
    }
    RequestLogging logging{.request_scoped = request->stateless, .level = request->log_level};
    auto context = std::make_shared<RequestContext>(request->peer.send, std::move(token_json), logging);
    context->set_principal(request->peer.principal);
    if (request->peer.gone) {
        request->peer.gone->on_cancel([weak = std::weak_ptr<RequestContext>(context)] {
            if (auto alive = weak.lock()) alive->cancellation()->cancel();
        });
    }
    // Server-to-client requests ride on the call's own stream (stdio, or the POST's SSE
    // stream); the stateless revision has none.
    if (client_elicits_ && !request->stateless) {
        context->set_elicitation([outbound = std::weak_ptr<Outbounds>(outbound_), executor = executor_, send = request->peer.send,
                                  scope = request->peer.scope](std::string method, std::string params, std::chrono::milliseconds timeout) {
            return ask_client(outbound.lock(), executor, send, scope, std::move(method), std::move(params), timeout);
        });
    }
    in_flight_[request->peer.scope + request->id] = context;
    asio::co_spawn(executor_, run_tool(&*tool, request), report_failure);
}

struct Session::Outbound {
    explicit Outbound(asio::any_io_executor executor) : timer(std::move(executor)) {}
    asio::steady_timer timer;
    std::optional<std::string> result;  // serialized; stays empty for an error response
};

asio::awaitable<std::optional<std::string>> Session::ask_client(std::shared_ptr<Outbounds> outbound, asio::any_io_executor executor,
                                                                std::function<void(std::string)> send, std::string scope,
                                                                std::string method, std::string params_json,
                                                                std::chrono::milliseconds timeout) {
    if (!outbound || outbound->closed) co_return std::nullopt;
    // Our ids are strings of our own, so they never meet the client's numbers.
    auto id = fmt::format("\"cubicle-{}\"", ++outbound->next);
    auto key = scope + "\n" + id;
    auto pending = std::make_shared<Outbound>(executor);
    pending->timer.expires_after(timeout);
    outbound->pending[key] = pending;
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").key("id").raw(id).field("method", method).key("params").raw(params_json).end_object();
    send(w.take());
    co_await pending->timer.async_wait(asio::as_tuple(asio::use_awaitable));
    outbound->pending.erase(key);
    co_return std::move(pending->result);
}

void Session::close_outbound() {
    outbound_->closed = true;
    for (auto& [key, pending] : outbound_->pending) pending->timer.cancel();
}

void Session::take_response(const Request& response, simdjson::dom::object message) {
    auto it = outbound_->pending.find(response.peer.scope + "\n" + response.id);
    if (it == outbound_->pending.end()) return;  // late, or not ours
    auto pending = it->second;
    outbound_->pending.erase(it);
    simdjson::dom::element result;
    if (message["result"].get(result) == simdjson::SUCCESS) pending->result = json::to_string(result);
    pending->timer.cancel();
}

asio::awaitable<void> Session::run_tool(const Tool* tool, std::shared_ptr<Request> request) {
    auto context = in_flight_.at(request->peer.scope + request->id);
    simdjson::dom::element arguments;
    if (request->params["arguments"].get(arguments) != simdjson::SUCCESS) arguments = empty_object();
    auto started = std::chrono::steady_clock::now();
    context->log(log::Level::debug, fmt::format("{}: started", tool->name));
    ToolResult result;
    std::string internal_error;
    try {
        result = co_await tool->handler(arguments, context);
    } catch (const ToolError& e) {
        result = ToolResult{.text = e.what(), .is_error = true};
    } catch (const std::exception& e) {
        internal_error = e.what();
    }
    auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    if (!internal_error.empty()) {
        context->log(log::Level::error, fmt::format("{} failed: {}", tool->name, internal_error));
    } else {
        context->log(log::Level::debug, fmt::format("{}: {} after {} ms", tool->name, result.is_error ? "tool error" : "done",
                                                    elapsed.count()));
    }
    in_flight_.erase(request->peer.scope + request->id);
    // The spec asks for no response to a request the client cancelled.
    if (context->cancelled()) {
        settle(*request, {});
        co_return;
    }
    if (!internal_error.empty()) {
        reply_error(*request, error_code::internal_error, fmt::format("Internal error in {}: {}", tool->name, internal_error));
        co_return;
    }
    reply(*request, call_result_json(result, links_allowed(*request)));
}

bool Session::links_allowed(const Request& request) const {
    return request.stateless || protocol_version_ >= "2025-06-18";  // revisions are dates
}

bool Session::handle_resources(std::shared_ptr<Request> request) {
    const auto& method = request->method;
    if (!resources_ || (method != "resources/list" && method != "resources/templates/list" && method != "resources/read")) return false;
    if (method == "resources/templates/list") {
        json::Writer w;
        w.begin_object().key("resourceTemplates").begin_array();
        for (const auto& t : resources_->templates) {
            w.begin_object().field("uriTemplate", t.uri_template).field("name", t.name).field("title", t.title);
            w.field("description", t.description).end_object();
        }
        w.end_array().end_object();
        reply(*request, w.take());
        return true;
    }
    in_flight_[request->peer.scope + request->id] =
        std::make_shared<RequestContext>(request->peer.send, std::string(), RequestLogging{.request_scoped = request->stateless});
    asio::co_spawn(executor_, serve_resources(std::move(request)), report_failure);
    return true;
}

asio::awaitable<void> Session::serve_resources(std::shared_ptr<Request> request) {
    std::string result;
    int code = 0;
    std::string message;
    try {
        json::Writer w;
        w.begin_object();
        if (request->method == "resources/list") {
            std::string_view cursor;
            if (request->has_params && request->params["cursor"].get(cursor) != simdjson::SUCCESS) cursor = {};
            auto page = co_await resources_->list(request->peer.principal, std::string(cursor));
            w.key("resources").begin_array();
            for (const auto& r : page.resources) {
                w.begin_object().field("uri", r.uri).field("name", r.name);
                if (!r.title.empty()) w.field("title", r.title);
                if (!r.description.empty()) w.field("description", r.description);
                w.field("mimeType", r.mime_type);
                if (r.size) w.field("size", r.size);  // 0: not known
                w.end_object();
            }
            w.end_array();
            if (!page.next_cursor.empty()) w.field("nextCursor", page.next_cursor);
        } else {
            std::string_view uri;
            if (!request->has_params || request->params["uri"].get(uri) != simdjson::SUCCESS) {
                throw std::invalid_argument("resources/read needs params.uri");
            }
            auto content = co_await resources_->read(request->peer.principal, std::string(uri));
            w.key("contents").begin_array().begin_object().field("uri", content.uri).field("mimeType", content.mime_type);
            if (content.binary) {
                w.field("blob", content.blob_base64);
            } else {
                w.field("text", content.text);
            }
            w.end_object().end_array();
        }
        w.end_object();
        result = w.take();
    } catch (const ResourceNotFound& e) {
        code = error_code::resource_not_found;
        message = e.what();
    } catch (const std::invalid_argument& e) {
        code = error_code::invalid_params;
        message = fmt::format("Invalid params: {}", e.what());
    } catch (const std::exception& e) {
        code = error_code::internal_error;
        message = fmt::format("Internal error: {}", e.what());
    }
    in_flight_.erase(request->peer.scope + request->id);
    if (code) {
        reply_error(*request, code, message);
    } else {
        reply(*request, std::move(result));
    }
}

// The tool list never changes, so a subscription is acknowledged with nothing
// to deliver and held open until the client cancels it or the server stops.
void Session::listen(std::shared_ptr<Request> request) {
    simdjson::dom::object filter;
    if (request->params["notifications"].get(filter) != simdjson::SUCCESS) {
        reply_error(*request, error_code::invalid_params, "Invalid params: subscriptions/listen needs params.notifications (an object)");
        return;
    }
    auto context = std::make_shared<RequestContext>(request->peer.send, std::string(), RequestLogging{.request_scoped = true});
    if (request->peer.gone) {
        request->peer.gone->on_cancel([weak = std::weak_ptr<RequestContext>(context)] {
            if (auto alive = weak.lock()) alive->cancellation()->cancel();
        });
    }
    in_flight_[request->peer.scope + request->id] = context;
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").field("method", "notifications/subscriptions/acknowledged");
    w.key("params").begin_object();
    w.key("_meta").begin_object().key(meta_subscription_key).raw(request->id).end_object();
    w.key("notifications").begin_object().end_object();
    w.end_object().end_object();
    request->peer.send(w.take());
    asio::co_spawn(executor_, hold_subscription(std::move(request)), report_failure);
}

asio::awaitable<void> Session::hold_subscription(std::shared_ptr<Request> request) {
    auto context = in_flight_.at(request->peer.scope + request->id);
    auto timer = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    std::weak_ptr<asio::steady_timer> weak = timer;
    auto on_cancel = [weak] {
        if (auto t = weak.lock()) t->cancel();
    };
    context->cancellation()->on_cancel(on_cancel);
    if (!context->cancelled()) co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
    in_flight_.erase(request->peer.scope + request->id);
    // Ended by the client: no response. Ended by the server: a graceful close.
    if (!shutting_down_) co_return;
    reply(*request, "{}", Caching::none, fmt::format("\"{}\":{}", meta_subscription_key, request->id));
}

void Session::reply(const Request& request, std::string result_json, Caching caching, std::string_view extra_meta,
                    std::string_view result_type) {
    if (request.stateless) {
        // 2026-07-28 results say whether they are complete, name the server and,
        // where cacheable, how long they stay fresh and for whom.
        json::Writer envelope;
        envelope.begin_object().field("resultType", result_type);
        envelope.key("_meta").begin_object().key(meta_server_info_key).raw(server_info_json_);
        if (!extra_meta.empty()) envelope.raw(extra_meta);
        envelope.end_object();
        if (caching == Caching::cacheable) envelope.field("ttlMs", cache_ttl_ms).field("cacheScope", cache_scope);
        envelope.end_object();
        auto fields = envelope.take();  // {"resultType":…}: its members go into the result object
        result_json.pop_back();
        if (result_json.size() > 1) result_json += ',';
        result_json.append(fields, 1);
    }
    std::string message;
    message.reserve(result_json.size() + request.id.size() + 40);
    message += "{\"jsonrpc\":\"2.0\",\"id\":";
    message += request.id;
    message += ",\"result\":";
    message += result_json;
    message += '}';
    settle(request, std::move(message));
}

void Session::reply_error(const Request& request, int code, std::string_view message, std::string_view data_json) {
    settle(request, error_message(request.id, code, message, data_json));
}

void Session::settle(const Request& request, std::string message) {
    if (!request.batch) {
        if (!message.empty()) request.peer.send(std::move(message));
        return;
    }
    auto& batch = *request.batch;
    if (!message.empty()) batch.responses.push_back(std::move(message));
    if (--batch.unsettled > 0 || batch.responses.empty()) return;
    std::string joined = "[";
    for (const auto& response : batch.responses) {
        if (joined.size() > 1) joined += ',';
        joined += response;
    }
    joined += ']';
    request.peer.send(std::move(joined));
}

asio::awaitable<void> Session::shutdown() {
    shutting_down_ = true;
    for (auto& [id, context] : in_flight_) context->cancellation()->cancel();
    close_outbound();
    // Tasks shared with other Sessions outlive this one; its own end with it.
    if (owns_tasks_) tasks_->cancel_all();
    asio::steady_timer timer(executor_);
    auto deadline = std::chrono::steady_clock::now() + shutdown_grace;
    while ((!in_flight_.empty() || (owns_tasks_ && tasks_->working() > 0)) && std::chrono::steady_clock::now() < deadline) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

// ---- tasks ---------------------------------------------------------------------

bool Session::tasks_negotiated() const { return protocol_version_ >= tasks_version; }  // revisions are dates

void Session::start_task(std::shared_ptr<Request> request, const Tool& tool, std::optional<std::int64_t> ttl_ms) {
    simdjson::dom::element token;
    std::string token_json;
    if (request->params["_meta"]["progressToken"].get(token) == simdjson::SUCCESS && (token.is_string() || token.is_number())) {
        token_json = json::to_string(token);
    }
    // Progress and log lines reach the client only while the call is still a
    // plain request: once it is a task, its request has been answered.
    auto outlet = std::make_shared<bool>(true);
    auto forward = [send = request->peer.send, outlet](std::string message) {
        if (*outlet) send(std::move(message));
    };
    RequestLogging logging{.request_scoped = request->stateless, .level = request->log_level};
    auto context = std::make_shared<RequestContext>(std::move(forward), std::move(token_json), logging);
    context->set_principal(request->peer.principal);
    simdjson::dom::element arguments;
    if (request->params["arguments"].get(arguments) != simdjson::SUCCESS) arguments = empty_object();
    std::shared_ptr<Task> task;
    try {
        task = tasks_->start(request->peer.principal, tool, request->document, arguments, context, ttl_ms,
                             request->stateless ? TaskEra::y2026 : TaskEra::y2025);
    } catch (const std::length_error& e) {
        reply_error(*request, error_code::invalid_request, fmt::format("Invalid Request: {}", e.what()));
        return;
    }
    // Stdio: one stream for everything, so status changes can follow the task.
    if (!request->stateless && !request->peer.finished) task->notify = request->peer.send;
    if (request->peer.gone) {
        // A client that stops listening cancels its call, not the task it became.
        request->peer.gone->on_cancel([weak = std::weak_ptr<Task>(task)] {
            if (auto alive = weak.lock(); alive && !alive->promoted) alive->context->cancellation()->cancel();
        });
    }
    in_flight_[request->peer.scope + request->id] = context;
    asio::co_spawn(executor_, answer_task_call(std::move(request), std::move(task), std::move(outlet)), report_failure);
}

asio::awaitable<void> Session::answer_task_call(std::shared_ptr<Request> request, std::shared_ptr<Task> task,
                                                std::shared_ptr<bool> outlet) {
    bool server_decides = request->stateless;
    if (server_decides) co_await tasks_->wait(task, std::chrono::steady_clock::now() + task_promotion_delay);
    in_flight_.erase(request->peer.scope + request->id);
    if (server_decides && (task->terminal() || task->context->cancelled())) {
        // Done in time (or cancelled by notifications/cancelled): a plain answer, no task.
        if (!task->terminal()) co_await tasks_->wait(task, std::chrono::steady_clock::time_point::max());
        tasks_->erase(task->id);
        if (task->context->cancelled()) {
            settle(*request, {});
        } else if (task->state == Task::State::failed) {
            reply_error(*request, task->error_code, task->error_message);
        } else {
            reply(*request, task->result_json);
        }
        co_return;
    }
    task->promoted = true;
    *outlet = false;
    json::Writer w;
    if (server_decides) {
        TaskStore::write(w, *task, TaskEra::y2026, false);
        reply(*request, w.take(), Caching::none, {}, "task");
        co_return;
    }
    w.begin_object().key("task");
    TaskStore::write(w, *task, TaskEra::y2025, false);
    w.key("_meta").begin_object();
    w.field(meta_immediate_response_key,
            fmt::format("{} is running as task {}; its result comes with tasks/result once it ends.", task->tool, task->id));
    w.end_object().end_object();
    reply(*request, w.take());
}

void Session::handle_task_request(std::shared_ptr<Request> request) {
    const auto& method = request->method;
    if (request->stateless && !request->tasks_extension) {
        json::Writer data;
        data.begin_object().key("requiredCapabilities").begin_object().key("extensions").begin_object();
        data.key(tasks_extension).begin_object().end_object().end_object().end_object().end_object();
        reply_error(*request, error_code::missing_client_capability,
                    fmt::format("Missing required client capability: {} needs the {} extension in the request's capabilities",
                                method, tasks_extension),
                    data.str());
        return;
    }
    auto era = request->stateless ? TaskEra::y2026 : TaskEra::y2025;
    const auto& principal = request->peer.principal;
    if (method == "tasks/list") {
        std::string_view cursor;
        if (!request->has_params || request->params["cursor"].get(cursor) != simdjson::SUCCESS) cursor = {};
        std::string next;
        std::vector<std::shared_ptr<Task>> page;
        try {
            page = tasks_->list(principal, std::string(cursor), next);
        } catch (const std::invalid_argument&) {
            reply_error(*request, error_code::invalid_params, "Invalid params: unknown cursor (pass the nextCursor of an earlier tasks/list)");
            return;
        }
        json::Writer w;
        w.begin_object().key("tasks").begin_array();
        for (const auto& task : page) TaskStore::write(w, *task, era, false);
        w.end_array();
        if (!next.empty()) w.field("nextCursor", next);
        w.end_object();
        reply(*request, w.take());
        return;
    }
    if (method != "tasks/get" && method != "tasks/cancel" && method != "tasks/result" && method != "tasks/update") {
        reply_error(*request, error_code::method_not_found, fmt::format("Method not found: {}", method));
        return;
    }
    std::string_view id;
    if (!request->has_params || request->params["taskId"].get(id) != simdjson::SUCCESS) {
        reply_error(*request, error_code::invalid_params, fmt::format("Invalid params: {} needs params.taskId (a string)", method));
        return;
    }
    auto task = tasks_->find(principal, std::string(id));
    if (!task) {
        reply_error(*request, error_code::invalid_params,
                    "Failed to retrieve task: Task not found (never created, expired, or another client's)");
        return;
    }
    json::Writer w;
    if (method == "tasks/get") {
        TaskStore::write(w, *task, era, true);
        reply(*request, w.take());
    } else if (method == "tasks/update") {
        reply(*request, "{}");  // no task of ours ever waits for input: nothing is outstanding
    } else if (method == "tasks/cancel") {
        bool cancelled = tasks_->cancel(task);
        if (era == TaskEra::y2026) {
            reply(*request, "{}");  // cancelling an ended task is acknowledged all the same
        } else if (!cancelled) {
            reply_error(*request, error_code::invalid_params,
                        fmt::format("Invalid params: task {} has already ended; it cannot be cancelled", task->id));
        } else {
            TaskStore::write(w, *task, era, false);
            reply(*request, w.take());
        }
    } else {
        auto context = std::make_shared<RequestContext>(request->peer.send, std::string());
        if (request->peer.gone) {
            request->peer.gone->on_cancel([weak = std::weak_ptr<RequestContext>(context)] {
                if (auto alive = weak.lock()) alive->cancellation()->cancel();
            });
        }
        in_flight_[request->peer.scope + request->id] = context;
        asio::co_spawn(executor_, task_result(std::move(request), std::move(task)), report_failure);
    }
}

// tasks/result: waits for the end, then answers what the call would have.
asio::awaitable<void> Session::task_result(std::shared_ptr<Request> request, std::shared_ptr<Task> task) {
    auto context = in_flight_.at(request->peer.scope + request->id);
    while (!task->terminal() && !context->cancelled()) {
        co_await tasks_->wait(task, std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
    }
    in_flight_.erase(request->peer.scope + request->id);
    if (context->cancelled()) {
        settle(*request, {});
        co_return;
    }
    if (task->state == Task::State::failed) {
        reply_error(*request, task->error_code, task->error_message);
    } else if (task->state == Task::State::cancelled) {
        reply_error(*request, error_code::invalid_params, fmt::format("Invalid params: task {} was cancelled; it has no result", task->id));
    } else {
        auto result = task->result_json;
        result.pop_back();
        result += fmt::format(",\"_meta\":{{\"{}\":{{\"taskId\":\"{}\"}}}}}}", meta_related_task_key, task->id);
        reply(*request, std::move(result));
    }
}

} // namespace cubicle::mcp
