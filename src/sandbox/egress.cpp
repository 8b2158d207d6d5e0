#include "sandbox/egress.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/all_at_once.hpp"
#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

// What the Engine (Docker 20.10 and later) says when no subnet of its default
// address pools is free for another network.
constexpr std::string_view pools_used_up = "could not find an available, non-overlapping IPv4 address pool";

} // namespace

std::string network_refused(std::string_view why) {
    if (why.find(pools_used_up) != std::string_view::npos) {
        return "no network could be made for this sandbox: the Docker daemon has no address range left for another "
               "network (its default-address-pools are used up, by this server's networks and others on the host). "
               "Create the sandbox without network: true, or try again once networked sandboxes have stopped; the "
               "operator can remove unused Docker networks (`docker network prune`), give the daemon more pools "
               "(default-address-pools in daemon.json) or lower --max-egress-networks";
    }
    return fmt::format("could not set up network access for sandboxes: {}", why);
}

std::string no_network_left(std::size_t most) {
    return fmt::format("no network is left for this sandbox: the server keeps at most {} egress networks (one per "
                       "principal with networked sandboxes) and all are in use by others. Create the sandbox without "
                       "network: true, or try again once other principals' networked sandboxes have stopped; the "
                       "operator can raise --max-egress-networks if the Docker daemon's address pools have room",
                       most);
}

Egress::Egress(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance,
               AgentVolume& agent_volume)
    : executor_(std::move(executor)), docker_(docker), config_(config), instance_(std::move(instance)), agent_volume_(agent_volume) {}

std::string Egress::proxy_url() const { return fmt::format("http://{}:{}", proxy_alias, proxy_port); }

asio::awaitable<std::string> Egress::join(std::string principal) {
    co_await ensure_proxy();
    // Another call of this principal's creates or removes its network: wait, then look again.
    for (;;) {
        if (closed_) throw ToolError("the server is stopping; no new sandbox can start");
        auto it = networks_.find(principal);
        if (it == networks_.end()) break;
        auto network = it->second;
        if (network->state == Network::State::ready) {
            ++network->members;
            co_return network->name;
        }
        log::debug("a sandbox waits for egress network {} to be {}", network->name,
                   network->state == Network::State::creating ? "created" : "removed");
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        network->waiting.push_back(turn);
        co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
    }
    const auto most = static_cast<std::size_t>(config_.max_egress_networks);
    if (networks_.size() >= most) throw ToolError(no_network_left(most));
    auto network = std::make_shared<Network>();
    // Random, and never the principal's: a sandbox on the network can look its name up
    // (Docker's DNS answers reverse lookups with container.network).
    network->name = "cubicle-egress-" + random_hex(8);
    networks_[principal] = network;
    std::string failure;
    try {
        auto config = egress_network_config(network->name, instance_);
        network->id = co_await docker_.create_network(std::move(config));
        // Under the same name on every network: the sandboxes' proxy settings are all alike.
        std::vector<std::string> aliases{proxy_alias};
        co_await docker_.connect_network(network->id, proxy_id_, std::move(aliases));
        if (closed_) failure = "the server is stopping; no new sandbox can start";
    } catch (const std::exception& e) {
        failure = network_refused(e.what());
    }
    if (failure.empty()) {
        network->state = Network::State::ready;
        network->members = 1;
        wake(std::move(network->waiting));
        log::debug("egress network {} ready", network->name);
        co_return network->name;
    }
    if (auto it = networks_.find(principal); it != networks_.end() && it->second == network) networks_.erase(it);
    if (!network->id.empty()) co_await remove_network(network->id);
    wake(std::move(network->waiting));
    throw ToolError(failure);
}

asio::awaitable<void> Egress::leave(std::string principal) {
    auto it = networks_.find(principal);
    if (it == networks_.end()) co_return;
    auto network = it->second;
    if (network->state != Network::State::ready || --network->members > 0) co_return;
    // Joins of this principal wait until it is gone, then make a new one.
    network->state = Network::State::removing;
    co_await remove_network(network->id);
    if (auto found = networks_.find(principal); found != networks_.end() && found->second == network) networks_.erase(found);
    wake(std::move(network->waiting));
    log::debug("egress network {} removed with its last sandbox", network->name);
}

asio::awaitable<void> Egress::remove_network(std::string id) {
    // The proxy first: the Engine removes no network that a container is still on.
    if (!proxy_id_.empty()) {
        try {
            co_await docker_.disconnect_network(id, proxy_id_);
        } catch (const std::exception& e) {
            log::debug("disconnecting the egress proxy from network {}: {}", id.substr(0, 12), e.what());
        }
    }
    try {
        co_await docker_.remove_network(id);
    } catch (const std::exception& e) {
        log::warning("removing egress network {}: {} (it goes at exit)", id.substr(0, 12), e.what());
    }
}

void Egress::wake(std::vector<std::shared_ptr<asio::steady_timer>> waiting) {
    for (auto& turn : waiting) turn->cancel();
}

asio::awaitable<void> Egress::ensure_proxy() {
    if (closed_) throw ToolError("the server is stopping; no new sandbox can start");
    if (proxy_state_ == State::ready) co_return;
    if (proxy_state_ == State::starting) {
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        waiting_for_proxy_.push_back(turn);
        co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
        if (proxy_state_ != State::ready) throw ToolError(proxy_failure_);
        co_return;
    }
    proxy_state_ = State::starting;
    try {
        co_await start_proxy();
        proxy_state_ = State::ready;
    } catch (const std::exception& e) {
        proxy_failure_ = fmt::format("could not set up network access for sandboxes: {}", e.what());
    }
    if (proxy_state_ != State::ready) {
        try {
            co_await remove_proxy();  // the next request starts from scratch
        } catch (const std::exception& e) {
            log::warning("cleaning up a failed egress set-up: {}", e.what());
        }
    }
    wake(std::move(waiting_for_proxy_));
    waiting_for_proxy_.clear();
    if (proxy_state_ != State::ready) throw ToolError(proxy_failure_);
}

asio::awaitable<void> Egress::start_proxy() {
    auto agent_volume = co_await agent_volume_.ensure(config_.default_image);
    // On the default bridge, its way out; the principals' networks are joined as they come.
    auto config = proxy_config(config_.default_image, instance_, config_.egress_allow, docker_.engine(), agent_volume);
    proxy_id_ = co_await docker_.create_container(std::move(config), "cubicle-proxy-" + random_hex(8));
    if (agent_volume.empty()) co_await docker_.put_archive(proxy_id_, agent_dir, agent_archive());
    proxy_stdin_ = co_await docker_.attach(proxy_id_);
    co_await docker_.start_container(proxy_id_);
    log::debug("egress proxy {} ready", proxy_id_.substr(0, 12));
}

asio::awaitable<void> Egress::remove_proxy() {
    if (proxy_stdin_) proxy_stdin_->close();
    proxy_stdin_.reset();
    if (!proxy_id_.empty()) co_await docker_.remove_container(proxy_id_);
    proxy_id_.clear();
    proxy_state_ = State::idle;
}

asio::awaitable<void> Egress::teardown() {
    closed_ = true;
    auto networks = std::move(networks_);
    networks_.clear();
    for (auto& [principal, network] : networks) wake(std::move(network->waiting));
    co_await remove_proxy();
    // Every network of this instance, those a creation cut short included, all at once
    // (shutdown has a deadline).
    auto of_this_instance = fmt::format("{}={}", label_instance, instance_);
    auto ours = co_await docker_.list_networks(std::move(of_this_instance));
    std::vector<asio::awaitable<void>> removals;
    for (const auto& network : ours) removals.push_back(remove_network(network.id));
    co_await all_at_once(executor_, std::move(removals));
}

} // namespace cubicle::sandbox
