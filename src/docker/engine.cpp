#include "docker/engine.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/json.hpp"

namespace cubicle::docker {

std::string Engine::describe() const {
    auto name = fmt::format("{} {}", podman() ? "Podman" : "Docker", version.empty() ? "(unknown version)" : version);
    if (!default_runtime.empty() && default_runtime != "runc") name += fmt::format(" (runtime {})", default_runtime);
    return name;
}

bool Engine::kill_found_not_running(unsigned status, std::string_view message) const {
    if (status == 409) return true;
    return podman() && status == 500 && message.find("state improper") != std::string_view::npos;
}

bool Engine::offers(std::string_view runtime) const {
    if (runtime.empty() || runtime == default_runtime) return true;
    if (!runtime_per_container()) return false;
    return std::find(runtimes.begin(), runtimes.end(), runtime) != runtimes.end();
}

std::string Engine::why_not(std::string_view runtime) const {
    if (podman()) {
        return fmt::format("Podman runs every container under the runtime its service was started with ({}); start it with "
                           "`podman --runtime {} system service` to use {}",
                           default_runtime.empty() ? "unknown" : default_runtime, runtime, runtime);
    }
    std::string known;
    for (const auto& name : runtimes) known += (known.empty() ? "" : ", ") + name;
    return fmt::format("the Docker daemon has no runtime named {} (its runtimes: {}); register it in /etc/docker/daemon.json "
                       "(for gVisor: https://gvisor.dev/docs/user_guide/install/) and restart the daemon",
                       runtime, known.empty() ? "unknown" : known);
}

Engine parse_engine(std::string_view version_json, std::string_view info_json) {
    Engine engine;
    json::Document version;
    if (!version.parse(version_json)) {
        std::string_view text;
        if (version.root()["Version"].get(text) == simdjson::SUCCESS) engine.version = text;
        simdjson::dom::array components;
        if (version.root()["Components"].get(components) == simdjson::SUCCESS) {
            for (auto component : components) {
                std::string_view name;
                if (component["Name"].get(name) != simdjson::SUCCESS) continue;
                if (name == "Podman Engine") {
                    engine.kind = Engine::Kind::podman;
                    if (component["Version"].get(text) == simdjson::SUCCESS) engine.version = text;
                } else if (name.starts_with("OCI Runtime (") && name.ends_with(")")) {
                    // Podman names the runtime its service uses here.
                    engine.default_runtime = name.substr(13, name.size() - 14);
                }
            }
        }
    }
    json::Document info;
    if (!info.parse(info_json)) {
        simdjson::dom::object runtimes;
        if (info.root()["Runtimes"].get(runtimes) == simdjson::SUCCESS) {
            for (auto [key, value] : runtimes) engine.runtimes.emplace_back(key);
        }
        bool memory = true, pids = true;
        if (info.root()["MemoryLimit"].get(memory) != simdjson::SUCCESS) memory = true;
        if (info.root()["PidsLimit"].get(pids) != simdjson::SUCCESS) pids = true;
        // Rootless Podman on cgroup v1 says true to both and ignores the limits.
        bool rootless = false;
        if (info.root()["Rootless"].get(rootless) != simdjson::SUCCESS) rootless = false;
        simdjson::dom::array options;  // Docker says it here
        if (info.root()["SecurityOptions"].get(options) == simdjson::SUCCESS) {
            for (auto option : options) {
                std::string_view text;
                if (option.get(text) == simdjson::SUCCESS && text == "name=rootless") rootless = true;
            }
        }
        std::string_view cgroups;
        bool cgroup_v1 = info.root()["CgroupVersion"].get(cgroups) == simdjson::SUCCESS && cgroups == "1";
        engine.enforces_limits = memory && pids && !(rootless && cgroup_v1);
        std::string_view text;
        // Podman's DefaultRuntime is its configuration's, not the one --runtime chose.
        if (engine.default_runtime.empty() && info.root()["DefaultRuntime"].get(text) == simdjson::SUCCESS) engine.default_runtime = text;
    }
    return engine;
}

RuntimeOverhead runtime_overhead(std::string_view runtime) {
    if (is_gvisor(runtime)) return {.pids = 64, .memory_mb = 64};
    return {};
}

bool is_gvisor(std::string_view runtime) {
    return runtime == "runsc" || runtime.starts_with("runsc-") || runtime == "gvisor";
}

} // namespace cubicle::docker
