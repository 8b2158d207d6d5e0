// The local placement (placement.hpp): each sandbox a container of the engine at
// --docker-host, its agent on a socket mounted into it, on its attach stream, or dialing
// home from a network of its own (dial_networks.hpp).
#pragma once

#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/agent_channel.hpp"
#include "sandbox/agent_volume.hpp"
#include "sandbox/dial_networks.hpp"
#include "sandbox/placement.hpp"

namespace cubicle::sandbox {

class LocalPlacement : public Placement {
public:
    LocalPlacement(boost::asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance,
                   AgentVolume& agent_volume);

    const char* name() const override { return "local"; }
    PlacementOffers offers() const override { return {}; }
    boost::asio::awaitable<std::shared_ptr<Sandbox>> launch(SandboxSpec spec, std::string sandbox_id, bool agent) override;
    boost::asio::awaitable<void> remove(std::string host_id) override;
    boost::asio::awaitable<std::vector<docker::ContainerSummary>> hosts(std::string label_filter) override;
    boost::asio::awaitable<std::vector<LostSandbox>> lost(std::vector<std::string>) override { co_return std::vector<LostSandbox>{}; }
    boost::asio::awaitable<void> teardown() override { co_await dial_networks_.teardown(); }

private:
    // Tried once more when the agent volume turns out to have been removed (`retried`).
    boost::asio::awaitable<std::shared_ptr<Sandbox>> launch_with(SandboxSpec spec, std::string sandbox_id, bool agent, bool retried);
    // `copy_agent`: the container has no shared agent volume, the agent is copied into it.
    // `channel`: the agent's channel the container mounts, if any.
    boost::asio::awaitable<std::shared_ptr<Sandbox>> start(std::string sandbox_id, std::string container_id, SandboxSpec spec,
                                                           bool agent, bool copy_agent, std::unique_ptr<AgentChannel> channel);

    boost::asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    AgentVolume& agent_volume_;
    // Where the agents' channels listen (agent_channel.hpp); empty: none, every agent
    // speaks over its attach stream (--agent-channel attach, an engine that is not local).
    std::unique_ptr<AgentChannels> channels_;
    DialNetworks dial_networks_;  // --agent-channel tcp (dial_networks.hpp)
};

} // namespace cubicle::sandbox
