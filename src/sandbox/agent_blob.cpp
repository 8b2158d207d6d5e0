#include "sandbox/agent_blob.hpp"

#include "docker/tar.hpp"

extern "C" const char cubicle_agent_start[];
extern "C" const char cubicle_agent_end[];

namespace cubicle::sandbox {

std::string_view agent_binary() {
    return {cubicle_agent_start, static_cast<std::size_t>(cubicle_agent_end - cubicle_agent_start)};
}

std::string agent_archive() {
    docker::TarWriter tar;
    tar.add({.name = "agent", .content = agent_binary(), .mode = 0755});
    return tar.finish();
}

} // namespace cubicle::sandbox
