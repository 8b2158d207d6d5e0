#include "sandbox/mirror.hpp"

#include <charconv>
#include <chrono>
#include <optional>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "docker/stream.hpp"
#include "docker/watchdog.hpp"

namespace cubicle::sandbox {
namespace {

using namespace std::chrono_literals;

// A copy back at the start and one to disk: bounded by the workspace's size, which
// the tmpfs bounds; generous for the largest one allowed (the script's own `timeout 600`
// and the container's exit).
constexpr auto copy_limit = 660s;
constexpr std::size_t line_max = 4096;   // its lines are short: more is not the mirror speaking
constexpr std::size_t stderr_kept = 2048;

// POSIX sh (dash), run as the sandbox user: /workspace is the volume on disk, /live the
// tmpfs. A copy is made whole in "next", synced, then becomes "current" by two renames
// through "old": a copy cut short leaves the last complete one, and a start takes "old"
// when a crash fell between the renames.
//  - The copy out is GNU tar reading the tmpfs, not cp: tar walks by directory
//    descriptors and never follows a symlink, so a program swapping a directory for a
//    symlink while the copy runs cannot make it read anything but the tmpfs (cp builds
//    paths, and a symlink into /workspace would copy the last copy into the next). Its
//    status comes through a file (dash has no pipefail): 1 is "a file changed as it was
//    read", the normal case of a live tree; 2 and up fail the copy.
//  - `chmod u+rX` on the tmpfs first: the user may have made a file of theirs
//    unreadable, which must not fail every copy; `chmod u+w` before a removal: tar keeps
//    a directory's mode, and rm cannot empty a read-only directory.
//  - The copy back at a start is cp: the sandbox is not running then, nothing races it.
//  - A line "last" on stdin, then its end: the server's stop (the sandbox is gone by then);
//    its end alone: the server died, and the sandbox's agent, which saw the same end, is
//    given two seconds to end its programs first. SIGTERM (a daemon stopping) copies too.
//  - A line "changed" while the sandbox runs (--persist-copy-s): a copy when anything in
//    the tmpfs changed since the last copy began ("unchanged" otherwise), told by ctime,
//    which no program can set back (mtime it can); /workspace/copied marks that moment
//    (after the copy's own chmod, which sets every ctime), and goes when a copy fails. A
//    walk that fails counts as a change.
constexpr const char* mirror_script = R"(set -u
save='set -u
for d in /workspace/next /workspace/old; do
    if [ -e "$d" ]; then chmod -R u+w "$d" 2>/dev/null; rm -rf "$d" || exit 1; fi
done
chmod -R u+rX /live 2>/dev/null
touch /workspace/copied || exit 1
mkdir /workspace/next || exit 1
{ tar -C /live --one-file-system --sparse -cf - .; echo $? > /workspace/next.status; } | tar -C /workspace/next -xpf - || exit 1
read -r made < /workspace/next.status && rm -f /workspace/next.status && [ "$made" -le 1 ] || exit 1
sync -f /workspace/next || exit 1
if [ -d /workspace/current ]; then mv /workspace/current /workspace/old || exit 1; fi
mv /workspace/next /workspace/current || exit 1
chmod -R u+w /workspace/old 2>/dev/null; rm -rf /workspace/old; sync -f /workspace
du -s -B1 /workspace/current | cut -f1'
copy() { if bytes=$(timeout 600 sh -c "$save"); then echo "saved $bytes"; else rm -f /workspace/copied; echo failed; fi; }
changed() {
    [ -e /workspace/copied ] || return 0
    found=$(timeout 600 find /live -cnewer /workspace/copied -print -quit 2>/dev/null) || return 0
    [ -n "$found" ]
}
if ! [ -w /workspace ]; then echo "the volume on disk is not writable by the sandbox user" >&2; echo failed; exit 1; fi
for kept in current old; do
    if [ -d "/workspace/$kept" ]; then cp -a --sparse=always "/workspace/$kept/." /live/ || { echo failed; exit 1; }; break; fi
done
touch /workspace/copied
echo ready
trap 'copy; exit 0' TERM
line=
while read -r line; do
    [ "$line" = last ] && break
    if [ "$line" = changed ] && ! changed; then echo unchanged; else copy; fi
done
[ "$line" = last ] || sleep 2
copy
)";

} // namespace

struct Mirror::Impl {
    docker::Client& docker;
    std::string container_id;
    std::string live_volume;
    std::unique_ptr<docker::RawStream> stream;
    docker::Demuxer demuxer;
    std::string out;     // stdout not yet read as lines
    std::string errors;  // the end of what it wrote to stderr
    bool ended = false;
    // One exchange with the script at a time (a periodic copy, the last copy, the removal).
    bool busy = false;
    std::unique_ptr<asio::steady_timer> turn_over;

    asio::awaitable<void> take_turn() {
        while (busy) {
            turn_over->expires_at(asio::steady_timer::time_point::max());
            co_await turn_over->async_wait(asio::as_tuple(asio::use_awaitable));
        }
        busy = true;
    }
    void end_turn() {
        busy = false;
        turn_over->cancel();
    }

    // Its next line on stdout; nullopt when it ended (or `limit` passed, said in `errors`:
    // it is closed then).
    asio::awaitable<std::optional<std::string>> next_line(std::chrono::milliseconds limit) {
        docker::Watchdog watchdog(co_await asio::this_coro::executor, [this] { stream->close(); });
        watchdog.arm(limit);
        char buffer[4096];
        while (true) {
            if (auto end = out.find('\n'); end != std::string::npos) {
                auto line = out.substr(0, end);
                out.erase(0, end + 1);
                co_return line;
            }
            if (ended || !stream || out.size() > line_max) {
                if (watchdog.expired()) errors = fmt::format("no answer within {} s", limit.count() / 1000);
                ended = true;
                co_return std::nullopt;
            }
            std::size_t got = 0;
            try {
                got = co_await stream->read_some(buffer, sizeof buffer);
            } catch (const std::exception&) {
                got = 0;
            }
            if (got == 0) {
                ended = true;
                continue;
            }
            bool ok = demuxer.feed(std::string_view(buffer, got), [this](docker::StreamKind kind, std::string_view data) {
                if (kind == docker::StreamKind::stderr_) {
                    errors.append(data);
                    if (errors.size() > stderr_kept) errors.erase(0, errors.size() - stderr_kept);
                } else {
                    out.append(data);
                }
            });
            if (!ok) ended = true;
        }
    }

    std::string why() const {
        auto text = errors;
        while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
        return text.empty() ? std::string("no reason given") : text;
    }

    // The container and the tmpfs go; failures are logged (the orphan sweep removes what is left).
    asio::awaitable<void> remove() {
        if (stream) stream->close();
        try {
            if (!container_id.empty()) co_await docker.remove_container(container_id);
            container_id.clear();
            co_await docker.remove_volume(live_volume);
        } catch (const std::exception& e) {
            log::warning("removing the mirror of the workspace {}: {}", live_volume, e.what());
        }
    }
};

Mirror::Mirror(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), live_volume_(impl_->live_volume) {}

Mirror::~Mirror() {
    if (impl_->stream) impl_->stream->close();
}

asio::awaitable<std::unique_ptr<Mirror>> Mirror::start(docker::Client& docker, const SandboxSpec& spec, const std::string& image,
                                                       const std::string& instance, const std::string& disk_volume) {
    // A name of its own each time: a tmpfs a dead server left is the orphan sweep's, by its labels.
    auto impl = std::make_unique<Impl>(Impl{docker, {}, "cubicle-live-" + spec.sandbox_id + "-" + random_hex(4)});
    impl->turn_over = std::make_unique<asio::steady_timer>(co_await asio::this_coro::executor);
    std::exception_ptr failure;
    try {
        co_await docker.create_volume(live_volume_config(spec, impl->live_volume, instance));
        auto config = mirror_config(spec, image, instance, impl->live_volume, disk_volume, mirror_script, docker.engine());
        impl->container_id = co_await docker.create_container(std::move(config), "cubicle-mirror-" + random_hex(6));
        impl->stream = co_await docker.attach(impl->container_id);
        co_await docker.start_container(impl->container_id);
        auto line = co_await impl->next_line(copy_limit);
        if (line != "ready") {
            throw ToolError(fmt::format("the saved files of sandbox {} could not be put back into its workspace of {} MiB and {} "
                                        "files: {}",
                                        spec.sandbox_id, spec.disk_mb, spec.files_limit, impl->why()));
        }
    } catch (...) {
        failure = std::current_exception();
    }
    if (failure) {
        co_await impl->remove();
        std::rethrow_exception(failure);
    }
    co_return std::unique_ptr<Mirror>(new Mirror(std::move(impl)));
}

namespace {

std::optional<std::uint64_t> saved_bytes(const std::optional<std::string>& line) {
    std::uint64_t bytes = 0;
    if (!line || !line->starts_with("saved ")) return std::nullopt;
    auto digits = std::string_view(*line).substr(6);
    if (std::from_chars(digits.data(), digits.data() + digits.size(), bytes).ec != std::errc()) return std::nullopt;
    return bytes;
}

} // namespace

asio::awaitable<Mirror::Copy> Mirror::copy_if_changed() {
    co_await impl_->take_turn();
    Copy result = Copy::failed;
    if (impl_->stream && !impl_->ended) {
        impl_->stream->send("changed\n");
        auto line = co_await impl_->next_line(copy_limit);
        if (line == "unchanged") result = Copy::unchanged;
        else if (saved_bytes(line)) result = Copy::saved;
        else log::warning("a copy of the workspace {} to disk failed: {}", live_volume_, impl_->why());
    }
    impl_->end_turn();
    co_return result;
}

asio::awaitable<std::optional<std::uint64_t>> Mirror::finish() {
    co_await impl_->take_turn();
    std::optional<std::uint64_t> copied;
    if (impl_->stream && !impl_->ended) {
        impl_->stream->send("last\n");
        impl_->stream->close_write();
        copied = saved_bytes(co_await impl_->next_line(copy_limit));
        if (!copied) log::warning("the last copy of the workspace {} to disk failed: {}", live_volume_, impl_->why());
    }
    co_await impl_->remove();
    impl_->end_turn();
    co_return copied;
}

asio::awaitable<void> Mirror::discard() {
    if (impl_->stream) impl_->stream->close();  // a copy under way ends at once
    co_await impl_->take_turn();
    co_await impl_->remove();
    impl_->end_turn();
}

} // namespace cubicle::sandbox
