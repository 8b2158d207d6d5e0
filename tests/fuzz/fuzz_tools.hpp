// The trivial tool set the MCP fuzz targets (fuzz_session, fuzz_http) serve:
// one that answers with progress first, one that fails as a tool error and one
// that throws what no tool should (an internal error).
#pragma once

#include <stdexcept>
#include <vector>

#include <simdjson.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "mcp/tool.hpp"

namespace cubicle::fuzz {

inline boost::asio::awaitable<mcp::ToolResult> echo_tool(simdjson::dom::element arguments, std::shared_ptr<mcp::RequestContext> context) {
    context->progress(1, "echoing");  // a progress notification (an SSE event over HTTP) before the answer
    json::Writer w;
    w.begin_object().key("echo").raw(json::to_string(arguments)).end_object();
    co_return mcp::ToolResult{.structured = w.take()};
}

inline boost::asio::awaitable<mcp::ToolResult> fail_tool(simdjson::dom::element, std::shared_ptr<mcp::RequestContext>) {
    throw ToolError("always fails");
    co_return mcp::ToolResult{};
}

inline boost::asio::awaitable<mcp::ToolResult> crash_tool(simdjson::dom::element, std::shared_ptr<mcp::RequestContext>) {
    throw std::runtime_error("boom");
    co_return mcp::ToolResult{};
}

inline std::vector<mcp::Tool> tools() {
    const char* any = R"({"type":"object","properties":{},"additionalProperties":true})";
    return {
        mcp::Tool{.name = "echo", .title = "Echo", .description = "Echoes its arguments", .input_schema = any,
                  .output_schema = R"({"type":"object","properties":{"echo":{"type":"object"}}})", .read_only = true,
                  .handler = echo_tool},
        mcp::Tool{.name = "fail", .title = "Fail", .description = "A tool error", .input_schema = any, .output_schema = any,
                  .handler = fail_tool},
        mcp::Tool{.name = "crash", .title = "Crash", .description = "Throws", .input_schema = any, .output_schema = any,
                  .handler = crash_tool},
    };
}

} // namespace cubicle::fuzz
