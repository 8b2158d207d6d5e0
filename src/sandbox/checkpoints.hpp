// The checkpoints of a sandbox's interpreters (checkpoint_session): which parked
// copies exist, the oldest dropped past the limit. The copies themselves are the
// agent's and the interpreter's (agent/checkpoint.h); this only keeps the books.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cubicle::sandbox {

struct Checkpoint {
    std::string id;                    // "ckpt-N", unique within its sandbox
    std::string language;
    std::uint32_t interpreter = 0;     // the exec id of the interpreter it is a copy of
    int pid = 0;                       // the parked copy, in the sandbox
    std::chrono::system_clock::time_point created;
    std::uint64_t memory_kb = 0;       // the interpreter's resident memory when it was taken
    bool files = false;                // a copy of the workspace was kept with it (checkpoint_tools.cpp)
};

class Checkpoints {
public:
    // A new id, never used before in this sandbox.
    std::string next_id() { return "ckpt-" + std::to_string(++made_); }
    // Keeps `checkpoint`; returns those dropped to keep at most `max` (the oldest).
    std::vector<Checkpoint> add(Checkpoint checkpoint, std::size_t max);
    // Forgets the checkpoints `live` says are gone (their interpreter ended).
    void forget_unless(const std::function<bool(const Checkpoint&)>& live);
    const Checkpoint* find(std::string_view id) const;
    // Its parked copy is now `pid` (a restore re-parks a fresh one); 0 forgets it.
    void replace_pid(std::string_view id, int pid);
    // A copy of the workspace was kept with it.
    void set_files(std::string_view id);
    const std::vector<Checkpoint>& list() const { return list_; }

private:
    std::vector<Checkpoint> list_;  // oldest first
    std::uint64_t made_ = 0;
};

} // namespace cubicle::sandbox
