// Which languages an image has, detected by running a probe in it: the list_languages
// tool and the cubicle://languages resource, both written from the one language table.
#include <map>

#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "image/profiles.hpp"
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

// What a language is in any image, from the table: the part of a list_languages entry
// and of a cubicle://languages entry that does not depend on the image.
void write_language(json::Writer& w, const sandbox::Language& language) {
    w.field("name", language.name);
    w.key("aliases").begin_array();
    for (auto alias : language.aliases) w.value(alias);
    w.end_array();
    w.field("extension", language.extension).field("compiled", !language.compile.empty()).field("stateful", language.repl);
    w.field("packages", language.packages);
}

void write_languages(json::Writer& w, const std::vector<DetectedLanguage>& found) {
    w.key("languages").begin_array();
    for (const auto& [language, version] : found) {
        w.begin_object();
        write_language(w, *language);
        w.field("version", version).end_object();
    }
    w.end_array();
}

// The languages of `image` (present on this host): from the cache when its id was probed
// before, else probed in a throwaway sandbox.
asio::awaitable<std::vector<DetectedLanguage>> languages_of_image(Env env, std::string principal, std::string image,
                                                                  sandbox::StatusSink status) {
    if (auto info = co_await env.docker.inspect_image(image)) {
        if (auto it = detected_by_image().find(info->id); it != detected_by_image().end()) co_return it->second;
    }
    sandbox::SandboxSpec spec;
    spec.image = std::move(image);
    auto box = co_await env.manager.create(std::move(spec), principal, true, std::move(status));
    std::vector<DetectedLanguage> found;
    std::exception_ptr failure;
    try {
        found = co_await detect_languages(env, box);
    } catch (...) {
        failure = std::current_exception();
    }
    env.manager.release(box->id());
    if (failure) std::rethrow_exception(failure);
    co_return found;
}

asio::awaitable<ToolResult> list_languages(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "image"});
    auto id = args.string("sandbox_id");
    auto image = args.string("image");
    if (id && image) throw ToolError("give sandbox_id or image, not both");
    std::string searched;
    std::vector<DetectedLanguage> found;
    if (id) {
        auto box = env.manager.get(*id, context->principal());
        searched = box->spec().image;
        found = co_await detect_languages(env, box);
    } else {
        searched = image.value_or(env.config.default_image);
        auto executor = co_await asio::this_coro::executor;
        auto notes = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
        sandbox::StatusSink status = [notes](std::string_view m) { notes->note(m); };
        found = co_await languages_of_image(env, context->principal(), searched, std::move(status));
    }
    json::Writer w;
    w.begin_object().field("image", searched);
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

mcp::Resource languages_resource() {
    return {.uri = std::string(languages_uri), .name = "languages", .mime_type = "application/json", .size = 0,
            .title = "Languages",
            .description = "Every language execute_code knows (extension, compiled, stateful, Debian packages) and the images "
                           "on this host that have it, with the version found in each; images of profiles not built here are "
                           "listed with the command that builds them."};
}

asio::awaitable<mcp::ResourceContent> read_languages_resource(Env env, std::string principal) {
    // The default image and every sandbox profile's (the server's own image runs no sandboxes).
    struct Image {
        std::string name;
        const image::Profile* profile;
        bool present = false;
        std::vector<DetectedLanguage> found;
    };
    std::vector<Image> images{{env.config.default_image, image::find_profile(env.config.default_image)}};
    for (const auto& profile : image::profiles()) {
        if (profile.binary.empty() && &profile != images.front().profile) images.push_back({profile.image, &profile});
    }
    for (auto& image : images) {
        image.present = co_await env.docker.inspect_image(image.name) != std::nullopt;
        if (image.present) image.found = co_await languages_of_image(env, principal, image.name, {});
    }
    json::Writer w;
    w.begin_object().field("default_image", env.config.default_image).key("images").begin_array();
    for (const auto& image : images) {
        w.begin_object().field("image", image.name).field("present", image.present);
        if (image.profile) w.field("profile", image.profile->name);
        w.key("languages").begin_array();
        if (image.present) {
            for (const auto& detected : image.found) w.value(detected.language->name);
        } else if (image.profile) {
            for (const auto& name : image.profile->languages) w.value(name);
        }
        w.end_array();
        if (!image.present && image.profile) w.field("build", fmt::format("cubicle image build {}", image.profile->name));
        w.end_object();
    }
    w.end_array().key("languages").begin_array();
    for (const auto& language : sandbox::languages()) {
        w.begin_object();
        write_language(w, language);
        w.key("images").begin_array();
        for (const auto& image : images) {
            for (const auto& [found, version] : image.found) {
                if (found == &language) w.begin_object().field("image", image.name).field("version", version).end_object();
            }
        }
        w.end_array().end_object();
    }
    w.end_array().end_object();
    co_return mcp::ResourceContent{.uri = std::string(languages_uri), .mime_type = "application/json", .text = w.take()};
}

Handlers language_handlers(Env env) { return {{"list_languages", bind<list_languages>(env)}}; }

} // namespace cubicle::tools
