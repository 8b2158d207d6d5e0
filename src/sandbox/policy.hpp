// What a sandbox is allowed to do: SandboxSpec -> Docker container config.
// Every security default lives here and nowhere else.
#pragma once

#include <string>
#include <string_view>
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
// The agent has no attach stream (a Swarm task): it dials home or ends (Sandbox::connect_dialed).
inline constexpr const char* agent_dial_only_flag = "--dial-only";
inline constexpr unsigned sandbox_uid = 1000;
inline constexpr unsigned sandbox_gid = 1000;

inline constexpr const char* label_managed = "io.cubicle.managed";
inline constexpr const char* label_instance = "io.cubicle.instance";
inline constexpr const char* label_sandbox = "io.cubicle.sandbox";
// The owning process's liveness record (sandbox/owner.hpp): only a provably dead owner's containers are reaped.
inline constexpr const char* label_owner = "io.cubicle.owner";
// A mirror's (mirror.hpp) owner, under a label of its own: a cubicle older than mirrors,
// whose sweep would take it for an orphan, must never remove one making its last copy.
inline constexpr const char* label_mirror_owner = "io.cubicle.mirror-owner";

struct SandboxSpec {
    std::string image;
    bool network = false;
    bool gpu = false;  // all NVIDIA GPUs, through the daemon's device requests
    // With network: the internal network the sandbox joins, and the egress proxy on it.
    std::string network_name;
    std::string proxy_url;
    // With network: the operator's secrets (secrets.hpp) it asked for, by name; each an
    // environment variable holding the sandbox's placeholder for it.
    std::vector<std::string> secrets;
    // 0 here and below: the server's default (Manager::resolve); a throwaway run's
    // sandbox asks for nothing else.
    int memory_mb = 0;
    double cpus = 0;
    int pids_limit = 0;
    int tmp_size_mb = 0;
    int disk_mb = 0;       // /workspace: a tmpfs of this size, charged to memory
    int files_limit = 0;   // and this many inodes
    std::vector<std::pair<std::string, std::string>> env;
    // The OCI runtime (runsc for gVisor); empty: the engine's default.
    std::string runtime;
    // A persistent sandbox's workspace: its named tmpfs volume, shared with its mirror
    // (sandbox/mirror.hpp); empty, an anonymous one.
    std::string workspace_volume;
    // A persistent sandbox keeps its id from server to server; empty: a new one.
    std::string sandbox_id;
};

// Memory in MiB: what the sandbox's programs may hold (memory_mb, enforced by the agent:
// agent/memory.h), and the container's hard limit that protects the host, which
// also holds its files (/tmp and the workspace are tmpfs, charged to its cgroup),
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
// `dial_network`, `dial`: the agent dials home instead (dial_home.hpp): the container
// joins that network alone and its agent finds `dial` in CUBICLE_AGENT_DIAL.
std::string container_config(const SandboxSpec& spec, const std::string& instance, const std::string& sandbox_id,
                             bool agent = true, const docker::Engine& engine = {}, const std::string& agent_volume = {},
                             const std::string& agent_channel = {}, const std::string& dial_network = {},
                             const std::string& dial = {});
// The JSON body of POST /networks/create for a server's agent network (dial_home.hpp):
// internal (no route out) and without traffic between its containers. Only the relay is on it.
std::string agent_network_config(const std::string& name, const std::string& instance);
// The network of one sandbox whose agent dials home, `subnet` of its own: internal, and
// no address of the host's on it (inhibit_ipv4): the relay is the one peer there.
std::string dial_network_config(const std::string& name, const std::string& instance, const std::string& subnet);
// The relay (agent/relay.h) on `network`, listening on `port`, forwarding to `target` (HOST:PORT).
std::string relay_config(const std::string& image, const std::string& instance, const docker::Engine& engine,
                         const std::string& agent_volume, const std::string& network, int port, const std::string& target);

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
inline constexpr const char* role_agent = "agent";  // the agent volume and the container that holds it
// On the agent volume: the SHA-256 of the agent it holds (agent_volume.hpp).
inline constexpr const char* label_agent_digest = "io.cubicle.agent-digest";
inline constexpr const char* role_live = "live";      // a persistent sandbox's tmpfs workspace
inline constexpr const char* role_sandbox = "sandbox";  // a Swarm service that is a sandbox
inline constexpr const char* role_relay = "relay";      // the relay its agent dials home through
// On an image derived for Swarm (agent_image_context): the image it was derived from.
inline constexpr const char* label_agent_base = "io.cubicle.agent-base";
inline constexpr const char* role_mirror = "mirror";  // the container copying it to disk
// Where a mirror finds the sandbox's volume on disk, and its tmpfs.
inline constexpr const char* mirror_disk_dir = "/workspace";
inline constexpr const char* mirror_live_dir = "/live";
inline constexpr const char* proxy_alias = "cubicle-proxy";
inline constexpr int proxy_port = 3128;

// The egress proxy's container: the agent in proxy mode, locked down like a
// sandbox, on the default bridge (its way out); it joins each internal network
// under the name proxy_alias (sandbox/egress.hpp). `ask_wait_s` > 0: a host the allowlist
// refuses is put to the server (egress approvals), whose answer a connection awaits this long.
std::string proxy_config(const std::string& image, const std::string& instance, const std::vector<std::string>& allow,
                         const docker::Engine& engine = {}, const std::string& agent_volume = {}, int ask_wait_s = 0);

// The volume containers take the agent `digest` from, shared by the servers of that agent
// (agent_volume.hpp): no instance of its own.
std::string agent_volume_config(const std::string& name, const std::string& digest);
// The container, created and never started, by which a server holds that volume (the daemon
// removes no volume a container mounts) and writes the agent into it.
std::string agent_volume_filler_config(const std::string& image, const std::string& instance, const std::string& volume);

// A persistent sandbox's workspace (spec.sandbox_id's): a named tmpfs of spec.disk_mb,
// shared by the sandbox and its mirror (sandbox/mirror.hpp).
std::string live_volume_config(const SandboxSpec& spec, const std::string& name, const std::string& instance);
// The mirror: `script` run by sh as the sandbox user in `image` (one the operator
// trusts: never the sandbox's own), with the volume on disk at mirror_disk_dir and that
// tmpfs at mirror_live_dir, locked down like a sandbox, without network.
std::string mirror_config(const SandboxSpec& spec, const std::string& image, const std::string& instance,
                          const std::string& live_volume, const std::string& disk_volume, const std::string& script,
                          const docker::Engine& engine = {});

// The internal network a principal's networked sandboxes share: no route out but the proxy.
// ---- Swarm (swarm_placement.hpp) ----
// Where a sandbox's service runs and how its agent dials home.
struct SwarmSandbox {
    std::string service_name;
    std::string image;    // derived: the agent inside (agent_image_context)
    std::string network;  // its own internal overlay, with its relay alone
    std::vector<std::string> constraints;  // --swarm-constraint
    std::string dial;     // CUBICLE_AGENT_DIAL's value
};
// The JSON body of POST /services/create for one sandbox: its container_config's locks
// as a 1.41 ServiceSpec can carry them (docs/engines.md, "Swarm"). Throws ToolError for
// what a service cannot be (network: true, persistent).
std::string sandbox_service_spec(const SandboxSpec& spec, const std::string& instance, const std::string& sandbox_id,
                                 const docker::Engine& engine, const SwarmSandbox& swarm);
// The relay of one sandbox (agent/relay.h) on `networks` (the sandbox's, then a way to the
// server), listening on `port`, forwarding to `target` (HOST:PORT).
std::string relay_service_spec(const std::string& image, const std::string& instance, const std::string& sandbox_id,
                               const std::string& name, std::vector<std::string> networks, const std::vector<std::string>& constraints,
                               const docker::Engine& engine, int port, const std::string& target);
// POST /networks/create for an overlay network of ours.
std::string overlay_network_config(const std::string& name, const std::string& instance, bool internal);
// The build context (a tar) of `base_image` with `agent` at agent_path, labelled with its
// `digest` and base, with no set-user-id or set-group-id file left.
std::string agent_image_context(const std::string& base_image, std::string_view agent, const std::string& digest);

std::string egress_network_config(const std::string& name, const std::string& instance);

} // namespace cubicle::sandbox
