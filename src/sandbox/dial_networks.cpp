#include "sandbox/dial_networks.hpp"

#include <exception>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

namespace {

// Where the sandboxes' own networks take their /29s: 10.213.0.0/16.
constexpr const char* dial_subnet_prefix = "10.213";
constexpr unsigned dial_subnets = 8192;
constexpr int dial_subnet_attempts = 8;
// The relay's port on each of them (agent/relay.h).
constexpr int dial_relay_port = 4000;

} // namespace

DialNetworks::DialNetworks(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance,
                           AgentVolume& agent_volume)
    : executor_(executor), docker_(docker), config_(config), instance_(std::move(instance)), agent_volume_(agent_volume),
      started_(executor, asio::steady_timer::time_point::max()) {}

asio::awaitable<void> DialNetworks::release(std::string container_id) {
    auto it = networks_.find(container_id);
    if (it == networks_.end()) co_return;
    auto network = it->second;
    networks_.erase(it);
    // Not removed (the engine busy, say): kept, for teardown() to try again.
    if (!co_await drop(network)) networks_.emplace(std::move(container_id), std::move(network));
}

asio::awaitable<std::pair<std::unique_ptr<AgentChannel>, std::string>> DialNetworks::channel() {
    // teardown() may run at any co_await below: the server is stopping then.
    while (!endpoint_ && starting_) co_await started_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (!endpoint_) {
        starting_ = true;
        std::exception_ptr failure;
        try {
            co_await start();
        } catch (...) {
            failure = std::current_exception();
        }
        // Teardown first, then wake: a waiter woken earlier would start again while teardown
        // removes the network and relay it builds on.
        if (failure) co_await teardown();
        starting_ = false;
        started_.cancel();
        if (failure) std::rethrow_exception(failure);
    }
    // A subnet of its own, with room for the relay and the sandbox (a /29): random, so
    // that servers sharing an engine seldom meet; the Engine refuses one in use.
    std::string network, failure;
    for (int attempt = 0; attempt < dial_subnet_attempts && network.empty(); ++attempt) {
        if (!endpoint_) throw ToolError("the server is stopping");
        auto block = std::stoul(random_hex(2), nullptr, 16) % dial_subnets;
        auto subnet = fmt::format("{}.{}.{}/29", dial_subnet_prefix, block / 32, (block % 32) * 8);
        auto relay = fmt::format("{}.{}.{}", dial_subnet_prefix, block / 32, (block % 32) * 8 + 2);  // .1 is the gateway's
        try {
            network = co_await docker_.create_network(dial_network_config("cubicle-dial-" + random_hex(8), instance_, subnet));
            if (endpoint_) co_await docker_.connect_network(network, relay_id_, {}, relay);
            if (endpoint_) {
                auto channel = endpoint_->expect(network, relay, dial_relay_port);
                co_return std::make_pair(std::move(channel), network);
            }
        } catch (const std::exception& e) {
            failure = e.what();
        }
        if (!network.empty()) co_await drop(std::exchange(network, {}));
    }
    if (!endpoint_) throw ToolError("the server is stopping");
    throw ToolError(network_refused(failure));
}

asio::awaitable<void> DialNetworks::start() {
    if (agent_network_id_.empty()) {
        // Random, as the egress networks' names: a sandbox on it can look its name up.
        auto name = "cubicle-agents-" + random_hex(8);
        try {
            agent_network_id_ = co_await docker_.create_network(agent_network_config(name, instance_));
        } catch (const std::exception& e) {
            throw ToolError(network_refused(e.what()));
        }
    }
    auto gateway = co_await docker_.network_gateway(agent_network_id_);
    // Listening on the gateway of a network the relay alone is on: no other host address
    // or interface takes agents.
    std::string host = gateway;
    std::uint16_t port = 0;
    if (!config_.agent_listen.empty()) {
        auto colon = config_.agent_listen.rfind(':');
        host = config_.agent_listen.substr(0, colon);
        if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        port = static_cast<std::uint16_t>(std::stoi(config_.agent_listen.substr(colon + 1)));
    }
    bool anywhere = host == "0.0.0.0" || host == "::";
    auto dial_host = anywhere ? gateway : host;
    if (dial_host.empty()) throw ToolError("the agents' network has no gateway to dial the server at; set --agent-listen");
    try {
        endpoint_ = DialHome::listen(executor_, host, port);
    } catch (const std::runtime_error& e) {
        throw ToolError(fmt::format("sandboxes cannot start: {}{}", e.what(),
                                    config_.agent_listen.empty() ? " (the agent network's gateway: is the engine on another "
                                                                   "host? Set --agent-listen to an address of this one its "
                                                                   "sandboxes reach)"
                                                                 : ""));
    }
    // The relay, from the operator's image as the egress proxy.
    auto agent_volume = co_await agent_volume_.ensure(config_.default_image);
    auto config = relay_config(config_.default_image, instance_, docker_.engine(), agent_volume, agent_network_id_,
                               dial_relay_port, host_port(dial_host, endpoint_->port()));
    relay_id_ = co_await docker_.create_container(std::move(config), "cubicle-relay-" + random_hex(8));
    if (agent_volume.empty()) co_await docker_.put_archive(relay_id_, agent_dir, agent_archive());
    relay_stdin_ = co_await docker_.attach(relay_id_);
    co_await docker_.start_container(relay_id_);
}

asio::awaitable<bool> DialNetworks::drop(std::string network) {
    // Each step on its own: a relay already off the network must not keep it.
    try {
        if (!relay_id_.empty()) co_await docker_.disconnect_network(network, relay_id_);
    } catch (const std::exception& e) {
        log::debug("disconnecting the relay from a sandbox's agent network: {}", e.what());
    }
    try {
        co_await docker_.remove_network(network);
        co_return true;
    } catch (const std::exception& e) {
        log::warning("removing a sandbox's agent network: {}", e.what());
        co_return false;
    }
}

asio::awaitable<void> DialNetworks::teardown() {
    endpoint_.reset();
    if (relay_stdin_) relay_stdin_->close();
    relay_stdin_.reset();
    try {
        if (!relay_id_.empty()) co_await docker_.remove_container(std::exchange(relay_id_, {}));
    } catch (const std::exception& e) {
        log::warning("removing the agents' relay: {}", e.what());
    }
    auto networks = std::exchange(networks_, {});
    for (auto& [container, network] : networks) co_await drop(network);  // the orphan sweep takes what is left
    try {
        if (!agent_network_id_.empty()) co_await docker_.remove_network(std::exchange(agent_network_id_, {}));
    } catch (const std::exception& e) {
        log::warning("removing the agent network: {}", e.what());
    }
}

} // namespace cubicle::sandbox
