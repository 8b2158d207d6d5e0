#include "sandbox/removals.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace cubicle::sandbox {

namespace asio = boost::asio;

struct RemovalTurns::State {
    std::size_t at_once;
    std::size_t busy = 0;
    bool open = false;
    std::deque<std::shared_ptr<asio::steady_timer>> waiting;  // cancelled when their turn comes
};

RemovalTurns::RemovalTurns(asio::any_io_executor executor, std::size_t at_once)
    : executor_(executor), state_(std::make_shared<State>(State{.at_once = at_once})) {}

RemovalTurns::Turn::~Turn() {
    if (!state_) return;  // moved from
    if (state_->waiting.empty()) {
        --state_->busy;
        return;
    }
    // Handed over: the next one's turn counts as busy already.
    state_->waiting.front()->cancel();
    state_->waiting.pop_front();
}

asio::awaitable<RemovalTurns::Turn> RemovalTurns::wait() {
    if (state_->open || state_->busy < state_->at_once) {
        ++state_->busy;
        co_return Turn(state_);
    }
    auto waiter = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    state_->waiting.push_back(waiter);
    co_await waiter->async_wait(asio::as_tuple(asio::use_awaitable));
    co_return Turn(state_);
}

void RemovalTurns::open() {
    state_->open = true;
    state_->busy += state_->waiting.size();
    for (auto& waiter : state_->waiting) waiter->cancel();
    state_->waiting.clear();
}

} // namespace cubicle::sandbox
