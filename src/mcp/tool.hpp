// A tool as the protocol sees it: name, schemas, annotations and a handler.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <simdjson.h>

#include "common/cancellation.hpp"
#include "common/log.hpp"

namespace cubicle::mcp {

// An image returned beside the text (base64 data).
struct ImageContent {
    std::string data;
    std::string mime_type;
};

// A resource a result points to (content type resource_link, from 2025-06-18).
struct ResourceLink {
    std::string uri;
    std::string name;
    std::string mime_type;
    std::string description;
};

// What a tool call returns. `structured` is a serialized JSON object matching
// the tool's output schema; `text` defaults to it.
struct ToolResult {
    std::string structured;
    std::string text;
    bool is_error = false;
    std::vector<ImageContent> images;
    std::vector<ResourceLink> links;
};

// How a request wants log lines about it: the 2026-07-28 revision scopes them
// to the request (sent only at or above the level its _meta names, none without
// one); earlier revisions send server-wide lines after logging/setLevel.
struct RequestLogging {
    bool request_scoped = false;
    std::optional<log::Level> level;  // request-scoped only
};

// Sends a request to the client (its method and serialized params) and waits at most
// `timeout` for the answer: the serialized result, or nullopt (no answer in time, an
// error response, the client gone).
using ClientRequester = std::function<boost::asio::awaitable<std::optional<std::string>>(
    std::string method, std::string params_json, std::chrono::milliseconds timeout)>;

// The per-request side of a tool call: progress, cancellation, logging.
class RequestContext {
public:
    RequestContext(std::function<void(std::string)> send, std::string progress_token, RequestLogging logging = {})
        : send_(std::move(send)), progress_token_(std::move(progress_token)), logging_(logging),
          cancellation_(std::make_shared<Cancellation>()) {}

    bool wants_progress() const { return !progress_token_.empty(); }
    // Sends notifications/progress (when the client asked for it); `progress`
    // must grow from call to call.
    void progress(double progress, std::string_view message);
    // Logs a line about this request: to stderr, and to the client as it asked.
    void log(log::Level level, std::string_view message);
    const std::shared_ptr<Cancellation>& cancellation() const { return cancellation_; }
    bool cancelled() const { return cancellation_->cancelled(); }
    // Who asked: sandboxes belong to the principal that created them.
    const std::string& principal() const { return principal_; }
    void set_principal(std::string principal) { principal_ = std::move(principal); }
    // Whether the user can be asked through the client (it declared form elicitation).
    bool can_elicit() const { return static_cast<bool>(elicit_); }
    // elicitation/create with `params_json`; see ClientRequester. Only when can_elicit().
    boost::asio::awaitable<std::optional<std::string>> elicit(std::string params_json, std::chrono::milliseconds timeout) {
        return elicit_("elicitation/create", std::move(params_json), timeout);
    }
    void set_elicitation(ClientRequester requester) { elicit_ = std::move(requester); }

private:
    std::function<void(std::string)> send_;
    std::string progress_token_;  // serialized JSON (string or number), empty if none
    RequestLogging logging_;
    std::shared_ptr<Cancellation> cancellation_;
    std::string principal_;
    ClientRequester elicit_;
};

using ToolHandler = std::function<boost::asio::awaitable<ToolResult>(simdjson::dom::element arguments,
                                                                     std::shared_ptr<RequestContext> context)>;

struct Tool {
    std::string name;
    std::string title;
    std::string description;
    std::string input_schema;   // serialized JSON Schema
    std::string output_schema;  // serialized JSON Schema
    bool read_only = false;
    bool destructive = false;
    bool idempotent = false;
    bool open_world = false;
    ToolHandler handler;
    // May run as an MCP task (execution.taskSupport "optional"): long work that outlives its request.
    bool task_support = false;
};

} // namespace cubicle::mcp
