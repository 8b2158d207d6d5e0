// Background runs as the model handles them: look (get_run), feed (send_input),
// signal (signal_run) and list (list_runs). Started by execute_code and
// run_command with background: true.
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>

#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "tools/args.hpp"
#include "tools/runs.hpp"
#include "tools/support.hpp"
#include "tools/tools.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;

// Longer than this, a look would meet the client's own request timeout.
constexpr double max_wait_s = 60;

// The run, if the caller may see it: its sandbox must still be theirs.
std::shared_ptr<Run> find_run(const Env& env, const std::string& principal, const std::string& id) {
    auto unknown = [&id] { return ToolError(fmt::format("no run {}; list_runs shows the runs of a sandbox", id)); };
    auto run = env.runs->find(id);
    if (!run) throw unknown();
    if (!env.manager.find(run->sandbox_id())) {
        env.runs->forget_sandbox(run->sandbox_id());
        if (const auto* ended = env.manager.lifetimes().ended_sandbox(principal, run->sandbox_id())) {
            throw ToolError(fmt::format("run {}: {}", id, sandbox::ended_message(*ended)));
        }
        throw ToolError(fmt::format("run {} belonged to sandbox {}, which has been stopped", id, run->sandbox_id()));
    }
    // Another principal's run looks exactly like one that never existed.
    try {
        env.manager.get(run->sandbox_id(), principal);
    } catch (const ToolError&) {
        throw unknown();
    }
    return run;
}

std::string_view status_of(const Run& run) {
    if (!run.finished()) return "running";
    return run.error().empty() ? "exited" : "failed";
}

double age_s(const Run& run) {
    auto age = std::chrono::duration<double>(std::chrono::system_clock::now() - run.started()).count();
    return std::round(age * 10) / 10;
}

void write_end(json::Writer& w, const Run& run) {
    if (!run.finished()) return;
    if (!run.error().empty()) {
        w.field("error", run.error());
        return;
    }
    const auto& status = run.result().status;
    w.field("exit_code", status.signal ? 128 + status.signal : status.exit_code).field("timed_out", status.timed_out);
    w.field("duration_ms", static_cast<double>(status.duration_us / 100) / 10.0);
}

// ---- get_run ----------------------------------------------------------------

asio::awaitable<ToolResult> get_run(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"run_id", "wait_s", "since", "max_result_bytes"});
    auto run = find_run(env, context->principal(), args.required_string("run_id"));
    auto wait = args.number("wait_s", 0, max_wait_s).value_or(0);
    auto since = args.string("since").value_or("");
    auto asked = args.integer("max_result_bytes", static_cast<std::int64_t>(min_result_budget), INT64_MAX);
    auto budget = static_cast<std::size_t>(std::min<std::uint64_t>(asked.value_or(INT64_MAX), env.config.result_budget));
    if (wait > 0) {
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::llround(wait * 1000));
        co_await run->wait(since, deadline);
    }
    auto view = run->view(since, budget);
    json::Writer w;
    w.begin_object().field("run_id", run->id()).field("sandbox_id", run->sandbox_id()).field("status", status_of(*run));
    w.field("command", run->label()).field("age_s", age_s(*run));
    bool capped = run->finished() && run->result().status.truncated;
    write_output(w, view.out, view.err, budget, run->home(), capped);
    w.field("next_since", view.next);
    write_end(w, *run);
    w.end_object();
    co_return structured(w.take());
}

// ---- send_input ---------------------------------------------------------------

asio::awaitable<ToolResult> send_input(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"run_id", "data", "eof"});
    auto run = find_run(env, context->principal(), args.required_string("run_id"));
    auto data = args.string("data").value_or("");
    bool eof = args.boolean("eof").value_or(false);
    if (data.empty() && !eof) throw ToolError("nothing to send: give data, or eof: true to close the program's stdin");
    auto box = env.manager.get(run->sandbox_id(), context->principal());
    box->send_input(*run->handle(), data, eof);
    json::Writer w;
    w.begin_object().field("run_id", run->id()).field("bytes", static_cast<std::uint64_t>(data.size())).field("eof", eof).end_object();
    co_return structured(w.take());
}

// ---- signal_run ---------------------------------------------------------------

struct SignalName {
    std::string_view name;
    int number;
};
constexpr std::array signal_names{
    SignalName{"INT", SIGINT}, SignalName{"TERM", SIGTERM}, SignalName{"KILL", SIGKILL}, SignalName{"HUP", SIGHUP},
    SignalName{"QUIT", SIGQUIT}, SignalName{"USR1", SIGUSR1}, SignalName{"USR2", SIGUSR2}, SignalName{"STOP", SIGSTOP},
    SignalName{"CONT", SIGCONT},
};

asio::awaitable<ToolResult> signal_run(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"run_id", "signal"});
    auto run = find_run(env, context->principal(), args.required_string("run_id"));
    std::string name = args.string("signal").value_or("INT");
    std::string_view bare = name;
    if (bare.starts_with("SIG")) bare.remove_prefix(3);
    int number = 0;
    for (const auto& entry : signal_names) {
        if (entry.name == bare) number = entry.number;
    }
    if (!number) throw ToolError(fmt::format("unknown signal '{}'; use INT, TERM, KILL, HUP, QUIT, USR1, USR2, STOP or CONT", name));
    auto box = env.manager.get(run->sandbox_id(), context->principal());
    box->signal(*run->handle(), number);
    json::Writer w;
    w.begin_object().field("run_id", run->id()).field("signal", fmt::format("SIG{}", bare)).end_object();
    co_return structured(w.take());
}

// ---- list_runs ----------------------------------------------------------------

asio::awaitable<ToolResult> list_runs(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    json::Writer w;
    w.begin_object().key("runs").begin_array();
    for (const auto& run : env.runs->of_sandbox(box->id())) {
        w.begin_object().field("run_id", run->id()).field("command", run->label()).field("status", status_of(*run));
        w.field("age_s", age_s(*run)).field("stdout_bytes", run->bytes(0)).field("stderr_bytes", run->bytes(1));
        write_end(w, *run);
        w.end_object();
    }
    w.end_array().end_object();
    co_return structured(w.take());
}

} // namespace

Handlers run_handlers(Env env) {
    return {
        {"get_run", bind<get_run>(env)},
        {"send_input", bind<send_input>(env)},
        {"signal_run", bind<signal_run>(env)},
        {"list_runs", bind<list_runs>(env)},
    };
}

} // namespace cubicle::tools
