#pragma once

#include <string>
#include <string_view>

namespace cubicle::sandbox {

// The in-sandbox agent executable (src/agent), embedded at build time so that
// cubicle stays a single binary.
std::string_view agent_binary();

// A tar archive holding the agent as "agent" (mode 0755), for /opt/cubicle.
std::string agent_archive();

// The same for a volume that containers may be running it from already: the agent as
// `file`, then "agent" as a symbolic link to it, so that "agent" is never half-written.
std::string agent_archive_linked(const std::string& file);

// The agent's SHA-256, in hex: what names the volume it is shared in (agent_volume.hpp).
const std::string& agent_digest();

} // namespace cubicle::sandbox
