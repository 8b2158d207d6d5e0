#include "sandbox/agent_volume.hpp"

#include <exception>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/ids.hpp"
#include "common/log.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {

AgentVolume::AgentVolume(asio::any_io_executor executor, docker::Client& docker, std::string instance)
    : executor_(std::move(executor)), docker_(docker), instance_(std::move(instance)), name_("cubicle-agent-" + random_hex(8)) {}

asio::awaitable<std::string> AgentVolume::ensure(std::string image) {
    if (state_ == State::filling) {
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        waiting_.push_back(turn);
        co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
    } else if (state_ == State::idle) {
        state_ = State::filling;
        try {
            co_await fill(std::move(image));
            state_ = State::ready;
        } catch (const std::exception& e) {
            state_ = State::idle;
            if (!warned_) {
                log::warning("the shared agent volume {} could not be set up ({}); copying the agent into each container "
                             "instead, and trying again at the next start",
                             name_, e.what());
            } else {
                log::debug("the shared agent volume {} could not be set up: {}", name_, e.what());
            }
            warned_ = true;
        }
        for (auto& turn : waiting_) turn->cancel();
        waiting_.clear();
    }
    co_return state_ == State::ready ? name_ : std::string();
}

asio::awaitable<bool> AgentVolume::intact() {
    if (state_ != State::ready) co_return true;
    try {
        auto volume = co_await docker_.inspect_volume(name_);
        if (volume && volume->labels[label_instance] == instance_) co_return true;
        log::warning("the agent volume {} was removed behind this server's back; writing it again", name_);
        state_ = State::idle;
        if (volume) co_await docker_.remove_volume(name_);
    } catch (const std::exception& e) {
        log::debug("checking the agent volume {}: {}", name_, e.what());
    }
    co_return state_ == State::ready;
}

asio::awaitable<void> AgentVolume::fill(std::string image) {
    made_ = true;
    co_await docker_.create_volume(agent_volume_config(name_, instance_));
    // An archive goes into a container, not a volume: one that is created, never started.
    auto filler = co_await docker_.create_container(agent_volume_filler_config(image, instance_, name_));
    std::exception_ptr failure;
    try {
        co_await docker_.put_archive(filler, agent_dir, agent_archive());
    } catch (...) {
        failure = std::current_exception();
    }
    try {
        co_await docker_.remove_container(filler);
    } catch (const std::exception& e) {
        // Labelled as ours: the shutdown or the orphan sweep removes it.
        log::warning("removing the container {} that filled the agent volume: {}", filler.substr(0, 12), e.what());
    }
    if (failure) std::rethrow_exception(failure);
}

asio::awaitable<bool> AgentVolume::remove() {
    if (!made_) co_return true;
    try {
        co_await docker_.remove_volume(name_);
    } catch (const docker::Error& e) {
        if (e.status() != 409) throw;
        co_return false;
    }
    state_ = State::idle;
    made_ = false;
    co_return true;
}

} // namespace cubicle::sandbox
