// What a sandbox is allowed to do: SandboxSpec -> Docker container config.
// Every security default lives here and nowhere else.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace cubicle::sandbox {

inline constexpr const char* workspace_dir = "/workspace";
inline constexpr const char* agent_dir = "/opt/cubicle";
inline constexpr const char* agent_path = "/opt/cubicle/agent";
inline constexpr unsigned sandbox_uid = 1000;
inline constexpr unsigned sandbox_gid = 1000;

inline constexpr const char* label_managed = "io.cubicle.managed";
inline constexpr const char* label_instance = "io.cubicle.instance";
inline constexpr const char* label_sandbox = "io.cubicle.sandbox";

struct SandboxSpec {
    std::string image;
    bool network = false;
    bool gpu = false;  // all NVIDIA GPUs, through the daemon's device requests
    int memory_mb = 512;
    double cpus = 1.0;
    int pids_limit = 256;
    int tmp_size_mb = 256;
    std::vector<std::pair<std::string, std::string>> env;
};

// The JSON body of POST /containers/create for `spec`. Without `agent` the
// main process is a shell that only waits for its stdin to close (exec fallback).
std::string container_config(const SandboxSpec& spec, const std::string& instance, const std::string& sandbox_id,
                             bool agent = true);

} // namespace cubicle::sandbox
