// Owns every sandbox of this server: creation, lookup, limits, cleanup.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/agent_volume.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/keeper.hpp"
#include "sandbox/lifetimes.hpp"
#include "sandbox/mirror.hpp"
#include "sandbox/placement.hpp"
#include "sandbox/pools.hpp"
#include "sandbox/removals.hpp"
#include "sandbox/sandbox.hpp"
#include "sandbox/snapshots.hpp"

namespace cubicle::sandbox {

// Progress lines for slow steps (an image pull), shown to the client.
using StatusSink = std::function<void(std::string_view)>;

class Manager {
public:
    Manager(asio::any_io_executor executor, docker::Client& docker, const Config& config);

    const std::string& instance() const { return instance_; }

    // Fills unset fields of a spec from the server's defaults and checks limits.
    SandboxSpec resolve(SandboxSpec spec) const;

    // Creates, starts and connects a sandbox for `owner` (a principal). Throws ToolError.
    asio::awaitable<std::shared_ptr<Sandbox>> create(SandboxSpec spec, std::string owner, bool throwaway, StatusSink status = {});
    // A workspace in a container shared with other workspaces of the same
    // profile: its own directory and uid, a fraction of the cost of a container.
    asio::awaitable<std::shared_ptr<Sandbox>> create_workspace(SandboxSpec spec, std::string owner, StatusSink status = {});
    // initialize_sandbox {name, persistent: true}: `owner`'s persistent sandbox called
    // `name`, live here already, resumed from the store (`resumed`; its interpreters start
    // afresh: `state_lost`), or created. It outlives this server: stop_sandbox and the
    // server's exit save it (docs/persistence.md).
    struct Kept {
        std::shared_ptr<Sandbox> sandbox;
        bool resumed = false;
        bool state_lost = false;
        bool started = false;  // by this call (false: it was live here already)
    };
    asio::awaitable<Kept> keep(SandboxSpec spec, std::string owner, std::string name, bool stateful, bool auto_install,
                               StatusSink status);
    // Snapshots of sandboxes' workspaces, kept in the same store (snapshots.hpp).
    Snapshots& snapshots() { return snapshots_; }
    // The record of a live persistent sandbox, or null.
    const store::SavedSandbox* persistent(const std::string& id) const { return keeper_.held(id); }
    // `owner`'s persistent sandboxes that are not live here (get_sandbox_status).
    std::vector<Keeper::Listed> saved(const std::string& owner) { return keeper_.list(owner); }
    // Removes `owner`'s saved sandbox `id` for good; false when there is none.
    asio::awaitable<bool> erase_saved(std::string id, std::string owner);
    std::shared_ptr<Sandbox> find(const std::string& id) const;
    // Throws ToolError naming `owner`'s sandboxes when `id` is not one of them:
    // another principal's sandbox gets the same answer as an id that never existed.
    std::shared_ptr<Sandbox> get(const std::string& id, const std::string& owner) const;
    std::vector<std::shared_ptr<Sandbox>> list(const std::string& owner) const;
    std::size_t live() const { return sandboxes_.size(); }
    // Most live sandboxes one principal may hold (0: only --max-sandboxes applies).
    void set_sandboxes_per_owner(std::size_t limit) { per_owner_limit_ = limit; }
    // Stops a sandbox: a persistent one is saved (`reason`: why, shown in status) unless
    // `erase`, which removes it with its files. False when a persistent one's files could
    // not be copied to disk (its last copy stays).
    asio::awaitable<bool> destroy(std::string id, std::string reason, bool erase);
    asio::awaitable<bool> destroy(std::string id) { return destroy(std::move(id), "stopped", false); }
    // Where a client's sandbox ends (stop_sandbox, its ttl_s, the server's exit): why is kept
    // for its owner (lifetimes.hpp), a paused one is thawed, then it is destroyed (a
    // persistent one saved with that reason, unless `erase`).
    asio::awaitable<bool> end(std::string id, EndReason reason, bool erase = false);
    // Idle pause, ttl_s and the record of ended sandboxes.
    Lifetimes& lifetimes() { return lifetimes_; }
    const Lifetimes& lifetimes() const { return lifetimes_; }
    // Like destroy, but in the background: the sandbox is unusable at once, the
    // caller does not wait. A throwaway sandbox of a pooled profile is reset
    // and pooled again for the same principal (Pool::recycle); others are removed.
    void release(std::string id);
    // Removes every container of this server, all at once; refuses new sandboxes
    // from then on. Never throws: what fails is left to the next start's sweep.
    asio::awaitable<void> destroy_all();
    bool closed() const { return closed_; }

    // Removes the containers and networks of cubicle instances that are provably
    // dead (sandbox/owner.hpp), in any state; never those of a live or unknown owner.
    asio::awaitable<void> remove_orphans();
    // Runs remove_orphans periodically: other servers may die while this one runs.
    asio::awaitable<void> sweep_orphans();
    // Pauses idle sandboxes and ends expired ones until destroy_all (lifetimes.hpp).
    asio::awaitable<void> watch_lifetimes();
    // Copies running persistent sandboxes' workspaces to disk every --persist-copy-s
    // when their files changed, until close().
    asio::awaitable<void> copy_workspaces();
    // Where the placement reports losses (a Swarm node that left), until destroy_all: a lost
    // sandbox's calls fail saying so, and its host is removed at once (nothing of it stays
    // when the node returns); it stays listed until stop_sandbox.
    asio::awaitable<void> watch_placement();
    // What the daemon offers (GPUs), read once at start-up after connecting; logs an
    // error when the engine cannot run the configured --runtime (sandboxes are then refused).
    void set_daemon_info(docker::DaemonInfo info);
    // Start-up (main.cpp) is meeting the engine; start_up_attempted(): it has, or failed
    // to at its first attempt (`failure`). Meanwhile a call waits for it rather than meet
    // the engine itself: it then takes the pool's first sandbox instead of starting its own
    // beside it, or fails with start-up's error rather than wait for the engine once more.
    void start_up_begins() { starting_up_ = true; }
    void start_up_attempted(std::exception_ptr failure = nullptr);
    // Starts keeping warm sandboxes of the default profile (and of others in demand).
    void start_pool() {
        // A runtime the engine lacks would fail every warm sandbox (set_daemon_info said so).
        const auto& engine = docker_.engine();
        if (closed_ || !engine.enforces_limits || (!config_.runtime.empty() && !engine.offers(config_.runtime))) return;
        pool_started_ = true;
        pools_.start();
    }
    // Where sandboxes run, and what the Engine can do to them there (placement.hpp).
    const Placement& placement() const { return *placement_; }
    // What a sandbox's programs may hold, and its container's hard limit (policy.hpp).
    MemoryLimits memory_limits(const SandboxSpec& spec) const { return sandbox::memory_limits(spec, docker_.engine()); }
    const std::string& default_image() const { return config_.default_image; }
    // The egress proxy's side of networked sandboxes: their runs' network ledgers.
    Egress& egress() { return egress_; }
    const Egress& egress() const { return egress_; }
    int pool_size() const { return config_.pool_size; }
    // Summed over the pools of every profile.
    PoolStats pool_stats() const { return pools_.stats(); }
    // What the warm sandboxes hold, from the host's accounting (all zero where it cannot read it).
    ContainerMemory pool_memory() const { return pools_.memory(); }
    // The pool's bounds: --pool-size and --pool-max.
    int pool_max() const { return config_.pool_max; }
    // Whether the default image is on the host; when not, warns the operator with the
    // command that builds it (or that it must be pulled on first use).
    asio::awaitable<bool> check_default_image();

private:
    // Returns once start_up_attempted() was called.
    asio::awaitable<void> await_start_up();
    asio::awaitable<void> ensure_image(std::string image, StatusSink status);
    // Which of cubicle's images this host has, said to whoever asked for a missing one.
    asio::awaitable<std::string> images_here();
    // create, once a networked sandbox's network is known (spec.network_name).
    asio::awaitable<std::shared_ptr<Sandbox>> create_on(SandboxSpec spec, std::string owner, bool throwaway, StatusSink status);
    // A networked sandbox's secrets (secrets.hpp): their values and its CA to the proxy, the
    // CA into the sandbox. A sandbox that cannot have them is removed (ToolError).
    asio::awaitable<void> install_secrets(std::shared_ptr<Sandbox> sandbox, std::vector<std::pair<std::string, std::string>> placeholders);
    // Where every sandbox's own container is removed (stop_sandbox, release, the pools):
    // a networked sandbox then leaves its principal's network, the last one removing it.
    asio::awaitable<void> remove_container_of(std::shared_ptr<Sandbox> sandbox);
    // Creates and connects a sandbox that nobody owns yet (for a client or the pool).
    asio::awaitable<std::shared_ptr<Sandbox>> launch(SandboxSpec spec);
    // Through the placement, once the engine is known and can run `spec`.
    asio::awaitable<std::shared_ptr<Sandbox>> launch_with(SandboxSpec spec, bool agent);
    // Connects first when start-up has not yet (which engine it is decides the config).
    asio::awaitable<void> know_engine();
    // Throws ToolError when the engine cannot run `spec` (limits, runtime).
    void check_engine(const SandboxSpec& spec) const;

    // `spec`'s limits, lowered to this server's ceilings (a saved sandbox's, made under others).
    SandboxSpec within_ceilings(SandboxSpec spec) const;
    // Removes a shared-container workspace's files and processes; the container stays.
    asio::awaitable<void> remove_workspace(std::shared_ptr<Sandbox> sandbox);
    // Removes a sandbox in the background (release, the pools), taking turns with the others.
    asio::awaitable<void> discard(std::shared_ptr<Sandbox> sandbox);
    // Removes a container; a failure is logged (the next sweep retries).
    asio::awaitable<void> remove_quietly(std::string container_id);
    // Removes the containers of this instance still there, and waits for removals under way.
    asio::awaitable<void> remove_leftovers();
    // Removes the containers a server that died holding persistent sandbox `sandbox_id` left,
    // once its mirror made its last copy.
    asio::awaitable<void> remove_stale(std::string sandbox_id);
    // Returns once `copying` says no more (last copies of mirrors here: Mirror::finish), or
    // after the longest a copy may take.
    asio::awaitable<void> wait_for_copies(std::function<bool()> copying);
    // Once its container is gone: its mirror's last copy and its record (`reason`), or
    // neither (`erase`); then the mirror goes. False when the copy failed.
    asio::awaitable<bool> end_mirror(std::string sandbox_id, bool erase, std::string reason);
    asio::awaitable<void> save_at_exit(std::string sandbox_id);
    // Whether `labels` are those of another cubicle instance whose owner is provably dead.
    bool orphaned(const std::map<std::string, std::string>& labels) const;
    // The container that holds the workspaces of `spec`'s profile, started on first use.
    asio::awaitable<std::shared_ptr<Sandbox>> workspace_host(SandboxSpec spec, StatusSink status);
    // Refuses a new sandbox past --max-sandboxes, else holds a place until destroyed.
    struct CreationSlot {
        std::size_t& creating;
        std::size_t& owner_creating;
        ~CreationSlot() {
            --creating;
            --owner_creating;
        }
    };
    [[nodiscard]] CreationSlot reserve_slot(const std::string& owner);

    asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    std::map<std::string, std::shared_ptr<Sandbox>> sandboxes_;
    std::size_t creating_ = 0;
    std::map<std::string, std::size_t> creating_by_owner_;
    std::size_t per_owner_limit_ = 0;
    bool closed_ = false;
    docker::DaemonInfo daemon_info_;
    bool docker_connected_ = false;  // docker_.engine() is known
    bool starting_up_ = false;       // between start_up_begins() and start_up_attempted()
    asio::steady_timer start_up_;    // cancelled by start_up_attempted()
    std::exception_ptr start_up_failure_;  // the first attempt's, for the calls that waited for it
    std::set<std::string> exec_only_images_;  // images the agent failed to start in
    std::map<std::string, std::shared_ptr<Sandbox>> workspace_hosts_;  // by profile
    unsigned next_workspace_uid_ = 10000;
    Pools pools_;
    RemovalTurns removal_turns_;
    bool pool_started_ = false;
    AgentVolume agent_volume_;
    std::unique_ptr<Placement> placement_;  // where sandboxes run (placement.hpp)
    std::set<std::string> lost_hosts_;      // hosts watch_placement() found lost (and removed)
    Egress egress_;
    Keeper keeper_;
    // The mirrors of the persistent sandboxes running here, by sandbox id (mirror.hpp).
    std::map<std::string, std::unique_ptr<Mirror>> mirrors_;
    std::size_t copies_under_way_ = 0;  // last copies of sandboxes that ended (Mirror::finish)
    Snapshots snapshots_;
    Lifetimes lifetimes_;
};

} // namespace cubicle::sandbox
