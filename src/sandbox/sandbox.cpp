#include "sandbox/sandbox.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/log.hpp"

namespace cubicle::sandbox {
namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// How long past its own timeout an execution may take before the agent is
// presumed wedged and the container is given up.
constexpr auto watchdog_grace = std::chrono::seconds(10);
constexpr std::size_t max_agent_log = 4096;

void append_capped(std::string& out, std::string_view data, std::uint64_t cap, bool& truncated) {
    if (cap && out.size() + data.size() > cap) {
        data = data.substr(0, cap > out.size() ? cap - out.size() : 0);
        truncated = true;
    }
    out.append(data);
}

} // namespace

// One execution (or the hello) waiting for the agent's answer.
struct Sandbox::Pending {
    explicit Pending(asio::any_io_executor executor) : done(executor) {}
    asio::steady_timer done;  // cancelled when the answer arrives
    bool finished = false;
    OutputSink sink;
    std::uint64_t max_output = 0;
    ExecResult result;
    std::string error;

    void finish() {
        finished = true;
        done.cancel();
    }
};

Sandbox::Sandbox(asio::any_io_executor executor, std::string id, std::string container_id, SandboxSpec spec, bool throwaway)
    : executor_(std::move(executor)), id_(std::move(id)), container_id_(std::move(container_id)), spec_(std::move(spec)),
      throwaway_(throwaway), created_(std::chrono::steady_clock::now()) {}

Sandbox::~Sandbox() {
    if (stream_) stream_->close();
}

std::size_t Sandbox::running() const { return pending_.size(); }

asio::awaitable<void> Sandbox::connect(std::unique_ptr<docker::RawStream> stream, std::chrono::milliseconds timeout) {
    stream_ = std::move(stream);
    alive_ = true;
    hello_ = std::make_shared<Pending>(executor_);
    hello_->done.expires_after(timeout);
    asio::co_spawn(executor_, read_loop(), asio::detached);
    auto hello = hello_;
    co_await hello->done.async_wait(use_tuple);
    if (!hello->finished) {
        shutdown("the agent did not start");
        throw ToolError(fmt::format("the sandbox agent did not start within {} ms in image {}{}", timeout.count(),
                                    spec_.image, agent_log_.empty() ? "" : ": " + agent_log_));
    }
    if (!hello->error.empty()) throw ToolError(hello->error);
}

asio::awaitable<ExecResult> Sandbox::run(agent::RunRequest request, OutputSink sink, std::shared_ptr<Cancellation> cancel) {
    if (!alive_) throw ToolError(fmt::format("sandbox {} is no longer running ({})", id_, death_reason_));
    std::uint32_t exec_id = next_exec_id_++;
    auto pending = std::make_shared<Pending>(executor_);
    pending->sink = std::move(sink);
    pending->max_output = request.max_output_bytes;
    auto watchdog = request.timeout_ms ? std::chrono::milliseconds(request.timeout_ms) + watchdog_grace
                                       : std::chrono::hours(24 * 365);
    pending->done.expires_after(watchdog);
    pending_[exec_id] = pending;
    stream_->send(agent::encode_run(exec_id, request));
    if (cancel) {
        std::weak_ptr<Sandbox> weak = weak_from_this();
        cancel->on_cancel([weak, exec_id, pending] {
            auto self = weak.lock();
            if (!self || pending->finished) return;
            pending->result.cancelled = true;
            if (self->stream_) self->stream_->send(agent::encode(agent::FrameType::kill, exec_id));
        });
    }
    co_await pending->done.async_wait(use_tuple);
    if (!pending->finished) {
        pending_.erase(exec_id);
        shutdown("the agent stopped answering");
        throw ToolError(fmt::format("sandbox {} stopped answering; it has been shut down", id_));
    }
    if (!pending->error.empty()) throw ToolError(pending->error);
    co_return std::move(pending->result);
}

void Sandbox::shutdown(std::string reason) {
    if (!alive_ && !death_reason_.empty()) return;
    alive_ = false;
    death_reason_ = reason.empty() ? "stopped" : std::move(reason);
    if (stream_) stream_->close();
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& [id, entry] : pending) {
        entry->error = fmt::format("sandbox {} stopped: {}", id_, death_reason_);
        entry->finish();
    }
    if (hello_ && !hello_->finished) {
        hello_->error = fmt::format("the sandbox agent exited before it was ready{}",
                                    agent_log_.empty() ? "" : ": " + agent_log_);
        hello_->finish();
    }
}

asio::awaitable<void> Sandbox::read_loop() {
    auto self = shared_from_this();
    std::string buffer(64 * 1024, '\0');
    while (alive_) {
        std::size_t n = co_await stream_->read_some(buffer.data(), buffer.size());
        if (n == 0) break;
        bool ok = demuxer_.feed(std::string_view(buffer.data(), n), [&](docker::StreamKind kind, std::string_view data) {
            if (kind == docker::StreamKind::stdout_) {
                decoder_.feed(data);
            } else if (agent_log_.size() < max_agent_log) {
                agent_log_.append(data.substr(0, max_agent_log - agent_log_.size()));
            }
        });
        try {
            while (ok) {
                auto frame = decoder_.next();
                if (!frame) break;
                dispatch(std::move(*frame));
            }
        } catch (const std::exception& e) {
            log::warning("sandbox {}: {}", id_, e.what());
            ok = false;
        }
        if (!ok) {
            shutdown("the agent sent a corrupt stream");
            co_return;
        }
    }
    if (alive_) shutdown(agent_log_.empty() ? "its agent exited" : "its agent exited: " + agent_log_);
}

void Sandbox::dispatch(agent::Frame frame) {
    using agent::FrameType;
    if (frame.type == FrameType::hello) {
        if (hello_) hello_->finish();
        return;
    }
    auto it = pending_.find(frame.id);
    if (it == pending_.end()) return;
    auto& pending = *it->second;
    switch (frame.type) {
    case FrameType::stdout_:
    case FrameType::stderr_: {
        bool is_stdout = frame.type == FrameType::stdout_;
        auto& out = is_stdout ? pending.result.stdout_text : pending.result.stderr_text;
        append_capped(out, frame.payload, pending.max_output, pending.result.status.truncated);
        if (pending.sink) pending.sink(is_stdout ? docker::StreamKind::stdout_ : docker::StreamKind::stderr_, frame.payload);
        break;
    }
    case FrameType::exit: {
        auto status = agent::parse_exit(frame.payload);
        if (!status) {
            pending.error = "the sandbox agent sent an unreadable exit status";
        } else {
            bool truncated = pending.result.status.truncated || status->truncated;
            pending.result.status = *status;
            pending.result.status.truncated = truncated;
        }
        auto keep = it->second;
        pending_.erase(it);
        keep->finish();
        break;
    }
    case FrameType::error: {
        pending.error = frame.payload;
        auto keep = it->second;
        pending_.erase(it);
        keep->finish();
        break;
    }
    default:
        break;
    }
}

} // namespace cubicle::sandbox
