#include "sandbox/pool.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/log.hpp"

namespace cubicle::sandbox {

Pool::Pool(asio::any_io_executor executor, SandboxSpec profile, PoolSettings settings, Launcher launch, Remover remove)
    : executor_(executor), profile_(std::move(profile)), settings_(settings), launch_(std::move(launch)),
      remove_(std::move(remove)), last_take_(std::chrono::steady_clock::now()), idle_timer_(executor) {}

void Pool::start() {
    if (settings_.size == 0) return;
    refill();
    asio::co_spawn(executor_, watch_idle(), asio::detached);
}

bool Pool::matches(const SandboxSpec& spec) const {
    // Per-sandbox environment travels with each execution, so it does not split the pool.
    return spec.image == profile_.image && spec.network == profile_.network && spec.gpu == profile_.gpu && spec.memory_mb == profile_.memory_mb &&
           spec.cpus == profile_.cpus && spec.pids_limit == profile_.pids_limit && spec.tmp_size_mb == profile_.tmp_size_mb &&
           spec.disk_mb == profile_.disk_mb && spec.files_limit == profile_.files_limit;
}

std::shared_ptr<Sandbox> Pool::take(const SandboxSpec& spec) {
    if (settings_.size == 0 || stopped_) return nullptr;
    if (!matches(spec)) {
        ++counts_.bypassed;
        return nullptr;
    }
    last_take_ = std::chrono::steady_clock::now();
    idle_ = false;
    std::shared_ptr<Sandbox> box;
    while (!ready_.empty() && !box) {
        box = std::move(ready_.front());
        ready_.pop_front();
        if (!box->alive()) {
            asio::co_spawn(executor_, remove_(std::move(box)), asio::detached);
            box.reset();
        }
    }
    ++(box ? counts_.hits : counts_.misses);
    refill();
    return box;
}

PoolStats Pool::stats() const {
    PoolStats stats = counts_;
    stats.target = settings_.size;
    stats.ready = ready_.size();
    stats.starting = launching_;
    return stats;
}

void Pool::refill() {
    while (!stopped_ && !idle_ && ready_.size() + launching_ < settings_.size && launching_ < settings_.refill_concurrency) {
        ++launching_;
        asio::co_spawn(executor_, launch_one(), asio::detached);
    }
}

asio::awaitable<void> Pool::launch_one() {
    std::shared_ptr<Sandbox> box;
    try {
        box = co_await launch_(profile_);
    } catch (const std::exception& e) {
        log::warning("warm pool: could not start a sandbox: {}", e.what());
        ++counts_.start_failures;
    }
    --launching_;
    if (!box) co_return;  // retried on the next take rather than in a tight loop
    if (stopped_ || idle_) {
        co_await remove_(std::move(box));
        co_return;
    }
    // Python is the default language: its interpreter is already running when
    // the sandbox is handed out, so a first cell costs only its own work.
    box->prewarm("python");
    ready_.push_back(std::move(box));
    refill();
}

asio::awaitable<void> Pool::watch_idle() {
    while (!stopped_) {
        idle_timer_.expires_after(std::min<std::chrono::steady_clock::duration>(settings_.idle, std::chrono::seconds(10)));
        auto [ec] = co_await idle_timer_.async_wait(asio::as_tuple(asio::use_awaitable));
        if (ec || stopped_) co_return;
        if (idle_ || ready_.empty() || std::chrono::steady_clock::now() - last_take_ < settings_.idle) continue;
        log::debug("warm pool idle for {} s: releasing {} sandbox(es)", settings_.idle.count(), ready_.size());
        idle_ = true;
        auto released = std::move(ready_);
        ready_.clear();
        for (auto& box : released) co_await remove_(std::move(box));
    }
}

asio::awaitable<void> Pool::drain() {
    stopped_ = true;
    idle_timer_.cancel();
    // Sandboxes still starting remove themselves once started (stopped_ is
    // set); wait for them so that nothing outlives the server.
    asio::steady_timer timer(executor_);
    for (int i = 0; launching_ > 0 && i < 1500; ++i) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    auto released = std::move(ready_);
    ready_.clear();
    for (auto& box : released) co_await remove_(std::move(box));
}

} // namespace cubicle::sandbox
