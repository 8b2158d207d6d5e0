#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "sandbox/container_memory.hpp"

using namespace cubicle::sandbox;
namespace fs = std::filesystem;

namespace {

// A cgroup file system of one container whose one process is this test itself:
// memory.stat as the kernel writes it, cgroup.procs naming our pid.
struct FakeCgroup {
    fs::path root = fs::temp_directory_path() / ("cubicle-memory-test-" + std::to_string(::getpid()));
    FakeCgroup(const std::string& dir, const std::string& stat) {
        fs::create_directories(root / dir);
        std::ofstream(root / dir / "memory.stat") << stat;
        std::ofstream(root / dir / "cgroup.procs") << ::getpid() << "\n";
    }
    ~FakeCgroup() { fs::remove_all(root); }
};

const std::string id = "0123456789abcdef";

} // namespace

TEST(ContainerMemory, ReadsCgroupV1TotalsAndOurOwnSmaps) {
    FakeCgroup cgroup("memory/docker/" + id,
                      "cache 100\nrss 200\nshmem 30\nmapped_file 40\ntotal_cache 1000\ntotal_rss 2000\ntotal_shmem 300\n"
                      "total_mapped_file 400\n");
    auto m = read_container_memory(id, cgroup.root.string());
    EXPECT_EQ(m.measured, 1u);
    EXPECT_EQ(m.cgroup_rss, 2000u) << "the hierarchical totals where v1 has them";
    EXPECT_EQ(m.cgroup_cache, 1000u);
    EXPECT_EQ(m.cgroup_shmem, 300u);
    EXPECT_EQ(m.cgroup_mapped_file, 400u);
    // This process, from /proc/self/smaps_rollup: private pages are part of what it maps.
    EXPECT_GT(m.uss, 0u);
    EXPECT_LE(m.uss, m.pss);
    EXPECT_LE(m.pss, m.rss);
}

TEST(ContainerMemory, ReadsCgroupV2UnderTheSystemdDriver) {
    FakeCgroup cgroup("system.slice/docker-" + id + ".scope", "anon 5000\nfile 7000\nshmem 70\nfile_mapped 700\n");
    auto m = read_container_memory(id, cgroup.root.string());
    EXPECT_EQ(m.measured, 1u);
    EXPECT_EQ(m.cgroup_rss, 5000u);
    EXPECT_EQ(m.cgroup_cache, 7000u);
    EXPECT_EQ(m.cgroup_shmem, 70u);
    EXPECT_EQ(m.cgroup_mapped_file, 700u);
}

TEST(ContainerMemory, NothingWhereTheContainerCannotBeFound) {
    FakeCgroup cgroup("memory/docker/other", "rss 1\n");
    auto m = read_container_memory(id, cgroup.root.string());
    EXPECT_EQ(m.measured, 0u);
    EXPECT_EQ(m.uss + m.pss + m.rss + m.cgroup_rss + m.cgroup_cache, 0u);
    EXPECT_EQ(read_container_memory("", cgroup.root.string()).measured, 0u);
}

TEST(ContainerMemory, SumsOverContainers) {
    ContainerMemory a{.measured = 1, .uss = 10, .pss = 20, .rss = 30, .cgroup_rss = 40, .cgroup_cache = 50};
    ContainerMemory b{.measured = 1, .uss = 1, .pss = 2, .rss = 3, .cgroup_rss = 4, .cgroup_cache = 5};
    a += b;
    EXPECT_EQ(a.measured, 2u);
    EXPECT_EQ(a.uss, 11u);
    EXPECT_EQ(a.pss, 22u);
    EXPECT_EQ(a.cgroup_rss, 44u);
    EXPECT_EQ(a.cgroup_cache, 55u);
}
