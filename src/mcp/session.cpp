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
#include "common/log.hpp"

namespace cubicle::mcp {
namespace {

// The stateless revision: no initialize, version and capabilities in each request's _meta.
constexpr std::string_view stateless_version = "2026-07-28";
constexpr std::string_view meta_version_key = "io.modelcontextprotocol/protocolVersion";
constexpr auto shutdown_grace = std::chrono::seconds(5);

// Stands in for omitted tool arguments; parsed once and never reparsed, so it stays valid.
simdjson::dom::element empty_object() {
    static json::Document document;
    static const bool parsed = !document.parse("{}");
    (void)parsed;
    return document.root();
}

} // namespace

const std::vector<std::string>& supported_versions() {
    static const std::vector<std::string> versions = {"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};
    return versions;
}

void RequestContext::progress(double progress, std::string_view message) {
    if (progress_token_.empty()) return;
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").field("method", "notifications/progress");
    w.key("params").begin_object().key("progressToken").raw(progress_token_).field("progress", progress);
    if (!message.empty()) w.field("message", message);
    w.end_object().end_object();
    send_(w.take());
}

struct Session::Request {
    json::Document document;
    std::string id;  // serialized JSON; empty for notifications
    std::string method;
    simdjson::dom::element params;
    bool has_params = false;
    bool stateless = false;  // sent under the stateless revision: results carry resultType
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
}

Session::~Session() { log::set_forwarder({}); }

void Session::handle_message(std::string text) {
    auto request = std::make_shared<Request>();
    if (auto error = request->document.parse(std::move(text))) {
        reply_error("null", error_code::parse_error, fmt::format("Parse error: {}", *error));
        return;
    }
    auto root = request->document.root();
    if (root.is_array()) {
        reply_error("null", error_code::invalid_request, "Invalid Request: JSON-RPC batches are not supported");
        return;
    }
    simdjson::dom::object message;
    if (root.get(message) != simdjson::SUCCESS) {
        reply_error("null", error_code::invalid_request, "Invalid Request: a message must be a JSON object");
        return;
    }
    simdjson::dom::element id;
    bool has_id = message["id"].get(id) == simdjson::SUCCESS;
    if (has_id) {
        if (!id.is_string() && !id.is_int64() && !id.is_uint64()) {
            reply_error("null", error_code::invalid_request, "Invalid Request: id must be a string or an integer");
            return;
        }
        request->id = json::to_string(id);
    }
    std::string_view version;
    if (message["jsonrpc"].get(version) != simdjson::SUCCESS || version != "2.0") {
        reply_error(has_id ? request->id : "null", error_code::invalid_request, "Invalid Request: jsonrpc must be \"2.0\"");
        return;
    }
    std::string_view method;
    if (message["method"].get(method) != simdjson::SUCCESS) {
        // A response to a request of ours (we send none) or garbage.
        if (!message["result"].error() || !message["error"].error()) return;
        reply_error(has_id ? request->id : "null", error_code::invalid_request, "Invalid Request: method is missing");
        return;
    }
    request->method = method;
    if (message["params"].get(request->params) == simdjson::SUCCESS) {
        if (!request->params.is_object()) {
            if (has_id) reply_error(request->id, error_code::invalid_params, "Invalid params: params must be an object");
            return;
        }
        request->has_params = true;
        std::string_view meta_version;
        if (request->params["_meta"][meta_version_key].get(meta_version) == simdjson::SUCCESS) {
            request->stateless = meta_version == stateless_version;
        }
    }
    if (has_id) {
        handle_request(std::move(request));
    } else {
        handle_notification(std::move(request));
    }
}

void Session::handle_notification(std::shared_ptr<Request> request) {
    if (request->method == "notifications/cancelled" && request->has_params) {
        simdjson::dom::element id;
        if (request->params["requestId"].get(id) != simdjson::SUCCESS) return;
        auto it = in_flight_.find(json::to_string(id));
        if (it == in_flight_.end()) return;  // finished already, or never existed: ignore
        std::string_view reason;
        if (request->params["reason"].get(reason) != simdjson::SUCCESS) reason = {};
        log::debug("request {} cancelled by the client{}{}", it->first, reason.empty() ? "" : ": ", reason);
        it->second->cancellation()->cancel();
    }
    // notifications/initialized, notifications/progress, roots changes: nothing to do.
}

void Session::handle_request(std::shared_ptr<Request> request) {
    const auto& method = request->method;
    if (in_flight_.count(request->id)) {
        reply_error(request->id, error_code::invalid_request, "Invalid Request: this id is already in use by a running request");
        return;
    }
    if (method == "initialize") {
        std::string_view asked;
        if (!request->has_params || request->params["protocolVersion"].get(asked) != simdjson::SUCCESS) {
            reply_error(request->id, error_code::invalid_params, "Invalid params: initialize needs params.protocolVersion");
            return;
        }
        const auto& versions = supported_versions();
        // Answer with the client's revision when we speak it, else our newest stateful one.
        bool known = std::find(versions.begin(), versions.end(), asked) != versions.end() && asked != stateless_version;
        protocol_version_ = known ? std::string(asked) : versions[1];
        json::Writer w;
        w.begin_object().field("protocolVersion", protocol_version_);
        w.key("capabilities").begin_object();
        w.key("tools").begin_object().field("listChanged", false).end_object();
        w.key("logging").begin_object().end_object();
        w.end_object();
        w.key("serverInfo").begin_object().field("name", info_.name).field("title", "cubicle").field("version", info_.version).end_object();
        w.field("instructions", info_.instructions);
        w.end_object();
        reply(*request, w.take());
    } else if (method == "server/discover") {
        json::Writer w;
        w.begin_object().key("supportedVersions").begin_array();
        for (const auto& version : supported_versions()) w.value(version);
        w.end_array();
        w.key("capabilities").begin_object().key("tools").begin_object().field("listChanged", false).end_object().end_object();
        w.key("serverInfo").begin_object().field("name", info_.name).field("title", "cubicle").field("version", info_.version).end_object();
        w.field("instructions", info_.instructions);
        w.end_object();
        reply(*request, w.take());
    } else if (method == "ping") {
        reply(*request, "{}");
    } else if (method == "tools/list") {
        reply(*request, tools_json());
    } else if (method == "tools/call") {
        call_tool(std::move(request));
    } else if (method == "logging/setLevel") {
        std::string_view level;
        if (!request->has_params || request->params["level"].get(level) != simdjson::SUCCESS || !log::parse_level(level)) {
            reply_error(request->id, error_code::invalid_params,
                        "Invalid params: level must be one of debug, info, notice, warning, error, critical, alert, emergency");
            return;
        }
        set_client_log_level(level);
        reply(*request, "{}");
    } else {
        reply_error(request->id, error_code::method_not_found, fmt::format("Method not found: {}", method));
    }
}

void Session::set_client_log_level(std::string_view name) {
    auto threshold = *log::parse_level(name);
    auto send = send_;
    log::set_forwarder([send, threshold](log::Level level, std::string_view message) {
        if (level < threshold) return;
        json::Writer w;
        w.begin_object().field("jsonrpc", "2.0").field("method", "notifications/message");
        w.key("params").begin_object().field("level", log::level_name(level)).field("logger", "cubicle").field("data", message).end_object();
        w.end_object();
        send(w.take());
    });
}

std::string Session::tools_json() const {
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
        w.end_object();
    }
    w.end_array().end_object();
    return w.take();
}

void Session::call_tool(std::shared_ptr<Request> request) {
    std::string_view name;
    if (!request->has_params || request->params["name"].get(name) != simdjson::SUCCESS) {
        reply_error(request->id, error_code::invalid_params, "Invalid params: tools/call needs params.name");
        return;
    }
    auto tool = std::find_if(tools_.begin(), tools_.end(), [&](const Tool& t) { return t.name == name; });
    if (tool == tools_.end()) {
        std::string names;
        for (const auto& t : tools_) names += (names.empty() ? "" : ", ") + t.name;
        reply_error(request->id, error_code::invalid_params, fmt::format("Unknown tool: {} (available: {})", name, names));
        return;
    }
    simdjson::dom::element arguments;
    if (request->params["arguments"].get(arguments) == simdjson::SUCCESS && !arguments.is_object()) {
        reply_error(request->id, error_code::invalid_params, "Invalid params: arguments must be an object");
        return;
    }
    simdjson::dom::element token;
    std::string token_json;
    if (request->params["_meta"]["progressToken"].get(token) == simdjson::SUCCESS && (token.is_string() || token.is_number())) {
        token_json = json::to_string(token);
    }
    auto context = std::make_shared<RequestContext>(send_, std::move(token_json));
    in_flight_[request->id] = context;
    asio::co_spawn(executor_, run_tool(&*tool, request), [](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& ex) {
            log::error("tool call coroutine failed: {}", ex.what());
        }
    });
}

asio::awaitable<void> Session::run_tool(const Tool* tool, std::shared_ptr<Request> request) {
    auto context = in_flight_.at(request->id);
    simdjson::dom::element arguments;
    if (request->params["arguments"].get(arguments) != simdjson::SUCCESS) arguments = empty_object();
    ToolResult result;
    std::string internal_error;
    try {
        result = co_await tool->handler(arguments, context);
    } catch (const ToolError& e) {
        result = ToolResult{.text = e.what(), .is_error = true};
    } catch (const std::exception& e) {
        internal_error = e.what();
        log::error("{} failed: {}", tool->name, internal_error);
    }
    in_flight_.erase(request->id);
    // The spec asks for no response to a request the client cancelled.
    if (context->cancelled()) co_return;
    if (!internal_error.empty()) {
        reply_error(request->id, error_code::internal_error, fmt::format("Internal error in {}: {}", tool->name, internal_error));
        co_return;
    }
    json::Writer w;
    w.begin_object().key("content").begin_array();
    w.begin_object().field("type", "text").field("text", result.text.empty() ? result.structured : result.text).end_object();
    for (const auto& image : result.images) {
        w.begin_object().field("type", "image").field("data", image.data).field("mimeType", image.mime_type).end_object();
    }
    w.end_array();
    if (!result.structured.empty()) w.key("structuredContent").raw(result.structured);
    w.field("isError", result.is_error);
    w.end_object();
    reply(*request, w.take());
}

void Session::reply(const Request& request, std::string result_json) {
    if (request.stateless && result_json.size() >= 2 && result_json.front() == '{') {
        // Stateless-revision results say whether they are complete.
        result_json.insert(1, result_json.size() > 2 ? "\"resultType\":\"complete\"," : "\"resultType\":\"complete\"");
    }
    std::string message;
    message.reserve(result_json.size() + request.id.size() + 40);
    message += "{\"jsonrpc\":\"2.0\",\"id\":";
    message += request.id;
    message += ",\"result\":";
    message += result_json;
    message += '}';
    send_(std::move(message));
}

void Session::reply_error(std::string_view id_json, int code, std::string_view message) {
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").key("id").raw(id_json);
    w.key("error").begin_object().field("code", code).field("message", message).end_object();
    w.end_object();
    send_(w.take());
}

asio::awaitable<void> Session::shutdown() {
    for (auto& [id, context] : in_flight_) context->cancellation()->cancel();
    asio::steady_timer timer(executor_);
    auto deadline = std::chrono::steady_clock::now() + shutdown_grace;
    while (!in_flight_.empty() && std::chrono::steady_clock::now() < deadline) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

} // namespace cubicle::mcp
