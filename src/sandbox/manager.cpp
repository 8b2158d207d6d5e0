#include "sandbox/manager.hpp"

#include <cctype>
#include <chrono>
#include <set>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/all_at_once.hpp"
#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "docker/tar.hpp"
#include "image/profiles.hpp"
#include "sandbox/languages.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/owner.hpp"

namespace cubicle::sandbox {
namespace {

// The agent did not start in a container (say, an image for another CPU).
class AgentUnavailable : public ToolError {
public:
    using ToolError::ToolError;
};

constexpr auto agent_start_timeout = std::chrono::seconds(15);
// How often the containers of other, dead instances are looked for.
constexpr auto orphan_sweep_interval = std::chrono::seconds(10);
// How often shutdown looks again for containers of its own that are still being removed.
constexpr int leftover_rounds = 40;
// Every this many sweeps (10 minutes), persistent sandboxes' records are refreshed and retained.
constexpr unsigned saved_sweep_rounds = 60;
// Background removals at once (sandbox/removals.hpp).
constexpr std::size_t removals_at_once = 2;

} // namespace

Manager::Manager(asio::any_io_executor executor, docker::Client& docker, const Config& config)
    : executor_(executor), docker_(docker), config_(config), instance_(random_hex(8)),
      pools_(executor, resolve({}),
            PoolSettings{static_cast<std::size_t>(config.pool_size),
                         // no pool at all stays no pool: --pool-size 0 turns recycling off too
                         config.pool_size == 0 ? 0 : static_cast<std::size_t>(config.pool_max),
                         static_cast<std::size_t>(config.pool_refill), std::chrono::seconds(config.pool_idle_s)},
            [this](SandboxSpec spec) { return launch(std::move(spec)); },
            [this](std::shared_ptr<Sandbox> sandbox) { return discard(std::move(sandbox)); }),
      removal_turns_(executor, removals_at_once), agent_volume_(executor, docker, instance_),
      egress_(executor, docker, config, instance_, agent_volume_), keeper_(docker, config),
      snapshots_(keeper_, config),
      lifetimes_(executor, docker, std::chrono::seconds(config.idle_pause_s),
                 [this](std::string id, EndReason reason) { return end(std::move(id), reason); }) {
    if (config.agent_channel == "socket" && docker.endpoint().kind == docker::Endpoint::Kind::unix_socket)
        channels_ = AgentChannels::open();
}

SandboxSpec Manager::resolve(SandboxSpec spec) const {
    if (spec.image.empty()) spec.image = config_.default_image;
    if (spec.memory_mb <= 0) spec.memory_mb = config_.memory_mb;
    if (spec.cpus <= 0) spec.cpus = config_.cpus;
    if (spec.pids_limit <= 0) spec.pids_limit = config_.pids_limit;
    if (spec.tmp_size_mb <= 0) spec.tmp_size_mb = config_.tmp_size_mb;
    if (spec.disk_mb <= 0) spec.disk_mb = config_.disk_mb;
    if (spec.files_limit <= 0) spec.files_limit = config_.files_limit;
    if (spec.runtime.empty()) spec.runtime = config_.runtime;
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

void Manager::set_daemon_info(docker::DaemonInfo info) {
    daemon_info_ = std::move(info);
    docker_connected_ = true;
    keeper_.set_engine(daemon_info_.id);
    const auto& engine = docker_.engine();
    if (!engine.enforces_limits) {
        log::error("{} cannot enforce memory or pids limits (rootless on cgroup v1, or /info MemoryLimit or PidsLimit false): "
                   "every sandbox will be refused; use a rootful engine or one on cgroup v2",
                   engine.describe());
    }
    if (!config_.runtime.empty() && !engine.offers(config_.runtime)) {
        log::error("--runtime {}: {}; every sandbox will be refused", config_.runtime, engine.why_not(config_.runtime));
    }
}

asio::awaitable<void> Manager::ensure_image(std::string image, StatusSink status) {
    if (co_await docker_.inspect_image(image)) co_return;
    // cubicle's own images are built on this host, never pulled: whoever held the name
    // on a public registry would choose what every sandbox runs.
    if (auto profile = image::find_profile(image)) {
        throw ToolError(profile->image == config_.default_image || image::find_profile(config_.default_image) == profile
                            ? std::string("the sandbox image is not installed on this host; ask the user to run `cubicle image build`")
                            : fmt::format("the image {} is not installed on this host; ask the user to run `cubicle image build {}`",
                                          profile->image, profile->name));
    }
    log::info("pulling image {}", image);
    if (status) status(fmt::format("image {} is not present locally; pulling it", image));
    auto progress = [image, status](std::string_view line) {
        log::info("pulling {}: {}", image, line);
        if (status) status(line);
    };
    std::string failure;
    try {
        co_await docker_.pull_image(image, std::move(progress));
    } catch (const docker::Error& e) {
        failure = e.what();
    }
    if (!failure.empty()) {
        auto here = co_await images_here();
        throw ToolError(fmt::format("image {} is not available: it is not present locally and could not be pulled ({}). "
                                    "Ask the user to load it on the Docker host, or pick another image.{}{}",
                                    image, failure, here.empty() ? "" : " ", here));
    }
    log::info("pulled image {}", image);
}

asio::awaitable<std::string> Manager::images_here() {
    constexpr std::size_t most = 20;
    std::string label(image::recipe_label);  // named: GCC 12 and temporaries in a co_await (PITFALLS.md)
    std::vector<std::string> names;
    try {
        names = co_await docker_.list_images(label);
    } catch (const std::exception& e) {
        log::debug("listing cubicle's images: {}", e.what());
        co_return std::string();
    }
    if (names.empty()) co_return "This host has no cubicle image yet: the user builds them with `cubicle image build`.";
    std::string list;
    for (std::size_t i = 0; i < names.size() && i < most; ++i) list += (i ? ", " : "") + names[i];
    if (names.size() > most) list += fmt::format(" and {} more", names.size() - most);
    co_return fmt::format("cubicle's images on this host: {}.", list);
}

asio::awaitable<bool> Manager::check_default_image() {
    if (co_await docker_.inspect_image(config_.default_image)) co_return true;
    if (auto profile = image::find_profile(config_.default_image)) {
        log::warning("the default sandbox image {} is not installed: build it with `cubicle image build{}` "
                     "(as root, a few minutes; `cubicle doctor` checks the setup). Until then every sandbox fails.",
                     config_.default_image, profile->name == "sandbox" ? "" : " " + profile->name);
    } else {
        log::warning("the default sandbox image {} is not on this host: it will be pulled on first use", config_.default_image);
    }
    co_return false;
}

Manager::CreationSlot Manager::reserve_slot(const std::string& owner) {
    if (closed_) throw ToolError("the server is stopping; no new sandbox can start");
    if (sandboxes_.size() + creating_ >= static_cast<std::size_t>(config_.max_sandboxes)) {
        throw ToolError(fmt::format("the server already runs its maximum of {} sandboxes; stop one with stop_sandbox first",
                                    config_.max_sandboxes));
    }
    auto& owner_creating = creating_by_owner_[owner];
    if (per_owner_limit_ && list(owner).size() + owner_creating >= per_owner_limit_) {
        throw ToolError(fmt::format("you already have your maximum of {} live sandboxes on this server; stop one with "
                                    "stop_sandbox first",
                                    per_owner_limit_));
    }
    ++creating_;
    ++owner_creating;
    return CreationSlot{creating_, owner_creating};
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::workspace_host(SandboxSpec spec, StatusSink status) {
    auto profile = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", spec.image, spec.memory_mb, spec.cpus, spec.pids_limit, spec.tmp_size_mb,
                               spec.disk_mb, spec.files_limit, spec.gpu);
    auto& host = workspace_hosts_[profile];
    if (!host || !host->alive()) {
        co_await ensure_image(spec.image, status);
        auto started = co_await launch_with(std::move(spec), true);
        if (!host || !host->alive()) host = started;  // unless a concurrent call was first
        else co_await discard(started);
    }
    co_return host;
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::create_workspace(SandboxSpec spec, std::string owner, StatusSink status) {
    spec = resolve(std::move(spec));
    if (spec.network) throw ToolError("a shared-container workspace cannot have network access; create a sandbox of its own");
    auto slot = reserve_slot(owner);
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
    auto config = exec_config({.argv = {"/bin/sh", "-c", fmt::format("umask 077; exec {} {}", agent_path, agent_sandbox_flag)},
                               .env = {"HOME=" + workspace},
                               .cwd = workspace,
                               .user = fmt::format("{}:{}", uid, uid),
                               .stdin_open = true});
    auto exec_id = co_await docker_.exec_create(host->container_id(), std::move(config));
    auto stream = co_await docker_.exec_start(exec_id);
    auto sandbox = std::make_shared<Sandbox>(executor_, id, host->container_id(), spec);
    sandbox->make_shared_workspace(workspace, uid);
    co_await sandbox->connect(std::move(stream), nullptr, agent_start_timeout);
    sandbox->set_env(std::move(spec.env));
    sandbox->set_owner(std::move(owner));
    sandboxes_[id] = sandbox;
    co_return sandbox;
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::create(SandboxSpec spec, std::string owner, bool throwaway, StatusSink status) {
    spec = resolve(std::move(spec));
    auto slot = reserve_slot(owner);
    if (!spec.network) co_return co_await create_on(std::move(spec), std::move(owner), throwaway, std::move(status));
    // Its principal's network, held from here: a removal of the principal's last other
    // networked sandbox meanwhile leaves it in place.
    spec.network_name = co_await egress_.join(owner);
    spec.proxy_url = egress_.proxy_url();
    std::exception_ptr failure;
    try {
        co_return co_await create_on(std::move(spec), owner, throwaway, std::move(status));
    } catch (...) {
        failure = std::current_exception();
    }
    co_await egress_.leave(owner);
    std::rethrow_exception(failure);
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::create_on(SandboxSpec spec, std::string owner, bool throwaway, StatusSink status) {
    // The pools run once the default image is known to be present (start_pool).
    std::shared_ptr<Sandbox> pooled;
    // A persistent sandbox's workspace is its own volume: never a pooled container.
    if (pool_started_ && spec.workspace_volume.empty()) pooled = co_await pools_.acquire(spec, owner);
    if (auto sandbox = std::move(pooled)) {
        sandbox->set_throwaway(throwaway);
        sandbox->set_env(std::move(spec.env));
        if (!throwaway) sandbox->prewarm("python");  // a recycled one comes without its interpreter
        sandbox->set_owner(std::move(owner));
        sandboxes_[sandbox->id()] = sandbox;
        co_return sandbox;
    }
    co_await ensure_image(spec.image, status);
    auto sandbox = co_await launch(std::move(spec));
    sandbox->set_throwaway(throwaway);
    sandbox->set_owner(std::move(owner));
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

asio::awaitable<void> Manager::know_engine() {
    // A call that comes before start-up has met the engine: the container config depends on it.
    if (!docker_connected_) {
        co_await docker_.connect();
        docker_connected_ = true;
    }
}

void Manager::check_engine(const SandboxSpec& spec) const {
    const auto& engine = docker_.engine();
    if (!engine.enforces_limits) {
        throw ToolError(fmt::format("{} cannot enforce memory and process limits here (rootless on cgroup v1?), so no sandbox "
                                    "is started. Ask the operator to use a rootful engine or cgroup v2",
                                    engine.describe()));
    }
    if (!spec.runtime.empty() && !engine.offers(spec.runtime)) {
        throw ToolError(fmt::format("sandboxes cannot run under the runtime {} on this host: {}. Ask the operator to fix it",
                                    spec.runtime, engine.why_not(spec.runtime)));
    }
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::launch_with(SandboxSpec spec, bool agent, bool retried) {
    co_await know_engine();
    check_engine(spec);
    std::string agent_volume;
    if (agent) agent_volume = co_await agent_volume_.ensure(spec.image);
    std::string sandbox_id = spec.sandbox_id.empty() ? "sb-" + random_hex(6) : spec.sandbox_id;
    std::unique_ptr<AgentChannel> channel;
    if (agent && channels_ && docker_.engine().passes_host_sockets(spec.runtime)) channel = channels_->listen(executor_);
    // Built outside the co_await: GCC 12 frees temporaries inside one wrongly.
    std::string config = container_config(spec, instance_, sandbox_id, agent, docker_.engine(), agent_volume,
                                          channel ? channel->path() : std::string());
    std::string container_id;
    try {
        // Not named after the sandbox: Podman writes the name into its /etc/hosts, and
        // Docker's DNS answers a reverse lookup with it (the label io.cubicle.sandbox has the id).
        container_id = co_await docker_.create_container(std::move(config), "cubicle-" + random_hex(6));
    } catch (const docker::Error& e) {
        // Refused for the socket's sake (Docker and Podman name the path): the engine does
        // not see this server's files (a remote daemon, a server in a container of its own),
        // so no sandbox can have a channel. Logged once: launches under way fail alike.
        if (!channel || std::string_view(e.what()).find(channel->path()) == std::string_view::npos) throw;
        if (channels_) {
            log::warning("the engine cannot mount agent channels from {} ({}); sandboxes use their attach streams",
                         channels_->path(), e.what());
        }
        channel.reset();
        channels_.reset();
    }
    if (container_id.empty()) co_return co_await launch_with(std::move(spec), agent, retried);
    std::exception_ptr failure;
    try {
        co_return co_await start(sandbox_id, container_id, spec, agent, agent && agent_volume.empty(), std::move(channel));
    } catch (...) {
        failure = std::current_exception();
    }
    try {
        co_await docker_.remove_container(container_id);
    } catch (const std::exception& e) {
        log::warning("removing container {} after a failed start: {}", container_id, e.what());
    }
    if (!agent_volume.empty() && !retried) {
        bool intact = co_await agent_volume_.intact();
        if (!intact) co_return co_await launch_with(std::move(spec), agent, true);
    }
    std::rethrow_exception(failure);
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::start(std::string sandbox_id, std::string container_id, SandboxSpec spec, bool agent,
                                                         bool copy_agent, std::unique_ptr<AgentChannel> channel) {
    if (copy_agent) co_await docker_.put_archive(container_id, agent_dir, agent_archive());
    auto stream = co_await docker_.attach(container_id);
    co_await docker_.start_container(container_id);
    auto sandbox = std::make_shared<Sandbox>(executor_, sandbox_id, container_id, std::move(spec));
    if (!docker_.engine().forks_and_recycles(sandbox->spec().runtime)) sandbox->disable_zygote();
    if (!agent) {
        sandbox->connect_exec(std::move(stream), docker_);
        co_return sandbox;
    }
    try {
        co_await sandbox->connect(std::move(stream), std::move(channel), agent_start_timeout);
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
    auto turn = co_await removal_turns_.wait();
    try {
        co_await remove_container_of(std::move(sandbox));
    } catch (const std::exception& e) {
        log::warning("removing a sandbox: {}", e.what());
    }
}

asio::awaitable<void> Manager::remove_container_of(std::shared_ptr<Sandbox> sandbox) {
    // The sandbox leaves its network even when the removal fails: it is gone from
    // the manager either way, and the network would outlive every sandbox on it.
    std::exception_ptr failure;
    try {
        co_await docker_.remove_container(sandbox->container_id());
    } catch (...) {
        failure = std::current_exception();
    }
    if (sandbox->spec().network) co_await egress_.leave(sandbox->owner());
    if (failure) std::rethrow_exception(failure);
}

std::shared_ptr<Sandbox> Manager::find(const std::string& id) const {
    auto it = sandboxes_.find(id);
    return it == sandboxes_.end() ? nullptr : it->second;
}

std::shared_ptr<Sandbox> Manager::get(const std::string& id, const std::string& owner) const {
    if (auto sandbox = find(id); sandbox && sandbox->owner() == owner) return sandbox;
    if (const auto* ended = lifetimes_.ended_sandbox(owner, id)) throw ToolError(ended_message(*ended));
    std::string known;
    for (const auto& sandbox : list(owner)) {
        if (sandbox->throwaway()) continue;
        known += known.empty() ? sandbox->id() : ", " + sandbox->id();
    }
    throw ToolError(fmt::format("no sandbox with id '{}' (it may have been stopped). {}", id,
                                known.empty() ? "There are no live sandboxes; create one with initialize_sandbox."
                                              : "Live sandboxes: " + known + "."));
}

std::vector<std::shared_ptr<Sandbox>> Manager::list(const std::string& owner) const {
    std::vector<std::shared_ptr<Sandbox>> out;
    for (const auto& [id, sandbox] : sandboxes_) {
        if (sandbox->owner() == owner) out.push_back(sandbox);
    }
    return out;
}

asio::awaitable<void> Manager::end(std::string id, EndReason reason, bool erase) {
    co_await lifetimes_.thaw(id);
    // A persistent one is saved with its reason (get_sandbox_status lists it as saved), not ended.
    if (!keeper_.held(id)) lifetimes_.ended(id, reason);
    std::string why(name_of(reason));
    co_await destroy(std::move(id), std::move(why), erase);
}

asio::awaitable<void> Manager::destroy(std::string id, std::string reason, bool erase) {
    lifetimes_.forget(id);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) co_return;
    auto sandbox = it->second;
    sandboxes_.erase(it);
    if (sandbox->shared()) {
        co_await remove_workspace(std::move(sandbox));
        co_return;
    }
    bool kept = keeper_.held(id) != nullptr;
    if (kept && !erase) co_await save(sandbox, reason);
    auto owner = sandbox->owner();
    sandbox->shutdown("it was stopped");
    std::exception_ptr failure;
    try {
        co_await remove_container_of(std::move(sandbox));
    } catch (...) {
        failure = std::current_exception();
    }
    if (kept) {
        // Its volume goes (erase) or stays, only once its container is gone: another
        // server may take it from the moment it is released.
        if (erase && !failure) {
            try {
                co_await keeper_.erase(id);
            } catch (...) {
                failure = std::current_exception();
            }
        }
        keeper_.release(id);
        if (!erase) co_await keeper_.retain(owner, id);
    }
    if (failure) std::rethrow_exception(failure);
}

asio::awaitable<void> Manager::save(std::shared_ptr<Sandbox> sandbox, std::string reason) {
    // Its size as the workspace's allocated blocks, from inside (the engine has no cheap way).
    std::optional<std::uint64_t> bytes;
    if (sandbox->alive()) {
        agent::RunRequest request;
        // By its full path: the sandbox's own PATH could offer another du. What it cannot
        // read it cannot have written much of (it owns everything there).
        request.argv = {"/usr/bin/du", "-s", "-B1", "--one-file-system", sandbox->workspace()};
        request.timeout_ms = 10'000;
        request.max_output_bytes = 4096;
        try {
            OutputSink no_sink;
            auto result = co_await sandbox->run(std::move(request), std::move(no_sink), nullptr);
            if (!result.stdout_text.empty() && std::isdigit(static_cast<unsigned char>(result.stdout_text.front())))
                bytes = std::stoull(result.stdout_text);
        } catch (const std::exception& e) {
            log::debug("measuring the workspace of {}: {}", sandbox->id(), e.what());
        }
    }
    keeper_.save(sandbox->id(), bytes, reason);
}

asio::awaitable<Manager::Kept> Manager::keep(SandboxSpec spec, std::string owner, std::string name, bool stateful,
                                             bool auto_install, StatusSink status) {
    if (!config_.allow_persistent) {
        throw ToolError("persistent sandboxes are off on this server: their workspace is on disk, where its quota is held by "
                        "the in-sandbox agent rather than the kernel; the operator turns them on with --allow-persistent "
                        "(or CUBICLE_ALLOW_PERSISTENT=1). Without it, snapshot_sandbox keeps a sandbox's files");
    }
    if (auto problem = store::invalid_name(name)) throw ToolError("name: " + *problem);
    for (const auto& sandbox : list(owner)) {
        const auto* held = keeper_.held(sandbox->id());
        if (held && held->name == name) co_return Kept{sandbox, true, false, false};
    }
    store::SavedSandbox fresh;
    fresh.spec = resolve(std::move(spec));
    fresh.sandbox_id = "sb-" + random_hex(6);
    fresh.stateful = stateful;
    fresh.auto_install = auto_install;
    auto [saved, created] = keeper_.claim(owner, name, std::move(fresh));
    std::exception_ptr failure;
    try {
        if (created) {
            co_await keeper_.make_volume(saved);
        } else if (!co_await keeper_.volume_exists(saved)) {
            throw ToolError(fmt::format("the files of the persistent sandbox '{}' are gone: its volume {} was removed outside "
                                        "cubicle. Its record is removed; call initialize_sandbox again to start it afresh",
                                        name, saved.volume));
        }
        // What it was created with, within what this server allows now.
        spec = resolve(within_ceilings(saved.spec));
        spec.workspace_volume = saved.volume;
        spec.sandbox_id = saved.sandbox_id;
        // A container left by a server that died holding it (the hold is ours now, so that
        // server is gone): it must not write to the workspace any more.
        std::string label = fmt::format("{}={}", label_sandbox, saved.sandbox_id);
        auto stale = co_await docker_.list_containers(label);
        for (const auto& container : stale) co_await docker_.remove_container(container.id);
        auto sandbox = co_await create(std::move(spec), owner, false, std::move(status));
        if (created) co_await check_writable(sandbox);
        sandbox->set_stateful(saved.stateful);
        sandbox->set_auto_install(saved.auto_install);
        co_return Kept{sandbox, !created, !created, true};
    } catch (...) {
        failure = std::current_exception();
    }
    // Nothing of a new one stays; a saved one stays saved.
    if (created) {
        try {
            co_await keeper_.erase(saved.sandbox_id);
        } catch (const std::exception& e) {
            log::warning("removing the persistent sandbox {} after a failed start: {}", saved.sandbox_id, e.what());
        }
    } else {
        keeper_.save(saved.sandbox_id, std::nullopt, "failed to start");
    }
    keeper_.release(saved.sandbox_id);
    std::rethrow_exception(failure);
}

SandboxSpec Manager::within_ceilings(SandboxSpec spec) const {
    const auto& c = config_;
    spec.memory_mb = std::min(spec.memory_mb, c.memory_ceiling_mb());
    spec.cpus = std::min(spec.cpus, c.cpu_ceiling());
    spec.pids_limit = std::min(spec.pids_limit, c.max_pids_limit);
    spec.disk_mb = std::min(spec.disk_mb, c.max_disk_mb);
    spec.files_limit = std::min(spec.files_limit, c.max_files_limit);
    spec.tmp_size_mb = std::min(spec.tmp_size_mb, c.max_tmp_size_mb);
    return spec;
}

asio::awaitable<void> Manager::check_writable(std::shared_ptr<Sandbox> sandbox) {
    agent::RunRequest request;
    request.argv = {"test", "-w", sandbox->workspace()};
    request.timeout_ms = 10'000;
    OutputSink no_sink;
    auto result = co_await sandbox->run(std::move(request), std::move(no_sink), nullptr);
    if (result.status.exit_code == 0) co_return;
    auto image = sandbox->spec().image;
    co_await destroy(sandbox->id(), "stopped", true);
    throw ToolError(fmt::format("the image {} has no {} owned by the sandbox user (uid {}), and a persistent sandbox's "
                                "volume takes its owner from there; use one of cubicle's images, or one that has it",
                                image, workspace_dir, sandbox_uid));
}

asio::awaitable<bool> Manager::erase_saved(std::string id, std::string owner) {
    if (!keeper_.take_by_id(owner, id)) co_return false;
    std::exception_ptr failure;
    try {
        co_await keeper_.erase(id);
    } catch (...) {
        failure = std::current_exception();
    }
    keeper_.release(id);
    if (failure) std::rethrow_exception(failure);
    co_return true;
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
    // A throwaway sandbox goes back to its profile's pool, reset, when it can (Pool::recycle).
    // Not where the runtime cannot be trusted with it (Engine::forks_and_recycles).
    if (sandbox->throwaway() && pool_started_ && !closed_ && !config_.no_recycle &&
        docker_.engine().forks_and_recycles(sandbox->spec().runtime)) {
        asio::co_spawn(executor_, pools_.recycle(std::move(sandbox)), asio::detached);
        return;
    }
    asio::co_spawn(executor_, discard(std::move(sandbox)), asio::detached);
}

asio::awaitable<void> Manager::destroy_all() {
    closed_ = true;
    removal_turns_.open();
    lifetimes_.close();
    // Their agents answer again: persistent sandboxes are saved first, while their agents still answer.
    co_await lifetimes_.thaw_all();
    std::vector<asio::awaitable<void>> saves;
    for (const auto& [id, sandbox] : sandboxes_) {
        if (keeper_.held(id)) saves.push_back(save(sandbox, "server exit"));
    }
    co_await all_at_once(executor_, std::move(saves));
    std::set<std::string> containers;  // shared-container workspaces go with their container
    for (const auto& [id, sandbox] : sandboxes_) {
        if (!keeper_.held(id)) lifetimes_.ended(id, EndReason::server_exit);
        sandbox->shutdown("the server is stopping");
        containers.insert(sandbox->container_id());
    }
    for (const auto& [profile, host] : workspace_hosts_) {
        host->shutdown("the server is stopping");
        containers.insert(host->container_id());
    }
    sandboxes_.clear();
    workspace_hosts_.clear();
    std::vector<asio::awaitable<void>> removals;
    removals.push_back(pools_.drain());
    for (const auto& container : containers) removals.push_back(remove_quietly(container));
    co_await all_at_once(executor_, std::move(removals));
    try {
        co_await remove_leftovers();
        co_await egress_.teardown();
        // Last, once no container uses it; a removal the daemon had not finished yet
        // holds it a moment longer, and then it is tried once more.
        bool removed = co_await agent_volume_.remove();
        if (!removed) {
            co_await remove_leftovers();
            removed = co_await agent_volume_.remove();
        }
        if (!removed) log::warning("the agent volume {} is still in use; the next cubicle to start removes it", agent_volume_.name());
    } catch (const std::exception& e) {
        log::warning("removing sandboxes at exit: {} (the next cubicle to start removes what is left)", e.what());
    }
}

// Anything of ours the map does not know (a creation cut short) goes too, and
// removals still under way (the daemon answers 409 to a second one) are waited for.
asio::awaitable<void> Manager::remove_leftovers() {
    asio::steady_timer pause(executor_);
    for (int round = 0; round < leftover_rounds; ++round) {
        auto ours = co_await docker_.list_containers(fmt::format("{}={}", label_instance, instance_));
        if (ours.empty()) break;
        std::vector<asio::awaitable<void>> leftovers;
        for (const auto& container : ours) leftovers.push_back(remove_quietly(container.id));
        co_await all_at_once(executor_, std::move(leftovers));
        pause.expires_after(std::chrono::milliseconds(50));
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<void> Manager::remove_quietly(std::string container_id) {
    try {
        co_await docker_.remove_container(container_id);
    } catch (const std::exception& e) {
        log::warning("removing container {}: {}", container_id.substr(0, 12), e.what());
    }
}

bool Manager::orphaned(const std::map<std::string, std::string>& labels) const {
    auto instance = labels.find(label_instance);
    auto owner = labels.find(label_owner);
    if (instance == labels.end() || instance->second == instance_ || owner == labels.end()) return false;
    return owner_state(owner->second) == OwnerState::dead;
}

asio::awaitable<void> Manager::remove_orphans() {
    auto containers = co_await docker_.list_containers(fmt::format("{}=true", label_managed));
    std::vector<asio::awaitable<void>> removals;
    for (const auto& container : containers) {
        if (!orphaned(container.labels)) continue;
        log::info("removing container {} of cubicle instance {}: its owner is gone ({})", container.id.substr(0, 12),
                  container.labels.at(label_instance), container.labels.at(label_owner));
        removals.push_back(remove_quietly(container.id));
    }
    co_await all_at_once(executor_, std::move(removals));
    // Their egress networks and agent volumes, once the containers using them are gone.
    for (const auto& network : co_await docker_.list_networks(fmt::format("{}=true", label_managed))) {
        if (!orphaned(network.labels)) continue;
        try {
            co_await docker_.remove_network(network.id);
        } catch (const std::exception& e) {
            log::debug("leaving network {}: {}", network.id.substr(0, 12), e.what());
        }
    }
    for (const auto& volume : co_await docker_.list_volumes(fmt::format("{}={}", label_role, role_agent))) {
        if (volume.labels.count(label_managed) == 0 || !orphaned(volume.labels)) continue;
        try {
            co_await docker_.remove_volume(volume.id);
        } catch (const std::exception& e) {
            log::debug("leaving volume {}: {}", volume.id, e.what());
        }
    }
}

asio::awaitable<void> Manager::watch_lifetimes() { co_await lifetimes_.watch(); }

asio::awaitable<void> Manager::sweep_orphans() {
    // Saved sandboxes past their time go once per server start (and at each save).
    std::string everyone, none;  // named: GCC 12 and temporaries in a co_await (PITFALLS.md)
    if (keeper_.exists()) co_await keeper_.retain(everyone, none);
    asio::steady_timer timer(executor_);
    for (unsigned round = 1; !closed_; ++round) {
        timer.expires_after(orphan_sweep_interval);
        co_await timer.async_wait(asio::use_awaitable);
        if (closed_) break;
        // Persistent sandboxes: those in use here marked as used now, saved ones past
        // their time removed, every so often.
        if (round % saved_sweep_rounds == 0 && keeper_.exists()) {
            keeper_.refresh();
            co_await keeper_.retain(everyone, none);
        }
        try {
            co_await remove_orphans();
        } catch (const std::exception& e) {
            log::debug("orphan sweep: {}", e.what());
        }
    }
}

} // namespace cubicle::sandbox
