#include "sandbox/manager.hpp"

#include <chrono>
#include <ctime>
#include <set>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "docker/tar.hpp"
#include "sandbox/languages.hpp"
#include "sandbox/agent_blob.hpp"

namespace cubicle::sandbox {
namespace {

// The agent did not start in a container (say, an image for another CPU).
class AgentUnavailable : public ToolError {
public:
    using ToolError::ToolError;
};

constexpr auto agent_start_timeout = std::chrono::seconds(15);
// A container of another instance still in "created" this long, while that
// instance runs no container at all, was abandoned between create and start.
constexpr std::int64_t abandoned_after_s = 3;

} // namespace

Manager::Manager(asio::any_io_executor executor, docker::Client& docker, const Config& config)
    : executor_(executor), docker_(docker), config_(config), instance_(random_hex(8)),
      pool_(executor, resolve({}),
            PoolSettings{static_cast<std::size_t>(config.pool_size), static_cast<std::size_t>(config.pool_refill),
                         std::chrono::seconds(config.pool_idle_s)},
            [this](SandboxSpec spec) { return launch(std::move(spec)); },
            [this](std::shared_ptr<Sandbox> sandbox) { return discard(std::move(sandbox)); }),
      egress_(executor, docker, config, instance_) {}

SandboxSpec Manager::resolve(SandboxSpec spec) const {
    if (spec.image.empty()) spec.image = config_.default_image;
    if (spec.memory_mb <= 0) spec.memory_mb = config_.memory_mb;
    if (spec.cpus <= 0) spec.cpus = config_.cpus;
    spec.pids_limit = config_.pids_limit;
    spec.tmp_size_mb = config_.tmp_size_mb;
    if (spec.gpu && !daemon_info_.nvidia_runtime()) {
        std::string runtimes;
        for (const auto& runtime : daemon_info_.runtimes) runtimes += (runtimes.empty() ? "" : ", ") + runtime;
        throw ToolError(fmt::format("no GPU is available: the Docker daemon has no NVIDIA runtime (its runtimes: {}). "
                                    "Install the NVIDIA Container Toolkit on the host, or create the sandbox without gpu: true",
                                    runtimes.empty() ? "unknown" : runtimes));
    }
    if (spec.network && !config_.allow_network) {
        throw ToolError("network access is disabled on this server; the operator can allow it with --allow-network "
                        "(or CUBICLE_ALLOW_NETWORK=1)");
    }
    return spec;
}

asio::awaitable<void> Manager::ensure_image(std::string image, StatusSink status) {
    if (co_await docker_.inspect_image(image)) co_return;
    if (status) status(fmt::format("image {} is not present locally; pulling it", image));
    try {
        co_await docker_.pull_image(image);
    } catch (const docker::Error& e) {
        throw ToolError(fmt::format("image {} is not available: it is not present locally and could not be pulled ({}). "
                                    "Build or load it on the Docker host, or pick another image.",
                                    image, e.what()));
    }
}

Manager::CreationSlot Manager::reserve_slot() {
    if (sandboxes_.size() + creating_ >= static_cast<std::size_t>(config_.max_sandboxes)) {
        throw ToolError(fmt::format("the server already runs its maximum of {} sandboxes; stop one with stop_sandbox first",
                                    config_.max_sandboxes));
    }
    ++creating_;
    return CreationSlot{creating_};
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::workspace_host(SandboxSpec spec, StatusSink status) {
    auto profile = fmt::format("{}|{}|{}|{}", spec.image, spec.memory_mb, spec.cpus, spec.gpu);
    auto& host = workspace_hosts_[profile];
    if (!host || !host->alive()) {
        co_await ensure_image(spec.image, status);
        auto started = co_await launch_with(std::move(spec), true);
        if (!host || !host->alive()) host = started;  // unless a concurrent call was first
        else co_await discard(started);
    }
    co_return host;
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::create_workspace(SandboxSpec spec, StatusSink status) {
    spec = resolve(std::move(spec));
    if (spec.network) throw ToolError("a shared-container workspace cannot have network access; create a sandbox of its own");
    auto slot = reserve_slot();
    auto host = co_await workspace_host(spec, status);
    std::string id = "ws-" + random_hex(6);
    unsigned uid = next_workspace_uid_++;
    // A private directory: mode 0700 and its own uid keep the other workspaces out.
    docker::TarWriter tar;
    tar.add({.name = id, .directory = true, .mode = 0700, .uid = uid, .gid = uid});
    co_await docker_.put_archive(host->container_id(), workspace_dir, tar.finish());
    // Its own agent, started as its uid through Docker exec (no capability is needed to
    // switch users); it ends, with its processes, when this connection closes.
    auto workspace = std::string(workspace_dir) + "/" + id;
    auto config = exec_config({.argv = {"/bin/sh", "-c", fmt::format("umask 077; exec {}", agent_path)},
                               .env = {"HOME=" + workspace},
                               .cwd = workspace,
                               .user = fmt::format("{}:{}", uid, uid),
                               .stdin_open = true});
    auto exec_id = co_await docker_.exec_create(host->container_id(), std::move(config));
    auto stream = co_await docker_.exec_start(exec_id);
    auto sandbox = std::make_shared<Sandbox>(executor_, id, host->container_id(), spec);
    sandbox->make_shared_workspace(workspace, uid);
    co_await sandbox->connect(std::move(stream), agent_start_timeout);
    sandbox->set_env(std::move(spec.env));
    sandboxes_[id] = sandbox;
    co_return sandbox;
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::create(SandboxSpec spec, bool throwaway, StatusSink status) {
    spec = resolve(std::move(spec));
    auto slot = reserve_slot();
    if (spec.network) {
        co_await egress_.ensure();
        spec.network_name = egress_.network();
        spec.proxy_url = egress_.proxy_url();
    }
    if (auto sandbox = pool_.take(spec)) {
        sandbox->set_throwaway(throwaway);
        sandbox->set_env(std::move(spec.env));
        sandboxes_[sandbox->id()] = sandbox;
        co_return sandbox;
    }
    co_await ensure_image(spec.image, status);
    auto sandbox = co_await launch(std::move(spec));
    sandbox->set_throwaway(throwaway);
    sandboxes_[sandbox->id()] = sandbox;
    co_return sandbox;
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::launch(SandboxSpec spec) {
    if (config_.executor == "agent" && !exec_only_images_.count(spec.image)) {
        try {
            co_return co_await launch_with(spec, true);
        } catch (const AgentUnavailable& e) {
            log::warning("the agent cannot run in image {} ({}); using Docker exec for it", spec.image, e.what());
            exec_only_images_.insert(spec.image);
        }
    }
    co_return co_await launch_with(std::move(spec), false);
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::launch_with(SandboxSpec spec, bool agent) {
    std::string sandbox_id = "sb-" + random_hex(6);
    std::string container_id = co_await docker_.create_container(container_config(spec, instance_, sandbox_id, agent),
                                                                 "cubicle-" + sandbox_id);
    std::exception_ptr failure;
    try {
        co_return co_await start(sandbox_id, container_id, spec, agent);
    } catch (...) {
        failure = std::current_exception();
    }
    try {
        co_await docker_.remove_container(container_id);
    } catch (const std::exception& e) {
        log::warning("removing container {} after a failed start: {}", container_id, e.what());
    }
    std::rethrow_exception(failure);
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::start(std::string sandbox_id, std::string container_id, SandboxSpec spec, bool agent) {
    // The workspace volume starts as a copy of the image's /workspace, owner included:
    // the image provides it owned by the sandbox user (Docker's archive upload does not
    // change the owner of the directory it extracts into).
    if (agent) co_await docker_.put_archive(container_id, agent_dir, agent_archive());
    auto stream = co_await docker_.attach(container_id);
    co_await docker_.start_container(container_id);
    auto sandbox = std::make_shared<Sandbox>(executor_, sandbox_id, container_id, std::move(spec));
    if (!agent) {
        sandbox->connect_exec(std::move(stream), docker_);
        co_return sandbox;
    }
    try {
        co_await sandbox->connect(std::move(stream), agent_start_timeout);
    } catch (const ToolError& e) {
        throw AgentUnavailable(e.what());
    }
    log::debug("sandbox {} ready (container {})", sandbox_id, container_id.substr(0, 12));
    co_return sandbox;
}

asio::awaitable<void> Manager::discard(std::shared_ptr<Sandbox> sandbox) {
    if (sandbox->shared()) {
        co_await remove_workspace(std::move(sandbox));
        co_return;
    }
    sandbox->shutdown("it was stopped");
    try {
        co_await docker_.remove_container(sandbox->container_id());
    } catch (const std::exception& e) {
        log::warning("removing sandbox {}: {}", sandbox->id(), e.what());
    }
}

std::shared_ptr<Sandbox> Manager::find(const std::string& id) const {
    auto it = sandboxes_.find(id);
    return it == sandboxes_.end() ? nullptr : it->second;
}

std::shared_ptr<Sandbox> Manager::get(const std::string& id) const {
    if (auto sandbox = find(id)) return sandbox;
    std::string known;
    for (const auto& [key, sandbox] : sandboxes_) {
        if (sandbox->throwaway()) continue;
        known += known.empty() ? key : ", " + key;
    }
    throw ToolError(fmt::format("no sandbox with id '{}' (it may have been stopped). {}", id,
                                known.empty() ? "There are no live sandboxes; create one with initialize_sandbox."
                                              : "Live sandboxes: " + known + "."));
}

std::vector<std::shared_ptr<Sandbox>> Manager::list() const {
    std::vector<std::shared_ptr<Sandbox>> out;
    for (const auto& [id, sandbox] : sandboxes_) out.push_back(sandbox);
    return out;
}

asio::awaitable<void> Manager::destroy(std::string id) {
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) co_return;
    auto sandbox = it->second;
    sandboxes_.erase(it);
    if (sandbox->shared()) {
        co_await remove_workspace(std::move(sandbox));
        co_return;
    }
    sandbox->shutdown("it was stopped");
    co_await docker_.remove_container(sandbox->container_id());
}

asio::awaitable<void> Manager::remove_workspace(std::shared_ptr<Sandbox> sandbox) {
    // Its files go first (as its own uid), then its agent and every process of its uid.
    // Emptied, not removed: the directory's own entry belongs to the container's /workspace.
    auto remove = shell_command(fmt::format("chmod -R u+rwx . 2>/dev/null; find . -mindepth 1 -delete"));
    remove.timeout_ms = 60'000;
    OutputSink no_sink;
    try {
        co_await sandbox->run(std::move(remove), std::move(no_sink), nullptr);
    } catch (const std::exception& e) {
        log::warning("removing workspace {}: {}", sandbox->id(), e.what());
    }
    sandbox->shutdown("it was stopped");
    auto config = exec_config({.argv = {"/bin/sh", "-c", "kill -9 -1"},
                               .user = fmt::format("{}:{}", sandbox->uid(), sandbox->uid())});
    auto exec_id = co_await docker_.exec_create(sandbox->container_id(), std::move(config));
    auto stream = co_await docker_.exec_start(exec_id);
    char buffer[256];
    while (co_await stream->read_some(buffer, sizeof buffer) > 0) {
    }
}

void Manager::release(std::string id) {
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) return;
    auto sandbox = it->second;
    sandboxes_.erase(it);
    asio::co_spawn(executor_, discard(std::move(sandbox)), asio::detached);
}

asio::awaitable<void> Manager::destroy_all() {
    co_await pool_.drain();
    std::set<std::string> containers;  // shared-container workspaces go with their container
    for (const auto& [id, sandbox] : sandboxes_) {
        sandbox->shutdown("the server is stopping");
        containers.insert(sandbox->container_id());
    }
    for (const auto& [profile, host] : workspace_hosts_) {
        host->shutdown("the server is stopping");
        containers.insert(host->container_id());
    }
    sandboxes_.clear();
    workspace_hosts_.clear();
    for (const auto& container : containers) {
        try {
            co_await docker_.remove_container(container);
        } catch (const std::exception& e) {
            log::warning("removing container {}: {}", container.substr(0, 12), e.what());
        }
    }
    // Anything of ours the map does not know (a creation cut short) goes too.
    auto ours = co_await docker_.list_containers(fmt::format("{}={}", label_instance, instance_));
    for (const auto& container : ours) co_await docker_.remove_container(container.id);
    co_await egress_.teardown();
}

asio::awaitable<void> Manager::remove_orphans() {
    auto containers = co_await docker_.list_containers(fmt::format("{}=true", label_managed));
    auto now = static_cast<std::int64_t>(std::time(nullptr));
    // A live server always has its agents running; a dead one's have exited.
    std::set<std::string> live_instances;
    for (const auto& container : containers) {
        if (container.state == "running") live_instances.insert(container.labels.count(label_instance) ? container.labels.at(label_instance) : "");
    }
    int removed = 0;
    for (const auto& container : containers) {
        auto instance = container.labels.find(label_instance);
        std::string owner = instance == container.labels.end() ? "" : instance->second;
        if (owner == instance_) continue;
        bool stopped = container.state == "exited" || container.state == "dead";
        bool abandoned = container.state == "created" && !live_instances.count(owner) && now - container.created > abandoned_after_s;
        if (!stopped && !abandoned) continue;
        try {
            co_await docker_.remove_container(container.id);
            ++removed;
        } catch (const std::exception& e) {
            log::warning("removing orphaned container {}: {}", container.id.substr(0, 12), e.what());
        }
    }
    if (removed) log::info("removed {} container(s) left behind by earlier cubicle runs", removed);
    // Their egress networks: removal fails harmlessly while a live server still uses one.
    for (const auto& network : co_await docker_.list_networks(fmt::format("{}=true", label_managed))) {
        auto owner = network.labels.find(label_instance);
        if (owner == network.labels.end() || owner->second == instance_ || live_instances.count(owner->second)) continue;
        try {
            co_await docker_.remove_network(network.id);
        } catch (const std::exception& e) {
            log::debug("leaving network {}: {}", network.id.substr(0, 12), e.what());
        }
    }
}

asio::awaitable<void> Manager::sweep_orphans() {
    // Soon after start-up (a dead server's half-created container must age
    // first), then now and then: other servers may die while this one runs.
    asio::steady_timer timer(executor_);
    for (auto delay = std::chrono::seconds(5);; delay = std::chrono::seconds(60)) {
        timer.expires_after(delay);
        co_await timer.async_wait(asio::use_awaitable);
        try {
            co_await remove_orphans();
        } catch (const std::exception& e) {
            log::debug("orphan sweep: {}", e.what());
        }
    }
}

} // namespace cubicle::sandbox
