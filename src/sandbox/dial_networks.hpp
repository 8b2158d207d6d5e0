// Where agents that dial home (--agent-channel tcp, dial_home.hpp) connect from. The
// server's TLS endpoint listens on the gateway of an agent network of its own, on which
// the relay (agent/relay.h) alone is; each sandbox joins a network of its own (internal,
// a /29 without a host address) with the relay, which forwards to the endpoint. So
// nothing but the endpoint answers a sandbox: no other sandbox, no host port, no route
// out. Made for the first sandbox; removed with the server (a dead server's by the
// orphan sweep: every piece carries the instance's labels).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/agent_channel.hpp"
#include "sandbox/agent_volume.hpp"
#include "sandbox/dial_home.hpp"

namespace cubicle::sandbox {

class DialNetworks {
public:
    DialNetworks(boost::asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance,
                 AgentVolume& agent_volume);

    // A channel for one sandbox's agent, and the id of the network of its own the sandbox
    // joins (dropped with drop(), or with release() once held). Throws ToolError.
    boost::asio::awaitable<std::pair<std::unique_ptr<AgentChannel>, std::string>> channel();
    // The sandbox's container was made on `network`: release() removes the network with it.
    void hold(std::string container_id, std::string network) { networks_[std::move(container_id)] = std::move(network); }
    // The container is gone: its network goes. Never throws.
    boost::asio::awaitable<void> release(std::string container_id);
    // Removes a network channel() made; false when the engine would not. Never throws.
    boost::asio::awaitable<bool> drop(std::string network);
    // Removes the relay, every network and the endpoint (the sandboxes must be gone). Never throws.
    boost::asio::awaitable<void> teardown();

private:
    boost::asio::awaitable<void> start();

    boost::asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    AgentVolume& agent_volume_;
    std::unique_ptr<DialHome> endpoint_;
    std::string agent_network_id_;
    std::string relay_id_;
    std::unique_ptr<docker::RawStream> relay_stdin_;  // the relay ends when it closes
    std::map<std::string, std::string> networks_;     // by container id
    bool starting_ = false;
    boost::asio::steady_timer started_;  // holds the channel() calls that come while start() runs
};

} // namespace cubicle::sandbox
