// A persistent sandbox's workspace, kept on disk with a quota the kernel holds.
//
// While the sandbox runs its /workspace is a tmpfs like every sandbox's (the kernel
// bounds its size and file count), but a named one, shared with a second, small
// container: the mirror, of an image the operator trusts (the default image, never the
// sandbox's own). It runs a shell as the sandbox user with that tmpfs and the sandbox's
// volume on disk mounted, and nothing else; the sandbox's programs never see the disk,
// so what reaches it is a copy of a bounded tree, made by GNU tar (hard links and holes
// kept, never following a symlink). The mirror
//  - at its start copies the saved files back into the tmpfs, then says "ready";
//  - copies the tmpfs to disk every --persist-copy-s while the sandbox runs, when
//    anything in it changed;
//  - copies the tmpfs to disk when its stdin ends: stop_sandbox and the server's exit
//    end it, and so does the server's death, SIGKILL included (the Engine ends a dead
//    client's attach stream); the Engine's SIGTERM (a daemon stopping) makes it copy too.
// A copy is made whole and synced in a new directory, then replaces the last one by
// renames: a copy cut short leaves the last complete one in place (docs/persistence.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>

#include "docker/client.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

class Mirror {
public:
    // Makes the sandbox's tmpfs (spec.sandbox_id's, of spec.disk_mb) and starts its mirror
    // from `image` with `disk_volume`; returns once the files saved there are back in the
    // tmpfs. Throws ToolError when they cannot be (they no longer fit, say); nothing is
    // left then.
    static asio::awaitable<std::unique_ptr<Mirror>> start(docker::Client& docker, const SandboxSpec& spec, const std::string& image,
                                                          const std::string& instance, const std::string& disk_volume);
    ~Mirror();
    Mirror(const Mirror&) = delete;
    Mirror& operator=(const Mirror&) = delete;

    // The named tmpfs volume the sandbox mounts at /workspace.
    const std::string& live_volume() const { return live_volume_; }
    // A copy while the sandbox runs when its files changed since the last one began
    // (--persist-copy-s); the last complete copy stays when it fails (logged).
    enum class Copy { saved, unchanged, failed };
    asio::awaitable<Copy> copy_if_changed();
    // A last copy (once the sandbox's programs are gone), then the mirror and the tmpfs
    // go. The copy's size on disk; nullopt when it failed (logged): the previous one stays.
    asio::awaitable<std::optional<std::uint64_t>> finish();
    // The mirror and the tmpfs go without a copy (the sandbox is being deleted, or
    // never started).
    asio::awaitable<void> discard();

private:
    struct Impl;
    explicit Mirror(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
    std::string live_volume_;
};

} // namespace cubicle::sandbox
