// A deadline for one step of I/O at a time (see Watchdog).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

namespace cubicle::docker {

// Runs `on_expire` (which cancels the I/O of a request) when a step outlives
// its deadline. The timer's handler may run after the watchdog is gone, so
// what it needs lives in shared state, and each arm() has its own generation:
// a stale expiry never cancels a later step.
class Watchdog {
public:
    Watchdog(boost::asio::any_io_executor executor, std::function<void()> on_expire)
        : state_(std::make_shared<State>(State{boost::asio::steady_timer(std::move(executor)), std::move(on_expire)})) {}
    ~Watchdog() {
        state_->on_expire = nullptr;
        state_->timer.cancel();
    }
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    // Starts the clock for the next step.
    void arm(std::chrono::milliseconds limit) {
        auto generation = ++state_->generation;
        state_->timer.expires_after(limit);
        state_->timer.async_wait([state = state_, generation](boost::system::error_code ec) {
            if (ec || generation != state->generation || !state->on_expire) return;
            state->expired = true;
            state->on_expire();
        });
    }
    bool expired() const { return state_->expired; }

private:
    struct State {
        boost::asio::steady_timer timer;
        std::function<void()> on_expire;
        unsigned generation = 0;
        bool expired = false;
    };
    std::shared_ptr<State> state_;
};

} // namespace cubicle::docker
