// GPU detection and requests, against daemon answers recorded in tests/golden/daemon/
// (info_no_gpu.json from this project's CI daemon; info_nvidia.json is the same answer
// with the runtime entry the NVIDIA Container Toolkit adds).
#include <fstream>
#include <sstream>

#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>
#include <simdjson.h>

#include "common/errors.hpp"
#include "docker/client.hpp"
#include "sandbox/manager.hpp"
#include "sandbox/policy.hpp"

#include "recorded.hpp"

using namespace cubicle;

namespace {

} // namespace

TEST(Gpu, DetectsTheNvidiaRuntime) {
    EXPECT_TRUE(docker::parse_daemon_info(recorded("info_nvidia.json")).nvidia_runtime());
    auto plain = docker::parse_daemon_info(recorded("info_no_gpu.json"));
    EXPECT_FALSE(plain.nvidia_runtime());
    EXPECT_FALSE(plain.runtimes.empty());
    EXPECT_FALSE(docker::parse_daemon_info("not json").nvidia_runtime());
}

TEST(Gpu, RequestsEveryNvidiaGpuOnlyWhenAsked) {
    sandbox::SandboxSpec spec;
    spec.image = "img";
    spec.gpu = true;
    simdjson::dom::parser parser;
    auto host = parser.parse(sandbox::container_config(spec, "inst", "sb-1"))["HostConfig"];
    simdjson::dom::array requests;
    ASSERT_EQ(host["DeviceRequests"].get(requests), simdjson::SUCCESS);
    ASSERT_EQ(requests.size(), 1u);
    auto request = requests.at(0);
    EXPECT_EQ(std::string_view(request["Driver"]), "nvidia");
    EXPECT_EQ(int64_t(request["Count"]), -1);
    EXPECT_EQ(std::string_view(request["Capabilities"].at(0).at(0)), "gpu");
    // Everything else stays locked down.
    EXPECT_EQ(std::string_view(host["NetworkMode"]), "none");
    EXPECT_EQ(std::string_view(host["CapDrop"].at(0)), "ALL");

    spec.gpu = false;
    simdjson::dom::parser other;
    EXPECT_EQ(other.parse(sandbox::container_config(spec, "inst", "sb-1"))["HostConfig"]["DeviceRequests"].error(),
              simdjson::NO_SUCH_FIELD);
}

TEST(Gpu, ManagerRefusesGpuWithoutTheRuntimeAndSaysWhy) {
    boost::asio::io_context io;
    Config config;
    config.pool_size = 0;
    docker::Client client(io.get_executor(), docker::parse_docker_host(""));
    sandbox::Manager manager(io.get_executor(), client, config);
    sandbox::SandboxSpec spec;
    spec.gpu = true;
    manager.set_daemon_info(docker::parse_daemon_info(recorded("info_no_gpu.json")));
    try {
        manager.resolve(spec);
        FAIL() << "gpu: true was accepted without an NVIDIA runtime";
    } catch (const ToolError& e) {
        EXPECT_NE(std::string(e.what()).find("NVIDIA"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("runc"), std::string::npos) << e.what();
    }
    manager.set_daemon_info(docker::parse_daemon_info(recorded("info_nvidia.json")));
    EXPECT_TRUE(manager.resolve(spec).gpu);
}
