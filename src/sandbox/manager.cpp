#include "sandbox/manager.hpp"

#include <cctype>
#include <chrono>
#include <set>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "agent/protocol.h"
#include "common/all_at_once.hpp"
#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "docker/tar.hpp"
#include "image/profiles.hpp"
#include "sandbox/languages.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/local_placement.hpp"
#include "sandbox/swarm_placement.hpp"
#include "sandbox/owner.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/secret_tls.hpp"
#include "sandbox/secrets.hpp"

namespace cubicle::sandbox {
namespace {

constexpr auto agent_start_timeout = std::chrono::seconds(15);
// How often the placement is asked which sandboxes it lost (Swarm: /tasks and /nodes).
constexpr auto loss_poll_interval = std::chrono::seconds(1);
// How often the containers of other, dead instances are looked for.
constexpr auto orphan_sweep_interval = std::chrono::seconds(10);
std::unique_ptr<Placement> make_placement(asio::any_io_executor executor, docker::Client& docker, const Config& config,
                                          const std::string& instance, AgentVolume& agent_volume) {
    if (config.engine == "swarm") return std::make_unique<SwarmPlacement>(executor, docker, config, instance);
    return std::make_unique<LocalPlacement>(executor, docker, config, instance, agent_volume);
}

// What a placement cannot do, in a message naming the engine (for refusals).
std::string not_offered(const Placement& placement, std::string_view what) {
    return fmt::format("{} not offered with --engine {} (docs/engines.md)", what, placement.name());
}

// How long a resume waits for the last copy of a mirror whose server died (mirror.hpp).
constexpr auto stale_mirror_wait = std::chrono::milliseconds(660'000);  // Mirror's own limit

// The liveness record of what `labels` mark as ours (a mirror's under its own label); empty: none.
std::string owner_of(const std::map<std::string, std::string>& labels) {
    for (const char* label : {label_owner, label_mirror_owner}) {
        if (auto owner = labels.find(label); owner != labels.end()) return owner->second;
    }
    return {};
}

// A persistent sandbox's mirror still running: making its last copy, when its server is gone.
bool mirror_copying(const docker::ContainerSummary& container) {
    auto role = container.labels.find(label_role);
    return role != container.labels.end() && role->second == role_mirror && container.state == "running";
}
// How often shutdown looks again for containers of its own that are still being removed.
constexpr int leftover_rounds = 40;
// Every this many sweeps (10 minutes), persistent sandboxes' records are refreshed and retained.
constexpr unsigned saved_sweep_rounds = 60;
// Background removals at once (sandbox/removals.hpp).
constexpr std::size_t removals_at_once = 2;

} // namespace

Manager::Manager(asio::any_io_executor executor, docker::Client& docker, const Config& config)
    : executor_(executor), docker_(docker), config_(config), instance_(random_hex(8)),
      start_up_(executor, asio::steady_timer::time_point::max()),
      pools_(executor, resolve({}),
            PoolSettings{static_cast<std::size_t>(config.pool_size),
                         // no pool at all stays no pool: --pool-size 0 turns recycling off too
                         config.pool_size == 0 ? 0 : static_cast<std::size_t>(config.pool_max),
                         static_cast<std::size_t>(config.pool_refill), std::chrono::seconds(config.pool_idle_s)},
            [this](SandboxSpec spec) { return launch(std::move(spec)); },
            [this](std::shared_ptr<Sandbox> sandbox) { return discard(std::move(sandbox)); }),
      removal_turns_(executor, removals_at_once), agent_volume_(executor, docker, instance_),
      placement_(make_placement(executor, docker, config, instance_, agent_volume_)),
      egress_(executor, docker, config, instance_, agent_volume_), keeper_(docker, config),
      snapshots_(keeper_, config),
      // Where the Engine cannot pause a sandbox's container, none is paused.
      lifetimes_(executor, docker, std::chrono::seconds(placement_->offers().pause ? config.idle_pause_s : 0),
                 [this](std::string id, EndReason reason) -> asio::awaitable<void> { co_await end(std::move(id), reason); }) {
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
    if (spec.network && !placement_->offers().egress) throw ToolError(not_offered(*placement_, "network: true is"));
    // (the default image first: the constructor resolves the pools' spec before placement_ exists)
    if (spec.image != config_.default_image && !image::find_profile(spec.image) && !placement_->offers().any_image) {
        throw ToolError(fmt::format("with --engine {} only the operator's images run (the default image {} and cubicle's profiles), "
                                    "not {} (docs/engines.md)",
                                    placement_->name(), config_.default_image, spec.image));
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

void Manager::start_up_attempted(std::exception_ptr failure) {
    if (!starting_up_) return;
    starting_up_ = false;
    start_up_failure_ = std::move(failure);
    start_up_.cancel();
}

asio::awaitable<void> Manager::await_start_up() {
    if (!starting_up_) co_return;
    co_await start_up_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (start_up_failure_) std::rethrow_exception(start_up_failure_);
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
    if (!placement_->offers().container) throw ToolError(not_offered(*placement_, "shared-container workspaces are"));
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
                               // Not the container's ticket to dial home: its agent spent it.
                               .env = {"HOME=" + workspace, std::string(CUBICLE_AGENT_DIAL) + "="},
                               .cwd = workspace,
                               .user = fmt::format("{}:{}", uid, uid),
                               .stdin_open = true});
    auto exec_id = co_await docker_.exec_create(host->container_id(), std::move(config));
    auto stream = co_await docker_.exec_start(exec_id);
    auto sandbox = std::make_shared<Sandbox>(executor_, id, host->container_id(), spec);
    sandbox->make_shared_workspace(workspace, uid);
    sandbox->set_zygote_preload(config_.zygote_preload);
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
    // Its secrets: placeholders in its environment; the values go to the proxy once its
    // address is known (below), never into the sandbox.
    if (!spec.secrets.empty()) egress_.secrets().check(spec.secrets, owner, config_.transport != "http");
    std::vector<std::pair<std::string, std::string>> placeholders;
    for (const auto& name : spec.secrets) {
        placeholders.emplace_back(name, secret_placeholder(name));
        std::erase_if(spec.env, [&name](const auto& entry) { return entry.first == name; });
        spec.env.emplace_back(name, placeholders.back().second);
    }
    // HTTPS to the secrets' hosts goes through the proxy's TLS, signed by the sandbox's own
    // CA: its programs trust the CA (written in below) beside the image's bundle.
    if (!placeholders.empty()) {
        for (auto& variable : sandbox_ca_env()) {  // (no structured binding: clang 14 cannot capture one)
            std::erase_if(spec.env, [&variable](const auto& entry) { return entry.first == variable.first; });
            spec.env.emplace_back(variable.first, variable.second);
        }
    }
    spec.network_name = co_await egress_.join(owner);
    spec.proxy_url = egress_.proxy_url();
    std::exception_ptr failure;
    std::shared_ptr<Sandbox> sandbox;
    try {
        sandbox = co_await create_on(std::move(spec), owner, throwaway, std::move(status));
    } catch (...) {
        failure = std::current_exception();
    }
    if (sandbox) {
        // Its connections count from the start, background runs' included.
        co_await egress_.watch(sandbox->id(), sandbox->container_id());
        if (!placeholders.empty()) co_await install_secrets(sandbox, std::move(placeholders));
        co_return sandbox;
    }
    co_await egress_.leave(owner);
    std::rethrow_exception(failure);
}

asio::awaitable<void> Manager::install_secrets(std::shared_ptr<Sandbox> sandbox, std::vector<std::pair<std::string, std::string>> placeholders) {
    // Whatever fails here (a CA not made included) removes the sandbox: none is left half-made.
    std::string failure;
    try {
        auto ca = egress_.bind_secrets(sandbox->id(), std::move(placeholders), sandbox->owner(), config_.transport != "http");
        if (!ca) {
            failure = "its address on the egress network is unknown";
        } else {
            agent::RunRequest request;
            request.argv = sandbox_ca_install();
            request.stdin_data = std::move(*ca);
            request.timeout_ms = 10000;
            request.max_output_bytes = 4096;
            OutputSink no_sink;
            auto result = co_await sandbox->run(std::move(request), std::move(no_sink), nullptr);
            failure = result.status.exit_code == 0 ? "" : json::sanitize_utf8(result.stderr_text);
        }
    } catch (const std::exception& e) {
        failure = e.what();
    }
    if (failure.empty()) co_return;
    // Without it HTTPS to the secrets' hosts would fail later and less clearly.
    std::exception_ptr error = std::make_exception_ptr(ToolError(fmt::format("could not give the sandbox its secrets: {}", failure)));
    co_await destroy(sandbox->id());
    std::rethrow_exception(error);
}

asio::awaitable<std::shared_ptr<Sandbox>> Manager::create_on(SandboxSpec spec, std::string owner, bool throwaway, StatusSink status) {
    // The pools run once the default image is known to be present (start_pool).
    co_await await_start_up();
    std::shared_ptr<Sandbox> pooled;
    // A persistent sandbox's workspace is its own volume: never a pooled container.
    if (pool_started_ && spec.workspace_volume.empty()) pooled = co_await pools_.acquire(spec, owner);
    if (auto sandbox = std::move(pooled)) {
        log::debug("sandbox {} taken from the warm pool", sandbox->id());
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
            if (!placement_->offers().container) throw;  // Docker exec reaches no container there
            log::warning("the agent cannot run in image {} ({}); using Docker exec for it", spec.image, e.what());
            exec_only_images_.insert(spec.image);
        }
    }
    co_return co_await launch_with(std::move(spec), false);
}

asio::awaitable<void> Manager::know_engine() {
    // A call that comes before start-up has met the engine: the container config depends on it.
    if (!docker_connected_) co_await await_start_up();
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

asio::awaitable<std::shared_ptr<Sandbox>> Manager::launch_with(SandboxSpec spec, bool agent) {
    co_await know_engine();
    check_engine(spec);
    std::string sandbox_id = spec.sandbox_id.empty() ? "sb-" + random_hex(6) : spec.sandbox_id;
    co_return co_await placement_->launch(std::move(spec), std::move(sandbox_id), agent);
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
    // Its secrets leave the proxy first: once the container is gone its address may be
    // another sandbox's.
    if (sandbox->spec().network) egress_.unbind_secrets(sandbox->id());
    std::exception_ptr failure;
    lost_hosts_.erase(sandbox->container_id());
    try {
        co_await placement_->remove(sandbox->container_id());
    } catch (...) {
        failure = std::current_exception();
    }
    if (sandbox->spec().network) {
        egress_.forget(sandbox->id());
        co_await egress_.leave(sandbox->owner());
    }
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

asio::awaitable<bool> Manager::end(std::string id, EndReason reason, bool erase) {
    co_await lifetimes_.thaw(id);
    // A persistent one is saved with its reason (get_sandbox_status lists it as saved), not ended.
    if (!keeper_.held(id)) lifetimes_.ended(id, reason);
    std::string why(name_of(reason));
    co_return co_await destroy(std::move(id), std::move(why), erase);
}

asio::awaitable<bool> Manager::destroy(std::string id, std::string reason, bool erase) {
    lifetimes_.forget(id);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) co_return true;
    auto sandbox = it->second;
    sandboxes_.erase(it);
    if (sandbox->shared()) {
        co_await remove_workspace(std::move(sandbox));
        co_return true;
    }
    bool kept = keeper_.held(id) != nullptr;
    bool copied = true;
    // Listed as saved from now on; the size comes with its last copy.
    if (kept && !erase) keeper_.save(id, std::nullopt, reason);
    auto owner = sandbox->owner();
    sandbox->shutdown("it was stopped");
    std::exception_ptr failure;
    try {
        co_await remove_container_of(std::move(sandbox));
    } catch (...) {
        failure = std::current_exception();
    }
    if (kept) {
        copied = co_await end_mirror(id, erase, reason);
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
    co_return copied;
}

asio::awaitable<Manager::Kept> Manager::keep(SandboxSpec spec, std::string owner, std::string name, bool stateful,
                                             bool auto_install, StatusSink status) {
    if (!placement_->offers().volumes) throw ToolError(not_offered(*placement_, "persistent sandboxes are"));
    if (config_.no_persistent) {
        throw ToolError("persistent sandboxes are off on this server (--no-persistent). snapshot_sandbox keeps a sandbox's "
                        "files meanwhile");
    }
    if (auto problem = store::invalid_name(name)) throw ToolError("name: " + *problem);
    for (const auto& sandbox : list(owner)) {
        const auto* held = keeper_.held(sandbox->id());
        if (held && held->name == name) co_return Kept{sandbox, true, false, false};
    }
    // One that ended a moment ago is resumed once its last copy is made.
    co_await wait_for_copies([&] { return keeper_.saving(owner, name); });
    store::SavedSandbox fresh;
    fresh.spec = resolve(std::move(spec));
    fresh.sandbox_id = "sb-" + random_hex(6);
    fresh.stateful = stateful;
    fresh.auto_install = auto_install;
    auto [saved, created] = keeper_.claim(owner, name, std::move(fresh));
    std::exception_ptr failure;
    std::unique_ptr<Mirror> mirror;
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
        spec.sandbox_id = saved.sandbox_id;
        if (spec.disk_mb <= 0) {
            throw ToolError("a persistent sandbox needs a sized workspace (disk_mb), and this server's is unbounded (--disk-mb 0)");
        }
        co_await remove_stale(saved.sandbox_id);
        co_await know_engine();
        // The mirror runs the default image, the operator's, whatever image the sandbox names.
        co_await ensure_image(config_.default_image, status);
        mirror = co_await Mirror::start(docker_, spec, config_.default_image, instance_, saved.volume);
        spec.workspace_volume = mirror->live_volume();
        auto sandbox = co_await create(std::move(spec), owner, false, std::move(status));
        mirrors_[saved.sandbox_id] = std::move(mirror);
        sandbox->set_stateful(saved.stateful);
        sandbox->set_auto_install(saved.auto_install);
        co_return Kept{sandbox, !created, !created, true};
    } catch (...) {
        failure = std::current_exception();
    }
    if (mirror) co_await mirror->discard();
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

asio::awaitable<void> Manager::wait_for_copies(std::function<bool()> copying) {
    asio::steady_timer pause(executor_);
    for (auto waited = std::chrono::milliseconds(0); copying() && waited < stale_mirror_wait; waited += std::chrono::milliseconds(50)) {
        pause.expires_after(std::chrono::milliseconds(50));
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<void> Manager::remove_stale(std::string sandbox_id) {
    // The hold is ours now, so the server that held it is gone; its mirror (whose stdin
    // closed with that server) may still be making its last copy: that copy is kept.
    std::string label = fmt::format("{}={}", label_sandbox, sandbox_id);
    asio::steady_timer pause(executor_);
    for (auto waited = std::chrono::milliseconds(0); waited < stale_mirror_wait; waited += std::chrono::milliseconds(100)) {
        bool copying = false;
        for (const auto& container : co_await docker_.list_containers(label)) {
            copying = copying || mirror_copying(container);
        }
        if (!copying) break;
        pause.expires_after(std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::use_awaitable);
    }
    for (const auto& container : co_await docker_.list_containers(label)) co_await docker_.remove_container(container.id);
    // Its tmpfs, empty once unmounted: once its containers are gone (a removal the orphan
    // sweep began meanwhile is answered at once, 409, and still holds it a moment). The new
    // mirror makes a tmpfs of its own, so one still held is the orphan sweep's, later.
    for (int round = 0; round < 50 && !(co_await docker_.list_containers(label)).empty(); ++round) {
        pause.expires_after(std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::use_awaitable);
    }
    for (const auto& volume : co_await docker_.list_volumes(label)) {
        auto role = volume.labels.find(label_role);
        if (role == volume.labels.end() || role->second != role_live) continue;
        try {
            co_await docker_.remove_volume(volume.id);
        } catch (const docker::Error& e) {
            log::info("the tmpfs {} of a dead server stays for the orphan sweep: {}", volume.id, e.what());
        }
    }
}

asio::awaitable<void> Manager::save_at_exit(std::string sandbox_id) { co_await end_mirror(std::move(sandbox_id), false, "server exit"); }

asio::awaitable<bool> Manager::end_mirror(std::string sandbox_id, bool erase, std::string reason) {
    auto it = mirrors_.find(sandbox_id);
    std::unique_ptr<Mirror> mirror;
    if (it != mirrors_.end()) {
        mirror = std::move(it->second);
        mirrors_.erase(it);
    }
    if (erase) {
        if (mirror) co_await mirror->discard();
        co_return true;
    }
    std::optional<std::uint64_t> copied;
    if (mirror) {
        ++copies_under_way_;
        copied = co_await mirror->finish();
        --copies_under_way_;
    }
    // The record says why it ended, and that its files are the last copy's when this one failed.
    keeper_.save(sandbox_id, copied, copied ? reason : reason + "; its last files could not be copied to disk");
    co_return copied.has_value();
}

asio::awaitable<bool> Manager::erase_saved(std::string id, std::string owner) {
    if (!keeper_.take_by_id(owner, id)) co_return false;
    std::exception_ptr failure;
    try {
        co_await remove_stale(id);  // its volume is in use until then
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
    egress_.forget(id);  // a recycled one comes back under another id
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
    start_up_attempted();
    removal_turns_.open();
    lifetimes_.close();
    egress_.close();  // the proxy goes with the leftovers below: not to be replaced
    // Paused ones are thawed before their containers are removed below.
    co_await lifetimes_.thaw_all();
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
    // The persistent sandboxes' last copies to disk, once their programs are gone.
    std::vector<asio::awaitable<void>> copies;
    std::vector<std::string> mirrored;
    for (const auto& [id, mirror] : mirrors_) mirrored.push_back(id);
    for (const auto& id : mirrored) copies.push_back(save_at_exit(id));
    co_await all_at_once(executor_, std::move(copies));
    // And those of sandboxes that ended just before (a stop, an expiry): the leftovers'
    // removal below would cut them short.
    co_await wait_for_copies([this] { return copies_under_way_ > 0; });
    // The agent volume stays for the next server (agent_volume.hpp); the container
    // holding it for this one goes with the leftovers.
    try {
        co_await agent_volume_.settle();
        co_await remove_leftovers();
        co_await placement_->teardown();
        co_await egress_.teardown();
    } catch (const std::exception& e) {
        log::warning("removing sandboxes at exit: {} (the next cubicle to start removes what is left)", e.what());
    }
}

// Anything of ours the map does not know (a creation cut short) goes too, and
// removals still under way (the daemon answers 409 to a second one) are waited for.
asio::awaitable<void> Manager::remove_leftovers() {
    asio::steady_timer pause(executor_);
    for (int round = 0; round < leftover_rounds; ++round) {
        auto ours = co_await placement_->hosts(fmt::format("{}={}", label_instance, instance_));
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
        co_await placement_->remove(container_id);
    } catch (const std::exception& e) {
        log::warning("removing {} {}: {}", placement_->name() == std::string_view("local") ? "container" : "service",
                     container_id.substr(0, 12), e.what());
    }
}

bool Manager::orphaned(const std::map<std::string, std::string>& labels) const {
    auto instance = labels.find(label_instance);
    auto owner = owner_of(labels);
    if (instance == labels.end() || instance->second == instance_ || owner.empty()) return false;
    return owner_state(owner) == OwnerState::dead;
}

asio::awaitable<void> Manager::remove_orphans() {
    auto containers = co_await placement_->hosts(fmt::format("{}=true", label_managed));
    std::vector<asio::awaitable<void>> removals;
    for (const auto& container : containers) {
        if (!orphaned(container.labels)) continue;
        // A mirror ends by itself once its last copy is made (its stdin closed with its server).
        if (mirror_copying(container)) continue;
        log::info("removing container {} of cubicle instance {}: its owner is gone ({})", container.id.substr(0, 12),
                  container.labels.at(label_instance), owner_of(container.labels));
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
    // Agent volumes: one per server before they were shared (of a dead server), or of
    // another agent. The daemon refuses to remove one a container mounts (409), which
    // includes those that live servers hold (agent_volume.hpp). And the tmpfs of a
    // persistent sandbox whose server died.
    for (const char* role : {role_agent, role_live}) {
        for (const auto& volume : co_await docker_.list_volumes(fmt::format("{}={}", label_role, role))) {
            bool gone = orphaned(volume.labels) || (std::string_view(role) == role_agent && agent_volume_.stale(volume.labels));
            if (volume.labels.count(label_managed) == 0 || !gone) continue;
            try {
                co_await docker_.remove_volume(volume.id);
                log::debug("removed the volume {}", volume.id);
            } catch (const std::exception& e) {
                log::debug("leaving volume {}: {}", volume.id, e.what());
            }
        }
    }
}

asio::awaitable<void> Manager::watch_lifetimes() { co_await lifetimes_.watch(); }

asio::awaitable<void> Manager::copy_workspaces() {
    if (config_.persist_copy_s == 0) co_return;
    asio::steady_timer timer(executor_);
    while (!closed_) {
        timer.expires_after(std::chrono::seconds(config_.persist_copy_s));
        co_await timer.async_wait(asio::use_awaitable);
        // One at a time: a copy reads and writes the whole workspace. A mirror that goes
        // meanwhile waits for the copy under way (Mirror takes turns).
        std::vector<std::string> ids;
        for (const auto& [id, mirror] : mirrors_) ids.push_back(id);
        for (const auto& id : ids) {
            auto it = mirrors_.find(id);
            if (closed_ || it == mirrors_.end()) continue;
            try {
                co_await it->second->copy_if_changed();
            } catch (const std::exception& e) {
                log::warning("copying the workspace of sandbox {} to disk: {}", id, e.what());
            }
        }
    }
}

asio::awaitable<void> Manager::watch_placement() {
    if (!placement_->offers().losses) co_return;
    asio::steady_timer timer(executor_);
    while (!closed_) {
        timer.expires_after(loss_poll_interval);
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
        if (closed_) break;
        std::map<std::string, std::string> by_host;  // sandbox id by host id
        for (const auto& entry : sandboxes_) {
            if (!entry.second->shared() && !lost_hosts_.count(entry.second->container_id())) by_host[entry.second->container_id()] = entry.first;
        }
        if (by_host.empty()) continue;
        std::vector<std::string> hosts;
        for (const auto& entry : by_host) hosts.push_back(entry.first);
        std::vector<LostSandbox> losses;
        try {
            losses = co_await placement_->lost(std::move(hosts));
        } catch (const std::exception& e) {
            log::debug("asking the placement for lost sandboxes: {}", e.what());
            continue;
        }
        for (const auto& loss : losses) {
            auto host = by_host.find(loss.host_id);
            auto sandbox = host == by_host.end() ? nullptr : find(host->second);
            if (!sandbox || sandbox->container_id() != loss.host_id) continue;
            auto reason = loss.node_lost ? fmt::format("the node running sandbox {} was lost", sandbox->id())
                                         : fmt::format("sandbox {} was lost: {}", sandbox->id(), loss.detail);
            log::warning("{}; stop_sandbox removes it from the list, initialize_sandbox starts another", reason);
            sandbox->mark_lost(reason + "; start a new one with initialize_sandbox");
            lost_hosts_.insert(loss.host_id);
            asio::co_spawn(executor_, remove_quietly(loss.host_id), asio::detached);
        }
    }
}

asio::awaitable<void> Manager::sweep_orphans() {
    // Saved sandboxes past their time go once per server start (and at each save).
    std::string everyone, none;  // named: GCC 12 and temporaries in a co_await (PITFALLS.md)
    if (keeper_.exists()) co_await keeper_.retain(everyone, none);
    asio::steady_timer timer(executor_);
    for (unsigned round = 1; !closed_; ++round) {
        timer.expires_after(orphan_sweep_interval);
        co_await timer.async_wait(asio::use_awaitable);
        if (closed_) break;
        co_await agent_volume_.hold();
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
