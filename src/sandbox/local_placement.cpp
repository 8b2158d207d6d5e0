#include "sandbox/local_placement.hpp"

#include <chrono>
#include <exception>
#include <string_view>
#include <utility>

#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

namespace {

constexpr auto agent_start_timeout = std::chrono::seconds(15);

} // namespace

LocalPlacement::LocalPlacement(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance,
                               AgentVolume& agent_volume)
    : executor_(executor), docker_(docker), config_(config), instance_(std::move(instance)), agent_volume_(agent_volume),
      dial_networks_(executor, docker, config, instance_, agent_volume) {
    if (config.agent_channel == "socket" && docker.endpoint().kind == docker::Endpoint::Kind::unix_socket)
        channels_ = AgentChannels::open();
}

asio::awaitable<std::shared_ptr<Sandbox>> LocalPlacement::launch(SandboxSpec spec, std::string sandbox_id, bool agent) {
    co_return co_await launch_with(std::move(spec), std::move(sandbox_id), agent, false);
}

asio::awaitable<std::shared_ptr<Sandbox>> LocalPlacement::launch_with(SandboxSpec spec, std::string sandbox_id, bool agent, bool retried) {
    std::string agent_volume;
    // Filled and held through a container of the operator's image, never a client's.
    if (agent) agent_volume = co_await agent_volume_.ensure(config_.default_image);
    std::unique_ptr<AgentChannel> channel;
    std::string dial_network;  // the sandbox's own, with the relay, when its agent dials home
    // A networked sandbox is on its egress network: its agent speaks over the attach stream.
    if (agent && config_.agent_channel == "tcp" && !spec.network) {
        auto dial = co_await dial_networks_.channel();
        channel = std::move(dial.first);
        dial_network = std::move(dial.second);
    } else if (agent && channels_ && docker_.engine().passes_host_sockets(spec.runtime)) channel = channels_->listen(executor_);
    auto wiring = channel ? channel->wiring() : AgentWiring{};
    // Built outside the co_await: GCC 12 frees temporaries inside one wrongly. A refused spec
    // after channel() must still drop the sandbox's network.
    std::exception_ptr refused;
    std::string config;
    try {
        config = container_config(spec, instance_, sandbox_id, agent, docker_.engine(), agent_volume, wiring.socket_path,
                                  wiring.network, wiring.dial);
    } catch (...) {
        refused = std::current_exception();
    }
    std::string container_id;
    if (!refused) try {
        // Not named after the sandbox: Podman writes the name into its /etc/hosts, and
        // Docker's DNS answers a reverse lookup with it (the label io.cubicle.sandbox has the id).
        container_id = co_await docker_.create_container(std::move(config), "cubicle-" + random_hex(6));
    } catch (const docker::Error& e) {
        // Refused for the socket's sake (Docker and Podman name the path): the engine does
        // not see this server's files (a remote daemon, a server in a container of its own),
        // so no sandbox can have a channel. Logged once: launches under way fail alike.
        if (wiring.socket_path.empty() || std::string_view(e.what()).find(wiring.socket_path) == std::string_view::npos) {
            refused = std::current_exception();
        } else {
            if (channels_) {
                log::warning("the engine cannot mount agent channels from {} ({}); sandboxes use their attach streams",
                             channels_->path(), e.what());
            }
            channel.reset();
            channels_.reset();
        }
    }
    if (refused) {
        if (!dial_network.empty()) co_await dial_networks_.drop(dial_network);
        std::rethrow_exception(refused);
    }
    if (container_id.empty()) co_return co_await launch_with(std::move(spec), std::move(sandbox_id), agent, retried);
    if (!dial_network.empty()) dial_networks_.hold(container_id, dial_network);
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
    co_await dial_networks_.release(container_id);
    if (!agent_volume.empty() && !retried) {
        bool repaired = co_await agent_volume_.repair();
        if (repaired) co_return co_await launch_with(std::move(spec), std::move(sandbox_id), agent, true);
    }
    std::rethrow_exception(failure);
}

asio::awaitable<std::shared_ptr<Sandbox>> LocalPlacement::start(std::string sandbox_id, std::string container_id, SandboxSpec spec, bool agent,
                                                         bool copy_agent, std::unique_ptr<AgentChannel> channel) {
    if (copy_agent) co_await docker_.put_archive(container_id, agent_dir, agent_archive());
    auto stream = co_await docker_.attach(container_id);
    co_await docker_.start_container(container_id);
    auto sandbox = std::make_shared<Sandbox>(executor_, sandbox_id, container_id, std::move(spec));
    if (!docker_.engine().forks_and_recycles(sandbox->spec().runtime)) sandbox->disable_zygote();
    sandbox->set_zygote_preload(config_.zygote_preload);
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

asio::awaitable<void> LocalPlacement::remove(std::string host_id) {
    co_await docker_.remove_container(host_id);
    co_await dial_networks_.release(std::move(host_id));
}

asio::awaitable<std::vector<docker::ContainerSummary>> LocalPlacement::hosts(std::string label_filter) {
    co_return co_await docker_.list_containers(std::move(label_filter));
}

} // namespace cubicle::sandbox
