#include "sandbox/policy.hpp"

#include <cmath>

#include <fmt/format.h>

#include "agent/protocol.h"
#include "common/errors.hpp"
#include "common/json.hpp"
#include "docker/tar.hpp"
#include "sandbox/owner.hpp"

namespace cubicle::sandbox {
namespace {

constexpr std::int64_t mib = 1024 * 1024;
constexpr std::int64_t max_file_bytes = 1024 * mib;  // fsize: no single file over 1 GiB
constexpr std::int64_t open_files = 1024;

// Podman's default for root (1048576) cannot be set here; this is far above any PidsLimit.
constexpr std::int64_t podman_nproc = 32768;

void ulimit(json::Writer& w, std::string_view name, std::int64_t value) {
    w.begin_object().field("Name", name).field("Soft", value).field("Hard", value).end_object();
}

// The Ulimits every container of ours carries, with what `engine` needs besides.
void ulimits(json::Writer& w, const docker::Engine& engine) {
    w.key("Ulimits").begin_array();
    ulimit(w, "nofile", open_files);
    ulimit(w, "fsize", max_file_bytes);
    ulimit(w, "core", 0);
    if (engine.needs_nproc_ulimit()) ulimit(w, "nproc", podman_nproc);
    w.end_array();
}

// Writable places are the same on every engine: Podman's extra tmpfs mounts on a
// read-only root are covered by read-only ones (engine.hpp).
void engine_tmpfs(json::Writer& w, const docker::Engine& engine) {
    if (!engine.adds_writable_tmpfs()) return;
    for (const char* path : {"/run", "/var/tmp"}) w.field(path, "ro,noexec,nosuid,nodev,size=64k,mode=755");
}

// The mount the agent comes from: the server's shared volume, read-only, with nothing of
// the image copied in (NoCopy); or else an anonymous volume the agent is copied into.
void agent_mount(json::Writer& w, const std::string& agent_volume) {
    w.begin_object().field("Type", "volume").field("Target", agent_dir);
    if (!agent_volume.empty()) {
        w.field("Source", agent_volume).field("ReadOnly", true);
        w.key("VolumeOptions").begin_object().field("NoCopy", true).end_object();
    }
    w.end_object();
}

// The tmpfs every workspace is: the one quota on size and file count that holds on
// every storage driver (a plain volume has none, and --storage-opt size needs overlay2
// on XFS with project quotas). Mode 0711: workspaces sharing a container (each its own
// uid) may pass through /workspace to their own directory but not list the others'.
void workspace_tmpfs_options(json::Writer& w, const SandboxSpec& spec) {
    w.begin_object().field("type", "tmpfs").field("device", "tmpfs");
    w.field("o", fmt::format("size={}m,nr_inodes={},uid={},gid={},mode=0711,nosuid,nodev", spec.disk_mb, spec.files_limit,
                             sandbox_uid, sandbox_gid));
    w.end_object();
}

// The workspace: a volume (archive PUT skips tmpfs mounts and refuses a read-only
// root) that is itself a tmpfs made by the `local` driver. Anonymous, removed with
// the container; or a persistent sandbox's named one (live_volume_config), which its
// mirror shares (sandbox/mirror.hpp), with nothing of the image copied in.
void workspace_mount(json::Writer& w, const SandboxSpec& spec) {
    w.begin_object().field("Type", "volume").field("Target", workspace_dir);
    if (!spec.workspace_volume.empty()) {
        // The driver's options too: should the volume be gone (removed behind our back), the
        // one the Engine makes in its place is the same tmpfs, not a disk without a quota.
        w.field("Source", spec.workspace_volume);
        w.key("VolumeOptions").begin_object().field("NoCopy", true).key("DriverConfig").begin_object().field("Name", "local");
        w.key("Options");
        workspace_tmpfs_options(w, spec);
        w.end_object().end_object();
    } else if (spec.disk_mb > 0) {
        w.key("VolumeOptions").begin_object().key("DriverConfig").begin_object().field("Name", "local");
        w.key("Options");
        workspace_tmpfs_options(w, spec);
        w.end_object().end_object();
    }
    w.end_object();
}

void our_labels(json::Writer& w, const std::string& instance) {
    w.field(label_managed, "true").field(label_instance, instance).field(label_owner, owner_record());
}

// What every sandbox's environment starts with.
void base_env(json::Writer& w) {
    w.value("HOME=/workspace").value("LANG=C.UTF-8").value("PYTHONUNBUFFERED=1").value("PYTHONDONTWRITEBYTECODE=1");
    w.value("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
}

// ---- Swarm services (swarm_placement.hpp), as Engine API 1.41 can say them ----

// The part of a TaskTemplate every service of ours shares: the locks of a container of
// ours that a ContainerSpec can express (docs/engines.md has the mapping), one replica,
// never restarted (a task that ends is a sandbox that ended: the server decides what next),
// on the operator's nodes, reached by DNS round robin (no IPVS for a VIP on every kernel).
struct ServiceSite {
    std::string name;
    std::string image;
    std::string sandbox_id;
    const char* role;
    std::vector<std::string> networks;
    const std::vector<std::string>& constraints;
};

void service_labels(json::Writer& w, const std::string& instance, const ServiceSite& site) {
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.field(label_sandbox, site.sandbox_id).field(label_role, site.role);
    w.end_object();
}

// Opens the service and its ContainerSpec up to its Mounts (left open for the caller).
void begin_service(json::Writer& w, const std::string& instance, const ServiceSite& site, const docker::Engine& engine) {
    w.begin_object().field("Name", site.name);
    service_labels(w, instance, site);
    w.key("Mode").begin_object().key("Replicated").begin_object().field("Replicas", 1).end_object().end_object();
    w.key("EndpointSpec").begin_object().field("Mode", "dnsrr").end_object();
    w.key("TaskTemplate").begin_object();
    w.key("RestartPolicy").begin_object().field("Condition", "none").field("MaxAttempts", 0).end_object();
    w.key("Placement").begin_object().key("Constraints").begin_array();
    for (const auto& constraint : site.constraints) w.value(constraint);
    w.end_array().end_object();
    w.key("Networks").begin_array();
    for (const auto& network : site.networks) w.begin_object().field("Target", network).end_object();
    w.end_array();
    // Output travels over the agent's connection; nothing needs to be kept in logs.
    w.key("LogDriver").begin_object().field("Name", "none").end_object();
    w.key("ContainerSpec").begin_object();
    w.field("Image", site.image);
    // On the task's container too: what a node holds is known as ours there.
    service_labels(w, instance, site);
    w.field("User", fmt::format("{}:{}", sandbox_uid, sandbox_gid));
    w.key("CapabilityDrop").begin_array().value("ALL").end_array();
    w.field("ReadOnly", true).field("Init", true);
    // An image's HEALTHCHECK would run its own command in the task, beside the agent.
    w.key("HealthCheck").begin_object().key("Test").begin_array().value("NONE").end_array().end_object();
    w.field("StopGracePeriod", static_cast<std::int64_t>(1'000'000'000));  // ns: teardown waits no 10 s per task
    ulimits(w, engine);
}

void end_service(json::Writer& w) {
    w.end_object();  // ContainerSpec
}

} // namespace

std::string sandbox_service_spec(const SandboxSpec& spec, const std::string& instance, const std::string& sandbox_id,
                                 const docker::Engine& engine, const SwarmSandbox& swarm) {
    if (spec.network) throw ToolError("a sandbox with network cannot run as a Swarm service (its egress network is on one host)");
    if (!spec.workspace_volume.empty()) throw ToolError("a persistent sandbox cannot run as a Swarm service");
    // A 1.41 ContainerSpec names neither a runtime nor devices: never a silent runc instead.
    if (!spec.runtime.empty())
        throw ToolError(fmt::format("--runtime {} cannot be given to a Swarm service (Engine API 1.41 has no per-service "
                                    "runtime): make it the nodes' default runtime instead",
                                    spec.runtime));
    if (spec.gpu) throw ToolError("gpu: true is not offered with --engine swarm");
    json::Writer w;
    ServiceSite site{.name = swarm.service_name, .image = swarm.image, .sandbox_id = sandbox_id, .role = role_sandbox,
                     .networks = {swarm.network}, .constraints = swarm.constraints};
    begin_service(w, instance, site, engine);
    // --dial-only: no attach stream reaches another node; the agent's connection home is all.
    w.key("Command").begin_array().value(agent_path).value(agent_sandbox_flag);
    w.value(agent_memory_flag).value(std::to_string(static_cast<std::int64_t>(spec.memory_mb) * mib)).value(agent_dial_only_flag);
    w.end_array();
    w.field("Dir", workspace_dir);
    w.key("Env").begin_array();
    base_env(w);
    w.value(fmt::format("{}={}", CUBICLE_AGENT_DIAL, swarm.dial));
    w.end_array();
    w.key("Mounts").begin_array();
    // /tmp: Docker mounts a tmpfs of the Mounts API noexec, nosuid, nodev (as HostConfig.Tmpfs's).
    w.begin_object().field("Type", "tmpfs").field("Target", "/tmp");
    w.key("TmpfsOptions").begin_object().field("SizeBytes", static_cast<std::int64_t>(spec.tmp_size_mb) * mib).field("Mode", 01777);
    w.end_object().end_object();
    workspace_mount(w, spec);  // an anonymous tmpfs volume of the node's, removed with the task's container
    w.end_array();
    end_service(w);
    auto overhead = docker::runtime_overhead(spec.runtime.empty() ? engine.default_runtime : spec.runtime);
    auto memory = static_cast<std::int64_t>(memory_limits(spec, engine).ceiling_mb) * mib;
    auto cpus = static_cast<std::int64_t>(std::llround(spec.cpus * 1e9));
    // Reserved as limited: Swarm places a sandbox only where its limits fit.
    w.key("Resources").begin_object();
    w.key("Limits").begin_object().field("NanoCPUs", cpus).field("MemoryBytes", memory);
    w.field("Pids", static_cast<std::int64_t>(spec.pids_limit) + overhead.pids).end_object();
    w.key("Reservations").begin_object().field("NanoCPUs", cpus).field("MemoryBytes", memory).end_object();
    w.end_object();
    w.end_object();  // TaskTemplate
    w.end_object();
    return w.take();
}

std::string relay_service_spec(const std::string& image, const std::string& instance, const std::string& sandbox_id,
                               const std::string& name, std::vector<std::string> networks, const std::vector<std::string>& constraints,
                               const docker::Engine& engine, int port, const std::string& target) {
    json::Writer w;
    ServiceSite site{.name = name, .image = image, .sandbox_id = sandbox_id, .role = role_relay, .networks = std::move(networks),
                     .constraints = constraints};
    begin_service(w, instance, site, engine);
    w.key("Command").begin_array().value(agent_path).value("--relay").value(std::to_string(port)).value(target).end_array();
    // The relay ends when its stdin closes (a local one with the server's attach): a task's
    // stays open, and the service goes with its sandbox or by the orphan sweep.
    w.field("OpenStdin", true);
    w.key("Env").begin_array().end_array();
    end_service(w);
    w.key("Resources").begin_object();
    w.key("Limits").begin_object().field("MemoryBytes", 64 * mib).field("Pids", static_cast<std::int64_t>(64)).end_object();
    w.end_object();
    w.end_object();  // TaskTemplate
    w.end_object();
    return w.take();
}

std::string overlay_network_config(const std::string& name, const std::string& instance, bool internal) {
    json::Writer w;
    w.begin_object().field("Name", name).field("CheckDuplicate", true).field("Driver", "overlay").field("Internal", internal);
    w.field("Attachable", false);
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.end_object();
    w.end_object();
    return w.take();
}

std::string agent_image_context(const std::string& base_image, std::string_view agent, const std::string& digest) {
    // The agent at its path, set-user-id and set-group-id bits gone (Engine API 1.41 has no
    // no-new-privileges for a service: with no such file, no program can gain a uid), and a
    // build that fails should any remain.
    auto dockerfile = fmt::format(
        "FROM {}\n"
        "USER 0\n"
        "COPY agent {}\n"
        "RUN find / -xdev -type f -perm /6000 -exec chmod ug-s {{}} + ; test -z \"$(find / -xdev -type f -perm /6000)\"\n"
        "LABEL {}={} {}={}\n"
        "USER {}:{}\n",
        base_image, agent_path, label_agent_digest, digest, label_agent_base, base_image, sandbox_uid, sandbox_gid);
    docker::TarWriter tar;
    tar.add({.name = "Dockerfile", .content = dockerfile, .mode = 0644});
    tar.add({.name = "agent", .content = agent, .mode = 0755});
    return tar.finish();
}

MemoryLimits memory_limits(const SandboxSpec& spec, const docker::Engine& engine) {
    auto overhead = docker::runtime_overhead(spec.runtime.empty() ? engine.default_runtime : spec.runtime);
    return {.programs_mb = spec.memory_mb,
            .ceiling_mb = spec.memory_mb + spec.disk_mb + spec.tmp_size_mb + own_processes_mb + overhead.memory_mb};
}

std::string container_config(const SandboxSpec& spec, const std::string& instance, const std::string& sandbox_id, bool agent,
                             const docker::Engine& engine, const std::string& agent_volume, const std::string& agent_channel,
                             const std::string& dial_network, const std::string& dial) {
    bool dials = agent && !dial_network.empty() && !dial.empty();
    if (dials && spec.network) throw ToolError("a sandbox with network cannot dial home (it joins its egress network)");
    json::Writer w;
    w.begin_object();
    w.field("Image", spec.image);
    // The agent is the main process, under Docker's init (Init: true) so that
    // orphaned grandchildren are reaped.
    w.key("Entrypoint").begin_array();
    if (agent) {
        // --sandbox: here every process of the sandbox user belongs to the
        // sandbox, so the agent may kill what a program detached (never on a host).
        w.value(agent_path).value(agent_sandbox_flag);
        w.value(agent_memory_flag).value(std::to_string(static_cast<std::int64_t>(spec.memory_mb) * mib));
    } else {
        w.value("/bin/sh").value("-c").value("while read -r _; do :; done");
    }
    w.end_array();
    w.key("Cmd").begin_array().end_array();
    w.field("User", fmt::format("{}:{}", sandbox_uid, sandbox_gid));
    w.field("WorkingDir", workspace_dir);
    // The main process reads stdin; StdinOnce closes it when the server's attach
    // connection drops, so a dead server's sandboxes stop by themselves.
    w.field("AttachStdin", true).field("AttachStdout", true).field("AttachStderr", true);
    w.field("OpenStdin", true).field("StdinOnce", true).field("Tty", false);
    // Only what is set here reaches the sandbox: the server's own environment never does.
    // A client's `env` travels with each execution instead, so pooled containers serve any client.
    w.key("Env").begin_array();
    base_env(w);
    if (!spec.proxy_url.empty()) {
        // The only way out of the internal network: HTTP(S) through the egress proxy.
        for (const char* name : {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"}) {
            w.value(fmt::format("{}={}", name, spec.proxy_url));
        }
        w.value("NO_PROXY=localhost,127.0.0.1").value("no_proxy=localhost,127.0.0.1");
        // Node's fetch and http heed those only when asked (Node 22.21 and 24.5 on; older ignore it).
        w.value("NODE_USE_ENV_PROXY=1");
    }
    // Read by the agent alone, which removes it before any program runs; worthless once used.
    if (dials) w.value(fmt::format("{}={}", CUBICLE_AGENT_DIAL, dial));
    w.end_array();
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.field(label_sandbox, sandbox_id);
    w.end_object();
    if (!spec.network && !dials) w.field("NetworkDisabled", true);

    w.key("HostConfig").begin_object();
    // A networked sandbox is on its principal's internal network, never on one with a way out.
    if (spec.network && spec.network_name.empty()) throw ToolError("a sandbox with network has no egress network to join");
    // A sandbox that dials home is on the server's agent network, where nothing else answers.
    w.field("NetworkMode", spec.network ? spec.network_name : dials ? dial_network : std::string("none"));
    w.key("CapDrop").begin_array().value("ALL").end_array();
    w.key("SecurityOpt").begin_array().value("no-new-privileges").end_array();
    w.field("ReadonlyRootfs", true);
    w.field("Init", true);
    w.field("Privileged", false);
    w.field("IpcMode", "private");
    if (!spec.runtime.empty() && engine.runtime_per_container()) w.field("Runtime", spec.runtime);
    // The runtime's own tasks and memory (gVisor's) come on top of what the sandbox's programs may use.
    auto overhead = docker::runtime_overhead(spec.runtime.empty() ? engine.default_runtime : spec.runtime);
    w.field("PidsLimit", static_cast<std::int64_t>(spec.pids_limit) + overhead.pids);
    // The hard limit: programs, files and the sandbox's own processes (memory_limits).
    auto memory = static_cast<std::int64_t>(memory_limits(spec, engine).ceiling_mb) * mib;
    w.field("Memory", memory);
    w.field("MemorySwap", memory);  // equal to Memory: no swap
    w.field("NanoCpus", static_cast<std::int64_t>(std::llround(spec.cpus * 1e9)));
    w.field("OomScoreAdj", 500);
    if (spec.gpu) {
        w.key("DeviceRequests").begin_array().begin_object();
        w.field("Driver", "nvidia").field("Count", -1);
        w.key("Capabilities").begin_array().begin_array().value("gpu").end_array().end_array();
        w.end_object().end_array();
    }  // under memory pressure the host kills sandboxes first
    ulimits(w, engine);
    // noexec spelt out: Docker adds it by default, Podman does not.
    w.key("Tmpfs").begin_object();
    w.field("/tmp", fmt::format("rw,noexec,nosuid,nodev,size={}m,mode=1777", spec.tmp_size_mb));
    engine_tmpfs(w, engine);
    w.end_object();
    w.key("Mounts").begin_array();
    workspace_mount(w, spec);
    if (agent) agent_mount(w, agent_volume);
    if (agent && !agent_channel.empty()) {
        w.begin_object().field("Type", "bind").field("Source", agent_channel).field("Target", CUBICLE_AGENT_CHANNEL);
        w.field("ReadOnly", true).end_object();
    }
    w.end_array();
    // Output travels over the attach stream or the agent's channel; nothing needs to be kept in logs.
    w.key("LogConfig").begin_object().field("Type", "none").key("Config").begin_object().end_object().end_object();
    w.end_object();

    w.end_object();
    return w.take();
}

std::string exec_config(const ExecSpec& exec) {
    json::Writer w;
    w.begin_object().field("AttachStdin", exec.stdin_open).field("AttachStdout", true).field("AttachStderr", true);
    w.field("Tty", false);
    if (!exec.user.empty()) w.field("User", exec.user);
    if (!exec.cwd.empty()) w.field("WorkingDir", exec.cwd);
    w.key("Cmd").begin_array();
    for (const auto& arg : exec.argv) w.value(arg);
    w.end_array().key("Env").begin_array();
    for (const auto& var : exec.env) w.value(var);
    w.end_array().end_object();
    return w.take();
}

std::string agent_network_config(const std::string& name, const std::string& instance) {
    json::Writer w;
    w.begin_object().field("Name", name).field("CheckDuplicate", true).field("Internal", true).field("Driver", "bridge");
    // No container reaches another on it: the only peer a sandbox has there is the server.
    w.key("Options").begin_object().field("com.docker.network.bridge.enable_icc", "false").end_object();
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.end_object();
    w.end_object();
    return w.take();
}

std::string dial_network_config(const std::string& name, const std::string& instance, const std::string& subnet) {
    json::Writer w;
    w.begin_object().field("Name", name).field("CheckDuplicate", true).field("Internal", true).field("Driver", "bridge");
    w.key("IPAM").begin_object().field("Driver", "default").key("Config").begin_array();
    w.begin_object().field("Subnet", subnet).end_object();
    w.end_array().end_object();
    // No host address on it: the host's ports are out of the sandbox's reach, and so is the host.
    w.key("Options").begin_object().field("com.docker.network.bridge.inhibit_ipv4", "true").end_object();
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.end_object();
    w.end_object();
    return w.take();
}

namespace {

// A container of the server's own that runs the agent in another mode (the egress
// proxy, the relay): the sandbox's locks, and it exits when the server's attach
// connection drops, like a sandbox's agent.
struct HelperContainer {
    std::vector<std::string> entrypoint;  // after the agent's path
    const char* role;
    std::string network;
    std::int64_t pids;
    std::int64_t memory;
};

std::string helper_container_config(const std::string& image, const std::string& instance, const docker::Engine& engine,
                                    const std::string& agent_volume, const HelperContainer& helper) {
    json::Writer w;
    w.begin_object().field("Image", image);
    w.key("Entrypoint").begin_array().value(agent_path);
    for (const auto& arg : helper.entrypoint) w.value(arg);
    w.end_array().key("Cmd").begin_array().end_array();
    w.field("User", fmt::format("{}:{}", sandbox_uid, sandbox_gid));
    w.field("AttachStdin", true).field("AttachStdout", true).field("AttachStderr", true);
    w.field("OpenStdin", true).field("StdinOnce", true).field("Tty", false);
    w.key("Env").begin_array().end_array();
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.field(label_role, helper.role);
    w.end_object();
    w.key("HostConfig").begin_object();
    w.field("NetworkMode", helper.network);
    w.key("CapDrop").begin_array().value("ALL").end_array();
    w.key("SecurityOpt").begin_array().value("no-new-privileges").end_array();
    w.field("ReadonlyRootfs", true).field("Init", true).field("Privileged", false);
    w.field("PidsLimit", helper.pids);
    w.field("Memory", helper.memory).field("MemorySwap", helper.memory);
    ulimits(w, engine);
    w.key("Tmpfs").begin_object();
    engine_tmpfs(w, engine);
    w.end_object();
    w.key("Mounts").begin_array();
    agent_mount(w, agent_volume);
    w.end_array();
    w.key("LogConfig").begin_object().field("Type", "none").key("Config").begin_object().end_object().end_object();
    w.end_object();
    w.end_object();
    return w.take();
}

} // namespace

std::string relay_config(const std::string& image, const std::string& instance, const docker::Engine& engine,
                         const std::string& agent_volume, const std::string& network, int port, const std::string& target) {
    return helper_container_config(image, instance, engine, agent_volume,
                                   {.entrypoint = {"--relay", std::to_string(port), target},
                                    .role = "relay",
                                    .network = network,
                                    .pids = 4096,  // a process per sandbox's connection
                                    .memory = 512 * mib});
}

std::string egress_network_config(const std::string& name, const std::string& instance) {
    json::Writer w;
    w.begin_object().field("Name", name).field("CheckDuplicate", true).field("Internal", true).field("Driver", "bridge");
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.end_object();
    w.end_object();
    return w.take();
}

std::string proxy_config(const std::string& image, const std::string& instance, const std::vector<std::string>& allow,
                         const docker::Engine& engine, const std::string& agent_volume, int ask_wait_s) {
    std::vector<std::string> entrypoint{"--proxy", std::to_string(proxy_port)};
    if (ask_wait_s > 0) entrypoint.push_back(fmt::format("--ask={}", ask_wait_s));
    entrypoint.insert(entrypoint.end(), allow.begin(), allow.end());
    return helper_container_config(image, instance, engine, agent_volume,
                                   {.entrypoint = std::move(entrypoint),
                                    .role = "proxy",
                                    .network = "bridge",
                                    // a thread for each of its 256 connections whose TLS it terminates (secrets)
                                    .pids = 64 + 256,
                                    // 256 connections x 2 x 256 KiB buffers, and the TLS state of those it terminates
                                    .memory = 384 * mib});
}

std::string agent_volume_config(const std::string& name, const std::string& digest) {
    json::Writer w;
    w.begin_object().field("Name", name).field("Driver", "local");
    w.key("Labels").begin_object();
    w.field(label_managed, "true").field(label_role, role_agent).field(label_agent_digest, digest);
    w.end_object().end_object();
    return w.take();
}

std::string agent_volume_filler_config(const std::string& image, const std::string& instance, const std::string& volume) {
    json::Writer w;
    w.begin_object().field("Image", image);
    // Never started: an entrypoint only because an image without CMD cannot be created.
    w.key("Entrypoint").begin_array().value(agent_path).end_array().key("Cmd").begin_array().end_array();
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.field(label_role, role_agent);
    w.end_object();
    w.field("NetworkDisabled", true);
    w.key("HostConfig").begin_object().field("NetworkMode", "none");
    w.key("Mounts").begin_array().begin_object();
    w.field("Type", "volume").field("Source", volume).field("Target", agent_dir);
    w.key("VolumeOptions").begin_object().field("NoCopy", true).end_object();
    w.end_object().end_array();
    w.key("LogConfig").begin_object().field("Type", "none").key("Config").begin_object().end_object().end_object();
    w.end_object().end_object();
    return w.take();
}

std::string live_volume_config(const SandboxSpec& spec, const std::string& name, const std::string& instance) {
    json::Writer w;
    w.begin_object().field("Name", name).field("Driver", "local");
    w.key("DriverOpts");
    workspace_tmpfs_options(w, spec);
    w.key("Labels").begin_object();
    our_labels(w, instance);
    w.field(label_sandbox, spec.sandbox_id).field(label_role, role_live);
    w.end_object().end_object();
    return w.take();
}

std::string mirror_config(const SandboxSpec& spec, const std::string& image, const std::string& instance,
                          const std::string& live_volume, const std::string& disk_volume, const std::string& script,
                          const docker::Engine& engine) {
    json::Writer w;
    w.begin_object().field("Image", image);
    w.key("Entrypoint").begin_array().value("/bin/sh").value("-c").value(script).value("cubicle-mirror").end_array();
    w.key("Cmd").begin_array().end_array();
    // The sandbox user: every file of the workspace is its own, and it can make nothing
    // on disk that the sandbox could not have made in its tmpfs.
    w.field("User", fmt::format("{}:{}", sandbox_uid, sandbox_gid)).field("WorkingDir", "/");
    // Like a sandbox's agent, it ends when the server's attach connection drops: after a last copy.
    w.field("AttachStdin", true).field("AttachStdout", true).field("AttachStderr", true);
    w.field("OpenStdin", true).field("StdinOnce", true).field("Tty", false);
    // A stopping daemon's SIGTERM also makes it copy: it gets the time a large copy takes.
    w.field("StopTimeout", static_cast<std::int64_t>(600));
    w.key("Env").begin_array().value("PATH=/usr/sbin:/usr/bin:/sbin:/bin").value("LANG=C.UTF-8").end_array();
    w.key("Labels").begin_object();
    w.field(label_managed, "true").field(label_instance, instance).field(label_mirror_owner, owner_record());
    w.field(label_sandbox, spec.sandbox_id).field(label_role, role_mirror);
    w.end_object();
    w.field("NetworkDisabled", true);
    w.key("HostConfig").begin_object();
    w.field("NetworkMode", "none");
    if (!spec.runtime.empty() && engine.runtime_per_container()) w.field("Runtime", spec.runtime);
    w.key("CapDrop").begin_array().value("ALL").end_array();
    w.key("SecurityOpt").begin_array().value("no-new-privileges").end_array();
    w.field("ReadonlyRootfs", true).field("Init", true).field("Privileged", false);
    w.field("PidsLimit", static_cast<std::int64_t>(32));
    // The tmpfs pages it writes back at a resume are charged to it, not to the sandbox.
    auto memory = (static_cast<std::int64_t>(spec.disk_mb) + 64) * mib;
    w.field("Memory", memory).field("MemorySwap", memory);
    if (spec.cpus > 0) w.field("NanoCpus", static_cast<std::int64_t>(std::llround(spec.cpus * 1e9)));
    ulimits(w, engine);
    w.key("Tmpfs").begin_object();
    engine_tmpfs(w, engine);
    w.end_object();
    w.key("Mounts").begin_array();
    // The volume on disk where the image has its /workspace, owned by the sandbox user: a new
    // volume takes that owner (NoCopy false) and the mirror can write it. The tmpfs as made.
    w.begin_object().field("Type", "volume").field("Source", disk_volume).field("Target", mirror_disk_dir);
    w.key("VolumeOptions").begin_object().field("NoCopy", false).end_object().end_object();
    w.begin_object().field("Type", "volume").field("Source", live_volume).field("Target", mirror_live_dir);
    w.key("VolumeOptions").begin_object().field("NoCopy", true).end_object().end_object();
    w.end_array();
    w.key("LogConfig").begin_object().field("Type", "none").key("Config").begin_object().end_object().end_object();
    w.end_object();
    w.end_object();
    return w.take();
}

} // namespace cubicle::sandbox
