#include "sandbox/container_memory.hpp"

#include <array>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

namespace cubicle::sandbox {
namespace {

namespace fs = std::filesystem;

// Where the engine's cgroup drivers put a container's memory cgroup: cgroupfs
// (v1 under memory/, v2 unified) and systemd.
std::optional<fs::path> memory_cgroup(std::string_view id, const std::string& root) {
    const std::array candidates{
        fmt::format("{}/memory/docker/{}", root, id),
        fmt::format("{}/memory/system.slice/docker-{}.scope", root, id),
        fmt::format("{}/docker/{}", root, id),
        fmt::format("{}/system.slice/docker-{}.scope", root, id),
    };
    std::error_code ec;
    for (const auto& dir : candidates) {
        if (fs::exists(fs::path(dir) / "memory.stat", ec)) return fs::path(dir);
    }
    return std::nullopt;
}

// memory.stat: "key value" lines; the hierarchical totals where v1 has them.
void read_stat(const fs::path& file, ContainerMemory& out) {
    std::ifstream in(file);
    std::string key;
    std::uint64_t value = 0;
    bool totals = false;
    ContainerMemory own, total;
    while (in >> key >> value) {
        if (key.starts_with("total_")) {
            totals = true;
            key.erase(0, 6);
            if (key == "rss") total.cgroup_rss = value;
            else if (key == "cache") total.cgroup_cache = value;
            else if (key == "shmem") total.cgroup_shmem = value;
            else if (key == "mapped_file") total.cgroup_mapped_file = value;
            continue;
        }
        if (key == "rss" || key == "anon") own.cgroup_rss = value;
        else if (key == "cache" || key == "file") own.cgroup_cache = value;
        else if (key == "shmem") own.cgroup_shmem = value;
        else if (key == "mapped_file" || key == "file_mapped") own.cgroup_mapped_file = value;
    }
    const auto& use = totals ? total : own;
    out.cgroup_rss = use.cgroup_rss;
    out.cgroup_cache = use.cgroup_cache;
    out.cgroup_shmem = use.cgroup_shmem;
    out.cgroup_mapped_file = use.cgroup_mapped_file;
}

// smaps_rollup: "Key:   N kB" lines; false if the process is gone or hidden from us.
bool read_rollup(const std::string& pid, ContainerMemory& out) {
    std::ifstream in("/proc/" + pid + "/smaps_rollup");
    if (!in) return false;
    std::string line;
    bool any = false;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string key;
        std::uint64_t kib = 0;
        if (!(fields >> key >> kib)) continue;
        auto bytes = kib * 1024;
        if (key == "Rss:") out.rss += bytes, any = true;
        else if (key == "Pss:") out.pss += bytes;
        else if (key == "Private_Clean:" || key == "Private_Dirty:") out.uss += bytes;
    }
    return any;
}

} // namespace

ContainerMemory& ContainerMemory::operator+=(const ContainerMemory& other) {
    measured += other.measured;
    uss += other.uss;
    pss += other.pss;
    rss += other.rss;
    cgroup_rss += other.cgroup_rss;
    cgroup_cache += other.cgroup_cache;
    cgroup_shmem += other.cgroup_shmem;
    cgroup_mapped_file += other.cgroup_mapped_file;
    return *this;
}

ContainerMemory read_container_memory(std::string_view container_id, const std::string& cgroup_root) {
    ContainerMemory memory;
    if (container_id.empty()) return memory;
    auto dir = memory_cgroup(container_id, cgroup_root);
    if (!dir) return memory;
    read_stat(*dir / "memory.stat", memory);
    std::ifstream procs(*dir / "cgroup.procs");
    std::string pid;
    while (procs >> pid) read_rollup(pid, memory);
    memory.measured = 1;
    return memory;
}

} // namespace cubicle::sandbox
