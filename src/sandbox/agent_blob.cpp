#include "sandbox/agent_blob.hpp"

#include "common/hex.hpp"
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

std::string agent_archive_linked(const std::string& file) {
    docker::TarWriter tar;
    tar.add({.name = file, .content = agent_binary(), .mode = 0755});
    tar.add({.name = "agent", .link_target = file, .mode = 0777});
    return tar.finish();
}

const std::string& agent_digest() {
    static const std::string digest = sha256_hex(agent_binary());
    return digest;
}

} // namespace cubicle::sandbox
