// The sandbox security policy (container_config) and the language table.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/errors.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <cstdlib>
#include <set>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>
#include <unistd.h>

#include "agent/protocol.h"
#include "common/json.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/languages.hpp"
#include "sandbox/owner.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

constexpr std::int64_t mib = 1024 * 1024;

class PolicyTest : public ::testing::Test {
protected:
    simdjson::dom::element config_for(const SandboxSpec& spec, std::string instance = "inst-1234",
                                      std::string sandbox = "sb-5678") {
        text_ = container_config(spec, instance, sandbox);
        auto error = doc_.parse(text_);
        EXPECT_FALSE(error) << text_;
        return doc_.root();
    }
    static SandboxSpec spec() {
        SandboxSpec s;  // as Manager::resolve leaves it
        s.image = "cubicle/sandbox:latest";
        s.memory_mb = 512;
        s.cpus = 1;
        return s;
    }
    std::string text_;
    json::Document doc_;
};

std::vector<std::string> string_array(simdjson::dom::element e) {
    std::vector<std::string> out;
    simdjson::dom::array array;
    EXPECT_EQ(e.get(array), simdjson::SUCCESS);
    for (auto item : array) {
        std::string_view s;
        EXPECT_EQ(item.get(s), simdjson::SUCCESS);
        out.emplace_back(s);
    }
    return out;
}

std::string str(simdjson::simdjson_result<simdjson::dom::element> e) {
    std::string_view s;
    EXPECT_EQ(e.get(s), simdjson::SUCCESS);
    return std::string(s);
}

std::int64_t i64(simdjson::simdjson_result<simdjson::dom::element> e) {
    std::int64_t v = -12345;
    EXPECT_EQ(e.get(v), simdjson::SUCCESS);
    return v;
}

bool boolean(simdjson::simdjson_result<simdjson::dom::element> e) {
    bool v = false;
    EXPECT_EQ(e.get(v), simdjson::SUCCESS);
    return v;
}

TEST_F(PolicyTest, NoNetworkByDefault) {
    auto root = config_for(spec());
    EXPECT_EQ(str(root["HostConfig"]["NetworkMode"]), "none");
    EXPECT_TRUE(boolean(root["NetworkDisabled"]));
}

TEST_F(PolicyTest, NetworkWhenAsked) {
    auto s = spec();
    s.network = true;
    EXPECT_THROW(config_for(s), ToolError);  // never the default bridge, which has a way out
    s.network_name = "cubicle-egress-x";
    auto root = config_for(s);
    EXPECT_EQ(str(root["HostConfig"]["NetworkMode"]), "cubicle-egress-x");
    bool disabled = false;
    if (root["NetworkDisabled"].get(disabled) == simdjson::SUCCESS) {
        EXPECT_FALSE(disabled);
    }
}

TEST_F(PolicyTest, NetworkedSandboxesJoinTheEgressNetworkWithTheProxySet) {
    auto s = spec();
    s.network = true;
    s.network_name = "cubicle-egress-inst";
    s.proxy_url = "http://cubicle-proxy:3128";
    auto root = config_for(s);
    EXPECT_EQ(str(root["HostConfig"]["NetworkMode"]), "cubicle-egress-inst");
    auto env = string_array(root["Env"].value());
    for (const char* name : {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"}) {
        EXPECT_NE(std::find(env.begin(), env.end(), std::string(name) + "=http://cubicle-proxy:3128"), env.end()) << name;
    }
}

TEST(EgressPolicy, TheNetworkIsInternal) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(egress_network_config("cubicle-egress-x", "x")));
    EXPECT_TRUE(boolean(doc.root()["Internal"]));
    EXPECT_EQ(str(doc.root()["Labels"]["io.cubicle.instance"]), "x");
}

TEST(EgressPolicy, TheProxyIsLockedDownAndCarriesTheAllowlist) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(proxy_config("img", "inst", {"pypi.org:443", "10.0.0.5:8080"})));
    auto root = doc.root();
    EXPECT_EQ(string_array(root["Entrypoint"].value()),
              (std::vector<std::string>{agent_path, "--proxy", "3128", "pypi.org:443", "10.0.0.5:8080"}));
    auto host = root["HostConfig"];
    // Its way out; it joins the principals' internal networks as they come (sandbox/egress.hpp).
    EXPECT_EQ(str(host["NetworkMode"]), "bridge");
    EXPECT_EQ(string_array(host["CapDrop"].value()), std::vector<std::string>{"ALL"});
    EXPECT_TRUE(boolean(host["ReadonlyRootfs"]));
    EXPECT_EQ(i64(host["Memory"]), i64(host["MemorySwap"]));
    EXPECT_EQ(str(root["User"]), "1000:1000");
    EXPECT_TRUE(boolean(root["StdinOnce"]));  // dies with the server's connection
}

TEST(EgressPolicy, UsedUpAddressPoolsAreSaidWithWhatToDo) {
    auto text = network_refused("creating a network failed: could not find an available, non-overlapping IPv4 address pool "
                                "among the defaults to assign to the network (HTTP 500)");
    EXPECT_NE(text.find("address range left"), std::string::npos) << text;
    EXPECT_NE(text.find("network: true"), std::string::npos) << text;
    EXPECT_NE(text.find("default-address-pools"), std::string::npos) << text;
    EXPECT_EQ(network_refused("the daemon is down"), "could not set up network access for sandboxes: the daemon is down");
    auto cap = no_network_left(16);
    EXPECT_NE(cap.find("at most 16 egress networks"), std::string::npos) << cap;
    EXPECT_NE(cap.find("--max-egress-networks"), std::string::npos) << cap;
}

TEST_F(PolicyTest, PrivilegesDropped) {
    auto host = config_for(spec())["HostConfig"];
    EXPECT_EQ(string_array(host["CapDrop"].value()), std::vector<std::string>{"ALL"});
    EXPECT_TRUE(host["CapAdd"].error() == simdjson::NO_SUCH_FIELD);
    auto security = string_array(host["SecurityOpt"].value());
    EXPECT_NE(std::find(security.begin(), security.end(), "no-new-privileges"), security.end());
    for (const auto& opt : security) {
        EXPECT_EQ(opt.find("unconfined"), std::string::npos) << opt;
    }
    EXPECT_TRUE(boolean(host["ReadonlyRootfs"]));
    EXPECT_TRUE(boolean(host["Init"]));
    EXPECT_FALSE(boolean(host["Privileged"]));
    EXPECT_TRUE(host["Devices"].error() == simdjson::NO_SUCH_FIELD);
    EXPECT_TRUE(host["PidMode"].error() == simdjson::NO_SUCH_FIELD);
    std::string_view ipc;
    if (host["IpcMode"].get(ipc) == simdjson::SUCCESS) {
        EXPECT_NE(ipc, "host");
    }
}

TEST_F(PolicyTest, ResourceLimits) {
    auto s = spec();
    s.memory_mb = 768;
    s.cpus = 1.5;
    s.pids_limit = 99;
    s.tmp_size_mb = 64;
    auto host = config_for(s)["HostConfig"];
    EXPECT_EQ(i64(host["PidsLimit"]), 99);
    // The hard ceiling: the programs' memory, /tmp (no workspace quota here) and the sandbox's own.
    EXPECT_EQ(i64(host["Memory"]), (768 + 64 + own_processes_mb) * mib);
    EXPECT_EQ(i64(host["MemorySwap"]), (768 + 64 + own_processes_mb) * mib);
    EXPECT_EQ(memory_limits(s).programs_mb, 768);
    EXPECT_EQ(memory_limits(s).ceiling_mb, 768 + 64 + own_processes_mb);
    EXPECT_EQ(i64(host["NanoCpus"]), 1500000000);
    std::string tmp = str(host["Tmpfs"]["/tmp"]);
    EXPECT_NE(tmp.find("size=64m"), std::string::npos) << tmp;
    EXPECT_NE(tmp.find("nosuid"), std::string::npos) << tmp;
}

TEST_F(PolicyTest, WorkspaceQuotaIsACappedTmpfsChargedToMemory) {
    auto s = spec();
    s.memory_mb = 512;
    s.disk_mb = 1024;
    s.files_limit = 100000;
    auto host = config_for(s)["HostConfig"];
    EXPECT_EQ(i64(host["Memory"]), (512 + 1024 + s.tmp_size_mb + own_processes_mb) * mib);
    EXPECT_EQ(i64(host["MemorySwap"]), (512 + 1024 + s.tmp_size_mb + own_processes_mb) * mib);
    simdjson::dom::array mounts;
    ASSERT_EQ(host["Mounts"].get(mounts), simdjson::SUCCESS);
    bool found = false;
    for (auto m : mounts) {
        if (str(m["Target"]) != workspace_dir) continue;
        found = true;
        auto driver = m["VolumeOptions"]["DriverConfig"];
        EXPECT_EQ(str(driver["Name"]), "local");
        EXPECT_EQ(str(driver["Options"]["type"]), "tmpfs");
        std::string o = str(driver["Options"]["o"]);
        EXPECT_NE(o.find("size=1024m,nr_inodes=100000,uid=1000,gid=1000"), std::string::npos) << o;
        EXPECT_NE(o.find("nosuid"), std::string::npos) << o;
    }
    EXPECT_TRUE(found);
}

TEST_F(PolicyTest, APersistentWorkspaceIsItsNamedTmpfsChargedToMemory) {
    auto s = spec();
    s.memory_mb = 512;
    s.disk_mb = 1024;
    s.workspace_volume = "cubicle-live-sb-5678";
    auto root = config_for(s);
    auto host = root["HostConfig"];
    // A tmpfs like every workspace: the ceiling holds disk_mb, and the agent holds no disk quota.
    EXPECT_EQ(i64(host["Memory"]), (512 + 1024 + s.tmp_size_mb + own_processes_mb) * mib);
    EXPECT_EQ(string_array(root["Entrypoint"].value()),
              (std::vector<std::string>{agent_path, agent_sandbox_flag, agent_memory_flag, std::to_string(512LL << 20)}));
    simdjson::dom::array mounts;
    ASSERT_EQ(host["Mounts"].get(mounts), simdjson::SUCCESS);
    int found = 0;
    for (auto m : mounts) {
        std::string_view source;
        if (m["Source"].get(source) == simdjson::SUCCESS) {
            EXPECT_FALSE(source.starts_with("cubicle-ws-")) << "the volume on disk is the mirror's only";
        }
        if (str(m["Target"]) != workspace_dir) continue;
        ++found;
        EXPECT_EQ(str(m["Source"]), "cubicle-live-sb-5678");
        EXPECT_TRUE(boolean(m["VolumeOptions"]["NoCopy"])) << "nothing of the image is copied over the saved files";
        // Should the volume be gone, the one the Engine makes in its place is the same tmpfs.
        EXPECT_EQ(str(m["VolumeOptions"]["DriverConfig"]["Options"]["type"]), "tmpfs");
    }
    EXPECT_EQ(found, 1);
}

TEST_F(PolicyTest, TheLiveVolumeIsASizedTmpfsOfThisInstance) {
    auto s = spec();
    s.disk_mb = 64;
    s.files_limit = 5000;
    s.sandbox_id = "sb-5678";
    json::Document doc;
    ASSERT_FALSE(doc.parse(live_volume_config(s, "cubicle-live-sb-5678", "inst")));
    auto volume = doc.root();
    EXPECT_EQ(str(volume["Name"]), "cubicle-live-sb-5678");
    EXPECT_EQ(str(volume["DriverOpts"]["type"]), "tmpfs");
    EXPECT_NE(str(volume["DriverOpts"]["o"]).find("size=64m,nr_inodes=5000,uid=1000,gid=1000,mode=0711,nosuid,nodev"),
              std::string::npos);
    EXPECT_EQ(str(volume["Labels"][label_role]), role_live);
    EXPECT_EQ(str(volume["Labels"][label_instance]), "inst");
    EXPECT_EQ(str(volume["Labels"][label_sandbox]), "sb-5678");
}

TEST_F(PolicyTest, TheMirrorIsLockedDownLikeASandbox) {
    auto s = spec();
    s.disk_mb = 100;
    s.sandbox_id = "sb-5678";
    json::Document doc;
    s.image = "untrusted/image";
    ASSERT_FALSE(doc.parse(mirror_config(s, "trusted/default", "inst", "cubicle-live-sb-5678", "cubicle-ws-sb-5678", "echo ready")));
    auto root = doc.root();
    EXPECT_EQ(str(root["Image"]), "trusted/default") << "never the sandbox's own image";
    EXPECT_EQ(str(root["User"]), "1000:1000");
    EXPECT_EQ(string_array(root["Entrypoint"].value()), (std::vector<std::string>{"/bin/sh", "-c", "echo ready", "cubicle-mirror"}));
    EXPECT_EQ(str(root["Labels"][label_role]), role_mirror);
    EXPECT_EQ(str(root["Labels"][label_sandbox]), "sb-5678");
    // Its owner under a label older cubicles' sweeps do not read: they never take it for an orphan.
    EXPECT_EQ(str(root["Labels"][label_mirror_owner]), owner_record());
    simdjson::dom::element none;
    EXPECT_NE(root["Labels"][label_owner].get(none), simdjson::SUCCESS);
    auto host = root["HostConfig"];
    EXPECT_EQ(str(host["NetworkMode"]), "none");
    EXPECT_EQ(string_array(host["CapDrop"].value()), (std::vector<std::string>{"ALL"}));
    EXPECT_EQ(string_array(host["SecurityOpt"].value()), (std::vector<std::string>{"no-new-privileges"}));
    EXPECT_TRUE(boolean(host["ReadonlyRootfs"]));
    EXPECT_FALSE(boolean(host["Privileged"]));
    EXPECT_TRUE(boolean(root["StdinOnce"]));  // its last copy when the server's connection drops
    EXPECT_EQ(i64(host["Memory"]), (100 + 64) * mib);
    simdjson::dom::array mounts;
    ASSERT_EQ(host["Mounts"].get(mounts), simdjson::SUCCESS);
    std::vector<std::string> seen;
    for (auto m : mounts) seen.push_back(fmt::format("{}:{}:{}", str(m["Source"]), str(m["Target"]), boolean(m["VolumeOptions"]["NoCopy"])));
    // The volume on disk where the image has /workspace: a new one takes its owner, the sandbox user.
    EXPECT_EQ(seen, (std::vector<std::string>{"cubicle-ws-sb-5678:/workspace:false", "cubicle-live-sb-5678:/live:true"}));
}

TEST_F(PolicyTest, LargeMemoryDoesNotOverflow) {
    auto s = spec();
    s.memory_mb = 1 << 20;  // the largest --memory-mb: 1 TiB
    auto host = config_for(s)["HostConfig"];
    auto ceiling = (std::int64_t{1} << 40) + std::int64_t{s.tmp_size_mb + own_processes_mb} * mib;
    EXPECT_EQ(i64(host["Memory"]), ceiling);
    EXPECT_EQ(i64(host["MemorySwap"]), ceiling);
}

TEST_F(PolicyTest, FractionalCpus) {
    auto s = spec();
    s.cpus = 0.01;
    EXPECT_EQ(i64(config_for(s)["HostConfig"]["NanoCpus"]), 10000000);
    s.cpus = 0.3;  // not exactly representable: rounded, not truncated
    EXPECT_EQ(i64(config_for(s)["HostConfig"]["NanoCpus"]), 300000000);
}

TEST_F(PolicyTest, Ulimits) {
    auto host = config_for(spec())["HostConfig"];
    simdjson::dom::array ulimits;
    ASSERT_EQ(host["Ulimits"].get(ulimits), simdjson::SUCCESS);
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> by_name;
    for (auto u : ulimits) by_name[str(u["Name"])] = {i64(u["Soft"]), i64(u["Hard"])};
    ASSERT_TRUE(by_name.count("nofile"));
    ASSERT_TRUE(by_name.count("fsize"));
    ASSERT_TRUE(by_name.count("core"));
    EXPECT_GT(by_name["nofile"].first, 0);
    EXPECT_EQ(by_name["nofile"].first, by_name["nofile"].second);
    EXPECT_GT(by_name["fsize"].first, 0);
    EXPECT_EQ(by_name["fsize"].first, by_name["fsize"].second);
    EXPECT_EQ(by_name["core"], std::make_pair(std::int64_t{0}, std::int64_t{0}));
}

TEST_F(PolicyTest, OnlyAnonymousVolumes) {
    auto root = config_for(spec());
    auto host = root["HostConfig"];
    EXPECT_TRUE(host["Binds"].error() == simdjson::NO_SUCH_FIELD);
    EXPECT_TRUE(host["VolumesFrom"].error() == simdjson::NO_SUCH_FIELD);
    EXPECT_TRUE(root["Volumes"].error() == simdjson::NO_SUCH_FIELD);
    simdjson::dom::array mounts;
    ASSERT_EQ(host["Mounts"].get(mounts), simdjson::SUCCESS);
    std::set<std::string> targets;
    for (auto m : mounts) {
        EXPECT_EQ(str(m["Type"]), "volume");
        EXPECT_TRUE(m["Source"].error() == simdjson::NO_SUCH_FIELD) << json::to_string(m);
        targets.insert(str(m["Target"]));
    }
    EXPECT_EQ(targets, (std::set<std::string>{workspace_dir, agent_dir}));
    EXPECT_EQ(text_.find("bind"), std::string::npos);
    EXPECT_EQ(text_.find("docker.sock"), std::string::npos);
}

// The agent comes from the server's one volume, read-only and never filled from the image.
void expect_shared_agent_mount(simdjson::dom::element mounts_field, const std::string& volume) {
    simdjson::dom::array mounts;
    ASSERT_EQ(mounts_field.get(mounts), simdjson::SUCCESS);
    int agent_mounts = 0;
    for (auto m : mounts) {
        if (str(m["Target"]) != agent_dir) {
            EXPECT_TRUE(m["Source"].error() == simdjson::NO_SUCH_FIELD) << json::to_string(m);  // the workspace stays its own
            continue;
        }
        ++agent_mounts;
        EXPECT_EQ(str(m["Type"]), "volume");
        EXPECT_EQ(str(m["Source"]), volume);
        EXPECT_TRUE(boolean(m["ReadOnly"]));
        EXPECT_TRUE(boolean(m["VolumeOptions"]["NoCopy"]));
    }
    EXPECT_EQ(agent_mounts, 1);
}

TEST_F(PolicyTest, SharedAgentVolumeIsMountedReadOnly) {
    auto text = container_config(spec(), "inst", "sb-1", true, {}, "cubicle-agent-inst");
    json::Document doc;
    ASSERT_FALSE(doc.parse(text));
    expect_shared_agent_mount(doc.root()["HostConfig"]["Mounts"].value(), "cubicle-agent-inst");
    json::Document proxy;
    ASSERT_FALSE(proxy.parse(proxy_config("img", "inst", {}, {}, "cubicle-agent-inst")));
    expect_shared_agent_mount(proxy.root()["HostConfig"]["Mounts"].value(), "cubicle-agent-inst");
}

TEST_F(PolicyTest, ExecFallbackHasNoAgentMount) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(container_config(spec(), "inst", "sb-1", false, {}, "cubicle-agent-inst")));
    simdjson::dom::array mounts;
    ASSERT_EQ(doc.root()["HostConfig"]["Mounts"].get(mounts), simdjson::SUCCESS);
    for (auto m : mounts) EXPECT_NE(str(m["Target"]), agent_dir);
}

TEST_F(PolicyTest, AgentChannelIsBoundReadOnlyWhereTheAgentLooksForIt) {
    auto binds = [](const std::string& text) {
        json::Document doc;
        EXPECT_FALSE(doc.parse(text));
        std::vector<std::string> found;
        simdjson::dom::array mounts;
        EXPECT_EQ(doc.root()["HostConfig"]["Mounts"].get(mounts), simdjson::SUCCESS);
        for (auto m : mounts) {
            if (str(m["Type"]) != "bind") continue;
            EXPECT_EQ(str(m["Target"]), CUBICLE_AGENT_CHANNEL);
            EXPECT_TRUE(boolean(m["ReadOnly"]));
            found.push_back(str(m["Source"]));
        }
        return found;
    };
    EXPECT_EQ(binds(container_config(spec(), "inst", "sb-1", true, {}, "vol", "/run/cubicle/sb-1.sock")),
              std::vector<std::string>{"/run/cubicle/sb-1.sock"});
    EXPECT_TRUE(binds(container_config(spec(), "inst", "sb-1", true, {}, "vol")).empty());
    // Without the agent (exec fallback) there is nobody to connect to it.
    EXPECT_TRUE(binds(container_config(spec(), "inst", "sb-1", false, {}, "vol", "/run/cubicle/sb-1.sock")).empty());
}

TEST_F(PolicyTest, AnAgentThatDialsHomeIsOnTheAgentNetworkAloneWithItsTicketInItsEnvironment) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(container_config(spec(), "inst", "sb-1", true, {}, "vol", {}, "net-id", "10.0.0.1:4000 pin token")));
    EXPECT_EQ(str(doc.root()["HostConfig"]["NetworkMode"]), "net-id");
    EXPECT_EQ(doc.root()["NetworkDisabled"].error(), simdjson::NO_SUCH_FIELD);
    auto env = string_array(doc.root()["Env"].value());
    EXPECT_EQ(std::count(env.begin(), env.end(), std::string(CUBICLE_AGENT_DIAL) + "=10.0.0.1:4000 pin token"), 1);
    // Without the agent nobody would dial, and nothing may join the agent network.
    json::Document exec;
    ASSERT_FALSE(exec.parse(container_config(spec(), "inst", "sb-1", false, {}, "vol", {}, "net-id", "10.0.0.1:4000 pin token")));
    EXPECT_EQ(str(exec.root()["HostConfig"]["NetworkMode"]), "none");
    for (const auto& var : string_array(exec.root()["Env"].value())) EXPECT_EQ(var.find(CUBICLE_AGENT_DIAL), std::string::npos);
    // A networked sandbox is on its egress network: it cannot be on the agent network too.
    auto networked = spec();
    networked.network = true;
    networked.network_name = "egress";
    EXPECT_THROW(container_config(networked, "inst", "sb-1", true, {}, "vol", {}, "net-id", "x"), ToolError);
}

TEST(AgentNetworkPolicy, InternalWithoutTrafficBetweenContainers) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(agent_network_config("cubicle-agents-x", "inst")));
    EXPECT_EQ(str(doc.root()["Name"]), "cubicle-agents-x");
    EXPECT_TRUE(boolean(doc.root()["Internal"]));
    EXPECT_EQ(str(doc.root()["Options"]["com.docker.network.bridge.enable_icc"]), "false");
    EXPECT_EQ(str(doc.root()["Labels"]["io.cubicle.instance"]), "inst");
}

TEST(AgentNetworkPolicy, ASandboxsOwnNetworkHasNoHostAddressAndNoWayOut) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(dial_network_config("cubicle-dial-x", "inst", "10.213.1.8/29")));
    EXPECT_TRUE(boolean(doc.root()["Internal"]));
    EXPECT_EQ(str(doc.root()["Options"]["com.docker.network.bridge.inhibit_ipv4"]), "true");
    EXPECT_EQ(str(doc.root()["IPAM"]["Config"].at(0)["Subnet"]), "10.213.1.8/29");
    EXPECT_EQ(str(doc.root()["Labels"]["io.cubicle.instance"]), "inst");
}

TEST(AgentNetworkPolicy, TheRelayIsLockedDownAsTheProxyIs) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(relay_config("img", "inst", {}, "vol", "agents-net", 4000, "172.18.0.1:41000")));
    EXPECT_EQ(string_array(doc.root()["Entrypoint"].value()),
              (std::vector<std::string>{agent_path, "--relay", "4000", "172.18.0.1:41000"}));
    auto host = doc.root()["HostConfig"];
    EXPECT_EQ(str(host["NetworkMode"]), "agents-net");
    EXPECT_EQ(string_array(host["CapDrop"].value()), std::vector<std::string>{"ALL"});
    EXPECT_TRUE(boolean(host["ReadonlyRootfs"]));
    EXPECT_EQ(str(doc.root()["User"]).rfind("0:", 0), std::string::npos);  // never root
    EXPECT_EQ(str(doc.root()["Labels"]["io.cubicle.role"]), "relay");
}

TEST(AgentVolumePolicy, TheVolumeIsTheAgentsAndItsHolderThisInstances) {
    json::Document volume;
    ASSERT_FALSE(volume.parse(agent_volume_config("cubicle-agent-x", "d1g3st")));
    EXPECT_EQ(str(volume.root()["Name"]), "cubicle-agent-x");
    auto labels = volume.root()["Labels"];
    EXPECT_EQ(str(labels["io.cubicle.managed"]), "true");
    EXPECT_EQ(str(labels["io.cubicle.role"]), "agent");
    EXPECT_EQ(str(labels["io.cubicle.agent-digest"]), "d1g3st");
    // Shared by the servers of that agent: no server's, so no server's exit or death removes it.
    EXPECT_TRUE(labels["io.cubicle.instance"].error() == simdjson::NO_SUCH_FIELD);
    EXPECT_TRUE(labels["io.cubicle.owner"].error() == simdjson::NO_SUCH_FIELD);
    json::Document filler;
    ASSERT_FALSE(filler.parse(agent_volume_filler_config("img", "x", "cubicle-agent-x")));
    EXPECT_EQ(str(filler.root()["Labels"]["io.cubicle.instance"]), "x");  // a dead server's holder is swept like its sandboxes
    EXPECT_FALSE(str(filler.root()["Labels"]["io.cubicle.owner"]).empty());
    auto mount = filler.root()["HostConfig"]["Mounts"].at(0);
    EXPECT_EQ(str(mount["Source"]), "cubicle-agent-x");
    EXPECT_EQ(str(mount["Target"]), agent_dir);
    EXPECT_TRUE(mount["ReadOnly"].error() == simdjson::NO_SUCH_FIELD);  // the one writer
}

TEST_F(PolicyTest, UnprivilegedUserAndAgentEntrypoint) {
    auto root = config_for(spec());
    EXPECT_EQ(str(root["User"]), "1000:1000");
    EXPECT_EQ(str(root["WorkingDir"]), "/workspace");
    // The agent holds the programs to memory_mb (in bytes).
    EXPECT_EQ(string_array(root["Entrypoint"].value()),
              (std::vector<std::string>{agent_path, agent_sandbox_flag, agent_memory_flag, std::to_string(512LL << 20)}));
    EXPECT_EQ(str(root["Image"]), "cubicle/sandbox:latest");
    EXPECT_FALSE(boolean(root["Tty"]));
    EXPECT_TRUE(boolean(root["OpenStdin"]));
    EXPECT_TRUE(boolean(root["StdinOnce"]));
}

TEST_F(PolicyTest, EnvironmentIsOnlyTheFixedEntries) {
    // Neither the server's own environment nor a client's env reaches the
    // container config: a client's env travels with each execution, so that
    // pooled containers can serve any client.
    ::setenv("CUBICLE_TEST_SECRET", "hunter2-top-secret", 1);
    auto s = spec();
    s.env = {{"FOO", "bar"}, {"WITH_EQ", "a=b"}};
    auto root = config_for(s);
    auto env = string_array(root["Env"].value());
    std::vector<std::string> expected = {
        "HOME=/workspace",
        "LANG=C.UTF-8",
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    };
    EXPECT_EQ(env, expected);
    EXPECT_EQ(text_.find("hunter2"), std::string::npos);
    EXPECT_EQ(text_.find("CUBICLE_TEST_SECRET"), std::string::npos);
    EXPECT_EQ(text_.find("FOO"), std::string::npos);
    // Nothing else from the test process's environment either.
    if (const char* home = std::getenv("HOME"); home && std::string_view(home) != "/workspace" && *home) {
        EXPECT_EQ(text_.find(std::string("HOME=") + home), std::string::npos);
    }
    ::unsetenv("CUBICLE_TEST_SECRET");
}

TEST_F(PolicyTest, Labels) {
    auto root = config_for(spec(), "my-instance", "sandbox-42");
    auto labels = root["Labels"];
    EXPECT_EQ(str(labels["io.cubicle.managed"]), "true");
    EXPECT_EQ(str(labels["io.cubicle.instance"]), "my-instance");
    EXPECT_EQ(str(labels["io.cubicle.sandbox"]), "sandbox-42");
}

TEST_F(PolicyTest, HostileValuesStayInsideTheirStrings) {
    auto s = spec();
    s.image = "img\",\"Privileged\":true,\"x\":\"";
    auto root = config_for(s, "i\"", "s\n");
    EXPECT_EQ(str(root["Image"]), s.image);
    EXPECT_FALSE(boolean(root["HostConfig"]["Privileged"]));
    EXPECT_TRUE(root["Privileged"].error() == simdjson::NO_SUCH_FIELD);
    EXPECT_EQ(text_.find('\n'), std::string::npos);
}

// ================================================================ languages

TEST(Languages, CanonicalNamesAndAliases) {
    auto name = [](std::string_view alias) { return find_language(alias) ? find_language(alias)->name : "?"; };
    for (const char* alias : {"python", "python3", "py", "PY", "Python"}) EXPECT_EQ(name(alias), "python") << alias;
    for (const char* alias : {"javascript", "node", "js"}) EXPECT_EQ(name(alias), "javascript") << alias;
    for (const char* alias : {"bash", "sh", "shell"}) EXPECT_EQ(name(alias), "bash") << alias;
    for (const char* alias : {"typescript", "ts"}) EXPECT_EQ(name(alias), "typescript") << alias;
    for (const char* alias : {"r", "R", "rscript"}) EXPECT_EQ(name(alias), "r") << alias;
    for (const char* alias : {"ruby", "rb"}) EXPECT_EQ(name(alias), "ruby") << alias;
    for (const char* alias : {"go", "golang"}) EXPECT_EQ(name(alias), "go") << alias;
    for (const char* alias : {"c", "C"}) EXPECT_EQ(name(alias), "c") << alias;
    for (const char* alias : {"cpp", "c++", "C++", "cxx"}) EXPECT_EQ(name(alias), "cpp") << alias;
    for (const char* alias : {"java", "Java"}) EXPECT_EQ(name(alias), "java") << alias;
    for (const char* alias : {"rust", "rs"}) EXPECT_EQ(name(alias), "rust") << alias;
}

TEST(Languages, Unknown) {
    for (const char* name : {"", "python2", " python", "cobol", "c#", "kotlin"}) {
        EXPECT_EQ(find_language(name), nullptr) << name;
    }
}

TEST(Languages, NamesAreUnique) {
    auto names = language_names();
    std::set<std::string_view> unique(names.begin(), names.end());
    EXPECT_EQ(unique.size(), names.size());
    EXPECT_EQ(languages().size(), 11u);
}

TEST(Languages, CompiledBuildsAreKeptByContent) {
    auto a = build_for(*find_language("c"), "int main(){return 0;}", "/workspace");
    auto b = build_for(*find_language("c"), "int main(){return 0;}", "/workspace");
    auto c = build_for(*find_language("c"), "int main(){return 1;}", "/workspace");
    auto cpp = build_for(*find_language("cpp"), "int main(){return 0;}", "/workspace");
    EXPECT_EQ(a.dir, b.dir);
    EXPECT_NE(a.dir, c.dir);
    EXPECT_NE(a.dir, cpp.dir);
    EXPECT_TRUE(a.dir.starts_with("/workspace/.cubicle/build/c-")) << a.dir;
    EXPECT_EQ(a.prepare.stdin_data, "int main(){return 0;}");  // the source travels on stdin, never in argv
    EXPECT_EQ(a.prepare.argv.back(), a.dir);
    EXPECT_EQ(a.run.argv, (std::vector<std::string>{"/bin/sh", "-c", "exec \"" + a.dir + "/prog\""}));
}

TEST(Languages, JavaIsNamedAfterItsPublicClass) {
    auto named = build_for(*find_language("java"), "class Util {}\npublic class Hello { public static void main(String[] a) {} }", "/w");
    EXPECT_NE(named.prepare.argv[2].find("Hello.java"), std::string::npos);
    EXPECT_TRUE(named.run.argv[2].ends_with(" Hello")) << named.run.argv[2];
    auto plain = build_for(*find_language("java"), "class Prog { public static void main(String[] a) {} }", "/w");
    EXPECT_TRUE(plain.run.argv[2].ends_with(" Prog")) << plain.run.argv[2];
    auto none = build_for(*find_language("java"), "interface X {}", "/w");
    EXPECT_TRUE(none.run.argv[2].ends_with(" Main")) << none.run.argv[2];
}

TEST(Languages, VersionNumbers) {
    EXPECT_EQ(version_number("go version go1.19.8 linux/amd64"), "1.19.8");
    EXPECT_EQ(version_number("openjdk version \"17.0.13\" 2024-10-15"), "17.0.13");
    EXPECT_EQ(version_number("v20.20.2"), "20.20.2");
    EXPECT_EQ(version_number("something"), "something");
}

TEST(Languages, ProbeMentionsEveryLanguage) {
    auto script = language_probe_script();
    for (const auto& language : languages()) {
        EXPECT_NE(script.find(fmt::format("command -v {} ", language.program)), std::string::npos) << language.name;
    }
}

TEST(Languages, ListMentionsEveryAlias) {
    auto list = language_list();
    for (const char* name : {"python", "python3", "py", "javascript", "node", "js", "bash", "sh", "shell"}) {
        EXPECT_NE(list.find(name), std::string_view::npos) << name;
    }
}

TEST(Languages, PythonReadsCodeFromStdin) {
    auto r = program_for(*find_language("python"), "print('hi')\n");
    EXPECT_EQ(r.argv, (std::vector<std::string>{"python3", "-u", "-"}));
    EXPECT_EQ(r.stdin_data, "print('hi')\n");
    EXPECT_TRUE(r.cwd.empty());  // the sandbox runs it in its workspace
}

TEST(Languages, JavascriptReadsCodeFromStdin) {
    auto r = program_for(*find_language("javascript"), "console.log(1)");
    EXPECT_EQ(r.argv, (std::vector<std::string>{"node", "-"}));
    EXPECT_EQ(r.stdin_data, "console.log(1)");
    EXPECT_TRUE(r.cwd.empty());  // the sandbox runs it in its workspace
}

TEST(Languages, SmallBashIsAnArgument) {
    auto r = program_for(*find_language("bash"), "read x; echo $x");
    EXPECT_EQ(r.argv, (std::vector<std::string>{"bash", "-c", "read x; echo $x"}));
    EXPECT_EQ(r.stdin_data, "");  // stdin stays free for the script
    EXPECT_TRUE(r.cwd.empty());  // the sandbox runs it in its workspace
}

TEST(Languages, LargeBashGoesThroughAFile) {
    std::string code(150 * 1024, '#');
    code.front() = 'e';
    auto r = program_for(*find_language("bash"), code);
    ASSERT_EQ(r.argv.size(), 3u);
    EXPECT_EQ(r.argv[0], "bash");
    EXPECT_EQ(r.argv[1], "-c");
    EXPECT_LT(r.argv[2].size(), 1024u);  // the code is not in argv (MAX_ARG_STRLEN)
    EXPECT_EQ(r.stdin_data, code);
    // The script must not see the code as its stdin.
    EXPECT_NE(r.argv[2].find("</dev/null"), std::string::npos) << r.argv[2];
}

TEST(Languages, BashSizeThreshold) {
    std::string at_limit(100 * 1024, 'x');
    EXPECT_EQ(program_for(*find_language("bash"), at_limit).argv[2], at_limit);
    std::string over(100 * 1024 + 1, 'x');
    EXPECT_EQ(program_for(*find_language("bash"), over).stdin_data, over);
}

TEST(Languages, Interpreters) {
    EXPECT_TRUE(has_interpreter("python"));
    EXPECT_TRUE(has_interpreter("javascript"));
    EXPECT_FALSE(has_interpreter("bash"));
    EXPECT_TRUE(has_interpreter("r"));
    EXPECT_TRUE(has_interpreter("ruby"));
    EXPECT_FALSE(has_interpreter("go"));
    EXPECT_FALSE(has_interpreter("py"));  // canonical names only

    auto py = interpreter_for("python");
    ASSERT_EQ(py.argv.size(), 4u);
    EXPECT_EQ(py.argv[0], "python3");
    EXPECT_EQ(py.argv[1], "-u");
    EXPECT_EQ(py.argv[2], "-c");
    EXPECT_NE(py.argv[3].find("fdopen(3"), std::string::npos);  // reports on the control channel
    EXPECT_TRUE(py.cwd.empty());  // the sandbox runs it in its workspace
    EXPECT_EQ(py.stdin_data, "");

    auto js = interpreter_for("javascript");
    ASSERT_EQ(js.argv.size(), 3u);
    EXPECT_EQ(js.argv[0], "node");
    EXPECT_EQ(js.argv[1], "-e");
    EXPECT_NE(js.argv[2].find("writeSync(3"), std::string::npos);
    EXPECT_TRUE(js.cwd.empty());  // the sandbox runs it in its workspace
}

TEST(Languages, EncodeCell) {
    // u32 big-endian length of the code, a flags byte (1: echo), the code.
    EXPECT_EQ(encode_cell("", false), std::string(5, '\0'));
    EXPECT_EQ(encode_cell("x=1", true), std::string("\0\0\0\x03\x01x=1", 8));
    EXPECT_EQ(encode_cell("x=1", false), std::string("\0\0\0\x03\0x=1", 8));
    std::string big(0x010203, 'c');
    std::string cell = encode_cell(big, true);
    EXPECT_EQ(cell.substr(0, 5), std::string("\0\x01\x02\x03\x01", 5));
    EXPECT_EQ(cell.substr(5), big);
    EXPECT_EQ(encode_cell("é", false), std::string("\0\0\0\x02\0", 5) + "é");  // length in bytes
    // Flag 2: a u16 length and the directory for the cell's figures come first.
    EXPECT_EQ(encode_cell("x", false, "/w/d"), std::string("\0\0\0\x01\x02\0\x04/w/dx", 12));
}

// Runs the Python interpreter driver on the host (when python3 exists) with
// framed cells on stdin and fd 3 captured: state persists across cells,
// expressions are echoed when asked, errors give status 1 and do not end the session.
TEST(Languages, PythonDriverRunsCellsInOneNamespace) {
    if (std::system("python3 -c pass >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
    char dir_template[] = "/tmp/cubicle-py-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    std::string dir = dir_template;
    auto write = [](const std::string& path, const std::string& data) {
        std::ofstream f(path, std::ios::binary);
        f.write(data.data(), static_cast<std::streamsize>(data.size()));
    };
    auto read = [](const std::string& path) {
        std::ifstream f(path, std::ios::binary);
        std::ostringstream ss;
        ss << f.rdbuf();
        return ss.str();
    };
    write(dir + "/driver.py", interpreter_for("python").argv[3]);
    write(dir + "/cells", encode_cell("x = 40\nprint('hi')", true) + encode_cell("x + 2", true) +
                              encode_cell("x + 100", false) + encode_cell("1/0", true) +
                              encode_cell("import sys; sys.exit(3)", true) + encode_cell("print(x, 'é')", true) +
                              encode_cell("input()", true));
    std::string command = "cd '" + dir + "' && python3 -u driver.py <cells >out 2>err 3>control";
    int rc = std::system(command.c_str());
    EXPECT_EQ(rc, 0) << read(dir + "/err");
    EXPECT_EQ(read(dir + "/control"), "0 0\n0 0\n0 0\n1 0\n3 0\n0 0\n1 0\n");  // status, figures saved
    EXPECT_EQ(read(dir + "/out"), "hi\n42\n40 é\n");
    std::string err = read(dir + "/err");
    EXPECT_NE(err.find("ZeroDivisionError"), std::string::npos) << err;
    EXPECT_NE(err.find("EOFError"), std::string::npos) << err;  // user code does not read the cell stream
    EXPECT_EQ(err.find("driver.py"), std::string::npos) << err;  // tracebacks start at the user's code
    EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

TEST(Languages, ShellCommand) {
    auto r = shell_command("ls -la | wc -l");
    EXPECT_EQ(r.argv, (std::vector<std::string>{"/bin/sh", "-c", "ls -la | wc -l"}));
    EXPECT_TRUE(r.cwd.empty());  // the sandbox runs it in its workspace
    EXPECT_EQ(r.stdin_data, "");
}

} // namespace
} // namespace cubicle::sandbox
