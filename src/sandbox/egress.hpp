// Network egress for sandboxes that ask for it: they join an internal Docker
// network with no route out, whose only way out is an HTTP(S) proxy (the agent
// in proxy mode) in its own container. The proxy applies the operator's
// allowlist and never lets a sandbox reach private, link-local or loopback
// addresses, whatever the sandbox does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/agent_volume.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

class Egress {
public:
    Egress(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance, AgentVolume& agent_volume);

    // Creates the network and starts the proxy on first use; later calls wait
    // for that. Throws ToolError when it cannot.
    asio::awaitable<void> ensure();
    const std::string& network() const { return network_name_; }
    std::string proxy_url() const;
    // Removes the proxy and the network (the sandboxes on it must be gone).
    asio::awaitable<void> teardown();

private:
    asio::awaitable<void> start();

    asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    AgentVolume& agent_volume_;
    std::string network_name_;
    std::string network_id_;
    std::string proxy_id_;
    std::unique_ptr<docker::RawStream> proxy_stdin_;  // held open: closing it stops the proxy
    enum class State { idle, starting, ready } state_ = State::idle;
    std::vector<std::shared_ptr<asio::steady_timer>> waiting_;
    std::string failure_;
};

} // namespace cubicle::sandbox
