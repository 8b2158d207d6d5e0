// Snapshots of sandboxes' workspaces (snapshot_sandbox, fork_sandbox,
// initialize_sandbox {from_snapshot}): taking one, filling a new sandbox from
// one, finding, listing and removing them. The archive is made and unpacked by
// tar running as the sandbox user through its agent, so it works alike for a
// workspace on tmpfs, on a persistent sandbox's volume and in a pooled container,
// and reaches nothing that user could not (docs/persistence.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "config.hpp"
#include "sandbox/keeper.hpp"
#include "sandbox/sandbox.hpp"
#include "store/snapshot.hpp"

namespace cubicle::sandbox {

// A snapshot while it is taken, for those that fill sandboxes from it as it grows (fork_sandbox):
// its record (id and settings) once its archive is open, and whether that is whole or failed.
struct Growing {
    std::optional<store::Snapshot> snapshot;
    bool done = false;
    bool failed = false;
};

class Snapshots {
public:
    Snapshots(Keeper& keeper, const Config& config);

    // Archives `box`'s workspace (not its memory) for `owner`, with its spec and settings.
    // Refused, leaving nothing, when the archive would be larger than the workspace can
    // hold or than --max-saved-mb allows. Applies the retention rules afterwards.
    // `kept` false: a fork's own snapshot, deleted once its copies are made unless `keep` is
    // called; it is not fsynced and pushes no older snapshot out. `growing`, if any, follows it.
    asio::awaitable<store::Snapshot> take(std::shared_ptr<Sandbox> box, std::string owner, std::string name, bool kept = true,
                                          std::shared_ptr<Growing> growing = nullptr);
    // What a sandbox like `box` is made of: its spec without what was its own (network, volume, id).
    static SandboxSpec spec_like(const Sandbox& box);
    // Keeps a snapshot taken with `kept` false for good: on disk, and counted by retention.
    asio::awaitable<void> keep(store::Snapshot snapshot);
    // Unpacks `snapshot` into `box`'s workspace and restarts its interpreters, so that
    // they see what it brought (packages installed with --user into the workspace).
    asio::awaitable<void> restore(std::shared_ptr<Sandbox> box, store::Snapshot snapshot);
    // The same from a snapshot still being taken: its archive is read as it grows, so that
    // the copies of a fork are filled while the source is archived. Throws ToolError when
    // the taking fails.
    asio::awaitable<void> restore_growing(std::shared_ptr<Sandbox> box, std::shared_ptr<Growing> growing);

    // `owner`'s snapshot `id`. Throws ToolError when there is none: another principal's
    // snapshot gets the same answer as an id that never existed.
    store::Snapshot get(const std::string& id, const std::string& owner);
    // `owner`'s complete snapshots, oldest first.
    std::vector<store::Snapshot> list(const std::string& owner);
    // Removes `owner`'s snapshot `id` with its archive. Throws ToolError when there is none
    // or when it is being taken right now.
    void remove(const std::string& id, const std::string& owner);

private:
    asio::awaitable<void> unpack(std::shared_ptr<Sandbox> box, store::Snapshot snapshot, std::shared_ptr<Growing> growing);
    // The most bytes a snapshot of `box` may take, and which rule says so.
    struct Bound {
        std::uint64_t bytes;
        std::string why;
    };
    Bound bound_for(const Sandbox& box) const;

    Keeper& keeper_;
    const Config& config_;
};

} // namespace cubicle::sandbox
