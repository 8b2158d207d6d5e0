#include "sandbox/agent_blob.hpp"

extern "C" const char cubicle_agent_start[];
extern "C" const char cubicle_agent_end[];

namespace cubicle::sandbox {

std::string_view agent_binary() {
    return {cubicle_agent_start, static_cast<std::size_t>(cubicle_agent_end - cubicle_agent_start)};
}

} // namespace cubicle::sandbox
