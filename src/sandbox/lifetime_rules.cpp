#include "sandbox/lifetime_rules.hpp"

#include <fmt/format.h>

#include "common/utc_text.hpp"

namespace cubicle::sandbox {

std::string_view name_of(EndReason reason) {
    switch (reason) {
    case EndReason::stopped: return "stopped";
    case EndReason::expired: return "expired";
    case EndReason::server_exit: return "server exit";
    case EndReason::error: return "error";
    }
    return "error";
}

LifeStep next_step(const LifeState& state, std::chrono::steady_clock::time_point now, WallClock::time_point wall_now,
                   std::chrono::seconds idle_pause) {
    if (state.in_call) return LifeStep::none;
    if (state.expires_at && wall_now >= *state.expires_at) return LifeStep::expire;
    if (state.paused || !state.pausable || state.busy || idle_pause.count() <= 0) return LifeStep::none;
    return now - state.last_used >= idle_pause ? LifeStep::pause : LifeStep::none;
}

std::string ended_message(const EndedSandbox& ended) {
    auto when = utc_text(ended.ended_at);
    std::string what;
    switch (ended.reason) {
    case EndReason::expired:
        what = fmt::format("expired at {} (ttl_s {}: it was not used for that long)", when, ended.ttl_s);
        break;
    case EndReason::stopped:
        what = fmt::format("was stopped at {} (stop_sandbox)", when);
        break;
    case EndReason::server_exit:
        what = fmt::format("ended at {} when the server exited", when);
        break;
    case EndReason::error:
        what = fmt::format("ended at {}: its container died", when);
        break;
    }
    return fmt::format("sandbox {} {}; start a new one with initialize_sandbox", ended.sandbox_id, what);
}

void EndedRecord::add(const std::string& owner, EndedSandbox ended) {
    auto& list = by_owner_[owner];
    list.push_back(std::move(ended));
    while (list.size() > per_owner_) list.pop_front();
}

const EndedSandbox* EndedRecord::find(const std::string& owner, std::string_view sandbox_id) const {
    auto it = by_owner_.find(owner);
    if (it == by_owner_.end()) return nullptr;
    for (auto ended = it->second.rbegin(); ended != it->second.rend(); ++ended) {
        if (ended->sandbox_id == sandbox_id) return &*ended;
    }
    return nullptr;
}

const std::deque<EndedSandbox>& EndedRecord::of(const std::string& owner) const {
    static const std::deque<EndedSandbox> none;
    auto it = by_owner_.find(owner);
    return it == by_owner_.end() ? none : it->second;
}

} // namespace cubicle::sandbox
