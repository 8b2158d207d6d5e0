// A tool as the protocol sees it: name, schemas, annotations and a handler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <simdjson.h>

#include "common/cancellation.hpp"

namespace cubicle::mcp {

// An image returned beside the text (base64 data).
struct ImageContent {
    std::string data;
    std::string mime_type;
};

// What a tool call returns. `structured` is a serialized JSON object matching
// the tool's output schema; `text` defaults to it.
struct ToolResult {
    std::string structured;
    std::string text;
    bool is_error = false;
    std::vector<ImageContent> images;
};

// The per-request side of a tool call: progress, cancellation, logging.
class RequestContext {
public:
    RequestContext(std::function<void(std::string)> send, std::string progress_token)
        : send_(std::move(send)), progress_token_(std::move(progress_token)),
          cancellation_(std::make_shared<Cancellation>()) {}

    bool wants_progress() const { return !progress_token_.empty(); }
    // Sends notifications/progress (when the client asked for it); `progress`
    // must grow from call to call.
    void progress(double progress, std::string_view message);
    const std::shared_ptr<Cancellation>& cancellation() const { return cancellation_; }
    bool cancelled() const { return cancellation_->cancelled(); }

private:
    std::function<void(std::string)> send_;
    std::string progress_token_;  // serialized JSON (string or number), empty if none
    std::shared_ptr<Cancellation> cancellation_;
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
};

} // namespace cubicle::mcp
