// The pure part of sandbox lifetimes (lifetimes.hpp): when an idle sandbox is
// paused or an unused one expires, and the bounded record of why sandboxes ended.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace cubicle::sandbox {

using WallClock = std::chrono::system_clock;

// Why a sandbox made by initialize_sandbox is gone.
enum class EndReason { stopped, expired, server_exit, error };
std::string_view name_of(EndReason reason);

// What the watcher sees of one sandbox at a tick.
struct LifeState {
    std::chrono::steady_clock::time_point last_used;  // end of its last call (or its creation)
    std::optional<WallClock::time_point> expires_at;  // none: no ttl_s
    bool in_call = false;   // a tool call on it is under way
    bool busy = false;      // a program, a background run, a port or stream open in it
    bool pausable = false;  // a container of its own, on an engine that pauses
    bool paused = false;
};

enum class LifeStep { none, pause, expire };

// An expired sandbox ends even when paused or busy (a background run does not renew it),
// but never in the middle of a call; an idle one is paused after `idle_pause` (0: never).
LifeStep next_step(const LifeState& state, std::chrono::steady_clock::time_point now, WallClock::time_point wall_now,
                   std::chrono::seconds idle_pause);

struct EndedSandbox {
    std::string sandbox_id;
    EndReason reason;
    WallClock::time_point ended_at;
    std::int64_t ttl_s = 0;  // 0: it had none
};

// What a call on an ended sandbox is told: that it ended, when and why, and what to do.
std::string ended_message(const EndedSandbox& ended);

// The last `per_owner` sandboxes each principal saw end, newest last. One principal's
// record never shows another's.
class EndedRecord {
public:
    explicit EndedRecord(std::size_t per_owner = 32) : per_owner_(per_owner) {}
    void add(const std::string& owner, EndedSandbox ended);
    const EndedSandbox* find(const std::string& owner, std::string_view sandbox_id) const;
    const std::deque<EndedSandbox>& of(const std::string& owner) const;

private:
    std::size_t per_owner_;
    std::map<std::string, std::deque<EndedSandbox>> by_owner_;
};

} // namespace cubicle::sandbox
