#include "sandbox/agent_volume.hpp"

#include <chrono>
#include <exception>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/ids.hpp"
#include "common/log.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

// Enough of the digest to tell agents apart in a name; the label has all of it.
constexpr std::size_t digest_in_name = 16;

} // namespace

AgentVolume::AgentVolume(asio::any_io_executor executor, docker::Client& docker, std::string instance)
    : executor_(std::move(executor)), docker_(docker), instance_(std::move(instance)), digest_(agent_digest()),
      name_("cubicle-agent-" + digest_.substr(0, digest_in_name)) {}

asio::awaitable<std::string> AgentVolume::ensure(std::string image) {
    if (state_ == State::filling) {
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        waiting_.push_back(turn);
        co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
    } else if (state_ == State::idle) {
        state_ = State::filling;
        try {
            co_await find_or_fill(image);
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

asio::awaitable<void> AgentVolume::find_or_fill(std::string image) {
    if (image_.empty()) image_ = image;
    if (!rewrite_) {
        auto volume = co_await docker_.inspect_volume(name_);
        if (volume && volume->labels[label_agent_digest] == digest_) co_return;
        // An unlabelled one of this name was made by the daemon for a container naming a
        // removed volume: it holds no agent, and goes if nothing mounts it.
        if (volume) co_await docker_.remove_volume(name_);
    }
    co_await fill(std::move(image));
    rewrite_ = false;
}

asio::awaitable<void> AgentVolume::fill(std::string image) {
    // Creating a volume that exists (another server's fill under way) is no error on
    // Docker; Podman refuses it, and then the one there must be the agent's.
    std::exception_ptr refused;
    try {
        co_await docker_.create_volume(agent_volume_config(name_, digest_));
    } catch (const docker::Error&) {
        refused = std::current_exception();
    }
    if (refused) {
        auto volume = co_await docker_.inspect_volume(name_);
        if (!volume || volume->labels[label_agent_digest] != digest_) std::rethrow_exception(refused);
    }
    // An archive goes into a container, not a volume: the holding one, never started,
    // which then stays (see the header).
    if (holder_.empty()) {
        held_ = true;
        holder_ = co_await docker_.create_container(agent_volume_filler_config(image, instance_, name_));
    }
    co_await docker_.put_archive(holder_, agent_dir, agent_archive_linked(".agent-" + random_hex(8)));
    written_here_ = true;
}

asio::awaitable<void> AgentVolume::hold() {
    if (held_ || state_ != State::ready) co_return;
    held_ = true;
    holding_ = true;
    try {
        auto holder = co_await docker_.create_container(agent_volume_filler_config(image_, instance_, name_));
        // A fill meanwhile may have made one too: both go with the server.
        if (holder_.empty()) holder_ = std::move(holder);
    } catch (const std::exception& e) {
        held_ = false;
        log::debug("holding the agent volume {}: {}", name_, e.what());
    }
    holding_ = false;
}

asio::awaitable<void> AgentVolume::settle() {
    asio::steady_timer pause(executor_);
    for (int i = 0; holding_ && i < 250; ++i) {
        pause.expires_after(std::chrono::milliseconds(20));
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<bool> AgentVolume::repair() {
    if (state_ != State::ready) co_return false;
    try {
        auto volume = co_await docker_.inspect_volume(name_);
        bool labelled = volume && volume->labels[label_agent_digest] == digest_;
        if (labelled && written_here_) co_return false;
        if (labelled) {
            log::info("a sandbox failed to start from the agent volume {} that another server wrote; writing the agent again", name_);
            rewrite_ = true;
        } else {
            log::warning("the agent volume {} was removed behind this server's back; writing it again", name_);
        }
        state_ = State::idle;
        co_return true;
    } catch (const std::exception& e) {
        log::debug("checking the agent volume {}: {}", name_, e.what());
    }
    co_return false;
}

bool AgentVolume::stale(const std::map<std::string, std::string>& labels) const {
    auto digest = labels.find(label_agent_digest);
    return digest != labels.end() && digest->second != digest_ && labels.count(label_instance) == 0;
}

} // namespace cubicle::sandbox
