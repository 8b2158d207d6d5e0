#include "tools/tools.hpp"

#include <chrono>
#include <cmath>
#include <regex>

#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "docker/client.hpp"
#include "sandbox/languages.hpp"
#include "tools/args.hpp"
#include "tools/progress.hpp"
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

std::uint64_t timeout_ms(const Args& args, const Config& config) {
    auto seconds = args.number("timeout_s", 0.1, config.max_timeout_s).value_or(config.timeout_s);
    return static_cast<std::uint64_t>(std::llround(seconds * 1000));
}

// Runs one program, converting the sandbox being torn down underneath us
// (by a timeout of the whole container, or the server stopping) into a ToolError.
asio::awaitable<sandbox::ExecResult> run_streaming(std::shared_ptr<Sandbox> box, sandbox::agent::RunRequest request, Context context) {
    auto progress = std::make_shared<ProgressStream>(context);
    co_return co_await box->run(std::move(request), progress->sink(progress), context->cancellation());
}

void write_exec_fields(json::Writer& w, const sandbox::ExecResult& result) {
    w.field("stdout", result.stdout_text).field("stderr", result.stderr_text);
    w.field("exit_code", exit_code_of(result.status)).field("timed_out", result.status.timed_out);
}

// ---- initialize_sandbox ----------------------------------------------------

asio::awaitable<ToolResult> initialize_sandbox(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"image", "network", "memory_mb", "cpus", "env", "stateful", "gpu", "auto_install", "workspace"});
    bool shared_workspace = args.boolean("workspace").value_or(false);
    bool auto_install = args.boolean("auto_install").value_or(true);
    bool stateful = args.boolean("stateful").value_or(true);
    sandbox::SandboxSpec spec;
    spec.image = args.string("image").value_or("");
    spec.network = args.boolean("network").value_or(false);
    spec.gpu = args.boolean("gpu").value_or(false);
    spec.memory_mb = static_cast<int>(args.integer("memory_mb", 16, 1 << 20).value_or(0));
    spec.cpus = args.number("cpus", 0.01, 1024).value_or(0);
    static const std::regex env_name("[A-Za-z_][A-Za-z0-9_]*");
    for (auto& [name, value] : args.string_map("env").value_or(std::vector<std::pair<std::string, std::string>>{})) {
        if (!std::regex_match(name, env_name)) throw ToolError(fmt::format("env: '{}' is not a valid variable name", name));
        spec.env.emplace_back(std::move(name), std::move(value));
    }
    // Named, not built inside the co_await expression: GCC 12 double-frees such temporaries.
    sandbox::StatusSink status = [progress = std::make_shared<ProgressStream>(context)](std::string_view m) { progress->note(m); };
    std::shared_ptr<Sandbox> box;
    if (shared_workspace) {
        box = co_await env.manager.create_workspace(std::move(spec), std::move(status));
    } else {
        box = co_await env.manager.create(std::move(spec), false, std::move(status));
    }
    if (context->cancelled()) {
        co_await env.manager.destroy(box->id());
        co_return ToolResult{};
    }
    box->set_stateful(stateful);
    box->set_auto_install(auto_install);
    const auto& s = box->spec();
    json::Writer w;
    w.begin_object().field("sandbox_id", box->id()).field("container_id", box->container_id());
    w.field("image", s.image).field("network", s.network).field("memory_mb", s.memory_mb).field("cpus", s.cpus);
    w.field("stateful", stateful).field("gpu", s.gpu).field("workspace", box->workspace());
    w.end_object();
    co_return structured(w.take());
}

// ---- execute_code -------------------------------------------------------------

asio::awaitable<ToolResult> execute_code(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"code", "language", "sandbox_id", "timeout_s", "fresh", "return_images"});
    bool return_images = args.boolean("return_images").value_or(false);
    std::string code = args.required_string("code");
    auto language_name = args.string("language").value_or("python");
    auto language = sandbox::canonical_language(language_name);
    if (!language) {
        throw ToolError(fmt::format("unknown language '{}'; use one of: {}", language_name, sandbox::language_list()));
    }
    bool fresh = args.boolean("fresh").value_or(false);
    auto timeout = timeout_ms(args, env.config);

    std::shared_ptr<Sandbox> box;
    bool throwaway = false;
    if (auto id = args.string("sandbox_id")) {
        box = env.manager.get(*id);
    } else {
        sandbox::SandboxSpec spec;
        sandbox::StatusSink status = [progress = std::make_shared<ProgressStream>(context)](std::string_view m) { progress->note(m); };
        box = co_await env.manager.create(std::move(spec), true, std::move(status));
        throwaway = true;
    }
    sandbox::ExecResult result;
    std::vector<CollectedImage> images;
    auto started = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::exception_ptr failure;
    try {
        if (!context->cancelled()) {
            if (!throwaway) co_await install_workspace_dependencies(env, box, context);
            auto progress = std::make_shared<ProgressStream>(context);
            // A throwaway sandbox lives for one program, so its (possibly pre-started)
            // interpreter is as fresh as a new process.
            bool use_interpreter = box->uses_agent() && (throwaway || (!fresh && box->stateful()));
            if (use_interpreter && sandbox::has_interpreter(*language)) {
                result = co_await box->run_cell(std::string(*language), std::move(code), !throwaway, timeout, env.config.max_output_bytes,
                                                progress->sink(progress), context->cancellation());
            } else {
                auto request = sandbox::program_for(*language, std::move(code));
                request.timeout_ms = timeout;
                request.max_output_bytes = env.config.max_output_bytes;
                result = co_await box->run(std::move(request), progress->sink(progress), context->cancellation());
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
        result.stderr_text += result.status.timed_out ? "\n[cubicle] the interpreter was stopped at the timeout; its state (variables, imports) is lost and the next call starts fresh\n"
                              : result.cancelled ? "\n[cubicle] the interpreter was stopped by cancellation; its state is lost and the next call starts fresh\n"
                                                 : "\n[cubicle] the interpreter exited; its state is lost and the next call starts fresh\n";
    }
    json::Writer w;
    w.begin_object();
    write_exec_fields(w, result);
    w.field("truncated", result.status.truncated);
    w.field("duration_ms", static_cast<double>(result.status.duration_us / 100) / 10.0);
    w.field("state_lost", result.state_lost);
    ToolResult tool_result;
    if (return_images) {
        w.key("images").begin_array();
        for (auto& image : images) {
            w.begin_object().field("path", image.path).field("mime", image.mime).field("bytes", image.bytes).end_object();
            tool_result.images.push_back({std::move(image.base64_data), image.mime});
        }
        w.end_array();
    }
    w.end_object();
    tool_result.structured = w.take();
    co_return tool_result;
}

// ---- run_command --------------------------------------------------------------

asio::awaitable<ToolResult> run_command(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "command", "timeout_s"});
    auto box = env.manager.get(args.required_string("sandbox_id"));
    auto commands = args.strings("command");
    if (!commands) throw ToolError("argument 'command' is required (a shell command or a list of them)");
    auto timeout = timeout_ms(args, env.config);
    co_await install_workspace_dependencies(env, box, context);
    json::Writer w;
    w.begin_object().key("results").begin_array();
    for (auto& command : *commands) {
        if (context->cancelled()) break;
        auto request = sandbox::shell_command(command);
        request.timeout_ms = timeout;
        request.max_output_bytes = env.config.max_output_bytes;
        auto result = co_await run_streaming(box, std::move(request), context);
        w.begin_object().field("command", command);
        write_exec_fields(w, result);
        w.field("truncated", result.status.truncated);
        w.end_object();
    }
    w.end_array().end_object();
    co_return structured(w.take());
}

// ---- get_sandbox_status -------------------------------------------------------

void write_status(json::Writer& w, const Sandbox& box) {
    const auto& s = box.spec();
    auto age = std::chrono::duration<double>(std::chrono::steady_clock::now() - box.created()).count();
    w.begin_object();
    w.field("sandbox_id", box.id()).field("container_id", box.container_id());
    w.field("state", box.alive() ? "running" : "stopped");
    w.field("kind", box.throwaway() ? "throwaway" : box.shared() ? "workspace" : "persistent");
    w.field("workspace", box.workspace());
    w.field("image", s.image).field("age_s", std::round(age * 10) / 10).field("network", s.network);
    w.field("memory_mb", s.memory_mb).field("cpus", s.cpus).field("pids_limit", s.pids_limit);
    w.field("running_executions", static_cast<std::int64_t>(box.running()));
    w.field("executor", box.uses_agent() ? "agent" : "exec").field("stateful", box.uses_agent() && box.stateful());
    w.field("gpu", s.gpu);
    w.end_object();
}

asio::awaitable<ToolResult> get_sandbox_status(Env env, simdjson::dom::element arguments, Context) {
    Args args(arguments, {"sandbox_id"});
    json::Writer w;
    w.begin_object().key("sandboxes").begin_array();
    if (auto id = args.string("sandbox_id")) {
        write_status(w, *env.manager.get(*id));
    } else {
        for (const auto& box : env.manager.list()) write_status(w, *box);
    }
    w.end_array().end_object();
    co_return structured(w.take());
}

// ---- stop_sandbox -------------------------------------------------------------

asio::awaitable<ToolResult> stop_sandbox(Env env, simdjson::dom::element arguments, Context) {
    Args args(arguments, {"sandbox_id"});
    auto id = args.required_string("sandbox_id");
    env.manager.get(id);
    co_await env.manager.destroy(id);
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("stopped", true).end_object();
    co_return structured(w.take());
}

// ---- schemas ------------------------------------------------------------------

constexpr std::string_view exec_result_properties = R"(
        "stdout": {"type": "string", "description": "Standard output, UTF-8 with invalid bytes replaced"},
        "stderr": {"type": "string", "description": "Standard error"},
        "exit_code": {"type": "integer", "description": "Exit status; 128+N when killed by signal N"},
        "timed_out": {"type": "boolean", "description": "Killed (with all its processes) at the timeout"},
        "truncated": {"type": "boolean", "description": "Output went past the cap and was cut"})";

constexpr std::string_view timeout_property =
    R"("timeout_s": {"type": "number", "exclusiveMinimum": 0, "description": "Kill the program (and every process it started) after this many seconds"})";

constexpr std::string_view sandbox_status_properties = R"(
        "sandbox_id": {"type": "string"}, "container_id": {"type": "string"},
        "state": {"type": "string", "enum": ["running", "stopped"]},
        "kind": {"type": "string", "enum": ["persistent", "throwaway", "workspace"]},
        "workspace": {"type": "string"},
        "image": {"type": "string"}, "age_s": {"type": "number"}, "network": {"type": "boolean"},
        "memory_mb": {"type": "integer"}, "cpus": {"type": "number"}, "pids_limit": {"type": "integer"},
        "running_executions": {"type": "integer"},
        "executor": {"type": "string", "enum": ["agent", "exec"], "description": "How programs run: agent, the in-sandbox agent; or exec, Docker exec where the agent cannot run in the image, with no persistent interpreters and a timeout that stops the sandbox"},
        "stateful": {"type": "boolean"}, "gpu": {"type": "boolean"})";

} // namespace

std::vector<mcp::Tool> sandbox_tools(sandbox::Manager& manager, docker::Client& docker, const Config& config) {
    Env env{manager, docker, config};
    std::vector<mcp::Tool> tools;

    tools.push_back({
        .name = "initialize_sandbox",
        .title = "Create a sandbox",
        .description = "Create a persistent, isolated Linux sandbox (a locked-down Docker container) and return its "
                       "sandbox_id for execute_code and run_command. Files in /workspace persist until stop_sandbox. "
                       "No network unless network is true and the server allows it.",
        .input_schema = object_schema(fmt::format(R"(
            "image": {{"type": "string", "description": "Docker image; default {}"}},
            "network": {{"type": "boolean", "default": false, "description": "Give the sandbox network access, if the server allows it"}},
            "memory_mb": {{"type": "integer", "minimum": 16, "description": "Memory limit in MiB; default {}"}},
            "cpus": {{"type": "number", "exclusiveMinimum": 0, "description": "CPU limit; default {}"}},
            "env": {{"type": "object", "properties": {{}}, "additionalProperties": {{"type": "string"}}, "description": "Environment variables for programs in the sandbox"}},
            "stateful": {{"type": "boolean", "default": true, "description": "Python and JavaScript keep variables between execute_code calls, in one persistent interpreter per language"}},
            "workspace": {{"type": "boolean", "default": false, "description": "A private workspace (own directory and user) in a container shared with other workspaces: much cheaper than a container of its own, but memory, CPU and process limits are shared and there is no network"}},
            "auto_install": {{"type": "boolean", "default": true, "description": "Before running code, install requirements.txt / package.json from the workspace when they changed; sandboxes with network only"}},
            "gpu": {{"type": "boolean", "default": false, "description": "Give the sandbox the host's NVIDIA GPUs; needs the NVIDIA container runtime on the host"}})",
                                                  config.default_image, config.memory_mb, config.cpus),
                                      ""),
        .output_schema = object_schema(R"(
            "sandbox_id": {"type": "string"}, "container_id": {"type": "string"}, "image": {"type": "string"},
            "network": {"type": "boolean"}, "memory_mb": {"type": "integer"}, "cpus": {"type": "number"},
            "stateful": {"type": "boolean"}, "gpu": {"type": "boolean"},
            "workspace": {"type": "string", "description": "Directory of the sandbox's files"})",
                                       R"("sandbox_id", "image", "network", "memory_mb", "cpus")"),
        .read_only = false, .destructive = false, .idempotent = false, .open_world = false,
        .handler = bind<initialize_sandbox>(env),
    });

    tools.push_back({
        .name = "execute_code",
        .title = "Run code",
        .description = fmt::format(
            "Run a program in a sandbox and return its output. Languages: {}. Without sandbox_id it runs in a fresh "
            "throwaway sandbox removed afterwards. Output streams as progress notifications while it runs. Default "
            "timeout {} s (max {} s); output capped at {} bytes per stream.",
            sandbox::language_list(), config.timeout_s, config.max_timeout_s, config.max_output_bytes),
        .input_schema = object_schema(fmt::format(R"(
            "code": {{"type": "string", "description": "The program's source code"}},
            "language": {{"type": "string", "enum": ["python", "python3", "py", "javascript", "node", "js", "bash", "sh", "shell"], "default": "python"}},
            {},
            {},
            "fresh": {{"type": "boolean", "default": false, "description": "In a stateful sandbox, run in a fresh process instead of the persistent interpreter"}},
            "return_images": {{"type": "boolean", "default": false, "description": "Return images the code writes into the workspace (PNG, JPEG, GIF, WebP, SVG; at most 5 of 2 MiB) as image content"}})",
                                                  sandbox_id_property, timeout_property),
                                      R"("code")"),
        .output_schema = object_schema(fmt::format(R"({},
            "duration_ms": {{"type": "number", "description": "Wall time of the program"}},
            "state_lost": {{"type": "boolean", "description": "The persistent interpreter was stopped; earlier variables are gone"}},
            "images": {{"type": "array", "items": {{"type": "object", "properties": {{"path": {{"type": "string"}}, "mime": {{"type": "string"}}, "bytes": {{"type": "integer"}}}}, "required": ["path", "mime", "bytes"]}}}})",
                                                   exec_result_properties),
                                       R"("stdout", "stderr", "exit_code", "timed_out", "truncated", "duration_ms")"),
        .read_only = false, .destructive = false, .idempotent = false, .open_world = false,
        .handler = bind<execute_code>(env),
    });

    tools.push_back({
        .name = "run_command",
        .title = "Run shell commands",
        .description = "Run one shell command or a list of them, in order, with /bin/sh -c in the sandbox's /workspace. "
                       "Each command gets its own result.",
        .input_schema = object_schema(fmt::format(R"({},
            "command": {{"anyOf": [{{"type": "string"}}, {{"type": "array", "items": {{"type": "string"}}, "minItems": 1}}], "description": "A command, or a list run in order"}},
            {})",
                                                  sandbox_id_property, timeout_property),
                                      R"("sandbox_id", "command")"),
        .output_schema = object_schema(fmt::format(R"(
            "results": {{"type": "array", "items": {}}})",
                                                   object_schema(fmt::format(R"("command": {{"type": "string"}}, {})", exec_result_properties),
                                                                 R"("command", "stdout", "stderr", "exit_code", "timed_out")")),
                                       R"("results")"),
        .read_only = false, .destructive = false, .idempotent = false, .open_world = false,
        .handler = bind<run_command>(env),
    });

    tools.push_back({
        .name = "get_sandbox_status",
        .title = "Sandbox status",
        .description = "Show one sandbox (with sandbox_id) or every sandbox this server owns: state, image, age and limits.",
        .input_schema = object_schema(sandbox_id_property, ""),
        .output_schema = object_schema(fmt::format(R"(
            "sandboxes": {{"type": "array", "items": {}}})",
                                                   object_schema(sandbox_status_properties, R"("sandbox_id", "state", "image")")),
                                       R"("sandboxes")"),
        .read_only = true, .destructive = false, .idempotent = true, .open_world = false,
        .handler = bind<get_sandbox_status>(env),
    });

    tools.push_back({
        .name = "stop_sandbox",
        .title = "Stop a sandbox",
        .description = "Stop a sandbox and delete it with its files.",
        .input_schema = object_schema(sandbox_id_property, R"("sandbox_id")"),
        .output_schema = object_schema(R"("sandbox_id": {"type": "string"}, "stopped": {"type": "boolean"})",
                                       R"("sandbox_id", "stopped")"),
        .read_only = false, .destructive = true, .idempotent = false, .open_world = false,
        .handler = bind<stop_sandbox>(env),
    });
    for (auto& tool : file_tools(env)) tools.push_back(std::move(tool));
    for (auto& tool : package_tools(env)) tools.push_back(std::move(tool));
    return tools;
}

} // namespace cubicle::tools
