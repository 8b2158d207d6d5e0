// A snapshot as the store keeps it: a sandbox's workspace at one moment (an archive
// beside the record) with what it takes to start a sandbox like it (image, limits,
// env), and the retention rule that weighs snapshots and saved sandboxes together.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/policy.hpp"
#include "store/saved.hpp"
#include "store/store.hpp"

namespace cubicle::store {

// The suffix of a snapshot's archive beside its record (Store::path_of).
inline constexpr std::string_view snapshot_archive = ".tar";

struct Snapshot {
    std::string snapshot_id;
    std::string name;              // the caller's label; may be empty
    std::string owner;             // the principal ("local" on stdio)
    std::string source_sandbox_id;
    sandbox::SandboxSpec spec;     // the source's: image, limits, env
    bool stateful = true;
    bool auto_install = true;
    std::int64_t created_ms = 0;   // Unix milliseconds: snapshots taken in one second keep their order
    std::uint64_t size_bytes = 0;  // of its archive
    bool complete = false;         // false while it is being taken (its archive is not whole yet)
};

std::string to_json(const Snapshot& snapshot);
// Throws std::runtime_error when `text` is not a snapshot record of this version.
Snapshot snapshot_from_json(std::string_view text);

// A snapshot's label: at most 64 characters of letters, digits, ' ', '.', '_' and '-'.
// Returns why `name` is not one, or nullopt.
std::optional<std::string> invalid_snapshot_name(std::string_view name);

// Every snapshot record in `store` that parses (a broken one is skipped: `broken` gets its key).
std::vector<Snapshot> snapshot_records(const Store& store, std::vector<std::string>* broken = nullptr);

// What retention removes from one owner's saved sandboxes and snapshots (none of them in
// use): those older than the TTL (a saved sandbox counted from its last use, a snapshot
// from its creation), the oldest past --max-saved-sandboxes or --max-snapshots, and the
// oldest of both together past --max-saved-mb. The newest of each kind stays whatever
// the counts and bytes: neither a save nor a snapshot deletes what it just kept.
struct Expired {
    std::vector<std::string> sandboxes;
    std::vector<std::string> snapshots;
};
// `keep` (the one just saved or taken) always stays, even past the TTL.
Expired expired_together(std::vector<SavedSandbox> saved, std::vector<Snapshot> snapshots, const Retention& rules, std::int64_t now,
                         std::string_view keep = {});

} // namespace cubicle::store
