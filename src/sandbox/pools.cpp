#include "sandbox/pools.hpp"

#include <algorithm>
#include <chrono>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/all_at_once.hpp"
#include "common/log.hpp"

namespace cubicle::sandbox {
namespace {

using Clock = Pool::Clock;

// How often unused pools are looked for.
constexpr auto watch_interval = std::chrono::seconds(1);
constexpr auto memory_reuse = std::chrono::seconds(1);

void forget_before(std::deque<Clock::time_point>& takes, Clock::time_point now) {
    while (!takes.empty() && now - takes.front() > Pool::demand_window) takes.pop_front();
}

void add(PoolStats& into, const PoolStats& from) {
    into.target += from.target;
    into.ready += from.ready;
    into.starting += from.starting;
    into.hits += from.hits;
    into.misses += from.misses;
    into.bypassed += from.bypassed;
    into.start_failures += from.start_failures;
}

} // namespace

Pools::Pools(asio::any_io_executor executor, SandboxSpec default_profile, PoolSettings settings, Pool::Launcher launch,
             Pool::Remover remove)
    : executor_(executor), settings_(settings), launch_(std::move(launch)), remove_(std::move(remove)),
      default_key_(profile_key(default_profile)), timer_(executor) {
    settings_.max = std::max(settings_.max, settings_.size);
    by_key_[default_key_] = make_pool(std::move(default_profile), settings_.size);
}

std::shared_ptr<Pool> Pools::make_pool(SandboxSpec profile, std::size_t floor) {
    auto settings = settings_;
    settings.size = floor;
    auto key = profile_key(profile);
    return std::make_shared<Pool>(executor_, std::move(profile), settings, launch_, remove_,
                                  [this, key] { return held_except(key); });
}

std::size_t Pools::held_except(const std::string& key) const {
    std::size_t held = 0;
    for (const auto& [other, pool] : by_key_) {
        if (other == key) continue;
        held += other == default_key_ ? std::max(pool->held(), settings_.size) : pool->held();
    }
    return held;
}

void Pools::start() {
    if (settings_.max == 0) return;
    by_key_.at(default_key_)->start();
    asio::co_spawn(executor_, watch(), asio::detached);
}

asio::awaitable<std::shared_ptr<Sandbox>> Pools::acquire(SandboxSpec spec, std::string owner) {
    if (settings_.max == 0 || stopped_) co_return nullptr;
    auto key = profile_key(spec);
    if (auto it = by_key_.find(key); it != by_key_.end()) {
        auto pool = it->second;  // alive while this take waits, even if dropped meanwhile
        co_return co_await pool->acquire(std::move(spec), std::move(owner));
    }
    ++bypassed_;
    // Never more pools than --pool-max has room for sandboxes.
    if (spec.network || spec.gpu || by_key_.size() >= settings_.max || held_except(key) >= settings_.max) co_return nullptr;
    auto now = Clock::now();
    auto& takes = asked_[key];
    forget_before(takes, now);
    takes.push_back(now);
    if (takes.size() < 2) co_return nullptr;
    // Asked for again: from now on its sandboxes are started ahead of the takes.
    // This take pays a full start as before; the next finds one ready.
    auto pool = make_pool(std::move(spec), 0);
    by_key_[key] = pool;
    log::debug("warm pool for a new profile: {}", key);
    pool->start(std::move(takes));
    asked_.erase(key);
    co_return nullptr;
}

asio::awaitable<void> Pools::recycle(std::shared_ptr<Sandbox> box) {
    auto it = by_key_.find(profile_key(box->spec()));
    if (it == by_key_.end() || stopped_) {
        co_await remove_(std::move(box));
        co_return;
    }
    auto pool = it->second;
    co_await pool->recycle(std::move(box));
}

PoolStats Pools::stats() const {
    PoolStats total = retired_;
    for (const auto& [key, pool] : by_key_) add(total, pool->stats());
    total.bypassed += bypassed_;
    total.profiles = by_key_.size();
    return total;
}

ContainerMemory Pools::memory() const {
    // Each read walks every process's page tables (a millisecond or more per
    // warm sandbox, on the one I/O thread): scrapes and status calls within a
    // second share one.
    auto now = Clock::now();
    if (memory_read_ && now - *memory_read_ < memory_reuse) return memory_;
    ContainerMemory total;
    for (const auto& [key, pool] : by_key_) total += pool->memory();
    memory_ = total;
    memory_read_ = now;
    return total;
}

asio::awaitable<void> Pools::watch() {
    while (!stopped_) {
        timer_.expires_after(watch_interval);
        auto [ec] = co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
        if (ec || stopped_) co_return;
        auto now = Clock::now();
        for (auto& [key, takes] : asked_) forget_before(takes, now);
        std::erase_if(asked_, [](const auto& entry) { return entry.second.empty(); });
        for (auto it = by_key_.begin(); it != by_key_.end();) {
            if (it->first == default_key_ || !it->second->unused()) {
                ++it;
                continue;
            }
            log::debug("warm pool dropped, unused: {}", it->first);
            auto counts = it->second->stats();
            counts.target = counts.ready = counts.starting = 0;
            add(retired_, counts);
            asio::co_spawn(executor_, retire(std::move(it->second)), asio::detached);
            it = by_key_.erase(it);
        }
    }
}

asio::awaitable<void> Pools::retire(std::shared_ptr<Pool> pool) {
    co_await pool->drain();
}

asio::awaitable<void> Pools::drain() {
    stopped_ = true;
    timer_.cancel();
    auto pools = std::move(by_key_);
    by_key_.clear();
    std::vector<asio::awaitable<void>> drains;
    for (auto& [key, pool] : pools) drains.push_back(retire(pool));
    co_await all_at_once(executor_, std::move(drains));
}

} // namespace cubicle::sandbox
