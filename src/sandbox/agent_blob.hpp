#pragma once

#include <string_view>

namespace cubicle::sandbox {

// The in-sandbox agent executable (src/agent), embedded at build time so that
// cubicle stays a single binary.
std::string_view agent_binary();

} // namespace cubicle::sandbox
