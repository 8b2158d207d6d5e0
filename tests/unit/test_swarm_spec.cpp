// The Swarm service specs (policy.cpp's sandbox_service_spec, relay_service_spec): the locks
// of a local container as a 1.41 ServiceSpec carries them, and what a service cannot be.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>

#include "agent/protocol.h"
#include "common/errors.hpp"
#include "common/json.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

constexpr std::int64_t mib = 1024 * 1024;

SandboxSpec limited() {
    SandboxSpec spec;
    spec.image = "cubicle/sandbox:latest";
    spec.memory_mb = 256;
    spec.cpus = 0.5;
    spec.pids_limit = 64;
    spec.tmp_size_mb = 32;
    spec.disk_mb = 64;
    spec.files_limit = 1000;
    return spec;
}

SwarmSandbox site() {
    return {.service_name = "cubicle-abc",
            .image = "cubicle/sandbox:latest-agent-0123456789ab",
            .network = "net-1",
            .constraints = {"node.labels.sandboxes==yes", "node.role!=manager"},
            .dial = "10.0.0.2:4000 PIN TOKEN"};
}

std::vector<std::string> strings(simdjson::dom::element array) {
    std::vector<std::string> out;
    for (auto item : array.get_array()) out.emplace_back(std::string_view(item.get_string()));
    return out;
}

TEST(SwarmSpec, CarriesEveryLockThatA141ServiceSpecCanSay) {
    auto text = sandbox_service_spec(limited(), "inst", "sb-1", {}, site());
    json::Document doc;
    ASSERT_FALSE(doc.parse(text)) << text;
    auto root = doc.root();
    EXPECT_EQ(std::string_view(root["Name"].get_string()), "cubicle-abc");
    EXPECT_EQ(std::string_view(root["Labels"][label_sandbox].get_string()), "sb-1");
    EXPECT_EQ(std::string_view(root["Labels"][label_role].get_string()), role_sandbox);
    EXPECT_EQ(int64_t(root["Mode"]["Replicated"]["Replicas"].get_int64()), 1);
    EXPECT_EQ(std::string_view(root["EndpointSpec"]["Mode"].get_string()), "dnsrr");
    auto task = root["TaskTemplate"];
    EXPECT_EQ(std::string_view(task["RestartPolicy"]["Condition"].get_string()), "none");
    EXPECT_EQ(strings(task["Placement"]["Constraints"]), site().constraints);
    ASSERT_EQ(task["Networks"].get_array().size(), 1u);
    EXPECT_EQ(std::string_view(task["Networks"].at(0)["Target"].get_string()), "net-1");
    EXPECT_EQ(std::string_view(task["LogDriver"]["Name"].get_string()), "none");
    auto container = task["ContainerSpec"];
    EXPECT_EQ(strings(container["CapabilityDrop"]), std::vector<std::string>{"ALL"});
    EXPECT_TRUE(bool(container["ReadOnly"].get_bool()));
    EXPECT_TRUE(bool(container["Init"].get_bool()));
    EXPECT_EQ(std::string_view(container["User"].get_string()), "1000:1000");
    EXPECT_EQ(strings(container["HealthCheck"]["Test"]), std::vector<std::string>{"NONE"});
    EXPECT_EQ(std::string_view(container["Labels"][label_managed].get_string()), "true");
    auto command = strings(container["Command"]);
    EXPECT_EQ(command.front(), agent_path);
    EXPECT_EQ(command.back(), agent_dial_only_flag);
    EXPECT_EQ(command[3], std::to_string(256 * mib));
    bool dials = false;
    for (const auto& variable : strings(container["Env"])) dials |= variable == std::string(CUBICLE_AGENT_DIAL) + "=" + site().dial;
    EXPECT_TRUE(dials);
    std::vector<std::string> ulimits;
    for (auto ulimit : container["Ulimits"].get_array()) ulimits.emplace_back(std::string_view(ulimit["Name"].get_string()));
    EXPECT_EQ(ulimits, (std::vector<std::string>{"nofile", "fsize", "core"}));
    auto tmp = container["Mounts"].at(0);
    EXPECT_EQ(std::string_view(tmp["Type"].get_string()), "tmpfs");
    EXPECT_EQ(int64_t(tmp["TmpfsOptions"]["SizeBytes"].get_int64()), 32 * mib);
    auto workspace = container["Mounts"].at(1);
    EXPECT_EQ(std::string_view(workspace["Target"].get_string()), workspace_dir);
    std::string_view options = workspace["VolumeOptions"]["DriverConfig"]["Options"]["o"].get_string();
    EXPECT_NE(options.find("size=64m,nr_inodes=1000"), std::string_view::npos) << options;
    auto memory = static_cast<std::int64_t>(memory_limits(limited()).ceiling_mb) * mib;
    auto limits = task["Resources"]["Limits"];
    EXPECT_EQ(int64_t(limits["MemoryBytes"].get_int64()), memory);
    EXPECT_EQ(int64_t(limits["NanoCPUs"].get_int64()), 500'000'000);
    EXPECT_EQ(int64_t(limits["Pids"].get_int64()), 64);
    auto reservations = task["Resources"]["Reservations"];
    EXPECT_EQ(int64_t(reservations["MemoryBytes"].get_int64()), memory);
    EXPECT_EQ(int64_t(reservations["NanoCPUs"].get_int64()), 500'000'000);
}

TEST(SwarmSpec, RefusesWhatAServiceCannotBe) {
    auto networked = limited();
    networked.network = true;
    EXPECT_THROW(sandbox_service_spec(networked, "inst", "sb-1", {}, site()), ToolError);
    auto persistent = limited();
    persistent.workspace_volume = "cubicle-live-x";
    EXPECT_THROW(sandbox_service_spec(persistent, "inst", "sb-1", {}, site()), ToolError);
    auto runsc = limited();
    runsc.runtime = "runsc";
    EXPECT_THROW(sandbox_service_spec(runsc, "inst", "sb-1", {}, site()), ToolError);
    auto gpu = limited();
    gpu.gpu = true;
    EXPECT_THROW(sandbox_service_spec(gpu, "inst", "sb-1", {}, site()), ToolError);
}

TEST(SwarmSpec, TheRelayKeepsItsStdinOpenAndTheLocks) {
    auto text = relay_service_spec("img", "inst", "sb-1", "cubicle-relay-abc", {"net-1", "agents"}, {}, {}, 4000, "10.0.0.9:7000");
    json::Document doc;
    ASSERT_FALSE(doc.parse(text)) << text;
    auto container = doc.root()["TaskTemplate"]["ContainerSpec"];
    EXPECT_TRUE(bool(container["OpenStdin"].get_bool()));
    EXPECT_EQ(strings(container["HealthCheck"]["Test"]), std::vector<std::string>{"NONE"});
    EXPECT_TRUE(bool(container["ReadOnly"].get_bool()));
    EXPECT_EQ(strings(container["CapabilityDrop"]), std::vector<std::string>{"ALL"});
    EXPECT_EQ(strings(container["Command"]), (std::vector<std::string>{agent_path, "--relay", "4000", "10.0.0.9:7000"}));
    EXPECT_EQ(doc.root()["TaskTemplate"]["Networks"].get_array().size(), 2u);
    EXPECT_EQ(std::string_view(doc.root()["Labels"][label_role].get_string()), role_relay);
}

} // namespace
} // namespace cubicle::sandbox
