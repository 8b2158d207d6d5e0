// What every tool module shares: its environment, result helpers and the
// adapter from a coroutine to an mcp::ToolHandler.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <simdjson.h>

#include "common/errors.hpp"
#include "config.hpp"
#include "docker/client.hpp"
#include "mcp/tool.hpp"
#include "sandbox/manager.hpp"

namespace cubicle::tools {

struct Env {
    sandbox::Manager& manager;
    docker::Client& docker;
    const Config& config;
};

using Context = std::shared_ptr<mcp::RequestContext>;

inline mcp::ToolResult structured(std::string json_text) { return mcp::ToolResult{.structured = std::move(json_text)}; }

// A strict JSON Schema object: `properties` and `required` are JSON fragments.
inline std::string object_schema(std::string_view properties, std::string_view required) {
    return "{\"type\": \"object\", \"properties\": {" + std::string(properties) + "}, \"required\": [" +
           std::string(required) + "], \"additionalProperties\": false}";
}

inline constexpr std::string_view sandbox_id_property =
    R"("sandbox_id": {"type": "string", "description": "Id returned by initialize_sandbox"})";

// Docker failures (daemon down, image refused) are results the model can act on.
template <auto Handler>
boost::asio::awaitable<mcp::ToolResult> guarded(Env env, simdjson::dom::element arguments, Context context) {
    try {
        co_return co_await Handler(env, arguments, std::move(context));
    } catch (const docker::Error& e) {
        throw ToolError(e.what());
    }
}

template <auto Handler>
mcp::ToolHandler bind(Env env) {
    // Not a coroutine itself: it only forwards to one, so nothing it captures dangles.
    return [env](simdjson::dom::element arguments, Context context) {
        return guarded<Handler>(env, arguments, std::move(context));
    };
}

// An image file a run wrote into the workspace.
struct CollectedImage {
    std::string path;
    std::string mime;
    std::uint64_t bytes;
    std::string base64_data;
};

// Images (PNG, JPEG, GIF, WebP, SVG) in the workspace modified after `since`
// (unix seconds), at most 5 of at most 2 MiB each.
boost::asio::awaitable<std::vector<CollectedImage>> collect_images(Env env, std::shared_ptr<sandbox::Sandbox> box, double since);

// The file tools (file_tools.cpp).
std::vector<mcp::Tool> file_tools(Env env);

// install_package (package_tools.cpp).
std::vector<mcp::Tool> package_tools(Env env);

// Installs requirements.txt / package.json when they changed since the last
// install, in sandboxes with network and auto_install on. Throws ToolError
// with the installer's output when it fails.
boost::asio::awaitable<void> install_workspace_dependencies(Env env, std::shared_ptr<sandbox::Sandbox> box, Context context);

} // namespace cubicle::tools
