// A persistent sandbox as the store keeps it between servers, and the
// retention rules that decide which saved ones go.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/policy.hpp"

namespace cubicle::store {

struct SavedSandbox {
    std::string sandbox_id;
    std::string name;   // unique per owner
    std::string owner;  // the transport and principal ("stdio:local", "http:alice")
    std::string engine; // the Docker engine's id (/info ID) its volume lives on; empty: unknown
    std::string volume; // the named volume holding its /workspace: volume_of(sandbox_id)
    sandbox::SandboxSpec spec;  // as resolved at creation: image, limits, env (not its network's name)
    bool stateful = true;
    bool auto_install = true;
    std::int64_t created = 0;    // Unix seconds
    std::int64_t last_used = 0;  // Unix seconds: when it was last resumed or saved
    std::uint64_t size_bytes = 0;  // of its workspace when last saved
    std::string ended;  // why it was last saved: "stopped", "server exit", "expired"; empty while in use
};

// The only volume a record may name: never one a forged record chose.
std::string volume_of(std::string_view sandbox_id);

std::string to_json(const SavedSandbox& saved);
// Throws std::runtime_error when `text` is not a record of this version, or names a
// volume other than its sandbox's own.
SavedSandbox saved_sandbox_from_json(std::string_view text);

// A sandbox name: 1–64 letters, digits, '.', '_' and '-', starting with a letter or digit.
// Returns why `name` is not one, or nullopt.
std::optional<std::string> invalid_name(std::string_view name);

struct Retention {
    std::size_t most_saved = 10;       // --max-saved-sandboxes, per owner
    std::int64_t ttl_s = 7 * 86400;    // --saved-ttl-days, counted from last use
    std::uint64_t most_bytes = 0;      // --max-saved-mb, per owner (0: no limit)
};

// What retention removes from one owner's saved sandboxes (none of them in use):
// those unused for longer than the TTL, and the least recently used ones past the
// count or the bytes (`other_bytes`: what the owner's snapshots take). `keep` (the one
// just saved) always stays, and past the count or the bytes so does the most
// recently used one, so that a save never deletes what it saved.
std::vector<std::string> expired(std::vector<SavedSandbox> saved, const Retention& rules, std::int64_t now,
                                 std::uint64_t other_bytes = 0, std::string_view keep = {});

} // namespace cubicle::store
