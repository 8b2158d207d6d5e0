// What a container's memory costs the host, from the host kernel's own
// accounting: the memory cgroup's memory.stat (what the container is charged)
// and /proc/PID/smaps_rollup of its processes (USS and PSS: pages that only it
// holds, and its share of those it shares). RSS alone counts every shared page
// -- an interpreter's libraries, a zygote's pages its forks still share -- once
// in every process. Readable only where the engine runs on this host and the
// server may read its processes (root or the same user); elsewhere `measured`
// stays false.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cubicle::sandbox {

struct ContainerMemory {
    std::size_t measured = 0;  // containers summed here (0: nothing could be read)
    std::uint64_t uss = 0;     // private pages of its processes (Private_Clean + Private_Dirty)
    std::uint64_t pss = 0;     // its processes' proportional share of every page they map
    std::uint64_t rss = 0;     // summed over its processes (shared pages counted in each)
    // The cgroup's memory.stat, in cgroup v1's names (v2: anon, file, shmem, file_mapped).
    std::uint64_t cgroup_rss = 0;    // anonymous memory charged to it
    std::uint64_t cgroup_cache = 0;  // page cache charged to it (files it read, its tmpfs)
    std::uint64_t cgroup_shmem = 0;  // of the cache: tmpfs and shared memory
    std::uint64_t cgroup_mapped_file = 0;  // of the cache: mapped into its processes

    ContainerMemory& operator+=(const ContainerMemory& other);
};

// Reads the container's figures under the cgroup file system at `cgroup_root`
// (the cgroupfs and systemd drivers' places, v1 and v2) and /proc.
ContainerMemory read_container_memory(std::string_view container_id, const std::string& cgroup_root = "/sys/fs/cgroup");

} // namespace cubicle::sandbox
