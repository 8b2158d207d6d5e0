// A live sandbox: one container whose agent runs programs on our behalf.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "common/cancellation.hpp"
#include "docker/client.hpp"
#include "docker/stream.hpp"
#include "sandbox/agent_channel.hpp"
#include "sandbox/agent_protocol.hpp"
#include "sandbox/agent_stream.hpp"
#include "sandbox/checkpoints.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

class Previews;

// Receives each piece of output as soon as the agent forwards it.
using OutputSink = std::function<void(docker::StreamKind, std::string_view)>;

struct ExecResult {
    agent::ExitStatus status;
    std::string stdout_text;
    std::string stderr_text;
    bool cancelled = false;
    bool state_lost = false;  // a persistent interpreter died or was killed during the run
    int figures = 0;          // plots a Python cell saved in its save_dir (figure-N.png)
};

// A running program the caller may feed input to or signal (a background run).
struct ExecHandle {
    std::uint32_t exec_id = 0;  // 0 until started
};

// What a run does beyond returning its result.
struct RunOptions {
    // Absolute directory where the agent keeps the whole output (files stdout
    // and stderr, up to the run's output cap); empty: none. Agent mode only.
    std::string save_dir;
    // Absolute directory where a Python cell saves its matplotlib figures.
    std::string figure_dir;
    // Collect the output in ExecResult (capped), for callers that parse it;
    // runs shown to a model see it through the sink instead.
    bool collect = true;
    // Keep stdin open for send_input (a background run); filled once started.
    std::shared_ptr<ExecHandle> handle;
};

class Sandbox : public std::enable_shared_from_this<Sandbox> {
public:
    Sandbox(asio::any_io_executor executor, std::string id, std::string container_id, SandboxSpec spec);
    ~Sandbox();

    const std::string& id() const { return id_; }
    const std::string& container_id() const { return container_id_; }
    // Where its files live and programs start; the owner of its files.
    const std::string& workspace() const { return workspace_; }
    unsigned uid() const { return uid_; }
    // A workspace in a container shared with other workspaces (its own uid and
    // directory), rather than a container of its own.
    bool shared() const { return shared_; }
    void make_shared_workspace(std::string workspace, unsigned uid) {
        workspace_ = std::move(workspace);
        uid_ = uid;
        shared_ = true;
    }
    const SandboxSpec& spec() const { return spec_; }
    // The principal that created it; nobody else can see or use it.
    const std::string& owner() const { return owner_; }
    void set_owner(std::string owner) { owner_ = std::move(owner); }
    bool throwaway() const { return throwaway_; }
    void set_throwaway(bool throwaway) { throwaway_ = throwaway; }
    // Variables added to every execution (initialize_sandbox's env).
    // Interpreters already started (a pooled sandbox's) are restarted to see it.
    void set_env(std::vector<std::pair<std::string, std::string>> env);
    // Ends its interpreters and its zygote; the next cell or run starts them afresh (they
    // then see what changed in the workspace, say packages a snapshot brought).
    void restart_interpreters();
    bool alive() const { return alive_; }
    std::chrono::steady_clock::time_point created() const { return created_; }
    std::size_t running() const;
    // Whether anything is under way in it: a program or cell, a background run, a
    // relayed stream or an exposed port (an idle interpreter is not). Such a sandbox
    // is never paused.
    bool busy() const;

    // Takes over the attach stream and waits for the agent's hello; when the agent
    // connected to `channel` (may be null), its frames go over that from then on.
    asio::awaitable<void> connect(std::unique_ptr<docker::RawStream> stream, std::unique_ptr<AgentChannel> channel,
                                  std::chrono::milliseconds timeout);
    // No attach stream reaches the agent (a Swarm task on another node, the agent run with
    // --dial-only): its connection home on `channel` carries its hello and every frame.
    asio::awaitable<void> connect_dialed(std::unique_ptr<AgentChannel> channel, std::chrono::milliseconds timeout);
    // Whether frames go over a channel of their own rather than the attach stream.
    bool on_channel() const { return channel_ != nullptr; }
    // Which: "socket" or "tcp" (agent_channel.hpp); only when on_channel().
    const char* channel_kind() const { return channel_socket_ ? channel_socket_->kind() : "attach"; }
    // The fallback when the agent cannot run in the image: programs run through
    // Docker exec, a timeout or cancellation stops the whole container, and
    // there are no persistent interpreters. The attach stream only tells
    // whether the container is alive.
    void connect_exec(std::unique_ptr<docker::RawStream> stream, docker::Client& docker);
    bool uses_agent() const { return docker_ == nullptr; }

    // Runs a program through the agent. Output goes to `sink` as it comes and is
    // collected (capped) in the result. `cancel` kills the process group.
    // Throws ToolError when the program cannot start or the sandbox is gone.
    asio::awaitable<ExecResult> run(agent::RunRequest request, OutputSink sink, std::shared_ptr<Cancellation> cancel,
                                    RunOptions options);
    // Not a default argument: GCC 12 frees a coroutine's temporary arguments
    // wrongly inside a co_await expression; a plain function is safe.
    asio::awaitable<ExecResult> run(agent::RunRequest request, OutputSink sink, std::shared_ptr<Cancellation> cancel) {
        return run(std::move(request), std::move(sink), std::move(cancel), RunOptions());
    }
    // More input for a run started with a handle; `eof` closes its stdin.
    // Signals its process group. Both throw ToolError once it has ended.
    void send_input(const ExecHandle& handle, std::string_view data, bool eof);
    void signal(const ExecHandle& handle, int signal_number);

    // Runs a cell of `language` in the sandbox's persistent interpreter for it
    // (started on first use): variables survive between cells. Cells run one
    // at a time. A timeout or cancellation kills the interpreter (state lost;
    // the next cell starts a fresh one).
    // With `echo`, the value of a final bare expression is printed, as in a REPL.
    asio::awaitable<ExecResult> run_cell(std::string language, std::string code, bool echo, std::uint64_t timeout_ms,
                                         std::uint64_t max_output, OutputSink sink, std::shared_ptr<Cancellation> cancel,
                                         RunOptions options);

    // Checkpoints of the live Python interpreter (agent/checkpoint.h): a parked
    // copy-on-write fork, taken between cells (after the running one, like a
    // queued cell); at most `max` per sandbox, the oldest dropped. A checkpoint
    // lives as long as its interpreter. Throw ToolError saying why not.
    asio::awaitable<Checkpoint> checkpoint(std::string language, std::size_t max);
    // The checkpoint's copy becomes the live interpreter (the old one ends); a
    // fresh copy is parked in its place, so it can be restored again.
    asio::awaitable<Checkpoint> restore_checkpoint(std::string checkpoint_id);
    // The checkpoints whose interpreter still lives, oldest first.
    std::vector<Checkpoint> checkpoints();
    // Kills a checkpoint's parked copy and forgets it (no-op for an unknown id).
    void drop_checkpoint(const std::string& checkpoint_id);
    // Notes that a copy of the workspace was kept with the checkpoint.
    void set_checkpoint_files(const std::string& checkpoint_id) { checkpoints_.set_files(checkpoint_id); }

    // Starts the interpreter for `language` ahead of its first cell, and
    // the zygote for fresh runs (a pooled sandbox serves either).
    void prewarm(const std::string& language);
    // Only the zygote (a sandbox that serves fresh runs needs no interpreter).
    void start_zygote();
    // Fresh Python runs are exec'd, never forked (where the runtime cannot be trusted
    // with forks: Engine::forks_and_recycles).
    void disable_zygote() { zygote_disabled_ = true; }
    // The modules its zygote imports (--zygote-preload; nullopt: the language's default).
    void set_zygote_preload(std::optional<std::vector<std::string>> modules) { zygote_preload_ = std::move(modules); }
    // A fresh run does not start the zygote beside itself (its imports would take the CPU
    // the run needs): a sandbox handed over the moment it is ready, for a run waiting for
    // it. start_zygote() (a recycle, prewarm) still starts it.
    void hold_zygote_back() { zygote_held_back_ = true; }

    // Install requirements.txt / package.json before runs when they change.
    bool auto_install() const { return auto_install_; }
    void set_auto_install(bool on) { auto_install_ = on; }
    const std::string& dependencies_fingerprint() const { return dependencies_fingerprint_; }
    void set_dependencies_fingerprint(std::string fingerprint) { dependencies_fingerprint_ = std::move(fingerprint); }

    bool stateful() const { return stateful_; }
    void set_stateful(bool stateful) { stateful_ = stateful; }

    // Recycling a throwaway sandbox (agent/reset.h): the agent ends every process,
    // brings the writable places back to their state at start and checks the
    // container. "" when it is pristine again (the client's settings are then
    // forgotten too), else what is left: it must be removed, not reused.
    asio::awaitable<std::string> reset(std::chrono::milliseconds timeout);
    // A run hit a limit (timeout, cancellation, a kill, a dead interpreter):
    // such a sandbox is never recycled.
    bool limit_hit() const { return limit_hit_; }

    // A byte stream to 127.0.0.1:`port` inside the sandbox, relayed by the agent.
    // Throws ToolError when nothing listens there or the sandbox cannot relay.
    asio::awaitable<std::shared_ptr<AgentStream>> open_stream(unsigned short port);
    // Why a sandbox cannot relay ports, or empty when it can.
    std::string relay_refusal() const;
    // Its exposed ports (previews.hpp), closed with it.
    Previews& previews();

    // Marks the sandbox dead and closes the agent connection; pending runs fail,
    // streams break, exposed ports close.
    void shutdown(std::string reason);
    // Its host was lost (placement.hpp): `reason` is what its calls say from now on, even
    // when its agent's connection dropped first.
    void mark_lost(std::string reason);

private:
    struct Pending;
    struct Interpreter;
    struct ExecWatch;
    asio::awaitable<ExecResult> run_exec(agent::RunRequest request, OutputSink sink, std::shared_ptr<Cancellation> cancel);
    asio::awaitable<void> watch_exec(std::shared_ptr<ExecWatch> watch);
    // Reads the agent's channel (frames), or the attach stream: frames until there is
    // a channel, the agent's diagnostics (stderr) and the container's end.
    asio::awaitable<void> read_loop(bool from_channel);
    // The agent's own stderr (and its zygote's): kept for the reason of a death; a zygote's
    // modules not preloaded are logged.
    void note_diagnostics(std::string_view piece);
    // Dispatches every complete frame in `decoder`; false when the stream is corrupt.
    bool dispatch_decoded(agent::Decoder& decoder);
    void send_frame(std::string frame);
    void dispatch(agent::Frame frame);
    void deliver_output(Pending& target, bool is_stdout, std::string_view data);
    // Waits until no cell or exchange has `interpreter`, then takes it (Interpreter::Turn gives it back).
    asio::awaitable<void> take_turn(Interpreter& interpreter);
    void start_interpreter(const std::string& language, Interpreter& interpreter);
    // The stderr line of a run whose process was killed at the programs' memory limit.
    std::string memory_limit_note() const;
    // Sends a request to a live interpreter between cells (`send` gets its exec id
    // and an id for the agent's refusal) and waits for its control line.
    asio::awaitable<std::shared_ptr<Pending>> interpreter_exchange(std::string language,
                                                                   std::function<void(std::uint32_t, std::uint32_t)> send);
    void interpreter_ended(const std::string& language, std::uint32_t exec_id, const agent::ExitStatus* status, std::string error);

    asio::any_io_executor executor_;
    std::string id_;
    std::string container_id_;
    SandboxSpec spec_;
    bool throwaway_ = false;
    std::string owner_;
    std::string workspace_ = workspace_dir;
    unsigned uid_ = sandbox_uid;
    bool shared_ = false;
    std::chrono::steady_clock::time_point created_;
    std::unique_ptr<docker::RawStream> stream_;   // the attach stream
    std::unique_ptr<AgentChannel> channel_socket_;  // kept while the container lives (agent_channel.hpp)
    std::unique_ptr<docker::RawStream> channel_;    // the agent's connection to it
    docker::Demuxer demuxer_;
    agent::Decoder decoder_;          // of the attach stream
    agent::Decoder channel_decoder_;
    bool hello_channel_ = false;      // the hello said the agent is on its channel
    std::map<std::uint32_t, std::shared_ptr<Pending>> pending_;
    std::map<std::uint32_t, std::weak_ptr<AgentStream>> streams_;  // by stream id (shared with exec ids)
    std::shared_ptr<Previews> previews_;
    std::uint32_t next_exec_id_ = 1;
    bool alive_ = false;
    std::string death_reason_;
    std::shared_ptr<Pending> hello_;
    docker::Client* docker_ = nullptr;  // set in exec-fallback mode
    std::map<std::string, std::shared_ptr<Interpreter>> interpreters_;  // by language
    Checkpoints checkpoints_;
    bool stateful_ = true;
    bool limit_hit_ = false;
    bool zygote_started_ = false;  // ZYGOTE sent (the agent restarts a dead one itself)
    bool zygote_disabled_ = false;
    std::optional<std::vector<std::string>> zygote_preload_;
    bool zygote_held_back_ = false;
    bool auto_install_ = true;
    std::string dependencies_fingerprint_;
    std::string agent_log_;
};

} // namespace cubicle::sandbox
