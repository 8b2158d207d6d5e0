// Which engine serves the Engine API (Docker, or Podman's compatible API) and
// every way it differs from Docker that cubicle must know about: the one place
// for engine quirks. Filled from GET /version and GET /info at start-up.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cubicle::docker {

// gVisor's runtime (runsc), under any of the names it is registered by.
bool is_gvisor(std::string_view runtime);

struct Engine {
    enum class Kind { docker, podman } kind = Kind::docker;
    std::string version;          // the engine's own version: "24.0.5", "4.3.1"
    // The OCI runtime the engine uses when a container names none (Podman: the one
    // its service was started with, from /version's "OCI Runtime (NAME)").
    std::string default_runtime;
    // Runtimes the engine names in /info. Podman lists every runtime it knows a path
    // for, installed or not: only default_runtime is known to work there.
    std::vector<std::string> runtimes;

    // Whether the engine can hold containers to a memory and a pids limit (/info MemoryLimit
    // and PidsLimit). Rootless Podman on cgroup v1 cannot: it ignores both, and cubicle
    // then refuses to start sandboxes rather than run them unbounded.
    bool enforces_limits = true;

    bool podman() const { return kind == Kind::podman; }
    // "Docker 24.0.5", "Podman 4.3.1 (runtime runsc)" for messages and logs.
    std::string describe() const;

    // ---- quirks ----
    // Podman as root gives containers RLIMIT_NPROC 1048576 unless told otherwise, which
    // its runtime cannot set without CAP_SYS_RESOURCE: the container then fails to
    // start. Docker leaves the limit alone, where an nproc ulimit would count every
    // process of the uid on the host (PidsLimit is the real bound on both).
    bool needs_nproc_ulimit() const { return podman(); }
    // Podman adds writable tmpfs mounts on /run and /var/tmp to a read-only root
    // (its --read-only-tmpfs default, which the compatible API cannot turn off):
    // cubicle covers them with read-only mounts of its own so that the sandbox sees
    // what it sees on Docker: /tmp and the workspace are its only writable places.
    bool adds_writable_tmpfs() const { return podman(); }
    // Podman ignores HostConfig.Runtime: every container runs under the runtime its
    // service was started with (`podman --runtime runsc system service`).
    bool runtime_per_container() const { return !podman(); }
    // Whether a kill answered with `status` and `message` means only that the
    // container was not running (Docker: 409; Podman: 500 "container state improper").
    bool kill_found_not_running(unsigned status, std::string_view message) const;

    // ---- what a runtime can be trusted with ("" names the engine's default) ----
    std::string_view runtime_or_default(std::string_view runtime) const { return runtime.empty() ? default_runtime : runtime; }
    // Whether the agent's zygote may fork fresh runs and a throwaway sandbox may be
    // reset for reuse: runsc 2022-12 (ptrace) loses the agent of a sandbox whose runs
    // the zygote forks, and recycling is not proven under it.
    bool forks_and_recycles(std::string_view runtime) const { return !is_gvisor(runtime_or_default(runtime)); }
    // Whether a unix socket of the host bind-mounted into a container can be connected to
    // from inside (the agent's channel): gVisor refuses host sockets unless started with
    // --host-uds, so its agents keep the attach stream.
    bool passes_host_sockets(std::string_view runtime) const { return !is_gvisor(runtime_or_default(runtime)); }
    // Whether PUT and GET /archive work on a running container: Podman's fail under runsc
    // (Docker with runsc could not be tried here: it needs daemon.json registration).
    bool archive_on_running(std::string_view runtime) const { return !(podman() && is_gvisor(runtime_or_default(runtime))); }

    // Whether `runtime` can run containers here, and when not, why (for messages).
    bool offers(std::string_view runtime) const;
    std::string why_not(std::string_view runtime) const;
};

// Reads GET /version (Components name Podman) and GET /info (Runtimes, DefaultRuntime).
Engine parse_engine(std::string_view version_json, std::string_view info_json);

// What a runtime costs a sandbox beyond its programs: gVisor's sandbox (Sentry,
// Gofer, their threads) holds ~42 host tasks while idle and its memory is charged to
// the container, so the limits the user asked for are raised by this much.
struct RuntimeOverhead {
    int pids = 0;
    int memory_mb = 0;
};
RuntimeOverhead runtime_overhead(std::string_view runtime);

} // namespace cubicle::docker
