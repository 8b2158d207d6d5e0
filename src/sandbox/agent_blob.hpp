#pragma once

#include <string>
#include <string_view>

namespace cubicle::sandbox {

// The in-sandbox agent executable (src/agent), embedded at build time so that
// cubicle stays a single binary.
std::string_view agent_binary();

// A tar archive holding the agent as "agent" (mode 0755), for /opt/cubicle.
std::string agent_archive();

} // namespace cubicle::sandbox
