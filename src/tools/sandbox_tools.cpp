#include "tools/tools.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <optional>
#include <regex>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "common/utc_text.hpp"
#include "docker/client.hpp"
#include "projects/baseline.hpp"
#include "sandbox/agent_protocol.hpp"
#include "sandbox/languages.hpp"
#include "tools/args.hpp"
#include "tools/budget.hpp"
#include "tools/network_ledger.hpp"
#include "tools/progress.hpp"
#include "tools/runs.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::RequestContext;
using mcp::ToolResult;
using sandbox::Sandbox;

int exit_code_of(const sandbox::agent::ExitStatus& status) {
    return status.signal ? 128 + status.signal : status.exit_code;
}

// A background run may be given longer than a call, up to --max-background-s
// (its default).
std::uint64_t timeout_ms(const Args& args, const Config& config, bool background = false) {
    double max = background ? std::max(config.max_background_s, config.max_timeout_s) : config.max_timeout_s;
    double fallback = background ? config.max_background_s : config.timeout_s;
    auto seconds = args.number("timeout_s", 0.1, max).value_or(fallback);
    return static_cast<std::uint64_t>(std::llround(seconds * 1000));
}

// The call's result budget: max_result_bytes may lower the server's, never raise it.
std::size_t call_budget(const Args& args, const Config& config) {
    auto asked = args.integer("max_result_bytes", static_cast<std::int64_t>(min_result_budget), INT64_MAX);
    return static_cast<std::size_t>(std::min<std::uint64_t>(asked.value_or(INT64_MAX), config.result_budget));
}

// Where a run's whole output goes: its directory in the workspace, unless
// the sandbox cannot keep it.
OutputHome output_home(const Sandbox& box, bool throwaway, const std::string& run_id, const Config& config) {
    OutputHome home;
    home.cap = config.max_output_bytes;
    if (throwaway) {
        home.not_saved = "a throwaway sandbox keeps nothing; a sandbox from initialize_sandbox keeps the whole output as files";
    } else if (!box.uses_agent()) {
        home.not_saved = "this sandbox runs programs through Docker exec, which cannot save it";
    } else {
        home.dir = run_dir(run_id);
    }
    return home;
}

sandbox::RunOptions run_options(const Sandbox& box, const OutputHome& home) {
    sandbox::RunOptions options;
    if (!home.dir.empty()) options.save_dir = box.workspace() + "/" + home.dir;
    options.collect = false;
    return options;
}

// A foreground program's output: head and tail for the result, everything
// streamed as (coalesced) progress.
struct Watch {
    explicit Watch(std::size_t keep) : out(keep), err(keep) {}
    OutputCapture out;
    OutputCapture err;
};

sandbox::OutputSink watch_sink(std::shared_ptr<Watch> watch, std::shared_ptr<ProgressStream> progress) {
    return [watch, progress](docker::StreamKind kind, std::string_view data) {
        (kind == docker::StreamKind::stderr_ ? watch->err : watch->out).append(data);
        progress->output(kind, data);
    };
}

// Links to the saved output, for clients that fetch resources.
void add_output_links(ToolResult& result, const Sandbox& box, const OutputHome& home, const OutputCapture& out, const OutputCapture& err) {
    if (home.dir.empty()) return;
    for (auto [name, capture] : {std::pair{"stdout", &out}, std::pair{"stderr", &err}}) {
        if (capture->bytes() == 0) continue;
        auto path = home.dir + "/" + name;
        result.links.push_back({sandbox_uri(box.id(), path), path, "text/plain",
                                fmt::format("the whole {} ({} bytes)", name, capture->bytes())});
    }
}

void write_status_fields(json::Writer& w, const sandbox::ExecResult& result) {
    w.field("exit_code", exit_code_of(result.status)).field("timed_out", result.status.timed_out);
}

// Records a run whose output is saved (`bytes` of it) and removes the
// directories of the oldest ones past the limits: at most a quarter of the
// workspace's quota (it is memory), 1 GiB without one.
asio::awaitable<void> keep_saved_output_bounded(Env env, std::shared_ptr<Sandbox> box, const OutputHome& home, std::string run_id,
                                                std::uint64_t bytes) {
    if (home.dir.empty()) co_return;
    std::uint64_t quota_mb = box->spec().disk_mb > 0 ? static_cast<std::uint64_t>(box->spec().disk_mb) : 4096;
    auto expired = env.runs->note_saved(box->id(), std::move(run_id), bytes, (quota_mb << 20) / 4);
    if (expired.empty() || !box->alive()) co_return;
    sandbox::agent::RunRequest request;
    request.argv = {std::string(sandbox::agent::builtin_remove)};
    for (const auto& id : expired) request.argv.push_back(box->workspace() + "/" + run_dir(id));
    request.timeout_ms = 60'000;
    request.max_output_bytes = 4096;
    sandbox::OutputSink no_sink;
    co_await box->run(std::move(request), std::move(no_sink), nullptr);
}

// ---- background runs ------------------------------------------------------------

asio::awaitable<void> run_in_background(std::shared_ptr<Sandbox> box, sandbox::agent::RunRequest request, std::shared_ptr<Run> run,
                                        sandbox::RunOptions options) {
    try {
        auto sink = run->sink();
        auto cancel = run->cancellation();
        auto result = co_await box->run(std::move(request), std::move(sink), std::move(cancel), std::move(options));
        run->finish(std::move(result));
    } catch (const std::exception& e) {
        run->fail(e.what());
    }
}

asio::awaitable<ToolResult> start_background(Env env, std::shared_ptr<Sandbox> box, sandbox::agent::RunRequest request, std::string label) {
    if (!box->uses_agent()) {
        throw ToolError("background runs need the in-sandbox agent; this sandbox runs programs through Docker exec");
    }
    auto executor = co_await asio::this_coro::executor;
    auto id = new_run_id();
    auto home = output_home(*box, false, id, env.config);
    auto run = std::make_shared<Run>(executor, id, box->id(), std::move(label), home, static_cast<std::size_t>(env.config.result_budget) * 16);
    env.runs->add(run);
    co_await keep_saved_output_bounded(env, box, home, id, 0);
    auto options = run_options(*box, home);
    options.handle = run->handle();
    asio::co_spawn(executor, run_in_background(box, std::move(request), run, std::move(options)), asio::detached);
    json::Writer w;
    w.begin_object().field("run_id", id).field("sandbox_id", box->id()).field("status", "running");
    w.field("stdout_file", home.dir + "/stdout").field("stderr_file", home.dir + "/stderr");
    w.field("timeout_s", static_cast<double>(request.timeout_ms) / 1000).end_object();
    co_return structured(w.take());
}

// ---- initialize_sandbox ----------------------------------------------------

// A persistent sandbox from a snapshot is a new one: a name in use (live here or saved)
// would resume that sandbox instead, its files untouched.
void throw_if_named(Env env, const std::string& name, const std::string& owner) {
    bool taken = false;
    for (const auto& box : env.manager.list(owner)) {
        const auto* kept = env.manager.persistent(box->id());
        taken = taken || (kept && kept->name == name);
    }
    for (const auto& one : env.manager.saved(owner)) taken = taken || one.saved.name == name;
    if (taken) {
        throw ToolError(fmt::format("you already have a persistent sandbox named '{}'; a sandbox from a snapshot is a new one: "
                                    "choose another name",
                                    name));
    }
}

// ttl_s and expires_at, for a sandbox that has a ttl_s.
void write_lifetime(json::Writer& w, const std::optional<sandbox::Lifetimes::View>& life) {
    if (!life || !life->expires_at) return;
    w.field("ttl_s", life->ttl_s).field("expires_at", utc_text(*life->expires_at));
}

// What a client asked for, or the operator's default; never over the operator's ceiling.
template <typename Asked, typename T>
T within_ceiling(std::optional<Asked> asked, T fallback, T ceiling, std::string_view name, std::string_view unit, std::string_view flag) {
    if (!asked) return fallback;
    if (*asked > ceiling) {
        throw ToolError(fmt::format("{} {} is over this server's ceiling of {} {} (the operator sets it with {}); ask for at most {}",
                                    name, *asked, ceiling, unit, flag, ceiling));
    }
    return static_cast<T>(*asked);
}

asio::awaitable<ToolResult> initialize_sandbox(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"image", "network", "memory_mb", "cpus", "pids_limit", "tmp_size_mb", "disk_mb", "files_limit", "env", "stateful", "gpu", "auto_install", "workspace", "name", "persistent", "from_snapshot", "ttl_s", "secrets"});
    bool shared_workspace = args.boolean("workspace").value_or(false);
    auto name = args.string("name");
    bool persistent = args.boolean("persistent").value_or(false);
    if (persistent && !name) throw ToolError("persistent: true needs a name, to resume the sandbox by later");
    if (name && !persistent) throw ToolError("name is for persistent sandboxes: add persistent: true");
    if (persistent && shared_workspace) throw ToolError("a shared-container workspace cannot be persistent; leave out workspace: true");
    // A snapshot's settings are the defaults of a sandbox started from it; the caller may change
    // them within the server's ceilings, but not its image (its files and packages were made there).
    std::optional<store::Snapshot> snapshot;
    if (auto from = args.string("from_snapshot")) {
        if (args.string("image")) throw ToolError("a sandbox from a snapshot runs the snapshot's image; leave out image");
        if (shared_workspace) throw ToolError("a shared-container workspace cannot start from a snapshot; leave out workspace: true");
        snapshot = env.manager.snapshots().get(*from, context->principal());
        if (persistent) throw_if_named(env, *name, context->principal());
    }
    sandbox::SandboxSpec base;
    const auto& c = env.config;
    if (snapshot) {
        base = snapshot->spec;
    } else {
        base.memory_mb = c.memory_mb;
        base.cpus = c.cpus;
        base.pids_limit = c.pids_limit;
        base.disk_mb = c.disk_mb;
        base.files_limit = c.files_limit;
        base.tmp_size_mb = c.tmp_size_mb;
    }
    bool auto_install = args.boolean("auto_install").value_or(snapshot ? snapshot->auto_install : true);
    bool stateful = args.boolean("stateful").value_or(snapshot ? snapshot->stateful : true);
    sandbox::SandboxSpec spec;
    spec.image = args.string("image").value_or(base.image);
    spec.network = args.boolean("network").value_or(base.network);
    spec.gpu = args.boolean("gpu").value_or(base.gpu);
    spec.runtime = base.runtime;
    spec.memory_mb = static_cast<int>(within_ceiling(args.integer("memory_mb", 16, 1 << 24), base.memory_mb, c.memory_ceiling_mb(), "memory_mb", "MiB", "--max-memory-mb"));
    spec.cpus = within_ceiling(args.number("cpus", 0.01, 1024), base.cpus, c.cpu_ceiling(), "cpus", "CPUs", "--max-cpus");
    spec.pids_limit = static_cast<int>(within_ceiling(args.integer("pids_limit", 8, 1 << 22), base.pids_limit, c.max_pids_limit, "pids_limit", "processes", "--max-pids-limit"));
    spec.disk_mb = static_cast<int>(within_ceiling(args.integer("disk_mb", 1, 1 << 24), base.disk_mb, c.max_disk_mb, "disk_mb", "MiB", "--max-disk-mb"));
    spec.files_limit = static_cast<int>(within_ceiling(args.integer("files_limit", 100, 1 << 30), base.files_limit, c.max_files_limit, "files_limit", "files", "--max-files-limit"));
    spec.tmp_size_mb = static_cast<int>(within_ceiling(args.integer("tmp_size_mb", 1, 1 << 20), base.tmp_size_mb, c.max_tmp_size_mb, "tmp_size_mb", "MiB", "--max-tmp-size-mb"));
    if (snapshot) check_within_ceilings(spec, c);
    spec.env = base.env;
    spec.secrets = args.strings("secrets").value_or(std::vector<std::string>{});
    if (!spec.secrets.empty()) {
        if (!spec.network) throw ToolError("secrets need network: true (the egress proxy puts them into requests)");
        if (persistent || shared_workspace) throw ToolError("secrets are for sandboxes of their own that are not persistent; leave out persistent and workspace");
        std::sort(spec.secrets.begin(), spec.secrets.end());
        spec.secrets.erase(std::unique(spec.secrets.begin(), spec.secrets.end()), spec.secrets.end());
    }
    auto ttl_s = within_ceiling(args.integer("ttl_s", 1, INT64_MAX), static_cast<std::int64_t>(c.default_ttl_s),
                                static_cast<std::int64_t>(c.max_ttl_s), "ttl_s", "seconds", "--max-ttl-s");
    static const std::regex env_name("[A-Za-z_][A-Za-z0-9_]*");
    for (auto& [name, value] : args.named_strings("env").value_or(std::vector<std::pair<std::string, std::string>>{})) {
        if (!std::regex_match(name, env_name)) throw ToolError(fmt::format("env: '{}' is not a valid variable name", name));
        // The caller's value wins. (A copy: Clang 14 cannot capture a structured binding.)
        std::erase_if(spec.env, [given = name](const auto& entry) { return entry.first == given; });
        spec.env.emplace_back(std::move(name), std::move(value));
    }
    // Named, not built inside the co_await expression: GCC 12 double-frees such temporaries.
    auto executor = co_await asio::this_coro::executor;
    auto notes = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
    sandbox::StatusSink status = [notes](std::string_view m) { notes->note(m); };
    std::shared_ptr<Sandbox> box;
    sandbox::Manager::Kept kept;
    if (persistent) {
        kept = co_await env.manager.keep(std::move(spec), context->principal(), *name, stateful, auto_install, std::move(status));
        box = kept.sandbox;
    } else if (shared_workspace) {
        box = co_await env.manager.create_workspace(std::move(spec), context->principal(), std::move(status));
    } else {
        box = co_await env.manager.create(std::move(spec), context->principal(), false, std::move(status));
    }
    // A cancelled call undoes what it started (a persistent one is saved, not lost); one
    // that found its sandbox live already leaves it to the calls using it.
    if (context->cancelled() && (!persistent || kept.started)) {
        co_await env.manager.destroy(box->id());
        co_return ToolResult{};
    }
    if (!persistent) {  // a persistent one keeps what it was created with
        box->set_stateful(stateful);
        box->set_auto_install(auto_install);
    }
    if (snapshot) {
        std::exception_ptr failure;
        try {
            co_await env.manager.snapshots().restore(box, *snapshot);
        } catch (...) {
            failure = std::current_exception();
        }
        if (failure) {
            co_await env.manager.destroy(box->id(), "stopped", true);  // new: nothing of it stays
            std::rethrow_exception(failure);
        }
    }
    env.manager.lifetimes().adopt(box, std::chrono::seconds(ttl_s));
    const auto& s = box->spec();
    json::Writer w;
    w.begin_object().field("sandbox_id", box->id()).field("container_id", box->container_id());
    w.field("image", s.image).field("network", s.network).field("memory_mb", s.memory_mb).field("cpus", s.cpus);
    w.field("stateful", box->stateful()).field("gpu", s.gpu).field("workspace", box->workspace());
    write_lifetime(w, env.manager.lifetimes().view(box->id()));
    if (persistent) {
        w.field("name", *name).field("persistent", true).field("resumed", kept.resumed).field("state_lost", kept.state_lost);
    }
    if (snapshot) w.field("from_snapshot", snapshot->snapshot_id);
    w.end_object();
    co_return structured(w.take());
}

// ---- execute_code -------------------------------------------------------------

asio::awaitable<ToolResult> execute_code(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"code", "language", "sandbox_id", "timeout_s", "fresh", "return_images", "background", "max_result_bytes"});
    bool return_images = args.boolean("return_images").value_or(false);
    bool background = args.boolean("background").value_or(false);
    auto budget = call_budget(args, env.config);
    std::string code = args.required_string("code");
    auto language_name = args.string("language").value_or("python");
    const sandbox::Language* language = sandbox::find_language(language_name);
    bool fresh = args.boolean("fresh").value_or(false);
    auto timeout = timeout_ms(args, env.config, background);

    if (background) {
        auto id = args.string("sandbox_id");
        if (!id) throw ToolError("a background run needs a sandbox: pass the sandbox_id of initialize_sandbox");
        auto box = env.manager.get(*id, context->principal());
        if (!language || !language->source_file.empty()) {
            throw ToolError(fmt::format("background runs of execute_code take python, javascript or bash; build other languages "
                                        "with run_command and start the program with run_command {{background: true}}"));
        }
        auto request = sandbox::program_with_stdin(language->name, std::move(code));
        if (!request) {
            throw ToolError("the code is too long for a background run (100 KiB); write it to a file with write_file and "
                            "start it with run_command {background: true}");
        }
        request->timeout_ms = timeout;
        request->max_output_bytes = env.config.max_output_bytes;
        co_await install_workspace_dependencies(env, box, context);
        co_return co_await start_background(env, box, std::move(*request), std::string(language->name) + " code");
    }

    std::shared_ptr<Sandbox> box;
    bool throwaway = false;
    if (auto id = args.string("sandbox_id")) {
        box = env.manager.get(*id, context->principal());
    } else {
        sandbox::SandboxSpec spec;
        auto executor = co_await asio::this_coro::executor;
        auto notes = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
        sandbox::StatusSink status = [notes](std::string_view m) { notes->note(m); };
        box = co_await env.manager.create(std::move(spec), context->principal(), true, std::move(status));
        throwaway = true;
    }
    sandbox::ExecResult result;
    std::optional<sandbox::ExecResult> compiled;  // a compile phase that succeeded
    bool compile_failed = false;
    std::vector<CollectedImage> images;
    CollectedFigures figures;
    std::shared_ptr<sandbox::Ledger> ledger;
    auto started = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    auto run_id = new_run_id();
    auto home = output_home(*box, throwaway, run_id, env.config);
    auto watch = std::make_shared<Watch>(static_cast<std::size_t>(env.config.result_budget));
    std::exception_ptr failure;
    try {
        if (!language) {
            auto found = co_await detect_languages(env, box);
            throw ToolError(fmt::format("unknown language '{}'; image {} has: {}", language_name, box->spec().image, available_list(found)));
        }
        // Python, JavaScript and bash (no source file) run on cubicle's images and on the hot path
        // without a probe; a language the image may lack is looked up first, once per image.
        if (!language->source_file.empty()) {
            auto found = co_await detect_languages(env, box);
            if (std::ranges::none_of(found, [language](const DetectedLanguage& d) { return d.language == language; })) {
                throw ToolError(fmt::format("{} is not installed in image {} (Debian packages: {}); it has: {}", language->name,
                                            box->spec().image, language->packages, available_list(found)));
            }
        }
        if (!context->cancelled()) {
            if (!throwaway) co_await install_workspace_dependencies(env, box, context);
            auto executor = co_await asio::this_coro::executor;
            auto progress = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
            auto sink = watch_sink(watch, progress);
            auto options = run_options(*box, home);
            ledger = co_await open_ledger(env, box, context);
            // Throwaway and fresh runs are new processes (Python's forked by the sandbox's zygote).
            bool use_interpreter = box->uses_agent() && !throwaway && !fresh && box->stateful();
            if (use_interpreter && language->repl) {
                // Figures come back inline from the stateful REPL (a throwaway run keeps no files to link).
                if (language->name == "python" && !throwaway) options.figure_dir = box->workspace() + "/" + run_dir(run_id);
                result = co_await box->run_cell(std::string(language->name), std::move(code), !throwaway, timeout, env.config.max_output_bytes,
                                                std::move(sink), context->cancellation(), std::move(options));
            } else if (language->source_file.empty()) {
                auto request = sandbox::program_for(*language, std::move(code));
                request.timeout_ms = timeout;
                request.max_output_bytes = env.config.max_output_bytes;
                result = co_await box->run(std::move(request), std::move(sink), context->cancellation(), std::move(options));
            } else {
                // The compile phase has the run's limits and timeout; a failed compile is the result.
                // Its messages reach the output in order, before the program's.
                auto build = sandbox::build_for(*language, std::move(code), box->workspace());
                build.prepare.timeout_ms = build.run.timeout_ms = timeout;
                build.prepare.max_output_bytes = build.run.max_output_bytes = env.config.max_output_bytes;
                compiled = co_await box->run(std::move(build.prepare), sink, context->cancellation());
                const auto& status = compiled->status;
                if (status.exit_code != 0 || status.signal || status.timed_out || compiled->cancelled) {
                    result = std::move(*compiled);
                    compiled.reset();
                    compile_failed = true;
                } else {
                    result = co_await box->run(std::move(build.run), std::move(sink), context->cancellation(), std::move(options));
                }
            }
            progress->close();
            co_await env.manager.egress().close_run(ledger);
            if (!throwaway) co_await keep_saved_output_bounded(env, box, home, run_id, watch->out.bytes() + watch->err.bytes());
            if (result.figures > 0 && box->alive()) {
                figures = co_await collect_figures(env, box, box->workspace() + "/" + run_dir(run_id), result.figures);
            }
            if (return_images && box->alive()) images = co_await collect_images(env, box, started);
        }
    } catch (...) {
        failure = std::current_exception();
    }
    // Stopped now, removed by Docker in the background: the caller need not wait for it.
    if (throwaway) env.manager.release(box->id());
    if (failure) std::rethrow_exception(failure);

    if (result.state_lost) {
        watch->err.append(result.status.timed_out ? "\n[cubicle] the interpreter was stopped at the timeout; its state (variables, imports) is lost and the next call starts fresh\n"
                          : result.cancelled ? "\n[cubicle] the interpreter was stopped by cancellation; its state is lost and the next call starts fresh\n"
                                             : "\n[cubicle] the interpreter exited; its state is lost and the next call starts fresh\n");
    }
    // Images get what the output leaves of the message (with room for the rest of it);
    // a figure that does not fit stays saved, another image stays in the workspace.
    std::size_t room = max_message_bytes - (256 << 10) - 2 * budget;
    auto fits = [&room](const CollectedImage& image) {
        if (image.base64_data.size() > room) return false;
        room -= image.base64_data.size();
        return true;
    };
    std::erase_if(figures.images, [&](CollectedImage& image) {
        if (fits(image)) return false;
        figures.saved.push_back(image.path);
        return true;
    });
    std::erase_if(images, [&](const CollectedImage& image) {
        if (fits(image)) return false;
        watch->err.append(fmt::format("\n[cubicle] image {} ({} bytes) left out: the result would be too large; "
                                      "fetch it with read_file or download_file\n", image.path, image.bytes));
        return true;
    });
    json::Writer w;
    ToolResult tool_result;
    w.begin_object().field("run_id", run_id);
    write_output(w, watch->out, watch->err, budget, home, result.status.truncated);
    add_output_links(tool_result, *box, home, watch->out, watch->err);
    if (!home.dir.empty() && box->alive()) co_await add_changed_file_links(tool_result, box, started);
    write_status_fields(w, result);
    w.field("duration_ms", static_cast<double>(result.status.duration_us / 100) / 10.0);
    w.field("state_lost", result.state_lost);
    w.field("phase", compile_failed ? "compile" : "run");
    if (compiled) w.field("compile_ms", static_cast<double>(compiled->status.duration_us / 100) / 10.0);
    write_network(w, ledger.get());
    if (return_images || !figures.images.empty() || !figures.saved.empty()) {
        w.key("images").begin_array();
        for (auto* list : {&figures.images, &images}) {
            for (auto& image : *list) {
                w.begin_object().field("path", image.path).field("mime", image.mime).field("bytes", image.bytes).end_object();
                tool_result.images.push_back({std::move(image.base64_data), image.mime});
            }
        }
        w.end_array();
    }
    if (!figures.saved.empty()) {
        w.key("figures_saved").begin_array();
        for (const auto& path : figures.saved) w.value(path);
        w.end_array();
    }
    w.end_object();
    tool_result.structured = w.take();
    co_return tool_result;
}

// ---- run_command --------------------------------------------------------------

asio::awaitable<ToolResult> run_command(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "command", "timeout_s", "background", "max_result_bytes"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto commands = args.strings("command");
    if (!commands) throw ToolError("argument 'command' is required (a shell command or a list of them)");
    bool background = args.boolean("background").value_or(false);
    auto timeout = timeout_ms(args, env.config, background);
    auto budget = call_budget(args, env.config);
    co_await install_workspace_dependencies(env, box, context);
    if (background) {
        if (commands->size() != 1) throw ToolError("a background run takes one command; join several with && or ;");
        auto request = sandbox::shell_command(commands->front());
        request.timeout_ms = timeout;
        request.max_output_bytes = env.config.max_output_bytes;
        co_return co_await start_background(env, box, std::move(request), commands->front());
    }
    auto executor = co_await asio::this_coro::executor;
    json::Writer w;
    ToolResult tool_result;
    w.begin_object().key("results").begin_array();
    std::size_t left = commands->size();
    auto started = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    bool saved = false;
    for (auto& command : *commands) {
        if (context->cancelled()) break;
        auto request = sandbox::shell_command(command);
        request.timeout_ms = timeout;
        request.max_output_bytes = env.config.max_output_bytes;
        auto run_id = new_run_id();
        auto home = output_home(*box, false, run_id, env.config);
        auto watch = std::make_shared<Watch>(static_cast<std::size_t>(env.config.result_budget));
        auto progress = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
        auto sink = watch_sink(watch, progress);
        auto options = run_options(*box, home);
        auto ledger = co_await open_ledger(env, box, context);
        auto result = co_await box->run(std::move(request), std::move(sink), context->cancellation(), std::move(options));
        progress->close();
        co_await env.manager.egress().close_run(ledger);
        co_await keep_saved_output_bounded(env, box, home, run_id, watch->out.bytes() + watch->err.bytes());
        // The budget is shared by the commands in turn: what one leaves, the next may use.
        auto share = std::max(min_result_budget, budget / left--);
        json::Writer entry;
        entry.begin_object().field("command", command).field("run_id", run_id);
        write_output(entry, watch->out, watch->err, share, home, result.status.truncated);
        write_status_fields(entry, result);
        write_network(entry, ledger.get());
        entry.end_object();
        auto used = 2 * entry.str().size();  // escaped once, then again in the text content
        budget = budget > used ? budget - used : 0;
        w.raw(entry.str());
        add_output_links(tool_result, *box, home, watch->out, watch->err);
        saved = saved || !home.dir.empty();
    }
    if (saved && box->alive()) co_await add_changed_file_links(tool_result, box, started);
    w.end_array().end_object();
    tool_result.structured = w.take();
    co_return tool_result;
}

// ---- get_sandbox_status -------------------------------------------------------

void write_saved(json::Writer& w, const sandbox::Keeper::Listed& listed) {
    const auto& saved = listed.saved;
    w.begin_object().field("sandbox_id", saved.sandbox_id).field("name", saved.name);
    w.field("state", listed.elsewhere ? "elsewhere" : "saved").field("image", saved.spec.image);
    w.field("last_used", utc_text(std::chrono::system_clock::from_time_t(static_cast<std::time_t>(saved.last_used))));
    w.field("size_mb", mib(saved.size_bytes));
    // A record still marked in use that nobody holds: its server ended without saving it.
    w.field("ended", saved.ended.empty() && !listed.elsewhere ? std::string("server lost") : saved.ended);
    w.end_object();
}

void write_status(json::Writer& w, Sandbox& box, const sandbox::Manager& manager) {
    const auto& s = box.spec();
    auto memory = manager.memory_limits(s);
    auto age = std::chrono::duration<double>(std::chrono::steady_clock::now() - box.created()).count();
    w.begin_object();
    w.field("sandbox_id", box.id()).field("container_id", box.container_id());
    auto life = manager.lifetimes().view(box.id());
    w.field("state", !box.alive() ? "stopped" : life && life->paused ? "paused" : "running");
    const auto* kept = manager.persistent(box.id());
    w.field("kind", box.throwaway() ? "throwaway" : box.shared() ? "workspace" : kept ? "persistent" : "sandbox");
    if (kept) w.field("name", kept->name);
    w.field("workspace", box.workspace());
    w.field("image", s.image).field("age_s", std::round(age * 10) / 10).field("network", s.network);
    w.field("memory_mb", memory.programs_mb).field("memory_ceiling_mb", memory.ceiling_mb);
    w.field("cpus", s.cpus).field("pids_limit", s.pids_limit);
    w.field("running_executions", static_cast<std::int64_t>(box.running()));
    w.field("executor", box.uses_agent() ? "agent" : "exec").field("stateful", box.uses_agent() && box.stateful());
    w.field("agent_channel", !box.uses_agent() ? "none" : box.on_channel() ? box.channel_kind() : "attach");
    w.field("gpu", s.gpu);
    if (const auto* totals = s.network ? manager.egress().totals(box.id()) : nullptr) {
        w.key("network_ledger");
        sandbox::write_ledger(w, *totals);
    }
    write_lifetime(w, life);
    write_checkpoints(w, box);
    w.end_object();
}

// The warm pool every principal's throwaway runs and new sandboxes come from.
void write_pool(json::Writer& w, const sandbox::Manager& manager) {
    auto stats = manager.pool_stats();
    auto memory = manager.pool_memory();
    w.key("pool").begin_object();
    w.field("ready", static_cast<std::int64_t>(stats.ready)).field("starting", static_cast<std::int64_t>(stats.starting));
    w.field("target", static_cast<std::int64_t>(stats.target));
    w.field("size", manager.pool_size()).field("max", manager.pool_max());
    w.field("memory_measured", static_cast<std::int64_t>(memory.measured));
    if (memory.measured > 0) {
        w.field("memory_uss_mb", mib(memory.uss)).field("memory_pss_mb", mib(memory.pss));
        w.field("memory_cgroup_rss_mb", mib(memory.cgroup_rss)).field("memory_cgroup_cache_mb", mib(memory.cgroup_cache));
    }
    w.end_object();
}

asio::awaitable<ToolResult> get_sandbox_status(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id"});
    auto saved = env.manager.saved(context->principal());
    json::Writer w;
    w.begin_object().key("sandboxes").begin_array();
    auto id = args.string("sandbox_id");
    bool shown = false;
    if (id) {
        for (const auto& one : saved) shown = shown || one.saved.sandbox_id == *id;
        if (!shown) write_status(w, *env.manager.get(*id, context->principal()), env.manager);
    } else {
        for (const auto& box : env.manager.list(context->principal())) write_status(w, *box, env.manager);
    }
    w.end_array().key("saved").begin_array();
    for (const auto& one : saved) {
        if (!id || one.saved.sandbox_id == *id) write_saved(w, one);
    }
    w.end_array();
    // Why the principal's recent sandboxes are gone, newest first (saved ones are in `saved`).
    w.key("ended").begin_array();
    const auto& ended = env.manager.lifetimes().ended_of(context->principal());
    for (auto it = ended.rbegin(); it != ended.rend(); ++it) {
        w.begin_object().field("sandbox_id", it->sandbox_id).field("reason", sandbox::name_of(it->reason));
        w.field("ended_at", utc_text(it->ended_at)).end_object();
    }
    w.end_array();
    write_pool(w, env.manager);
    w.end_object();
    co_return structured(w.take());
}

// ---- stop_sandbox -------------------------------------------------------------

asio::awaitable<ToolResult> stop_sandbox(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "delete"});
    auto id = args.required_string("sandbox_id");
    bool erase = args.boolean("delete").value_or(false);
    json::Writer w;
    if (!env.manager.find(id) || env.manager.find(id)->owner() != context->principal()) {
        // A saved persistent sandbox of this principal: deleting it is the one thing to do.
        bool saved = false;
        for (const auto& one : env.manager.saved(context->principal())) saved = saved || one.saved.sandbox_id == id;
        if (saved) {
            bool deleted = false;
            if (erase) deleted = co_await env.manager.erase_saved(id, context->principal());
            w.begin_object().field("sandbox_id", id).field("stopped", true).field("saved", !deleted).field("deleted", deleted).end_object();
            co_return structured(w.take());
        }
    }
    env.manager.get(id, context->principal());
    bool kept = env.manager.persistent(id) != nullptr;
    bool copied = co_await env.manager.end(id, sandbox::EndReason::stopped, erase);
    // The projects it had open go with it (those of sandboxes reaped otherwise, at the next project call).
    auto alive = [&env](const std::string& sandbox) { return env.manager.find(sandbox) != nullptr; };
    env.projects->forget_unless(alive);
    w.begin_object().field("sandbox_id", id).field("stopped", true);
    // Not saved when its last files could not be copied to disk: the copy before stays.
    if (kept) w.field("saved", !erase && copied).field("deleted", erase);
    w.end_object();
    co_return structured(w.take());
}

} // namespace

asio::awaitable<sandbox::Lifetimes::Use> use_named_sandbox(Env env, simdjson::dom::element arguments, Context context) {
    std::string_view id;
    if (arguments["sandbox_id"].get(id) != simdjson::SUCCESS) co_return sandbox::Lifetimes::Use();
    std::string sandbox_id(id);  // named: GCC 12 and temporaries in a co_await
    std::string principal = context->principal();
    co_return co_await env.manager.lifetimes().use(std::move(sandbox_id), std::move(principal));
}

Services sandbox_services(sandbox::Manager& manager, docker::Client& docker, const Config& config) {
    Env env{manager, docker, config, std::make_shared<Runs>(), std::make_shared<projects::Baselines>()};
    return {tools_of(env), sandbox_resources(env)};
}

std::vector<mcp::Tool> sandbox_tools(sandbox::Manager& manager, docker::Client& docker, const Config& config) {
    return sandbox_services(manager, docker, config).tools;
}

std::vector<mcp::Tool> tools_of(Env env) {
    Handlers handlers{
        {"initialize_sandbox", bind<initialize_sandbox>(env)}, {"execute_code", bind<execute_code>(env)},
        {"run_command", bind<run_command>(env)},               {"get_sandbox_status", bind<get_sandbox_status, false>(env)},
        {"stop_sandbox", bind<stop_sandbox>(env)},
    };
    for (auto* more : {&run_handlers, &checkpoint_handlers, &snapshot_handlers, &file_handlers, &search_handlers, &project_handlers,
                       &preview_handlers, &package_handlers,
                       &language_handlers}) {
        for (auto& handler : (*more)(env)) handlers.push_back(std::move(handler));
    }
    return catalogue_tools(env.config, std::move(handlers));
}

} // namespace cubicle::tools
