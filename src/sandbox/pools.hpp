// The warm pools of every profile in demand: the default profile's always
// (its floor is --pool-size), another's once it is asked for again within the
// demand window (floor 0: only demand keeps it; dropped once it has emptied).
// Together they hold at most --pool-max sandboxes, the default floor first.
// Network and GPU sandboxes are never pooled: a network sandbox joins the
// egress network, which exists only once one is asked for and goes at exit,
// and a warm GPU sandbox would hold devices for nobody.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "sandbox/pool.hpp"

namespace cubicle::sandbox {

class Pools {
public:
    // `settings` are the default profile's; another profile's pool has the same
    // but a floor of 0. settings.max == 0: no pool at all.
    Pools(asio::any_io_executor executor, SandboxSpec default_profile, PoolSettings settings, Pool::Launcher launch,
          Pool::Remover remove);

    void start();
    // A ready sandbox of `spec`'s profile for `owner` (Pool::acquire), or nullptr.
    asio::awaitable<std::shared_ptr<Sandbox>> acquire(SandboxSpec spec, std::string owner);
    // Takes back a throwaway sandbox: into its profile's pool (Pool::recycle), or removed.
    asio::awaitable<void> recycle(std::shared_ptr<Sandbox> box);
    // Summed over every pool, those dropped included (counters never go back).
    PoolStats stats() const;
    // What the sandboxes ready in every pool hold now.
    ContainerMemory memory() const;
    // Stops every pool and removes what they hold.
    asio::awaitable<void> drain();

private:
    std::shared_ptr<Pool> make_pool(SandboxSpec profile, std::size_t floor);
    // What the pools of profiles other than `key` hold; the default pool counts for at least its floor.
    std::size_t held_except(const std::string& key) const;
    // Drops the pools of other profiles once unused, and forgets old demand.
    asio::awaitable<void> watch();
    asio::awaitable<void> retire(std::shared_ptr<Pool> pool);

    asio::any_io_executor executor_;
    PoolSettings settings_;
    Pool::Launcher launch_;
    Pool::Remover remove_;
    std::string default_key_;
    std::map<std::string, std::shared_ptr<Pool>> by_key_;  // by profile_key
    // Recent takes of profiles without a pool: the second within the window makes one.
    std::map<std::string, std::deque<Pool::Clock::time_point>> asked_;
    PoolStats retired_;  // the counters of dropped pools
    mutable ContainerMemory memory_;  // the last read, and when
    mutable std::optional<Pool::Clock::time_point> memory_read_;
    std::uint64_t bypassed_ = 0;
    bool stopped_ = false;
    asio::steady_timer timer_;
};

} // namespace cubicle::sandbox
