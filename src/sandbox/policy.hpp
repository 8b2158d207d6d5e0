// What a sandbox is allowed to do: SandboxSpec -> Docker container config.
// Every security default lives here and nowhere else.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "docker/engine.hpp"

namespace cubicle::sandbox {

inline constexpr const char* workspace_dir = "/workspace";
inline constexpr const char* agent_dir = "/opt/cubicle";
inline constexpr const char* agent_path = "/opt/cubicle/agent";
// Tells the agent it runs in a container of ours as a uid nothing else uses,
// which lets it kill every process of that uid a run left behind.
inline constexpr const char* agent_sandbox_flag = "--sandbox";
// Followed by a number of bytes: what the sandbox's programs may hold (agent/memory.h).
inline constexpr const char* agent_memory_flag = "--memory-limit";
// Followed by BYTES:FILES: the quota the agent holds a workspace on disk to (agent/diskquota.h).
inline constexpr const char* agent_disk_flag = "--disk-limit";
inline constexpr unsigned sandbox_uid = 1000;
inline constexpr unsigned sandbox_gid = 1000;

inline constexpr const char* label_managed = "io.cubicle.managed";
inline constexpr const char* label_instance = "io.cubicle.instance";
inline constexpr const char* label_sandbox = "io.cubicle.sandbox";
// The owning process's liveness record (sandbox/owner.hpp): only a provably dead owner's containers are reaped.
inline constexpr const char* label_owner = "io.cubicle.owner";

struct SandboxSpec {
    std::string image;
    bool network = false;
    bool gpu = false;  // all NVIDIA GPUs, through the daemon's device requests
    // With network: the internal network the sandbox joins, and the egress proxy on it.
    std::string network_name;
    std::string proxy_url;
    // 0 here and below: the server's default (Manager::resolve); a throwaway run's
    // sandbox asks for nothing else.
    int memory_mb = 0;
    double cpus = 0;
    int pids_limit = 0;
    int tmp_size_mb = 0;
    int disk_mb = 0;       // /workspace: a tmpfs of this size, charged to memory (but see workspace_volume)
    int files_limit = 0;   // and this many inodes
    std::vector<std::pair<std::string, std::string>> env;
    // The OCI runtime (runsc for gVisor); empty: the engine's default.
    std::string runtime;
    // A named volume on disk that holds /workspace (a persistent sandbox's); empty: a tmpfs
    // of disk_mb. On disk the agent holds disk_mb and files_limit (agent/diskquota.h).
    std::string workspace_volume;
    // A persistent sandbox keeps its id from server to server; empty: a new one.
    std::string sandbox_id;
};

// Memory in MiB: what the sandbox's programs may hold (memory_mb, enforced by the agent:
// agent/memory.h), and the container's hard limit that protects the host, which
// also holds its files (/tmp and, unless it is on disk, the workspace are tmpfs, charged to its cgroup),
// its own processes (agent, zygote) and the runtime's overhead.
// The sandbox's own processes under the hard limit: the agent, the zygote with
// Python's data stack imported (~75 MiB), page tables and kernel memory, and what a
// program allocates between two of the agent's checks.
inline constexpr int own_processes_mb = 128;
struct MemoryLimits {
    int programs_mb;
    int ceiling_mb;
};
MemoryLimits memory_limits(const SandboxSpec& spec, const docker::Engine& engine = {});

// The JSON body of POST /containers/create for `spec`. Without `agent` the
// main process is a shell that only waits for its stdin to close (exec fallback).
// `engine` says how the engine differs from Docker (docker/engine.hpp).
// `agent_volume`: the server's volume holding the agent, mounted read-only; empty,
// an anonymous volume of the container's own that the agent is copied into.
// `agent_channel`: the host path of the socket the agent connects to (agent_channel.hpp),
// mounted read-only where the agent looks for it; empty, none.
std::string container_config(const SandboxSpec& spec, const std::string& instance, const std::string& sandbox_id,
                             bool agent = true, const docker::Engine& engine = {}, const std::string& agent_volume = {},
                             const std::string& agent_channel = {});

// The JSON body of POST /containers/{id}/exec. An empty `user` keeps the container's.
struct ExecSpec {
    std::vector<std::string> argv;
    std::vector<std::string> env;
    std::string cwd;
    std::string user;
    bool stdin_open = false;
};
std::string exec_config(const ExecSpec& exec);

inline constexpr const char* label_role = "io.cubicle.role";
inline constexpr const char* role_agent = "agent";  // the agent volume and the container that fills it
inline constexpr const char* proxy_alias = "cubicle-proxy";
inline constexpr int proxy_port = 3128;

// The egress proxy's container: the agent in proxy mode, locked down like a
// sandbox, on the default bridge (its way out); it joins each internal network
// under the name proxy_alias (sandbox/egress.hpp).
std::string proxy_config(const std::string& image, const std::string& instance, const std::vector<std::string>& allow,
                         const docker::Engine& engine = {}, const std::string& agent_volume = {});

// The volume every container of one server instance takes its agent from (agent_volume.hpp).
std::string agent_volume_config(const std::string& name, const std::string& instance);
// The container, created and never started, through which the agent is written into that volume.
std::string agent_volume_filler_config(const std::string& image, const std::string& instance, const std::string& volume);

// The internal network a principal's networked sandboxes share: no route out but the proxy.
std::string egress_network_config(const std::string& name, const std::string& instance);

} // namespace cubicle::sandbox
