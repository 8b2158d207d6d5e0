// Which languages an image has, detected by running a probe in it; list_languages.
#include <map>

#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "sandbox/languages.hpp"
#include "tools/args.hpp"
#include "tools/progress.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;

// An image id names immutable content, so what was found in it holds for the
// life of the server, whichever sandbox found it.
std::map<std::string, std::vector<DetectedLanguage>>& detected_by_image() {
    static std::map<std::string, std::vector<DetectedLanguage>> cache;
    return cache;
}

asio::awaitable<std::vector<DetectedLanguage>> probe(std::shared_ptr<sandbox::Sandbox> box) {
    auto request = sandbox::shell_command(sandbox::language_probe_script());
    request.timeout_ms = 60'000;
    request.max_output_bytes = 64 * 1024;
    sandbox::OutputSink no_sink;
    auto result = co_await box->run(std::move(request), std::move(no_sink), nullptr);
    if (result.status.exit_code != 0 || result.status.timed_out) {
        throw ToolError(fmt::format("could not detect the languages of image {}: {}", box->spec().image, result.stderr_text));
    }
    std::vector<DetectedLanguage> found;
    std::string_view rest = result.stdout_text;
    while (!rest.empty()) {
        auto line = rest.substr(0, rest.find('\n'));
        rest.remove_prefix(std::min(rest.size(), line.size() + 1));
        auto tab = line.find('\t');
        if (tab == std::string_view::npos) continue;
        if (auto language = sandbox::find_language(line.substr(0, tab))) {
            found.push_back({language, sandbox::version_number(line.substr(tab + 1))});
        }
    }
    co_return found;
}

void write_languages(json::Writer& w, const std::vector<DetectedLanguage>& found) {
    w.key("languages").begin_array();
    for (const auto& [language, version] : found) {
        w.begin_object().field("name", language->name).field("version", version);
        w.key("aliases").begin_array();
        for (auto alias : language->aliases) w.value(alias);
        w.end_array();
        w.field("compiled", !language->compile.empty()).field("stateful", language->repl);
        w.field("packages", language->packages);
        w.end_object();
    }
    w.end_array();
}

asio::awaitable<ToolResult> list_languages(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "image"});
    auto id = args.string("sandbox_id");
    auto image = args.string("image");
    if (id && image) throw ToolError("give sandbox_id or image, not both");
    std::shared_ptr<sandbox::Sandbox> box;
    bool throwaway = false;
    if (id) {
        box = env.manager.get(*id, context->principal());
    } else {
        sandbox::SandboxSpec spec;
        spec.image = image.value_or("");
        auto executor = co_await asio::this_coro::executor;
        auto notes = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
        sandbox::StatusSink status = [notes](std::string_view m) { notes->note(m); };
        box = co_await env.manager.create(std::move(spec), context->principal(), true, std::move(status));
        throwaway = true;
    }
    std::vector<DetectedLanguage> found;
    std::exception_ptr failure;
    try {
        found = co_await detect_languages(env, box);
    } catch (...) {
        failure = std::current_exception();
    }
    if (throwaway) env.manager.release(box->id());
    if (failure) std::rethrow_exception(failure);
    json::Writer w;
    w.begin_object().field("image", box->spec().image);
    write_languages(w, found);
    w.end_object();
    co_return structured(w.take());
}

} // namespace

asio::awaitable<std::vector<DetectedLanguage>> detect_languages(Env env, std::shared_ptr<sandbox::Sandbox> box) {
    auto info = co_await env.docker.inspect_image(box->spec().image);
    std::string key = info ? info->id : box->spec().image;
    auto& cache = detected_by_image();
    if (auto it = cache.find(key); it != cache.end()) co_return it->second;
    auto found = co_await probe(box);
    cache[key] = found;
    co_return found;
}

std::string available_list(const std::vector<DetectedLanguage>& found) {
    std::string out;
    for (const auto& [language, version] : found) {
        if (!out.empty()) out += ", ";
        out += language->name;
        if (!language->aliases.empty()) out += fmt::format(" ({})", fmt::join(language->aliases, ", "));
    }
    return out.empty() ? "none" : out;
}

std::vector<mcp::Tool> language_tools(Env env) {
    std::vector<mcp::Tool> tools;
    tools.push_back({
        .name = "list_languages",
        .title = "List languages",
        .description = fmt::format("List the languages execute_code can run in a sandbox (sandbox_id) or an image (default {}), "
                                   "with their versions, as found in the image itself. Known languages: {}.",
                                   env.config.default_image, sandbox::language_list()),
        .input_schema = object_schema(fmt::format(R"({},
            "image": {{"type": "string", "description": "Docker image to look in, when no sandbox_id is given"}})",
                                                  sandbox_id_property),
                                      ""),
        .output_schema = object_schema(R"(
            "image": {"type": "string"},
            "languages": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string", "description": "The execute_code language"},
                "version": {"type": "string"},
                "aliases": {"type": "array", "items": {"type": "string"}},
                "compiled": {"type": "boolean", "description": "Compiled before it runs; builds are cached by content in the sandbox"},
                "stateful": {"type": "boolean", "description": "Keeps variables between execute_code calls in a stateful sandbox"},
                "packages": {"type": "string", "description": "The Debian packages that provide it"}},
                "required": ["name", "version", "aliases", "compiled", "stateful", "packages"]}})",
                                       R"("image", "languages")"),
        .read_only = true, .destructive = false, .idempotent = true, .open_world = false,
        .handler = bind<list_languages>(env),
    });
    return tools;
}

} // namespace cubicle::tools
