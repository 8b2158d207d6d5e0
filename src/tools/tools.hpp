// The MCP tools: thin adapters from validated arguments to sandbox calls.
#pragma once

#include <vector>

#include "config.hpp"
#include "docker/client.hpp"
#include "mcp/http.hpp"
#include "mcp/resource.hpp"
#include "mcp/tool.hpp"
#include "sandbox/manager.hpp"

namespace cubicle::tools {

std::vector<mcp::Tool> sandbox_tools(sandbox::Manager& manager, docker::Client& docker, const Config& config);

// The tools and, sharing their state, the sandboxes' files as resources.
struct Services {
    std::vector<mcp::Tool> tools;
    mcp::ResourceProvider resources;
};
Services sandbox_services(sandbox::Manager& manager, docker::Client& docker, const Config& config);

// What the HTTP transport serves under {path}/preview/: the caller's exposed ports.
mcp::PreviewOpener preview_opener(sandbox::Manager& manager);

} // namespace cubicle::tools
