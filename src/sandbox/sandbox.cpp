#include "sandbox/sandbox.hpp"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <sstream>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "sandbox/languages.hpp"
#include "sandbox/previews.hpp"

namespace cubicle::sandbox {
namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// How long past its own timeout an execution may take before the agent is
// presumed wedged and the container is given up.
constexpr auto watchdog_grace = std::chrono::seconds(10);
constexpr std::size_t max_agent_log = 4096;
// How long the agent may take to connect a preview stream to the sandbox's port (it dials its own loopback).
constexpr auto stream_connect_timeout = std::chrono::seconds(10);
constexpr std::size_t diagnostics_buffer = 1024;  // the attach stream's read buffer once a channel carries the frames
// Stdin up to this size rides in the RUN frame; more (an upload's archive may be
// larger than a frame can be) goes in STDIN frames after a START. Either way the
// agent holds what the program has not read yet.
constexpr std::size_t max_inline_stdin = 1 << 20;

} // namespace

// One execution (or the hello) waiting for the agent's answer.
struct Sandbox::Pending {
    explicit Pending(asio::any_io_executor executor) : done(executor) {}
    asio::steady_timer done;  // cancelled when the answer arrives
    bool finished = false;
    OutputSink sink;
    std::uint64_t max_output = 0;
    std::uint64_t delivered[2] = {0, 0};  // stdout, stderr
    bool collect = true;
    ExecResult result;
    std::string error;
    std::string interpreter;  // language, when this is a persistent interpreter process
    std::string control;      // the control line that ended a cell (or a checkpoint request)

    void finish() {
        finished = true;
        done.cancel();
    }
};

// A persistent interpreter process and the cell it is running.
struct Sandbox::Interpreter {
    std::uint32_t exec_id = 0;  // 0: not running
    std::shared_ptr<Pending> cell;
    bool busy = false;
    std::deque<std::shared_ptr<asio::steady_timer>> waiting;  // cells queued behind the running one

    void release() {
        busy = false;
        if (!waiting.empty()) {
            waiting.front()->cancel();
            waiting.pop_front();
        }
    }
    // Held while a cell or an exchange has the interpreter (Sandbox::take_turn).
    struct Turn {
        Interpreter& interpreter;
        ~Turn() { interpreter.release(); }
    };
};

asio::awaitable<void> Sandbox::take_turn(Interpreter& interpreter) {
    // One cell or exchange at a time: later ones queue behind the one running.
    while (interpreter.busy) {
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        interpreter.waiting.push_back(turn);
        co_await turn->async_wait(use_tuple);
        if (!alive_) throw ToolError(fmt::format("sandbox {} stopped: {}", id_, death_reason_));
    }
    interpreter.busy = true;
}

Sandbox::Sandbox(asio::any_io_executor executor, std::string id, std::string container_id, SandboxSpec spec)
    : executor_(std::move(executor)), id_(std::move(id)), container_id_(std::move(container_id)), spec_(std::move(spec)),
      created_(std::chrono::steady_clock::now()) {}

Sandbox::~Sandbox() {
    if (previews_) previews_->close_all();
    if (stream_) stream_->close();
    if (channel_) channel_->close();
}

void Sandbox::send_frame(std::string frame) {
    if (auto& stream = channel_ ? channel_ : stream_) stream->send(std::move(frame));
}

std::size_t Sandbox::running() const { return pending_.size(); }

bool Sandbox::busy() const {
    for (const auto& [exec_id, pending] : pending_) {
        if (pending->interpreter.empty()) return true;
    }
    for (const auto& [language, interpreter] : interpreters_) {
        if (interpreter->busy || !interpreter->waiting.empty()) return true;
    }
    for (const auto& [stream_id, weak] : streams_) {
        if (auto stream = weak.lock(); stream && !stream->finished()) return true;
    }
    return previews_ && !previews_->exposed().empty();
}

asio::awaitable<void> Sandbox::connect(std::unique_ptr<docker::RawStream> stream, std::unique_ptr<AgentChannel> channel,
                                       std::chrono::milliseconds timeout) {
    stream_ = std::move(stream);
    alive_ = true;
    hello_ = std::make_shared<Pending>(executor_);
    hello_->done.expires_after(timeout);
    asio::co_spawn(executor_, read_loop(false), asio::detached);
    auto hello = hello_;
    co_await hello->done.async_wait(use_tuple);
    if (!hello->finished) {
        shutdown("the agent did not start");
        throw ToolError(fmt::format("the sandbox agent did not start within {} ms in image {}{}", timeout.count(),
                                    spec_.image, agent_log_.empty() ? "" : ": " + agent_log_));
    }
    if (!hello->error.empty()) throw ToolError(hello->error);
    channel_socket_ = std::move(channel);
    if (!hello_channel_) {
        if (channel_socket_) channel_socket_->forgo();
        co_return;
    }
    if (!channel_socket_) {  // no agent of ours says so: there is no socket to connect to
        shutdown("the agent claimed a channel it was not given");
        throw ToolError("the sandbox agent claimed a channel it was not given");
    }
    try {
        channel_ = co_await channel_socket_->accept(timeout);
    } catch (const ToolError&) {
        shutdown("the agent did not connect to its channel");
        throw;
    }
    if (!alive_) throw ToolError(fmt::format("sandbox {} stopped: {}", id_, death_reason_));
    asio::co_spawn(executor_, read_loop(true), asio::detached);
}

asio::awaitable<void> Sandbox::connect_dialed(std::unique_ptr<AgentChannel> channel, std::chrono::milliseconds timeout) {
    channel_ = co_await channel->accept(timeout);
    channel_socket_ = std::move(channel);
    alive_ = true;
    hello_ = std::make_shared<Pending>(executor_);
    hello_->done.expires_after(timeout);
    asio::co_spawn(executor_, read_loop(true), asio::detached);
    auto hello = hello_;
    co_await hello->done.async_wait(use_tuple);
    if (!hello->finished) {
        shutdown("the agent did not start");
        throw ToolError(fmt::format("the sandbox agent dialed home but sent no hello within {} ms{}", timeout.count(),
                                    agent_log_.empty() ? "" : ": " + agent_log_));
    }
    if (!hello->error.empty()) throw ToolError(hello->error);
    if (hello_channel_) {  // it has no other channel to name
        shutdown("the agent claimed a channel it was not given");
        throw ToolError("the sandbox agent claimed a channel it was not given");
    }
}

void Sandbox::connect_exec(std::unique_ptr<docker::RawStream> stream, docker::Client& docker) {
    stream_ = std::move(stream);
    docker_ = &docker;
    alive_ = true;
    asio::co_spawn(executor_, read_loop(false), asio::detached);
}

// Stops an exec-mode run at its timeout or cancellation: Docker cannot kill an
// exec'd process (moby#35703), so the container goes.
struct Sandbox::ExecWatch {
    explicit ExecWatch(asio::any_io_executor executor) : timer(executor) {}
    asio::steady_timer timer;
    bool done = false;
    bool cancelled = false;
    bool fired = false;
};

asio::awaitable<void> Sandbox::watch_exec(std::shared_ptr<ExecWatch> watch) {
    auto self = shared_from_this();
    auto [ec] = co_await watch->timer.async_wait(use_tuple);
    if (watch->done || (ec && !watch->cancelled)) co_return;
    watch->fired = true;
    try {
        co_await docker_->kill_container(container_id_);
    } catch (const std::exception& e) {
        log::warning("sandbox {}: stopping the container at a timeout failed: {}", id_, e.what());
    }
}

asio::awaitable<ExecResult> Sandbox::run_exec(agent::RunRequest request, OutputSink sink, std::shared_ptr<Cancellation> cancel) {
    auto config = exec_config({.argv = request.argv, .env = request.env, .cwd = request.cwd,
                               .stdin_open = !request.stdin_data.empty()});
    auto exec_id = co_await docker_->exec_create(container_id_, std::move(config));
    auto stream = co_await docker_->exec_start(exec_id);
    if (!request.stdin_data.empty()) {
        stream->send(std::move(request.stdin_data));
        stream->close_write();
    }
    auto watch = std::make_shared<ExecWatch>(executor_);
    watch->timer.expires_after(request.timeout_ms ? std::chrono::milliseconds(request.timeout_ms) : std::chrono::hours(24 * 365));
    if (cancel) {
        cancel->on_cancel([watch] {
            watch->cancelled = true;
            watch->timer.cancel();
        });
    }
    asio::co_spawn(executor_, watch_exec(watch), asio::detached);
    Pending output(executor_);
    output.sink = std::move(sink);
    output.max_output = request.max_output_bytes;
    auto started = std::chrono::steady_clock::now();
    docker::Demuxer demuxer;
    std::string buffer(64 * 1024, '\0');
    for (;;) {
        std::size_t n = co_await stream->read_some(buffer.data(), buffer.size());
        if (n == 0) break;
        demuxer.feed(std::string_view(buffer.data(), n), [&](docker::StreamKind kind, std::string_view data) {
            if (kind != docker::StreamKind::stdin_) deliver_output(output, kind == docker::StreamKind::stdout_, data);
        });
    }
    watch->done = true;
    watch->timer.cancel();
    auto& status = output.result.status;
    if (watch->fired) {
        shutdown(watch->cancelled ? "a run was cancelled, which stops the container in exec mode"
                                  : "a run timed out, which stops the container in exec mode");
        status.signal = 9;
        status.exit_code = -1;
        status.timed_out = !watch->cancelled;
        output.result.cancelled = watch->cancelled;
    } else {
        status.exit_code = co_await docker_->exec_exit_code(exec_id);
        if (status.exit_code > 128) {
            status.signal = status.exit_code - 128;
            status.exit_code = -1;
        }
    }
    status.duration_us = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count());
    co_return std::move(output.result);
}

asio::awaitable<ExecResult> Sandbox::run(agent::RunRequest request, OutputSink sink, std::shared_ptr<Cancellation> cancel,
                                         RunOptions options) {
    if (!alive_) throw ToolError(fmt::format("sandbox {} is no longer running ({})", id_, death_reason_));
    // The sandbox's environment first, so that the request's own entries win.
    if (request.cwd.empty()) request.cwd = workspace_;
    std::vector<std::string> env{"HOME=" + workspace_};
    for (const auto& [key, value] : spec_.env) env.push_back(key + "=" + value);
    env.insert(env.end(), std::make_move_iterator(request.env.begin()), std::make_move_iterator(request.env.end()));
    request.env = std::move(env);
    if (!uses_agent()) co_return co_await run_exec(std::move(request), std::move(sink), std::move(cancel));
    std::uint32_t exec_id = next_exec_id_++;
    auto pending = std::make_shared<Pending>(executor_);
    pending->sink = std::move(sink);
    pending->max_output = request.max_output_bytes;
    pending->collect = options.collect;
    auto watchdog = request.timeout_ms ? std::chrono::milliseconds(request.timeout_ms) + watchdog_grace
                                       : std::chrono::hours(24 * 365);
    pending->done.expires_after(watchdog);
    pending_[exec_id] = pending;
    if (!options.save_dir.empty()) send_frame(agent::encode_save(exec_id, request.max_output_bytes, options.save_dir));
    bool stream_stdin = !options.handle && request.stdin_data.size() > max_inline_stdin;
    bool start = options.handle || stream_stdin;
    if (request.fork && !start && !zygote_held_back_) start_zygote();
    send_frame(agent::encode_run(exec_id, request,
                                 start          ? agent::FrameType::start
                                 : request.fork ? agent::FrameType::fork
                                                : agent::FrameType::run,
                                 !stream_stdin));
    if (options.handle) options.handle->exec_id = exec_id;
    if (stream_stdin) {
        send_input(ExecHandle{exec_id}, request.stdin_data, true);
        request.stdin_data.clear();  // sent: not kept for the whole run
        request.stdin_data.shrink_to_fit();
    }
    if (cancel) {
        std::weak_ptr<Sandbox> weak = weak_from_this();
        // Weak: the handler outlives the run in the request's Cancellation, and the run's
        // sink holds the request context, which holds the Cancellation (a cycle otherwise).
        std::weak_ptr<Pending> weak_pending = pending;
        cancel->on_cancel([weak, exec_id, weak_pending] {
            auto self = weak.lock();
            auto live = weak_pending.lock();
            if (!self || !live || live->finished) return;
            live->result.cancelled = true;
            self->send_frame(agent::encode(agent::FrameType::kill, exec_id));
        });
    }
    co_await pending->done.async_wait(use_tuple);
    if (!pending->finished) {
        pending_.erase(exec_id);
        shutdown("the agent stopped answering");
        throw ToolError(fmt::format("sandbox {} stopped answering; it has been shut down", id_));
    }
    if (!pending->error.empty()) throw ToolError(pending->error);
    const auto& status = pending->result.status;
    if (status.timed_out || pending->result.cancelled || status.signal == SIGKILL) limit_hit_ = true;
    co_return std::move(pending->result);
}

void Sandbox::send_input(const ExecHandle& handle, std::string_view data, bool eof) {
    if (!alive_ || !pending_.contains(handle.exec_id)) throw ToolError("the run has ended; it takes no more input");
    constexpr std::size_t chunk = 1 << 20;
    for (std::size_t at = 0; at < data.size(); at += chunk) {
        send_frame(agent::encode(agent::FrameType::stdin, handle.exec_id, data.substr(at, chunk)));
    }
    if (eof) send_frame(agent::encode(agent::FrameType::stdin, handle.exec_id));
}

void Sandbox::signal(const ExecHandle& handle, int signal_number) {
    if (!alive_ || !pending_.contains(handle.exec_id)) throw ToolError("the run has ended; there is nothing to signal");
    send_frame(agent::encode(agent::FrameType::signal, handle.exec_id, std::to_string(signal_number)));
}

std::string Sandbox::relay_refusal() const {
    if (!alive_) return fmt::format("sandbox {} is no longer running ({})", id_, death_reason_);
    if (!uses_agent()) return "this sandbox runs programs without its agent (exec mode), which is what relays ports";
    // Workspaces of one container share its loopback: one could reach another's servers.
    if (shared_) return "a workspace shares its container's network with other workspaces; ports are relayed only from a sandbox of its own";
    return {};
}

asio::awaitable<std::shared_ptr<AgentStream>> Sandbox::open_stream(unsigned short port) {
    if (auto refusal = relay_refusal(); !refusal.empty()) throw ToolError(refusal);
    auto self = shared_from_this();
    std::erase_if(streams_, [](const auto& entry) {
        auto stream = entry.second.lock();
        return !stream || stream->finished();
    });
    std::uint32_t stream_id = next_exec_id_++;
    std::weak_ptr<Sandbox> weak = weak_from_this();
    auto sender = [weak](std::string frame) {
        if (auto box = weak.lock(); box && box->alive_) box->send_frame(std::move(frame));
    };
    auto stream = std::make_shared<AgentStream>(executor_, stream_id, std::move(sender));
    streams_[stream_id] = stream;
    send_frame(agent::encode(agent::FrameType::connect, stream_id, std::to_string(port)));
    bool ok = co_await stream->connected(stream_connect_timeout);
    if (!ok) {
        streams_.erase(stream_id);
        throw ToolError(stream->error());
    }
    co_return stream;
}

Previews& Sandbox::previews() {
    if (!previews_) previews_ = std::make_shared<Previews>(executor_);
    return *previews_;
}

void Sandbox::mark_lost(std::string reason) {
    if (alive_) shutdown(std::move(reason));
    else death_reason_ = std::move(reason);
}

void Sandbox::shutdown(std::string reason) {
    if (!alive_ && !death_reason_.empty()) return;
    alive_ = false;
    death_reason_ = reason.empty() ? "stopped" : std::move(reason);
    if (stream_) stream_->close();
    if (channel_) channel_->close();
    if (previews_) previews_->close_all();
    auto streams = std::move(streams_);
    streams_.clear();
    for (auto& [stream_id, weak] : streams) {
        if (auto stream = weak.lock()) stream->on_closed(fmt::format("sandbox {} stopped: {}", id_, death_reason_));
    }
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& [id, entry] : pending) {
        entry->error = fmt::format("sandbox {} stopped: {}", id_, death_reason_);
        entry->finish();
    }
    for (auto& [language, interpreter] : interpreters_) {
        if (auto cell = std::move(interpreter->cell)) {
            cell->error = fmt::format("sandbox {} stopped: {}", id_, death_reason_);
            cell->finish();
        }
        for (auto& turn : interpreter->waiting) turn->cancel();
        interpreter->waiting.clear();
        interpreter->exec_id = 0;
    }
    if (hello_ && !hello_->finished) {
        hello_->error = fmt::format("the sandbox agent exited before it was ready{}",
                                    agent_log_.empty() ? "" : ": " + agent_log_);
        hello_->finish();
    }
}

bool Sandbox::dispatch_decoded(agent::Decoder& decoder) {
    try {
        while (auto frame = decoder.next()) dispatch(std::move(*frame));
        return true;
    } catch (const std::exception& e) {
        log::warning("sandbox {}: {}", id_, e.what());
        return false;
    }
}

void Sandbox::note_diagnostics(std::string_view piece) {
    if (agent_log_.size() < max_agent_log) agent_log_.append(piece.substr(0, max_agent_log - agent_log_.size()));
    constexpr std::string_view not_preloaded = "cubicle-zygote: not preloaded: ";
    auto at = agent_log_.find(not_preloaded);
    auto end = at == std::string::npos ? at : agent_log_.find('\n', at);
    if (end == std::string::npos) return;
    // Only the operator's own list is worth a warning: the default is "where the
    // image has it" (a minimal image has no numpy). Every warm container says the
    // same: once per server is enough. A run could write here too (through
    // /proc/1/fd/2), hence printable and short.
    static bool warned = false;
    if (!warned && zygote_preload_) {
        warned = true;
        auto names = agent_log_.substr(at + not_preloaded.size(), std::min<std::size_t>(end - at - not_preloaded.size(), 300));
        for (auto& ch : names) {
            if (ch < 0x20 || ch > 0x7e) ch = '?';
        }
        log::warning("the Python zygote (sandbox {}) could not preload {}: fresh runs import them as usual (--zygote-preload)",
                     id_, names);
    }
    agent_log_.erase(at, end + 1 - at);
}

asio::awaitable<void> Sandbox::read_loop(bool from_channel) {
    auto self = shared_from_this();
    auto& stream = from_channel ? channel_ : stream_;
    auto& decoder = from_channel ? channel_decoder_ : decoder_;
    std::string buffer(64 * 1024, '\0');
    while (alive_) {
        std::size_t n = co_await stream->read_some(buffer.data(), buffer.size());
        if (n == 0) break;
        std::string_view data(buffer.data(), n);
        bool ok = true;
        if (from_channel) {
            decoder.feed(data);
        } else {
            ok = demuxer_.feed(data, [&](docker::StreamKind kind, std::string_view piece) {
                if (kind != docker::StreamKind::stdout_) {
                    note_diagnostics(piece);
                } else if (!hello_channel_) {  // after a channel's hello, the agent writes no frame here
                    decoder.feed(piece);
                }
            });
        }
        if (!ok || !dispatch_decoded(decoder)) {
            shutdown("the agent sent a corrupt stream");
            co_return;
        }
        // Past a channel's hello only diagnostics come over the attach stream: no need to hold 64 KiB for them.
        if (!from_channel && hello_channel_ && buffer.size() > diagnostics_buffer) std::string(diagnostics_buffer, '\0').swap(buffer);
    }
    if (alive_) shutdown(agent_log_.empty() ? "its agent exited" : "its agent exited: " + agent_log_);
}

void Sandbox::deliver_output(Pending& target, bool is_stdout, std::string_view data) {
    auto& delivered = target.delivered[is_stdout ? 0 : 1];
    if (target.max_output && delivered + data.size() > target.max_output) {
        data = data.substr(0, target.max_output > delivered ? target.max_output - delivered : 0);
        target.result.status.truncated = true;
    }
    delivered += data.size();
    if (data.empty()) return;  // past the cap nothing more is streamed either
    if (target.collect) (is_stdout ? target.result.stdout_text : target.result.stderr_text).append(data);
    if (target.sink) target.sink(is_stdout ? docker::StreamKind::stdout_ : docker::StreamKind::stderr_, data);
}

std::string Sandbox::memory_limit_note() const {
    return fmt::format("\n[cubicle] stopped at the memory limit of {} MiB for the sandbox's programs; "
                       "a sandbox with more comes from initialize_sandbox {{\"memory_mb\": N}} (up to the server's ceiling)\n",
                       spec_.memory_mb);
}

void Sandbox::interpreter_ended(const std::string& language, std::uint32_t exec_id, const agent::ExitStatus* status, std::string error) {
    auto it = interpreters_.find(language);
    if (it == interpreters_.end() || it->second->exec_id != exec_id) return;
    auto& interpreter = *it->second;
    interpreter.exec_id = 0;
    auto cell = std::move(interpreter.cell);
    if (!cell) return;
    limit_hit_ = true;  // the interpreter died under a cell: perhaps the memory limit
    if (status) {
        cell->result.status.exit_code = status->exit_code;
        cell->result.status.signal = status->signal;
        cell->result.status.memory_limit = status->memory_limit;
        if (status->memory_limit) deliver_output(*cell, false, memory_limit_note());
    }
    cell->error = std::move(error);
    cell->result.state_lost = true;
    cell->finish();
}

void Sandbox::dispatch(agent::Frame frame) {
    using agent::FrameType;
    if (frame.type == FrameType::hello) {
        if (!hello_ || hello_->finished) return;
        hello_channel_ = frame.payload == CUBICLE_HELLO_CHANNEL;
        hello_->finish();
        return;
    }
    if (auto stream_it = streams_.find(frame.id); stream_it != streams_.end()) {
        auto stream = stream_it->second.lock();
        if (stream) stream->on_frame(frame.type, std::move(frame.payload));
        if (!stream || stream->finished()) streams_.erase(frame.id);
        return;
    }
    auto it = pending_.find(frame.id);
    if (it == pending_.end()) return;
    auto entry = it->second;
    auto& pending = *entry;
    // Output of an interpreter belongs to the cell it is running.
    Pending* target = &pending;
    if (!pending.interpreter.empty()) {
        auto interpreter = interpreters_.find(pending.interpreter);
        bool current = interpreter != interpreters_.end() && interpreter->second->exec_id == frame.id;
        target = current ? interpreter->second->cell.get() : nullptr;
    }
    switch (frame.type) {
    case FrameType::stdout_:
    case FrameType::stderr_:
        if (target) deliver_output(*target, frame.type == FrameType::stdout_, frame.payload);
        break;
    case FrameType::control:
        if (target && target != &pending) {
            auto& interpreter = *interpreters_[pending.interpreter];
            auto cell = std::move(interpreter.cell);
            cell->control = frame.payload;
            // "STATUS [FIGURES]": the cell's exit status and the plots it saved.
            char* rest = nullptr;
            cell->result.status.exit_code = static_cast<int>(std::strtol(frame.payload.c_str(), &rest, 10));
            cell->result.figures = static_cast<int>(std::strtol(rest, nullptr, 10));
            cell->finish();
        }
        break;
    case FrameType::clean:  // RESET's verdict
        pending_.erase(it);
        pending.result.stdout_text = std::move(frame.payload);
        pending.finish();
        break;
    case FrameType::exit:
    case FrameType::error: {
        pending_.erase(it);
        auto status = frame.type == FrameType::exit ? agent::parse_exit(frame.payload) : std::nullopt;
        std::string error = frame.type == FrameType::error ? frame.payload
                            : status                       ? std::string()
                                                           : "the sandbox agent sent an unreadable exit status";
        if (!pending.interpreter.empty()) {
            interpreter_ended(pending.interpreter, frame.id, status ? &*status : nullptr, std::move(error));
            break;
        }
        if (status) {
            if (status->memory_limit) deliver_output(pending, false, memory_limit_note());
            bool truncated = pending.result.status.truncated || status->truncated;
            pending.result.status = *status;
            pending.result.status.truncated = truncated;
        }
        pending.error = std::move(error);
        pending.finish();
        break;
    }
    default:
        break;
    }
}

void Sandbox::start_interpreter(const std::string& language, Interpreter& interpreter) {
    if (interpreter.exec_id || !alive_ || !uses_agent()) return;
    auto request = interpreter_for(language);
    request.cwd = workspace_;
    request.env.push_back("HOME=" + workspace_);
    for (const auto& [key, value] : spec_.env) request.env.push_back(key + "=" + value);
    auto process = std::make_shared<Pending>(executor_);
    process->interpreter = language;
    interpreter.exec_id = next_exec_id_++;
    pending_[interpreter.exec_id] = process;
    send_frame(agent::encode_run(interpreter.exec_id, request, agent::FrameType::open));
}

void Sandbox::set_env(std::vector<std::pair<std::string, std::string>> env) {
    if (env.empty()) return;
    spec_.env = std::move(env);
    restart_interpreters();
}

void Sandbox::restart_interpreters() {
    zygote_started_ = false;  // the next fresh run starts it again
    for (auto& [language, interpreter] : interpreters_) {
        if (!interpreter->exec_id) continue;
        send_frame(agent::encode(agent::FrameType::kill, interpreter->exec_id));
        interpreter->exec_id = 0;  // its exit, when it comes, concerns nobody
    }
}

asio::awaitable<std::string> Sandbox::reset(std::chrono::milliseconds timeout) {
    if (!alive_ || !uses_agent() || shared_) co_return "only a sandbox of its own with a live agent can be reset";
    if (limit_hit_) co_return "a run hit a limit";
    for (const auto& [running_id, running] : pending_) {
        if (running->interpreter.empty()) co_return "a program is still running";
    }
    auto self = shared_from_this();
    if (previews_) previews_->close_all();  // the agent ends their streams; the next user must not inherit the ports
    std::uint32_t exec_id = next_exec_id_++;
    auto pending = std::make_shared<Pending>(executor_);
    pending->done.expires_after(timeout);
    pending_[exec_id] = pending;
    send_frame(agent::encode(agent::FrameType::reset, exec_id));
    co_await pending->done.async_wait(use_tuple);
    if (!pending->finished) {
        pending_.erase(exec_id);
        shutdown("its reset did not finish");
        co_return "the reset did not finish in time";
    }
    if (!pending->error.empty()) co_return pending->error;
    if (!pending->result.stdout_text.empty()) co_return std::move(pending->result.stdout_text);
    // The interpreters ended (their EXIT frames came first); what a client set goes too,
    // and a zygote started with a client's environment is started again without it.
    if (!spec_.env.empty()) zygote_started_ = false;
    spec_.env.clear();
    throwaway_ = false;
    stateful_ = true;
    auto_install_ = true;
    dependencies_fingerprint_.clear();
    co_return std::string();
}

void Sandbox::prewarm(const std::string& language) {
    auto& slot = interpreters_[language];
    if (!slot) slot = std::make_shared<Interpreter>();
    start_interpreter(language, *slot);
    if (language == "python") start_zygote();
}

// Fresh Python runs (program_for's `fork`) are forked by the agent's zygote
// once it is ready; until then, and whenever it cannot, they are exec'd.
void Sandbox::start_zygote() {
    zygote_held_back_ = false;
    if (zygote_started_ || zygote_disabled_ || !alive_ || !uses_agent()) return;
    auto request = zygote_for("python", zygote_preload_);
    if (!request) return;
    zygote_started_ = true;
    request->cwd = workspace_;
    request->env.push_back("HOME=" + workspace_);
    for (const auto& [key, value] : spec_.env) request->env.push_back(key + "=" + value);
    send_frame(agent::encode_run(next_exec_id_++, *request, agent::FrameType::zygote));
}

asio::awaitable<ExecResult> Sandbox::run_cell(std::string language, std::string code, bool echo, std::uint64_t timeout_ms,
                                              std::uint64_t max_output, OutputSink sink, std::shared_ptr<Cancellation> cancel,
                                              RunOptions options) {
    if (!alive_) throw ToolError(fmt::format("sandbox {} is no longer running ({})", id_, death_reason_));
    auto self = shared_from_this();
    auto& slot = interpreters_[language];
    if (!slot) slot = std::make_shared<Interpreter>();
    auto interpreter = slot;
    co_await take_turn(*interpreter);
    Interpreter::Turn turn{*interpreter};

    start_interpreter(language, *interpreter);
    std::uint32_t exec_id = interpreter->exec_id;
    auto cell = std::make_shared<Pending>(executor_);
    cell->sink = std::move(sink);
    cell->max_output = max_output;
    cell->collect = options.collect;
    cell->done.expires_after(timeout_ms ? std::chrono::milliseconds(timeout_ms) : std::chrono::hours(24 * 365));
    interpreter->cell = cell;
    auto started = std::chrono::steady_clock::now();
    // Every cell says where its output goes (an empty directory: nowhere), so
    // one cell's files never receive the next cell's output.
    send_frame(agent::encode_save(exec_id, max_output, options.save_dir));
    send_frame(agent::encode(agent::FrameType::stdin, exec_id, encode_cell(code, echo, options.figure_dir)));
    std::weak_ptr<Sandbox> weak = weak_from_this();
    if (cancel) {
        std::weak_ptr<Pending> weak_cell = cell;  // weak for the reason given in run()
        cancel->on_cancel([weak_cell] {
            auto live = weak_cell.lock();
            if (!live || live->finished) return;
            live->result.cancelled = true;
            live->done.cancel();
        });
    }
    co_await cell->done.async_wait(use_tuple);
    if (!cell->finished) {
        limit_hit_ = true;
        // Timed out or cancelled: the interpreter dies with whatever it was doing.
        cell->result.status.timed_out = !cell->result.cancelled;
        cell->result.status.signal = 9;
        cell->result.status.exit_code = -1;
        cell->result.state_lost = true;
        if (interpreter->exec_id == exec_id) {
            interpreter->exec_id = 0;
            interpreter->cell.reset();
            send_frame(agent::encode(agent::FrameType::kill, exec_id));
        }
    }
    if (!cell->error.empty()) throw ToolError(cell->error);
    cell->result.status.duration_us = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count());
    co_return std::move(cell->result);
}

// ---- checkpoints (agent/checkpoint.h) ------------------------------------------

asio::awaitable<std::shared_ptr<Sandbox::Pending>> Sandbox::interpreter_exchange(std::string language,
                                                                                 std::function<void(std::uint32_t, std::uint32_t)> send) {
    constexpr auto exchange_timeout = std::chrono::seconds(60);
    if (!alive_) throw ToolError(fmt::format("sandbox {} is no longer running ({})", id_, death_reason_));
    auto self = shared_from_this();
    auto found = interpreters_.find(language);
    if (found == interpreters_.end() || !found->second->exec_id) {
        throw ToolError(fmt::format("sandbox {} has no live {} interpreter: run a cell with execute_code first", id_, language));
    }
    auto interpreter = found->second;
    co_await take_turn(*interpreter);
    Interpreter::Turn turn{*interpreter};
    std::uint32_t exec_id = interpreter->exec_id;
    if (!exec_id) throw ToolError(fmt::format("the {} interpreter ended before its turn (state lost)", language));
    auto op = std::make_shared<Pending>(executor_);
    op->done.expires_after(exchange_timeout);
    interpreter->cell = op;
    std::uint32_t request_id = next_exec_id_++;
    pending_[request_id] = op;  // an ERROR about the request (a refused RESTORE) ends it too
    send(exec_id, request_id);
    co_await op->done.async_wait(use_tuple);
    pending_.erase(request_id);
    if (interpreter->cell == op) interpreter->cell.reset();
    if (!op->finished) {
        limit_hit_ = true;
        if (interpreter->exec_id == exec_id) {
            interpreter->exec_id = 0;
            send_frame(agent::encode(agent::FrameType::kill, exec_id));
        }
        throw ToolError(fmt::format("the {} interpreter did not answer within {} s; it was stopped (state lost)", language,
                                    exchange_timeout.count()));
    }
    if (!op->error.empty()) throw ToolError(op->error);
    if (op->result.state_lost) throw ToolError(fmt::format("the {} interpreter ended (state lost)", language));
    co_return op;
}

std::vector<Checkpoint> Sandbox::checkpoints() {
    checkpoints_.forget_unless([this](const Checkpoint& c) {
        auto it = interpreters_.find(c.language);
        return alive_ && it != interpreters_.end() && it->second->exec_id == c.interpreter;
    });
    return checkpoints_.list();
}

asio::awaitable<Checkpoint> Sandbox::checkpoint(std::string language, std::size_t max) {
    if (language != "python") {
        throw ToolError(fmt::format("checkpoints are for Python: a {} interpreter runs threads of its own (V8's and libuv's "
                                    "for Node), which a fork does not copy",
                                    language));
    }
    auto self = shared_from_this();
    std::uint32_t interpreter = 0;
    // Named, not a temporary in the co_await: see run() in sandbox.hpp (GCC 12).
    std::function<void(std::uint32_t, std::uint32_t)> send = [&](std::uint32_t exec_id, std::uint32_t) {
        interpreter = exec_id;
        send_frame(agent::encode(agent::FrameType::stdin, exec_id, encode_checkpoint()));
    };
    auto op = co_await interpreter_exchange(language, std::move(send));
    // "STATUS 0 PID RSS_KB"
    std::istringstream line(op->control);
    int status = 1, figures = 0, pid = 0;
    std::uint64_t rss_kb = 0;
    line >> status >> figures >> pid >> rss_kb;
    if (status != 0 || pid <= 0) {
        auto why = op->result.stderr_text;
        while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
        throw ToolError(why.empty() ? "the interpreter could not make a checkpoint" : why);
    }
    checkpoints();  // forget those of an interpreter that ended
    Checkpoint made{checkpoints_.next_id(), language, interpreter, pid, std::chrono::system_clock::now(), rss_kb};
    for (const auto& dropped : checkpoints_.add(made, max)) {
        send_frame(agent::encode(agent::FrameType::drop, next_exec_id_++, fmt::format("{} {}", dropped.interpreter, dropped.pid)));
    }
    co_return made;
}

void Sandbox::drop_checkpoint(const std::string& checkpoint_id) {
    checkpoints();
    const Checkpoint* found = checkpoints_.find(checkpoint_id);
    if (!found) return;
    send_frame(agent::encode(agent::FrameType::drop, next_exec_id_++, fmt::format("{} {}", found->interpreter, found->pid)));
    checkpoints_.replace_pid(checkpoint_id, 0);
}

asio::awaitable<Checkpoint> Sandbox::restore_checkpoint(std::string checkpoint_id) {
    auto self = shared_from_this();
    checkpoints();
    const Checkpoint* found = checkpoints_.find(checkpoint_id);
    if (!found) {
        throw ToolError(fmt::format("sandbox {} has no checkpoint '{}' (a checkpoint lives as long as its interpreter: "
                                    "a timeout, a restart or the memory limit ends it)",
                                    id_, checkpoint_id));
    }
    Checkpoint wanted = *found;
    std::function<void(std::uint32_t, std::uint32_t)> send = [&](std::uint32_t exec_id, std::uint32_t request_id) {
        send_frame(agent::encode(agent::FrameType::restore, request_id, fmt::format("{} {}", exec_id, wanted.pid)));
    };
    std::shared_ptr<Pending> op;
    std::string refused;
    try {
        op = co_await interpreter_exchange(wanted.language, std::move(send));
    } catch (const ToolError& e) {
        refused = e.what();
    }
    if (!op) {
        // A copy killed (at the memory limit, by a program) is forgotten once a restore finds it gone.
        if (refused.find("parked copy is gone") != std::string::npos) checkpoints_.replace_pid(checkpoint_id, 0);
        throw ToolError(refused);
    }
    std::istringstream line(op->control);
    int status = 1, figures = 0, pid = 0;
    line >> status >> figures >> pid;
    // The restored copy answers with the fresh copy it parked in its place (0: none, the checkpoint is spent).
    checkpoints_.replace_pid(checkpoint_id, pid);
    if (pid > 0) wanted.pid = pid;
    co_return wanted;
}

} // namespace cubicle::sandbox
