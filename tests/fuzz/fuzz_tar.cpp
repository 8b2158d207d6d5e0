// libFuzzer target: the tar reader (files::read_tar), which parses archives
// the Docker Engine builds from sandbox files (names, sizes and links chosen
// by the sandbox), and the workspace path normaliser.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/errors.hpp"
#include "files/host_transfer.hpp"

using namespace cubicle;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // An exact-size copy so that any read outside the archive is caught.
    std::string archive(reinterpret_cast<const char*>(data), size);
    const files::Limits limits{.max_bytes = 1 << 20, .max_entries = 1000};
    try {
        auto members = files::read_tar(archive, limits);
        if (members.size() > limits.max_entries) std::abort();
        for (const auto& m : members) {
            if (m.path.starts_with('/') || m.path.starts_with("./") || (m.path.size() > 1 && m.path.ends_with('/')))
                std::abort();
            if (!m.data.empty() && (m.data.data() < archive.data() ||
                                    m.data.data() + m.data.size() > archive.data() + archive.size()))
                std::abort();
        }
    } catch (const ToolError&) {
        // a corrupt archive or one over the limits: a clear error for the model
    }
    try {
        std::string path = files::workspace_path(std::string_view(archive).substr(0, 4096));
        if (path.empty() || path.starts_with('/') || path == ".." || path.starts_with("../")) std::abort();
    } catch (const ToolError&) {
    }
    return 0;
}
