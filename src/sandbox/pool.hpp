// The warm-container scheduler: started, locked-down sandboxes of one profile
// kept ready (sandbox/pools.hpp keeps a pool per profile in demand), so that a
// new sandbox costs a hand-over instead of a container start. Its size follows
// demand, between its floor (--pool-size) and what --pool-max leaves it: the
// sandboxes taken and not given back per second times how long a container
// takes to start, plus those taken per second times how long a reset takes
// (Little's law for both ways a sandbox comes back).
// A throwaway sandbox comes back after its run, reset to pristine by its
// agent and verified (Sandbox::reset), and serves only the same principal
// again; anything that fails the reset is removed instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "sandbox/container_memory.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::sandbox {

// What /metrics reports about the pool.
struct PoolStats {
    std::size_t target = 0;     // sandboxes it wants ready now (--pool-size up to --pool-max)
    std::size_t ready = 0;      // waiting to be taken now
    std::size_t starting = 0;   // being started now
    std::uint64_t hits = 0;     // takes served by a sandbox ready or already under way
    std::uint64_t misses = 0;   // takes that found none ready nor under way
    std::uint64_t bypassed = 0; // takes of a profile without a pool (network, GPU, not yet in demand)
    std::uint64_t start_failures = 0;
    std::size_t profiles = 0;   // pools now, one per profile in demand (Pools)
};

struct PoolSettings {
    std::size_t size = 2;            // the floor: kept ready, and what the pool starts with
    std::size_t max = 16;            // the ceiling, however high demand gets, shared with the other pools
    std::size_t refill_concurrency = 1;  // starts at once at the floor; more when the deficit is larger
    std::chrono::seconds idle{300};  // emptied after this long without a take (shrunk to the floor well before)
};

// What makes two sandboxes interchangeable: everything their container was
// created with. Per-sandbox environment travels with each execution instead.
std::string profile_key(const SandboxSpec& spec);

// Owned through a shared_ptr (Pools drops idle pools): its background work keeps it alive.
class Pool : public std::enable_shared_from_this<Pool> {
public:
    using Clock = std::chrono::steady_clock;
    using Launcher = std::function<asio::awaitable<std::shared_ptr<Sandbox>>(SandboxSpec)>;
    using Remover = std::function<asio::awaitable<void>(std::shared_ptr<Sandbox>)>;
    // How many sandboxes the other pools hold, counted against settings.max.
    using Neighbours = std::function<std::size_t()>;

    // Demand is the takes of this recent past.
    static constexpr auto demand_window = std::chrono::seconds(10);

    Pool(asio::any_io_executor executor, SandboxSpec profile, PoolSettings settings, Launcher launch, Remover remove,
         Neighbours held_elsewhere = {});

    // Starts filling the pool and watching for idleness; `earlier_takes` of its
    // profile, from before the pool existed, are the demand it starts from.
    void start(std::deque<Clock::time_point> earlier_takes = {});
    // A ready sandbox for `owner` if `spec` is the pooled profile: one waiting,
    // or else the next one to come out of a start or a reset already under way
    // (sooner than a new container), for at most twice the time a start takes.
    // nullptr when there is none; the pool refills in the background either way.
    asio::awaitable<std::shared_ptr<Sandbox>> acquire(SandboxSpec spec, std::string owner);
    // Takes back a throwaway sandbox after its run: reset, verified and pooled
    // for its owner again, or removed.
    asio::awaitable<void> recycle(std::shared_ptr<Sandbox> box);
    PoolStats stats() const;
    // What its ready sandboxes hold now, read from the host (container_memory.hpp).
    ContainerMemory memory() const;
    // Stops refilling and removes every pooled sandbox.
    asio::awaitable<void> drain();

    // What the pool aims to keep ready now (for status and tests).
    std::size_t target() const;
    std::size_t ready() const { return ready_.size(); }
    // What counts against --pool-max: ready and starting.
    std::size_t held() const { return ready_.size() + launching_; }
    // Holds nothing, has nothing under way and saw no take within the demand window.
    bool unused() const;

private:
    struct Entry {
        std::shared_ptr<Sandbox> box;
        std::string owner;  // the principal a recycled sandbox served; empty: never used
    };
    struct Waiter;

    bool matches(const SandboxSpec& spec) const { return profile_key(spec) == key_; }
    // How many the pool may hold with what the other pools hold.
    std::size_t room() const;
    std::shared_ptr<Sandbox> take(const std::string& owner);
    // Hands a ready sandbox to the first waiter that may have it, else pools it.
    void offer(Entry entry);
    void refill();
    // refill() once the server's first run (in `first`, which a take waited for) has
    // had a start's time and has ended (its sandbox reset, stopped or idle), or
    // after first_run_alone at most.
    asio::awaitable<void> refill_after_run(std::weak_ptr<Sandbox> first);
    void remove_later(std::shared_ptr<Sandbox> box);
    asio::awaitable<void> launch_one();
    asio::awaitable<void> watch_idle();
    // Sandboxes per second taken, and taken and not given back (recycled), recently.
    double take_rate() const;
    double drain_rate() const;
    void forget_old(Clock::time_point now);

    asio::any_io_executor executor_;
    SandboxSpec profile_;
    std::string key_;
    PoolSettings settings_;
    Launcher launch_;
    Remover remove_;
    Neighbours held_elsewhere_;
    std::deque<Entry> ready_;
    std::deque<std::shared_ptr<Waiter>> waiters_;
    std::size_t launching_ = 0;
    std::size_t recycling_ = 0;
    bool stopped_ = false;
    bool idle_ = false;  // emptied for idleness; refills on the next take
    bool warmed_ = false;  // a sandbox of its own has been ready once
    Clock::time_point last_take_;
    std::optional<Clock::time_point> surplus_since_;  // since when it holds more ready than its target
    std::deque<Clock::time_point> recent_takes_;    // within the demand window
    std::deque<Clock::time_point> recent_returns_;  // recycled, within the window
    std::chrono::duration<double> start_latency_{0.5};   // moving averages, measured
    std::chrono::duration<double> recycle_latency_{0.02};
    PoolStats counts_;  // the counters; the gauges are read when asked
    asio::steady_timer idle_timer_;
};

} // namespace cubicle::sandbox
