#include "sandbox/pool.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/all_at_once.hpp"
#include "common/log.hpp"

namespace cubicle::sandbox {
namespace {

// How long a take waits for a server's first start, whose time is not known yet.
constexpr double first_start_patience = 15.0;

using Clock = Pool::Clock;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// Surplus sandboxes go once the pool has held more than its target for this
// long, one a second: a burst's worth of removals at once would compete for the
// CPU with the runs of a demand that comes back.
constexpr auto shrink_after = std::chrono::seconds(5);
constexpr auto reset_timeout = std::chrono::seconds(5);
// More starts at once than this only queue up in the daemon.
constexpr std::size_t max_refill_concurrency = 4;
// What an idle pooled sandbox costs the host (container, shim, an interpreter);
// the pool stays within half of the memory available.
constexpr std::uint64_t pooled_footprint = 64ull << 20;
// A server's first run has the host to itself until it ends, for up to this long:
// container starts and their interpreters beside an `import pandas` (1.5 s here)
// made it 1.4x slower than `docker run` of the same import. A call that comes
// meanwhile refills at once (acquire).
constexpr auto first_run_alone = std::chrono::seconds(5);
constexpr auto first_run_poll = std::chrono::milliseconds(50);

// How many more pooled sandboxes the host's memory allows (unbounded when
// unknown: then only --pool-max bounds the pool). Docker may run elsewhere; this is the
// local host's view, a safety net rather than a measurement of the engine.
std::size_t memory_allows() {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    std::uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:") return static_cast<std::size_t>(kib * 1024 / 2 / pooled_footprint);
    }
    return std::numeric_limits<std::size_t>::max() / 2;
}

// Runs `work`, a coroutine of `pool`, keeping the pool alive until it ends.
asio::awaitable<void> keeping(std::shared_ptr<Pool> pool, asio::awaitable<void> work) {
    co_await std::move(work);
}

} // namespace

std::string profile_key(const SandboxSpec& spec) {
    return fmt::format("{}|net={}|gpu={}|mem={}|cpus={}|pids={}|tmp={}|disk={}|files={}|runtime={}", spec.image, spec.network,
                       spec.gpu, spec.memory_mb, spec.cpus, spec.pids_limit, spec.tmp_size_mb, spec.disk_mb, spec.files_limit,
                       spec.runtime);
}

// A take that found the pool empty and waits for the next sandbox to come out.
struct Pool::Waiter {
    explicit Waiter(asio::any_io_executor executor) : timer(executor) {}
    asio::steady_timer timer;  // cancelled when a sandbox is handed over
    std::string owner;
    std::shared_ptr<Sandbox> box;
};

Pool::Pool(asio::any_io_executor executor, SandboxSpec profile, PoolSettings settings, Launcher launch, Remover remove,
           Neighbours held_elsewhere)
    : executor_(executor), profile_(std::move(profile)), key_(profile_key(profile_)), settings_(settings), launch_(std::move(launch)),
      remove_(std::move(remove)), held_elsewhere_(std::move(held_elsewhere)), last_take_(Clock::now()), idle_timer_(executor) {
    settings_.max = std::max(settings_.max, settings_.size);
}

void Pool::start(std::deque<Clock::time_point> earlier_takes) {
    if (settings_.max == 0) return;
    recent_takes_ = std::move(earlier_takes);
    refill();
    asio::co_spawn(executor_, keeping(shared_from_this(), watch_idle()), asio::detached);
}

std::size_t Pool::room() const {
    auto elsewhere = held_elsewhere_ ? held_elsewhere_() : 0;
    return settings_.max > elsewhere ? settings_.max - elsewhere : 0;
}

bool Pool::unused() const {
    return ready_.empty() && launching_ == 0 && recycling_ == 0 && waiters_.empty() && Clock::now() - last_take_ > demand_window;
}

double Pool::take_rate() const {
    return static_cast<double>(recent_takes_.size()) / std::chrono::duration<double>(demand_window).count();
}

double Pool::drain_rate() const {
    auto net = recent_takes_.size() > recent_returns_.size() ? recent_takes_.size() - recent_returns_.size() : 0;
    return static_cast<double>(net) / std::chrono::duration<double>(demand_window).count();
}

void Pool::forget_old(Clock::time_point now) {
    while (!recent_takes_.empty() && now - recent_takes_.front() > demand_window) recent_takes_.pop_front();
    while (!recent_returns_.empty() && now - recent_returns_.front() > demand_window) recent_returns_.pop_front();
}

std::size_t Pool::target() const {
    // Little's law: the sandboxes taken for good while one starts, and those taken
    // while one is being reset, must already be waiting. A take that finds none
    // waits for one in flight (acquire). The floor already covers that many: a
    // start beyond it costs the running calls far more CPU than a short wait for
    // a reset (a serial caller, 60 takes/s at 10 ms a reset, needs no third).
    auto in_flight = drain_rate() * start_latency_.count() + take_rate() * recycle_latency_.count();
    auto demand = static_cast<std::size_t>(std::ceil(in_flight));
    auto want = std::clamp(demand, settings_.size, settings_.max);
    if (want > settings_.size) want = std::max(settings_.size, std::min({want, room(), held() + memory_allows()}));
    return want;
}

std::shared_ptr<Sandbox> Pool::take(const std::string& owner) {
    // The longest waiting first (its interpreter has had the most time to start),
    // never one that served another principal.
    auto pick = std::find_if(ready_.begin(), ready_.end(), [&](const Entry& e) { return e.owner.empty() || e.owner == owner; });
    if (pick == ready_.end()) {
        // Another principal's leftovers would only block the refill for this one.
        if (!ready_.empty()) {
            remove_later(std::move(ready_.front().box));
            ready_.pop_front();
        }
        return nullptr;
    }
    auto box = std::move(pick->box);
    ready_.erase(pick);
    if (!box->alive()) {
        remove_later(std::move(box));
        return take(owner);
    }
    return box;
}

asio::awaitable<std::shared_ptr<Sandbox>> Pool::acquire(SandboxSpec spec, std::string owner) {
    if (settings_.max == 0 || stopped_) co_return nullptr;
    if (!matches(spec)) {
        ++counts_.bypassed;
        co_return nullptr;
    }
    auto now = Clock::now();
    last_take_ = now;
    idle_ = false;
    recent_takes_.push_back(now);
    forget_old(now);
    auto box = take(owner);
    // A take that finds nothing ready or under way is a miss even when it then
    // waits for the start it caused.
    bool under_way = launching_ + recycling_ > waiters_.size();
    refill();
    if (box || launching_ + recycling_ <= waiters_.size()) {
        ++(box ? counts_.hits : counts_.misses);
        co_return box;
    }
    // Something is on its way and unclaimed: it is ready sooner than a new start,
    // which would take a start's time from now while sharing the CPU with the one
    // under way. Waited for up to twice a start's time: one that is late is late
    // for want of CPU or of the daemon, which a start of our own would lack too
    // (a server's first start, 0.5 s assumed, took 0.7 s on a loaded 2-core host).
    // Before any start has been measured there is no estimate to go by: the start
    // under way is waited for until it succeeds or fails (a failure wakes the waits).
    auto waiter = std::make_shared<Waiter>(executor_);
    waiter->owner = std::move(owner);
    auto patience = warmed_ ? 2 * start_latency_ : std::chrono::duration<double>(first_start_patience);
    waiter->timer.expires_after(std::chrono::duration_cast<Clock::duration>(patience));
    waiters_.push_back(waiter);
    co_await waiter->timer.async_wait(use_tuple);
    std::erase(waiters_, waiter);
    ++(waiter->box && under_way ? counts_.hits : counts_.misses);
    co_return std::move(waiter->box);
}

void Pool::offer(Entry entry) {
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
        auto& waiter = **it;
        if (waiter.box || (!entry.owner.empty() && entry.owner != waiter.owner)) continue;
        waiter.box = std::move(entry.box);
        waiter.timer.cancel();
        waiters_.erase(it);
        return;
    }
    ready_.push_back(std::move(entry));
}

PoolStats Pool::stats() const {
    PoolStats stats = counts_;
    stats.target = target();
    stats.ready = ready_.size();
    stats.starting = launching_;
    return stats;
}

ContainerMemory Pool::memory() const {
    ContainerMemory total;
    for (const auto& entry : ready_) total += read_container_memory(entry.box->container_id());
    return total;
}

void Pool::refill() {
    if (stopped_ || idle_) return;
    auto want = target();
    auto have = ready_.size() + launching_ + recycling_;
    auto deficit = want > have ? want - have : 0;
    // The deeper the pool ran dry, the more starts at once.
    auto concurrency = std::clamp(deficit, settings_.refill_concurrency, std::max(settings_.refill_concurrency, max_refill_concurrency));
    // The first one alone, the rest once it is ready (launch_one refills): starts at once
    // share the host's CPU, and a client's first call waits for the first.
    if (!warmed_) concurrency = 1;
    while (deficit > 0 && launching_ < concurrency) {
        ++launching_;
        --deficit;
        asio::co_spawn(executor_, keeping(shared_from_this(), launch_one()), asio::detached);
    }
}

void Pool::remove_later(std::shared_ptr<Sandbox> box) {
    asio::co_spawn(executor_, remove_(std::move(box)), asio::detached);
}

asio::awaitable<void> Pool::launch_one() {
    std::shared_ptr<Sandbox> box;
    auto started = Clock::now();
    try {
        box = co_await launch_(profile_);
    } catch (const std::exception& e) {
        log::warning("warm pool: could not start a sandbox: {}", e.what());
        ++counts_.start_failures;
    }
    --launching_;
    if (!box) {
        // Retried on the next take rather than in a tight loop; those waiting start their own.
        for (auto& waiter : waiters_) {
            if (!waiter->box) waiter->timer.cancel();
        }
        co_return;
    }
    start_latency_ = 0.8 * start_latency_ + 0.2 * std::chrono::duration<double>(Clock::now() - started);
    if (stopped_ || idle_) {
        co_await remove_(std::move(box));
        co_return;
    }
    warmed_ = true;
    // Python is the default language: its interpreter is already running when
    // the sandbox is handed out, so a first cell costs only its own work. Not
    // when a take is waiting for it (a server's first call): its run comes at
    // once, and two Pythons importing beside it would take the CPU it needs; a
    // stateful sandbox gets its interpreter from Manager::create, a recycled one
    // its zygote.
    bool awaited = std::any_of(waiters_.begin(), waiters_.end(), [](const auto& waiter) { return !waiter->box; });
    if (awaited) {
        box->hold_zygote_back();
    } else {
        box->prewarm("python");
    }
    std::weak_ptr<Sandbox> first = box;
    offer({std::move(box), {}});
    // Container starts beside that first run would double its time on a small host.
    if (awaited) {
        asio::co_spawn(executor_, keeping(shared_from_this(), refill_after_run(std::move(first))), asio::detached);
    } else {
        refill();
    }
}

asio::awaitable<void> Pool::refill_after_run(std::weak_ptr<Sandbox> first) {
    auto until = Clock::now() + first_run_alone;
    asio::steady_timer pause(executor_);
    pause.expires_after(std::chrono::duration_cast<Clock::duration>(start_latency_));
    co_await pause.async_wait(use_tuple);
    // A short run (print(1)) has ended by now; a longer one is waited for.
    while (Clock::now() < until) {
        auto box = first.lock();
        if (stopped_ || !box || !box->alive() || !box->busy()) break;
        box.reset();
        pause.expires_after(first_run_poll);
        co_await pause.async_wait(use_tuple);
    }
    refill();
}

asio::awaitable<void> Pool::recycle(std::shared_ptr<Sandbox> box) {
    if (stopped_ || idle_ || !box->alive() || box->limit_hit() || !matches(box->spec())) {
        co_await remove_(std::move(box));
        co_return;
    }
    auto owner = box->owner();
    auto started = Clock::now();
    ++recycling_;
    std::string left;
    try {
        left = co_await box->reset(reset_timeout);
    } catch (const std::exception& e) {
        left = e.what();
    }
    --recycling_;
    recycle_latency_ = 0.8 * recycle_latency_ + 0.2 * std::chrono::duration<double>(Clock::now() - started);
    log::debug("sandbox {} reset in {} ms{}", box->id(),
               std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count(), left.empty() ? "" : ": " + left);
    if (!left.empty() || stopped_ || idle_ || held() >= room()) {
        if (!left.empty()) log::info("sandbox {} removed rather than recycled: {}", box->id(), left);
        co_await remove_(std::move(box));
        co_return;
    }
    recent_returns_.push_back(Clock::now());
    // It most likely serves throwaway runs again, which the zygote forks (it
    // outlives resets). Its interpreter, which the reset ended, starts again
    // only if a stateful sandbox is made of it (Manager::create): a Python start
    // per throwaway run would cost more CPU than the run itself.
    box->start_zygote();
    offer({std::move(box), std::move(owner)});
    refill();
}

asio::awaitable<void> Pool::watch_idle() {
    while (!stopped_) {
        idle_timer_.expires_after(std::chrono::seconds(1));
        auto [ec] = co_await idle_timer_.async_wait(use_tuple);
        if (ec || stopped_) co_return;
        auto now = Clock::now();
        forget_old(now);
        if (idle_ || ready_.empty()) continue;
        if (now - last_take_ >= settings_.idle) {
            log::debug("warm pool idle for {} s: releasing {} sandbox(es)", settings_.idle.count(), ready_.size());
            idle_ = true;
            auto released = std::move(ready_);
            ready_.clear();
            for (auto& entry : released) remove_later(std::move(entry.box));
            continue;
        }
        // Demand fell: the surplus above the target goes, oldest first. Whether
        // takes still trickle in does not matter, only that the target has been
        // lower for a while (demand_window plus shrink_after after a burst).
        if (ready_.size() <= target()) {
            surplus_since_.reset();
            continue;
        }
        if (!surplus_since_) surplus_since_ = now;
        if (now - *surplus_since_ < shrink_after) continue;
        log::debug("warm pool: {} ready above a target of {}: removing one", ready_.size(), target());
        remove_later(std::move(ready_.front().box));
        ready_.pop_front();
    }
}

asio::awaitable<void> Pool::drain() {
    stopped_ = true;
    idle_timer_.cancel();
    for (auto& waiter : waiters_) waiter->timer.cancel();
    // Sandboxes still starting or being reset remove themselves once done
    // (stopped_ is set); wait for them so that nothing outlives the server.
    asio::steady_timer timer(executor_);
    for (int i = 0; (launching_ > 0 || recycling_ > 0) && i < 1500; ++i) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(use_tuple);
    }
    auto released = std::move(ready_);
    ready_.clear();
    std::vector<asio::awaitable<void>> removals;
    for (auto& entry : released) removals.push_back(remove_(std::move(entry.box)));
    co_await all_at_once(executor_, std::move(removals));
}

} // namespace cubicle::sandbox
