// The warm-container scheduler: started, locked-down sandboxes kept ready for
// the server's default profile, so that a new sandbox costs a hand-over
// instead of a container start. A pooled sandbox serves exactly one client
// and is never reused after it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "sandbox/sandbox.hpp"

namespace cubicle::sandbox {

// What /metrics reports about the pool.
struct PoolStats {
    std::size_t target = 0;     // sandboxes it keeps ready (--pool-size)
    std::size_t ready = 0;      // waiting to be taken now
    std::size_t starting = 0;   // being started now
    std::uint64_t hits = 0;     // takes of the pooled profile served from the pool
    std::uint64_t misses = 0;   // takes of the pooled profile that found none ready
    std::uint64_t bypassed = 0; // takes of another profile (network, other image or limits)
    std::uint64_t start_failures = 0;
};

struct PoolSettings {
    std::size_t size = 2;            // sandboxes kept ready
    std::size_t refill_concurrency = 1;
    std::chrono::seconds idle{300};  // emptied after this long without a take
};

class Pool {
public:
    using Launcher = std::function<asio::awaitable<std::shared_ptr<Sandbox>>(SandboxSpec)>;
    using Remover = std::function<asio::awaitable<void>(std::shared_ptr<Sandbox>)>;

    Pool(asio::any_io_executor executor, SandboxSpec profile, PoolSettings settings, Launcher launch, Remover remove);

    // Starts filling the pool and watching for idleness.
    void start();
    // A ready sandbox if `spec` is the pooled profile and one is waiting;
    // nullptr otherwise. Either way the pool refills in the background.
    std::shared_ptr<Sandbox> take(const SandboxSpec& spec);
    PoolStats stats() const;
    // Stops refilling and removes every pooled sandbox.
    asio::awaitable<void> drain();

private:
    bool matches(const SandboxSpec& spec) const;
    void refill();
    asio::awaitable<void> launch_one();
    asio::awaitable<void> watch_idle();

    asio::any_io_executor executor_;
    SandboxSpec profile_;
    PoolSettings settings_;
    Launcher launch_;
    Remover remove_;
    std::deque<std::shared_ptr<Sandbox>> ready_;
    std::size_t launching_ = 0;
    bool stopped_ = false;
    bool idle_ = false;  // emptied for idleness; refills on the next take
    std::chrono::steady_clock::time_point last_take_;
    PoolStats counts_;  // the counters; the gauges are read when asked
    asio::steady_timer idle_timer_;
};

} // namespace cubicle::sandbox
