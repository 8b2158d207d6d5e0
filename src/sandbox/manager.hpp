// Owns every sandbox of this server: creation, lookup, limits, cleanup.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/pool.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::sandbox {

// Progress lines for slow steps (an image pull), shown to the client.
using StatusSink = std::function<void(std::string_view)>;

class Manager {
public:
    Manager(asio::any_io_executor executor, docker::Client& docker, const Config& config);

    const std::string& instance() const { return instance_; }

    // Fills unset fields of a spec from the server's defaults and checks limits.
    SandboxSpec resolve(SandboxSpec spec) const;

    // Creates, starts and connects a sandbox. Throws ToolError.
    asio::awaitable<std::shared_ptr<Sandbox>> create(SandboxSpec spec, bool throwaway, StatusSink status = {});
    // A workspace in a container shared with other workspaces of the same
    // profile: its own directory and uid, a fraction of the cost of a container.
    asio::awaitable<std::shared_ptr<Sandbox>> create_workspace(SandboxSpec spec, StatusSink status = {});
    std::shared_ptr<Sandbox> find(const std::string& id) const;
    // Throws ToolError naming the known sandboxes when `id` is not one of them.
    std::shared_ptr<Sandbox> get(const std::string& id) const;
    std::vector<std::shared_ptr<Sandbox>> list() const;
    asio::awaitable<void> destroy(std::string id);
    // Like destroy, but the container is removed in the background: the
    // sandbox is unusable at once, the caller does not wait for Docker.
    void release(std::string id);
    asio::awaitable<void> destroy_all();

    // Removes the containers of cubicle instances that are gone: their agents
    // exit when the owning server's connection drops, so they are not running.
    asio::awaitable<void> remove_orphans();
    // Runs remove_orphans again a little later and then periodically.
    asio::awaitable<void> sweep_orphans();
    // What the daemon offers (GPUs), read once at start-up.
    void set_daemon_info(docker::DaemonInfo info) { daemon_info_ = std::move(info); }
    // Starts keeping warm sandboxes of the default profile.
    void start_pool() { pool_.start(); }

private:
    asio::awaitable<void> ensure_image(std::string image, StatusSink status);
    // Creates and connects a sandbox that nobody owns yet (for a client or the pool).
    asio::awaitable<std::shared_ptr<Sandbox>> launch(SandboxSpec spec);
    asio::awaitable<std::shared_ptr<Sandbox>> launch_with(SandboxSpec spec, bool agent);
    asio::awaitable<std::shared_ptr<Sandbox>> start(std::string sandbox_id, std::string container_id, SandboxSpec spec, bool agent);
    // Removes a shared-container workspace's files and processes; the container stays.
    asio::awaitable<void> remove_workspace(std::shared_ptr<Sandbox> sandbox);
    asio::awaitable<void> discard(std::shared_ptr<Sandbox> sandbox);
    // The container that holds the workspaces of `spec`'s profile, started on first use.
    asio::awaitable<std::shared_ptr<Sandbox>> workspace_host(SandboxSpec spec, StatusSink status);
    // Refuses a new sandbox past --max-sandboxes, else holds a place until destroyed.
    struct CreationSlot {
        std::size_t& creating;
        ~CreationSlot() { --creating; }
    };
    [[nodiscard]] CreationSlot reserve_slot();

    asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    std::map<std::string, std::shared_ptr<Sandbox>> sandboxes_;
    std::size_t creating_ = 0;
    docker::DaemonInfo daemon_info_;
    std::set<std::string> exec_only_images_;  // images the agent failed to start in
    std::map<std::string, std::shared_ptr<Sandbox>> workspace_hosts_;  // by profile
    unsigned next_workspace_uid_ = 10000;
    Pool pool_;
    Egress egress_;
};

} // namespace cubicle::sandbox
