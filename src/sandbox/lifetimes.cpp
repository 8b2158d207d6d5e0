#include "sandbox/lifetimes.hpp"

#include <algorithm>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/all_at_once.hpp"
#include "common/log.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::sandbox {
namespace {

using Steady = std::chrono::steady_clock;

// How often the watcher looks: often enough that a short --idle-pause-s is kept to.
std::chrono::milliseconds tick_of(std::chrono::seconds idle_pause) {
    if (idle_pause.count() <= 0) return std::chrono::seconds(1);
    return std::clamp<std::chrono::milliseconds>(std::chrono::milliseconds(idle_pause) / 4, std::chrono::milliseconds(100),
                                                 std::chrono::seconds(1));
}

} // namespace

struct Lifetimes::Life {
    std::string id;
    std::string owner;
    std::string container_id;
    std::weak_ptr<Sandbox> box;
    bool pausable = false;
    std::chrono::seconds ttl{0};
    std::optional<WallClock::time_point> expires_at;
    Steady::time_point last_used = Steady::now();
    int calls = 0;
    enum class Freeze { running, pausing, paused, resuming } freeze = Freeze::running;
    // Cancelled when a pause or resume under way is over.
    std::shared_ptr<asio::steady_timer> change;

    void renew() {
        last_used = Steady::now();
        if (ttl.count() > 0) expires_at = WallClock::now() + ttl;
    }
    bool changing() const { return freeze == Freeze::pausing || freeze == Freeze::resuming; }
};

Lifetimes::Lifetimes(asio::any_io_executor executor, docker::Client& docker, std::chrono::seconds idle_pause, Ender end)
    : executor_(std::move(executor)), docker_(docker), idle_pause_(idle_pause), end_(std::move(end)) {}

void Lifetimes::adopt(const std::shared_ptr<Sandbox>& box, std::chrono::seconds ttl) {
    if (auto kept = lives_.find(box->id()); kept != lives_.end()) {
        // Asked for again (a live persistent sandbox by name): a new ttl_s, and paused it stays
        // until its next call.
        kept->second->ttl = ttl;
        kept->second->renew();
        return;
    }
    auto life = std::make_shared<Life>();
    life->id = box->id();
    life->owner = box->owner();
    life->container_id = box->container_id();
    life->box = box;
    life->pausable = !box->shared() && !box->throwaway();
    life->ttl = ttl;
    life->renew();
    lives_[box->id()] = std::move(life);
}

void Lifetimes::forget(const std::string& id) { lives_.erase(id); }

Lifetimes::Use::Use(std::shared_ptr<Life> life) : life_(std::move(life)) {
    ++life_->calls;
    life_->renew();
}

Lifetimes::Use& Lifetimes::Use::operator=(Use&& other) noexcept {
    if (this != &other) {
        end();
        life_ = std::move(other.life_);
    }
    return *this;
}

Lifetimes::Use::~Use() { end(); }

void Lifetimes::Use::end() {
    if (!life_) return;
    --life_->calls;
    life_->renew();
    life_.reset();
}

asio::awaitable<Lifetimes::Use> Lifetimes::use(std::string id, std::string owner) {
    auto it = lives_.find(id);
    if (it == lives_.end() || it->second->owner != owner) co_return Use();
    auto life = it->second;
    Use use(life);  // from here on the watcher leaves it alone
    co_await settled(life);
    if (life->freeze != Life::Freeze::paused) co_return std::move(use);
    auto box = life->box.lock();
    if (box && box->uses_agent()) {
        // The call goes on at once: its frames wait in the socket until the agent thaws, which
        // is about half the Engine's answer time (the Engine records the state after the thaw).
        // What speaks to the Engine about the container waits for the answer (thaw()).
        begin_resume(*life);
        asio::co_spawn(executor_, finish_resume(life), asio::detached);
    } else {
        co_await resume(life);  // Docker exec needs a running container
    }
    co_return std::move(use);
}

asio::awaitable<void> Lifetimes::thaw(std::string id) {
    auto it = lives_.find(id);
    if (it == lives_.end()) co_return;
    auto life = it->second;
    co_await settled(life);
    if (life->freeze == Life::Freeze::paused) co_await resume(life);
}

asio::awaitable<void> Lifetimes::thaw_all() {
    std::vector<asio::awaitable<void>> thaws;
    for (const auto& [id, life] : lives_) {
        if (life->freeze != Life::Freeze::running) thaws.push_back(thaw(id));
    }
    co_await all_at_once(executor_, std::move(thaws));
}

asio::awaitable<void> Lifetimes::settled(std::shared_ptr<Life> life) {
    while (life->changing()) {
        auto change = life->change;
        co_await change->async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<void> Lifetimes::pause(std::shared_ptr<Life> life) {
    life->freeze = Life::Freeze::pausing;
    auto change = life->change = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    try {
        co_await docker_.pause_container(life->container_id);
        life->freeze = Life::Freeze::paused;
        log::debug("sandbox {} paused after {} s idle", life->id, idle_pause_.count());
    } catch (const docker::Error& e) {
        life->freeze = Life::Freeze::running;
        // 404 and 409: this container is gone or not running; anything else is the engine's refusal
        // (a runtime without a freezer), said once.
        if (e.status() != 404 && e.status() != 409 && pauses_) {
            pauses_ = false;
            log::warning("the engine cannot pause containers ({}); idle sandboxes stay running", e.what());
        }
    } catch (const std::exception& e) {
        life->freeze = Life::Freeze::running;
        log::debug("pausing sandbox {}: {}", life->id, e.what());
    }
    change->cancel();
}

asio::awaitable<void> Lifetimes::resume(std::shared_ptr<Life> life) {
    begin_resume(*life);
    co_await finish_resume(std::move(life));
}

void Lifetimes::begin_resume(Life& life) {
    life.freeze = Life::Freeze::resuming;
    life.change = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
}

asio::awaitable<void> Lifetimes::finish_resume(std::shared_ptr<Life> life) {
    auto change = life->change;
    auto started = Steady::now();
    try {
        co_await docker_.unpause_container(life->container_id);
        log::debug("sandbox {} resumed in {:.1f} ms", life->id,
                   std::chrono::duration<double, std::milli>(Steady::now() - started).count());
    } catch (const std::exception& e) {
        // The call goes on: a container that cannot be thawed fails it with its own error.
        log::warning("resuming paused sandbox {}: {}", life->id, e.what());
    }
    life->freeze = Life::Freeze::running;
    change->cancel();
}

void Lifetimes::ended(const std::string& id, EndReason reason) {
    auto it = lives_.find(id);
    if (it == lives_.end()) return;
    const auto& life = *it->second;
    ended_.add(life.owner, EndedSandbox{life.id, reason, WallClock::now(), life.ttl.count()});
    lives_.erase(it);
}

std::optional<Lifetimes::View> Lifetimes::view(const std::string& id) const {
    auto it = lives_.find(id);
    if (it == lives_.end()) return std::nullopt;
    const auto& life = *it->second;
    // Paused once the Engine has said so; a resume under way is as good as done.
    return View{life.freeze == Life::Freeze::paused, life.ttl.count(), life.expires_at};
}

asio::awaitable<void> Lifetimes::watch() {
    asio::steady_timer timer(executor_);
    auto tick = tick_of(idle_pause_);
    while (!closed_) {
        timer.expires_after(tick);
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
        if (closed_) break;
        std::vector<std::shared_ptr<Life>> lives;
        for (const auto& [id, life] : lives_) lives.push_back(life);
        // One at a time, each looked at afresh: a call may have come while the last was handled.
        for (auto& life : lives) {
            if (closed_) break;
            auto box = life->box.lock();
            if (!box || !lives_.contains(life->id) || life->changing()) continue;
            // A container that died on its own is not paused (the Engine would refuse every tick).
            LifeState state{life->last_used, life->expires_at, life->calls > 0, box->busy(),
                            life->pausable && pauses_ && box->alive(), life->freeze == Life::Freeze::paused};
            box.reset();
            switch (next_step(state, Steady::now(), WallClock::now(), idle_pause_)) {
            case LifeStep::none: break;
            case LifeStep::pause: co_await pause(life); break;
            case LifeStep::expire:
                log::info("sandbox {} expired: unused for its ttl_s of {} s", life->id, life->ttl.count());
                try {
                    auto ending = end_(life->id, EndReason::expired);  // named: GCC 12 and temporaries in a co_await
                    co_await std::move(ending);
                } catch (const std::exception& e) {
                    log::warning("ending expired sandbox {}: {}", life->id, e.what());
                }
                break;
            }
        }
    }
}

} // namespace cubicle::sandbox
