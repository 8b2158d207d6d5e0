// What every tool module shares: its environment, result helpers and the
// adapter from a coroutine to an mcp::ToolHandler.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <simdjson.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "config.hpp"
#include "docker/client.hpp"
#include "files/host_transfer.hpp"
#include "mcp/resource.hpp"
#include "mcp/tool.hpp"
#include "sandbox/languages.hpp"
#include "sandbox/manager.hpp"
#include "tools/budget.hpp"
#include "tools/catalogue.hpp"

namespace cubicle::projects {
class Baselines;
}

namespace cubicle::tools {

class Runs;

struct Env {
    sandbox::Manager& manager;
    docker::Client& docker;
    const Config& config;
    std::shared_ptr<Runs> runs;  // background runs
    std::shared_ptr<projects::Baselines> projects;  // what open_project copied
};

using Context = std::shared_ptr<mcp::RequestContext>;

// Bytes as MiB with one decimal, as results show sizes.
inline double mib(std::uint64_t bytes) {
    return std::round(static_cast<double>(bytes) / (1 << 20) * 10) / 10;
}

// What one host transfer may move: --max-transfer-mb and --max-transfer-entries.
inline files::Limits transfer_limits(const Config& config) {
    return {static_cast<std::uint64_t>(config.max_transfer_mb) << 20, static_cast<std::uint64_t>(config.max_transfer_entries)};
}

// The last component of a host path: a transfer's default name in the workspace.
inline std::string base_name(std::string_view path) {
    while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
    auto slash = path.rfind('/');
    return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

// A host transfer's destination inside the sandbox never passes through a symbolic
// link. Where the sandbox user extracts the upload (extract_as_sandbox_user) this is
// no longer what keeps it in bounds, since tar cannot write where that user could
// not, but it keeps the behaviour of every path alike: an upload replaces what is
// at its destination and never lands where a link points. Where the Engine's
// archive API extracts (as root, following links: into another workspace's
// directory, or the agent's volume) it is the guard; checked as the sandbox user
// just before the upload, so a program running at that very moment could still
// swap a link in between (the README says so).
inline constexpr std::string_view no_link_on_the_way = R"SH(
        p=$1
        while [ "$p" != . ]; do
            if [ -L "$p" ]; then echo "$p is a symbolic link; host transfers never pass through one" >&2; exit 2; fi
            p=$(dirname -- "$p")
        done
)SH";

inline mcp::ToolResult structured(std::string json_text) { return mcp::ToolResult{.structured = std::move(json_text)}; }

// A call that names a sandbox (`sandbox_id`) is a use of it: a paused one is resumed
// first, its idle time and ttl_s start again when the call ends (sandbox/lifetimes.hpp).
boost::asio::awaitable<sandbox::Lifetimes::Use> use_named_sandbox(Env env, simdjson::dom::element arguments, Context context);

// Docker failures (daemon down, image refused) are results the model can act on.
// `wakes`: false for a tool that only reads the manager's state (get_sandbox_status).
template <auto Handler, bool wakes = true>
boost::asio::awaitable<mcp::ToolResult> guarded(Env env, simdjson::dom::element arguments, Context context) {
    try {
        sandbox::Lifetimes::Use use;
        if constexpr (wakes) use = co_await use_named_sandbox(env, arguments, context);
        auto result = co_await Handler(env, arguments, std::move(context));
        finish_result(result);
        co_return result;
    } catch (const docker::Error& e) {
        throw ToolError(e.what());
    }
}

template <auto Handler, bool wakes = true>
mcp::ToolHandler bind(Env env) {
    // Not a coroutine itself: it only forwards to one, so nothing it captures dangles.
    return [env](simdjson::dom::element arguments, Context context) {
        return guarded<Handler, wakes>(env, arguments, std::move(context));
    };
}

// An image file a run wrote into the workspace.
struct CollectedImage {
    std::string path;
    std::string mime;
    std::uint64_t bytes;
    std::string base64_data;
};

// Images (PNG, JPEG, GIF, WebP, SVG) in the workspace modified after `since`
// (unix seconds), at most 5 of at most 2 MiB each.
boost::asio::awaitable<std::vector<CollectedImage>> collect_images(Env env, std::shared_ptr<sandbox::Sandbox> box, double since);

// Adds resource_link content for workspace files modified after `since` (unix
// seconds): at most max_changed_links, the last one saying when there were more.
inline constexpr std::size_t max_changed_links = 10;
boost::asio::awaitable<void> add_changed_file_links(mcp::ToolResult& result, std::shared_ptr<sandbox::Sandbox> box, double since);

// The figures a Python cell saved (figure-1.png … in `dir`, absolute): the
// first `max_images` of at most `max_bytes` as images, the paths of the rest.
struct CollectedFigures {
    std::vector<CollectedImage> images;
    std::vector<std::string> saved;  // workspace-relative paths not returned inline
};
boost::asio::awaitable<CollectedFigures> collect_figures(Env env, std::shared_ptr<sandbox::Sandbox> box, std::string dir,
                                                         int count);

// Every enabled tool: the catalogue's entries with their handlers (sandbox_tools.cpp).
std::vector<mcp::Tool> tools_of(Env env);

// The sandboxes' files as resources, sandbox://<sandbox_id>/<path> (resources.cpp).
mcp::ResourceProvider sandbox_resources(Env env);
std::string sandbox_uri(std::string_view sandbox_id, std::string_view path);

// A workspace file's size and its first `max_bytes` (file_tools.cpp). Throws ToolError.
struct FileHead {
    std::uint64_t size;
    std::string data;
};
boost::asio::awaitable<FileHead> read_workspace_file(std::shared_ptr<sandbox::Sandbox> box, std::string path, std::uint64_t max_bytes);
// The MIME type of an image file by its bytes, else empty.
std::string image_mime_of(std::string_view path, std::string_view data);

// The background-run tools: get_run, send_input, signal_run, list_runs (run_tools.cpp).
Handlers run_handlers(Env env);

// The file tools (file_tools.cpp).
Handlers file_handlers(Env env);

// search_files (search_files.cpp).
Handlers search_handlers(Env env);

// A short shell script run in the workspace as the sandbox user ($1… are `args`),
// its output collected; a failure becomes a ToolError with its stderr (file_tools.cpp).
boost::asio::awaitable<sandbox::ExecResult> workspace_script(std::shared_ptr<sandbox::Sandbox> box, std::string script,
                                                             std::vector<std::string> args, std::string stdin_data,
                                                             std::uint64_t max_output);

// open_project, diff_project, apply_project (project_tools.cpp).
Handlers project_handlers(Env env);

// list_languages (language_tools.cpp).
Handlers language_handlers(Env env);

// A language found in an image, with its version.
struct DetectedLanguage {
    const sandbox::Language* language;
    std::string version;
};

// The languages present in a sandbox's image, probed once per image id.
boost::asio::awaitable<std::vector<DetectedLanguage>> detect_languages(Env env, std::shared_ptr<sandbox::Sandbox> box);

// cubicle://languages: every language and the images on this host that have it, with
// their versions (the languages part written like list_languages' entries).
inline constexpr std::string_view languages_uri = "cubicle://languages";
mcp::Resource languages_resource();
boost::asio::awaitable<mcp::ResourceContent> read_languages_resource(Env env, std::string principal);

// "python (python3, py), go (golang)" for the detected languages; "none" if there are none.
std::string available_list(const std::vector<DetectedLanguage>& found);

// checkpoint_session, restore_checkpoint (checkpoint_tools.cpp).
Handlers checkpoint_handlers(Env env);
// Its checkpoints, for get_sandbox_status: "checkpoints": [...].
void write_checkpoints(json::Writer& w, sandbox::Sandbox& box);

// expose_port, unexpose_port (preview_tools.cpp).
Handlers preview_handlers(Env env);

// snapshot_sandbox, fork_sandbox, list_snapshots, delete_snapshot (snapshot_tools.cpp).
Handlers snapshot_handlers(Env env);
// initialize_sandbox {from_snapshot}: throws ToolError when a snapshot's limits are over
// this server's ceilings (they may have been lowered since it was taken).
void check_within_ceilings(const sandbox::SandboxSpec& spec, const Config& config);

// install_package (package_tools.cpp).
Handlers package_handlers(Env env);

// Installs requirements.txt / package.json when they changed since the last
// install, in sandboxes with network and auto_install on. Throws ToolError
// with the installer's output when it fails.
boost::asio::awaitable<void> install_workspace_dependencies(Env env, std::shared_ptr<sandbox::Sandbox> box, Context context);

} // namespace cubicle::tools
