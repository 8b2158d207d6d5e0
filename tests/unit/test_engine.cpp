// Engine detection and quirks (docker/engine.hpp) against answers recorded from the
// engines of this project's machines (tests/golden/daemon/): Docker 20+, Podman 4.3.1,
// and Podman started with --runtime runsc.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <simdjson.h>

#include "docker/engine.hpp"
#include "sandbox/policy.hpp"

#include "recorded.hpp"

using namespace cubicle;

namespace {

std::string ulimit_names(simdjson::dom::element host) {
    std::string names;
    for (auto item : host["Ulimits"].get_array()) names += std::string(std::string_view(item["Name"])) + " ";
    return names;
}

} // namespace

TEST(Engine, TellsDockerFromPodman) {
    auto docker_engine = docker::parse_engine(recorded("docker_version.json"), recorded("info_no_gpu.json"));
    EXPECT_FALSE(docker_engine.podman());
    EXPECT_FALSE(docker_engine.version.empty());
    EXPECT_TRUE(docker_engine.runtime_per_container());
    EXPECT_EQ(docker_engine.describe().rfind("Docker ", 0), 0u) << docker_engine.describe();

    auto podman = docker::parse_engine(recorded("podman_version.json"), recorded("podman_info.json"));
    EXPECT_TRUE(podman.podman());
    EXPECT_EQ(podman.version, "4.3.1");
    EXPECT_EQ(podman.default_runtime, "runc");
    EXPECT_EQ(podman.describe(), "Podman 4.3.1");
    // Podman lists runsc without having it in use: only its service's runtime counts.
    EXPECT_NE(std::find(podman.runtimes.begin(), podman.runtimes.end(), "runsc"), podman.runtimes.end());
    EXPECT_FALSE(podman.offers("runsc"));
    EXPECT_NE(podman.why_not("runsc").find("--runtime runsc system service"), std::string::npos);

    auto gvisor = docker::parse_engine(recorded("podman_runsc_version.json"), recorded("podman_info.json"));
    EXPECT_EQ(gvisor.default_runtime, "runsc");
    EXPECT_TRUE(gvisor.offers("runsc"));
    EXPECT_EQ(gvisor.describe(), "Podman 4.3.1 (runtime runsc)");

    auto unknown = docker::parse_engine("not json", "");
    EXPECT_FALSE(unknown.podman());
    EXPECT_TRUE(unknown.offers(""));
}

TEST(Engine, WhatARuntimeIsTrustedWith) {
    auto docker_engine = docker::parse_engine(recorded("docker_version.json"), recorded("info_no_gpu.json"));
    EXPECT_TRUE(docker_engine.forks_and_recycles(""));
    EXPECT_TRUE(docker_engine.archive_on_running(""));
    EXPECT_FALSE(docker_engine.forks_and_recycles("runsc"));
    EXPECT_TRUE(docker_engine.archive_on_running("runsc"));  // only Podman's is known to fail

    auto gvisor = docker::parse_engine(recorded("podman_runsc_version.json"), recorded("podman_info.json"));
    EXPECT_EQ(gvisor.runtime_or_default(""), "runsc");
    EXPECT_FALSE(gvisor.forks_and_recycles(""));
    EXPECT_FALSE(gvisor.archive_on_running(""));
    auto podman = docker::parse_engine(recorded("podman_version.json"), recorded("podman_info.json"));
    EXPECT_TRUE(podman.forks_and_recycles(""));
    EXPECT_TRUE(podman.archive_on_running(""));
}

TEST(Engine, KillOfAStoppedContainer) {
    docker::Engine docker_engine;
    EXPECT_TRUE(docker_engine.kill_found_not_running(409, "Container abc is not running"));
    EXPECT_FALSE(docker_engine.kill_found_not_running(500, "container state improper"));
    docker::Engine podman{.kind = docker::Engine::Kind::podman};
    EXPECT_TRUE(podman.kill_found_not_running(500, "can only kill running containers. abc is in state exited: container state improper"));
    EXPECT_FALSE(podman.kill_found_not_running(500, "no space left on device"));
}

TEST(Engine, ContainerConfigFitsTheEngine) {
    sandbox::SandboxSpec spec;
    spec.image = "img";
    spec.pids_limit = 100;
    spec.memory_mb = 256;
    spec.tmp_size_mb = 64;
    spec.disk_mb = 32;
    simdjson::dom::parser on_docker;
    simdjson::dom::element host = on_docker.parse(sandbox::container_config(spec, "inst", "sb-1"))["HostConfig"].value();
    EXPECT_EQ(ulimit_names(host), "nofile fsize core ");
    EXPECT_EQ(std::string_view(host["Tmpfs"]["/tmp"]).find("noexec") != std::string_view::npos, true);
    EXPECT_EQ(host["Tmpfs"]["/run"].error(), simdjson::NO_SUCH_FIELD);
    EXPECT_EQ(host["Runtime"].error(), simdjson::NO_SUCH_FIELD);
    EXPECT_EQ(int64_t(host["PidsLimit"]), 100);

    auto podman = docker::parse_engine(recorded("podman_version.json"), recorded("podman_info.json"));
    simdjson::dom::parser on_podman;
    host = on_podman.parse(sandbox::container_config(spec, "inst", "sb-1", true, podman))["HostConfig"].value();
    EXPECT_EQ(ulimit_names(host), "nofile fsize core nproc ");
    EXPECT_EQ(std::string_view(host["Tmpfs"]["/run"]).substr(0, 3), "ro,");
    EXPECT_EQ(std::string_view(host["Tmpfs"]["/var/tmp"]).substr(0, 3), "ro,");

    // gVisor: room for its own tasks and memory; Docker is told the runtime, Podman is not.
    spec.runtime = "runsc";
    simdjson::dom::parser on_docker_runsc;
    host = on_docker_runsc.parse(sandbox::container_config(spec, "inst", "sb-1"))["HostConfig"].value();
    EXPECT_EQ(std::string_view(host["Runtime"]), "runsc");
    EXPECT_EQ(int64_t(host["PidsLimit"]), 164);
    EXPECT_EQ(int64_t(host["Memory"]), (256 + 32 + spec.tmp_size_mb + sandbox::own_processes_mb + 64) << 20);
    auto gvisor = docker::parse_engine(recorded("podman_runsc_version.json"), recorded("podman_info.json"));
    simdjson::dom::parser on_gvisor;
    host = on_gvisor.parse(sandbox::container_config(spec, "inst", "sb-1", true, gvisor))["HostConfig"].value();
    EXPECT_EQ(host["Runtime"].error(), simdjson::NO_SUCH_FIELD);
    EXPECT_EQ(int64_t(host["PidsLimit"]), 164);
}

TEST(Engine, KnowsWhenLimitsAreNotEnforced) {
    EXPECT_TRUE(docker::parse_engine("{}", R"({"MemoryLimit": true, "PidsLimit": true})").enforces_limits);
    EXPECT_TRUE(docker::parse_engine("{}", "{}").enforces_limits);  // an engine that does not say
    EXPECT_FALSE(docker::parse_engine("{}", R"({"MemoryLimit": true, "PidsLimit": false})").enforces_limits);
    EXPECT_FALSE(docker::parse_engine("{}", R"({"MemoryLimit": false, "PidsLimit": true})").enforces_limits);
}

TEST(Engine, RootlessPodmanOnCgroupV1CannotEnforceLimits) {
    // What rootless Podman 4.3.1 answers on this machine (cgroup v1): limits claimed, not enforced.
    auto info = R"({"CgroupVersion": "1", "MemoryLimit": true, "PidsLimit": true, "Rootless": true})";
    EXPECT_FALSE(docker::parse_engine("{}", info).enforces_limits);
    EXPECT_TRUE(docker::parse_engine("{}", R"({"CgroupVersion": "2", "MemoryLimit": true, "PidsLimit": true, "Rootless": true})").enforces_limits);
}
