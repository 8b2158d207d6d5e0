// Network egress for sandboxes that ask for it: each principal's networked
// sandboxes join an internal Docker network of that principal's (on stdio there
// is one principal, so one network), with no route out; the only way out of
// every one of them is one HTTP(S) proxy (the agent in proxy mode) in its own
// container, joined to each under the same name. Sandboxes of one principal
// reach each other; those of two principals do not. The proxy applies the
// operator's allowlist and never lets a sandbox reach private, link-local or
// loopback addresses, whatever the sandbox does.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/agent_volume.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

// The tool error for a network the Engine would not create (`why`: its error); used-up
// address pools are named as such, with what to do.
std::string network_refused(std::string_view why);
// The tool error past --max-egress-networks (`most`).
std::string no_network_left(std::size_t most);

class Egress {
public:
    Egress(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance, AgentVolume& agent_volume);

    // The name of the network a networked sandbox of `principal` joins: created, with
    // the proxy joined to it, for the principal's first; held until leave(). Calls of one
    // principal take turns, so two sandboxes created at once share one network and none
    // joins a network being removed. Throws ToolError when it cannot (--max-egress-networks
    // reached, the Engine's address pools used up).
    asio::awaitable<std::string> join(std::string principal);
    // A sandbox that joined is gone (its container removed): the principal's last one
    // takes the network with it. Never throws.
    asio::awaitable<void> leave(std::string principal);
    std::string proxy_url() const;
    // Removes the proxy and every network of this instance (the sandboxes on them must be gone).
    asio::awaitable<void> teardown();

private:
    struct Network {
        enum class State { creating, ready, removing } state = State::creating;
        std::string name;
        std::string id;
        std::size_t members = 0;  // sandboxes on it, and those being created for it
        std::vector<std::shared_ptr<asio::steady_timer>> waiting;  // joins until it is ready or gone
    };

    // Starts the proxy on first use; later calls wait for that.
    asio::awaitable<void> ensure_proxy();
    asio::awaitable<void> start_proxy();
    asio::awaitable<void> remove_proxy();
    // Disconnects the proxy and removes the network; a failure is logged (teardown retries).
    asio::awaitable<void> remove_network(std::string id);
    // Wakes those waiting: they look again.
    static void wake(std::vector<std::shared_ptr<asio::steady_timer>> waiting);

    asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    AgentVolume& agent_volume_;
    std::string proxy_id_;
    std::unique_ptr<docker::RawStream> proxy_stdin_;  // held open: closing it stops the proxy
    enum class State { idle, starting, ready } proxy_state_ = State::idle;
    std::vector<std::shared_ptr<asio::steady_timer>> waiting_for_proxy_;
    std::string proxy_failure_;
    std::map<std::string, std::shared_ptr<Network>> networks_;  // by principal
    bool closed_ = false;  // torn down: no more joins
};

} // namespace cubicle::sandbox
