// The MCP tools: thin adapters from validated arguments to sandbox calls.
#pragma once

#include <vector>

#include "config.hpp"
#include "docker/client.hpp"
#include "mcp/tool.hpp"
#include "sandbox/manager.hpp"

namespace cubicle::tools {

std::vector<mcp::Tool> sandbox_tools(sandbox::Manager& manager, docker::Client& docker, const Config& config);

} // namespace cubicle::tools
