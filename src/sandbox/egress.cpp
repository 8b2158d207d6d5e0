#include "sandbox/egress.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {

Egress::Egress(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance,
               AgentVolume& agent_volume)
    : executor_(std::move(executor)), docker_(docker), config_(config), instance_(std::move(instance)), agent_volume_(agent_volume),
      // Random, not the instance's: a sandbox on the network can look its name up
      // (Docker's DNS answers reverse lookups with container.network).
      network_name_("cubicle-egress-" + random_hex(8)) {}

std::string Egress::proxy_url() const { return fmt::format("http://{}:{}", proxy_alias, proxy_port); }

asio::awaitable<void> Egress::ensure() {
    if (state_ == State::ready) co_return;
    if (state_ == State::starting) {
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        waiting_.push_back(turn);
        co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
        if (state_ != State::ready) throw ToolError(failure_);
        co_return;
    }
    state_ = State::starting;
    try {
        co_await start();
        state_ = State::ready;
    } catch (const std::exception& e) {
        failure_ = fmt::format("could not set up network access for sandboxes: {}", e.what());
    }
    if (state_ != State::ready) {
        try {
            co_await teardown();  // the next request starts from scratch
        } catch (const std::exception& e) {
            log::warning("cleaning up a failed egress set-up: {}", e.what());
        }
    }
    for (auto& turn : waiting_) turn->cancel();
    waiting_.clear();
    if (state_ != State::ready) throw ToolError(failure_);
}

asio::awaitable<void> Egress::start() {
    network_id_ = co_await docker_.create_network(egress_network_config(network_name_, instance_));
    auto agent_volume = co_await agent_volume_.ensure(config_.default_image);
    proxy_id_ = co_await docker_.create_container(
        proxy_config(config_.default_image, instance_, network_name_, config_.egress_allow, docker_.engine(), agent_volume),
        "cubicle-proxy-" + random_hex(8));
    if (agent_volume.empty()) co_await docker_.put_archive(proxy_id_, agent_dir, agent_archive());
    // The proxy's second network is the way out.
    co_await docker_.connect_network("bridge", proxy_id_);
    proxy_stdin_ = co_await docker_.attach(proxy_id_);
    co_await docker_.start_container(proxy_id_);
    log::debug("egress proxy {} ready on network {}", proxy_id_.substr(0, 12), network_name_);
}

asio::awaitable<void> Egress::teardown() {
    if (proxy_stdin_) proxy_stdin_->close();
    if (!proxy_id_.empty()) co_await docker_.remove_container(proxy_id_);
    if (!network_id_.empty()) co_await docker_.remove_network(network_id_);
    proxy_id_.clear();
    network_id_.clear();
    state_ = State::idle;
}

} // namespace cubicle::sandbox
