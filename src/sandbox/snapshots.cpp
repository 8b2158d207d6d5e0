#include "sandbox/snapshots.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/cancellation.hpp"
#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"

namespace cubicle::sandbox {
namespace {

// Generous: 100 MB take about a second; a full workspace of several GiB on a slow disk longer.
constexpr std::uint64_t archive_timeout_ms = 600'000;
// Tar adds a 512-byte header and up to 511 bytes of padding per entry, and ends the archive
// with a record of its own.
constexpr std::uint64_t archive_bytes_per_entry = 1536;
constexpr std::uint64_t archive_slack = 1 << 20;
// While a snapshot is unpacked, tar reports every 100 records (of 10 KiB) it has read; the
// archive is fed at most `feed_window` ahead of that, so that neither this server nor the
// sandbox's agent ever holds more of it than that, however large it is.
constexpr std::uint64_t feed_chunk = 1 << 20;
constexpr std::uint64_t feed_window = 16 << 20;
constexpr std::uint64_t bytes_per_checkpoint = 100 * 10240;
constexpr std::string_view checkpoint_mark = "#cubicle-read";
constexpr std::size_t most_error_bytes = 2000;
// How often a fork's copy looks whether the archive it follows has grown.
constexpr auto growth_poll = std::chrono::milliseconds(5);

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string mib(std::uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

class Fd {
public:
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }
    // Closes now, reporting the error (a write the disk refused shows here on some file systems).
    int close() {
        int result = ::close(fd_);
        fd_ = -1;
        return result;
    }

private:
    int fd_;
};

bool write_all(int fd, std::string_view data) {
    while (!data.empty()) {
        auto n = ::write(fd, data.data(), data.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
}

void append_bounded(std::string& to, std::string_view data) {
    if (to.size() < most_error_bytes) to.append(data.substr(0, most_error_bytes - to.size()));
}

// What tar said, for an error message.
std::string said(const std::string& errors) {
    auto text = errors;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text.empty() ? std::string("no message") : text;
}

// An archive being written from tar's output.
struct Taking {
    explicit Taking(int fd, std::uint64_t bound) : fd(fd), bound(bound) {}
    int fd;
    std::uint64_t bound;
    std::uint64_t bytes = 0;
    bool over = false;
    int write_error = 0;
    std::string errors;
    std::shared_ptr<Cancellation> stop = std::make_shared<Cancellation>();
};

// An archive being fed to tar: how far tar has read, and whether it still runs.
struct Feeding {
    explicit Feeding(asio::any_io_executor executor) : wake(executor) {}
    asio::steady_timer wake;  // cancelled whenever something here changes
    std::uint64_t checkpoints = 0;
    std::string line;  // tar's stderr up to its next newline
    std::string errors;
    bool done = false;
    ExecResult result;
    std::exception_ptr failure;

    void notify() { wake.cancel(); }
    // Until something here changes, or `most` has passed.
    asio::awaitable<void> changed(std::chrono::milliseconds most = std::chrono::hours(1)) {
        wake.expires_after(most);
        co_await wake.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    void heard(std::string_view data) {
        for (char c : data) {
            if (c != '\n') {
                if (line.size() < 4096) line.push_back(c);
                continue;
            }
            if (line.find(checkpoint_mark) != std::string::npos) {
                ++checkpoints;
            } else {
                append_bounded(errors, line + "\n");
            }
            line.clear();
        }
        notify();
    }
};

asio::awaitable<void> run_unpacking(std::shared_ptr<Sandbox> box, agent::RunRequest request, RunOptions options,
                                    std::shared_ptr<Feeding> feeding) {
    try {
        OutputSink sink = [feeding](docker::StreamKind kind, std::string_view data) {
            if (kind == docker::StreamKind::stderr_) feeding->heard(data);
        };
        feeding->result = co_await box->run(std::move(request), std::move(sink), nullptr, std::move(options));
    } catch (...) {
        feeding->failure = std::current_exception();
    }
    feeding->done = true;
    feeding->notify();
}

} // namespace

Snapshots::Snapshots(Keeper& keeper, const Config& config) : keeper_(keeper), config_(config) {}

Snapshots::Bound Snapshots::bound_for(const Sandbox& box) const {
    const auto& spec = box.spec();
    Bound bound{(static_cast<std::uint64_t>(std::max(spec.disk_mb, 0)) << 20) +
                    static_cast<std::uint64_t>(std::max(spec.files_limit, 0)) * archive_bytes_per_entry + archive_slack,
                fmt::format("what its workspace can hold (disk_mb {})", spec.disk_mb)};
    if (config_.max_saved_mb > 0) {
        std::uint64_t saved = static_cast<std::uint64_t>(config_.max_saved_mb) << 20;
        if (saved < bound.bytes) {
            bound = {saved, fmt::format("--max-saved-mb {}, which your snapshots and saved sandboxes share (the oldest of "
                                        "them make room for a new one)",
                                        config_.max_saved_mb)};
        }
    }
    return bound;
}

SandboxSpec Snapshots::spec_like(const Sandbox& box) {
    auto spec = box.spec();
    spec.network_name.clear();
    spec.proxy_url.clear();
    spec.workspace_volume.clear();
    spec.sandbox_id.clear();
    return spec;
}

asio::awaitable<store::Snapshot> Snapshots::take(std::shared_ptr<Sandbox> box, std::string owner, std::string name, bool kept,
                                                 std::shared_ptr<Growing> growing) {
    if (auto problem = store::invalid_snapshot_name(name)) throw ToolError("name: " + *problem);
    if (!box->uses_agent()) throw ToolError("snapshots need the sandbox's agent, and this sandbox runs programs through Docker exec");
    const auto& store = keeper_.store();
    store::Snapshot snapshot;
    snapshot.snapshot_id = "snap-" + random_hex(6);
    snapshot.name = std::move(name);
    snapshot.owner = keeper_.qualified(owner);
    snapshot.source_sandbox_id = box->id();
    snapshot.spec = spec_like(*box);
    snapshot.stateful = box->stateful();
    snapshot.auto_install = box->auto_install();
    snapshot.created_ms = now_ms();
    const auto& id = snapshot.snapshot_id;
    // Held while it is taken: retention and delete_snapshot leave it alone, and a record that
    // stays incomplete and unheld is what a server that died meanwhile left (retention removes it).
    auto hold = store.try_hold(store::snapshots, id);
    if (!hold) throw ToolError("a new snapshot's record is held by another process; try again");
    auto bound = bound_for(*box);
    auto path = store.path_of(store::snapshots, id, store::snapshot_archive);
    std::exception_ptr failure;
    try {
        store.write(store::snapshots, id, store::to_json(snapshot));
        Fd file(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
        if (file.get() < 0) throw ToolError(fmt::format("cannot write the snapshot to {}: {}", path.string(), std::strerror(errno)));
        if (growing) growing->snapshot = snapshot;
        auto taking = std::make_shared<Taking>(file.get(), bound.bytes);
        OutputSink sink = [taking](docker::StreamKind kind, std::string_view data) {
            if (kind == docker::StreamKind::stderr_) {
                append_bounded(taking->errors, data);
                return;
            }
            if (taking->over || taking->write_error) return;
            if (taking->bytes + data.size() > taking->bound) {
                taking->over = true;
                taking->stop->cancel();
                return;
            }
            if (!write_all(taking->fd, data)) {
                taking->write_error = errno ? errno : EIO;
                taking->stop->cancel();
                return;
            }
            taking->bytes += data.size();
        };
        agent::RunRequest request;
        // The server's own run outputs name runs of this sandbox only; everything else goes.
        request.argv = {"tar", "-c", "-f", "-", "--numeric-owner", "--exclude=./.cubicle/runs", "-C", box->workspace(), "."};
        request.env = {"LC_ALL=C"};
        request.timeout_ms = archive_timeout_ms;
        request.max_output_bytes = bound.bytes + 1;
        RunOptions options;
        options.collect = false;
        auto result = co_await box->run(std::move(request), std::move(sink), taking->stop, std::move(options));
        if (taking->over) {
            throw ToolError(fmt::format("the snapshot would be larger than the {} allowed by {}; remove files from the workspace "
                                        "(or delete older snapshots and saved sandboxes) first",
                                        mib(bound.bytes), bound.why));
        }
        if (taking->write_error) {
            throw ToolError(fmt::format("cannot write the snapshot to {}: {}", path.string(), std::strerror(taking->write_error)));
        }
        // Exit status 1 is GNU tar's "a file changed while it was read": a program was writing
        // meanwhile, and the snapshot holds what tar saw.
        const auto& status = result.status;
        if (status.timed_out) throw ToolError("taking the snapshot timed out");
        if (status.signal || status.exit_code > 1) {
            throw ToolError(fmt::format("taking the snapshot failed (tar: {})", said(taking->errors)));
        }
        // On disk before the record says it is whole.
        if ((kept && ::fdatasync(file.get()) != 0) || file.close() != 0) {
            throw ToolError(fmt::format("cannot write the snapshot to {}: {}", path.string(), std::strerror(errno)));
        }
        snapshot.size_bytes = taking->bytes;
        snapshot.complete = true;
        store.write(store::snapshots, id, store::to_json(snapshot));
    } catch (const ToolError&) {
        failure = std::current_exception();
    } catch (const std::runtime_error& e) {
        failure = std::make_exception_ptr(ToolError(fmt::format("taking the snapshot: {}", e.what())));  // the store's
    } catch (...) {
        failure = std::current_exception();
    }
    if (failure) {
        if (growing) growing->failed = true;
        store.remove(store::snapshots, id);  // nothing stays of a snapshot that was not taken
        std::rethrow_exception(failure);
    }
    if (growing) growing->done = true;
    hold.reset();
    log::info("snapshot {} of sandbox {} ({}) for {}", id, box->id(), mib(snapshot.size_bytes), owner);
    if (kept) co_await keeper_.retain(owner, id);
    co_return snapshot;
}

asio::awaitable<void> Snapshots::keep(store::Snapshot snapshot) {
    auto path = keeper_.store().path_of(store::snapshots, snapshot.snapshot_id, store::snapshot_archive);
    Fd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (file.get() < 0 || ::fdatasync(file.get()) != 0) {
        throw ToolError(fmt::format("cannot keep snapshot {}: {}", snapshot.snapshot_id, std::strerror(errno)));
    }
    auto owner = keeper_.principal_of(snapshot.owner);
    co_await keeper_.retain(owner, snapshot.snapshot_id);
}

asio::awaitable<void> Snapshots::restore(std::shared_ptr<Sandbox> box, store::Snapshot snapshot) {
    co_await unpack(std::move(box), std::move(snapshot), nullptr);
}

asio::awaitable<void> Snapshots::restore_growing(std::shared_ptr<Sandbox> box, std::shared_ptr<Growing> growing) {
    asio::steady_timer pause(co_await asio::this_coro::executor);
    while (!growing->snapshot && !growing->failed) {
        pause.expires_after(growth_poll);
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    if (growing->failed) throw ToolError("the snapshot could not be taken");
    auto snapshot = *growing->snapshot;
    co_await unpack(std::move(box), std::move(snapshot), std::move(growing));
}

asio::awaitable<void> Snapshots::unpack(std::shared_ptr<Sandbox> box, store::Snapshot snapshot, std::shared_ptr<Growing> growing) {
    if (!box->uses_agent()) throw ToolError("snapshots need the sandbox's agent, and this sandbox runs programs through Docker exec");
    const auto& store = keeper_.store();
    auto path = store.path_of(store::snapshots, snapshot.snapshot_id, store::snapshot_archive);
    // Open before anything else: a delete_snapshot from here on does not take the archive away.
    Fd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (file.get() < 0) {
        throw ToolError(fmt::format("the archive of snapshot {} cannot be read ({}); delete it with delete_snapshot",
                                    snapshot.snapshot_id, std::strerror(errno)));
    }
    auto executor = co_await asio::this_coro::executor;
    auto feeding = std::make_shared<Feeding>(executor);
    agent::RunRequest request;
    // As the sandbox user: the archive's links and names reach nothing that user could not.
    request.argv = {"tar", "-x", "-p", "-f", "-", "--no-same-owner", "--checkpoint=100",
                    fmt::format("--checkpoint-action=echo={}", checkpoint_mark), "-C", box->workspace()};
    request.env = {"LC_ALL=C"};
    request.timeout_ms = archive_timeout_ms;
    request.max_output_bytes = 1 << 20;
    RunOptions options;
    options.collect = false;
    auto handle = std::make_shared<ExecHandle>();
    options.handle = handle;
    asio::co_spawn(executor, run_unpacking(box, std::move(request), std::move(options), feeding), asio::detached);
    std::string chunk(feed_chunk, '\0');
    std::uint64_t sent = 0;
    int read_error = 0;
    while (!feeding->done) {
        if (handle->exec_id == 0) {  // the run is not sent yet (co_spawn may start it later)
            co_await feeding->changed(std::chrono::milliseconds(1));
            continue;
        }
        if (sent > feeding->checkpoints * bytes_per_checkpoint + feed_window) {
            co_await feeding->changed();
            continue;
        }
        auto n = ::read(file.get(), chunk.data(), chunk.size());
        if (n < 0 && errno == EINTR) continue;
        // At the end of what is written so far of an archive still being taken: wait for more.
        // (Nothing runs between the read and this test, so a taking seen done wrote all before it.)
        if (n == 0 && growing && !growing->done && !growing->failed) {
            co_await feeding->changed(growth_poll);
            continue;
        }
        if (growing && growing->failed) {
            try {
                box->send_input(*handle, {}, true);
            } catch (const ToolError&) {
                // tar has ended already
            }
            break;
        }
        try {
            if (n <= 0) {
                if (n < 0) read_error = errno;
                box->send_input(*handle, {}, true);
                break;
            }
            box->send_input(*handle, std::string_view(chunk.data(), static_cast<std::size_t>(n)), false);
        } catch (const ToolError&) {
            break;  // tar has ended: its result says why
        }
        sent += static_cast<std::uint64_t>(n);
    }
    while (!feeding->done) co_await feeding->changed();
    if (feeding->failure) std::rethrow_exception(feeding->failure);
    if (growing && growing->failed) throw ToolError("the snapshot could not be taken");
    if (read_error) throw ToolError(fmt::format("reading the archive of snapshot {}: {}", snapshot.snapshot_id, std::strerror(read_error)));
    const auto& status = feeding->result.status;
    if (status.timed_out) throw ToolError(fmt::format("restoring snapshot {} timed out", snapshot.snapshot_id));
    if (status.exit_code != 0 || status.signal) {
        throw ToolError(fmt::format("restoring snapshot {} failed (tar: {})", snapshot.snapshot_id, said(feeding->errors)));
    }
    box->restart_interpreters();
}

store::Snapshot Snapshots::get(const std::string& id, const std::string& owner) {
    const auto& store = keeper_.store();
    std::optional<std::string> text;
    try {
        text = store.read(store::snapshots, id);
    } catch (const std::invalid_argument&) {
        // not a key the store could hold: an id that never existed
    }
    if (text) {
        try {
            auto snapshot = store::snapshot_from_json(*text);
            if (snapshot.owner == keeper_.qualified(owner) && snapshot.complete) return snapshot;
        } catch (const std::exception& e) {
            log::warning("the snapshot record {} cannot be read: {}", id, e.what());
        }
    }
    std::string known;
    for (const auto& snapshot : list(owner)) known += (known.empty() ? "" : ", ") + snapshot.snapshot_id;
    throw ToolError(fmt::format("no snapshot with id '{}'. {}", id,
                                known.empty() ? "You have no snapshots; take one with snapshot_sandbox."
                                              : "Your snapshots: " + known + "."));
}

std::vector<store::Snapshot> Snapshots::list(const std::string& owner) {
    std::vector<store::Snapshot> out;
    if (!keeper_.exists()) return out;
    for (auto& snapshot : store::snapshot_records(keeper_.store())) {
        if (snapshot.owner == keeper_.qualified(owner) && snapshot.complete) out.push_back(std::move(snapshot));
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
        return a.created_ms != b.created_ms ? a.created_ms < b.created_ms : a.snapshot_id < b.snapshot_id;
    });
    return out;
}

void Snapshots::remove(const std::string& id, const std::string& owner) {
    get(id, owner);
    const auto& store = keeper_.store();
    auto hold = store.try_hold(store::snapshots, id);
    if (!hold) throw ToolError(fmt::format("snapshot {} is in use right now; try again", id));
    store.remove(store::snapshots, id);
}

} // namespace cubicle::sandbox
