// open_project, diff_project, apply_project: thin adapters over src/projects
// (baseline, changes, apply). Inside the sandbox every step runs as the sandbox
// user through the agent; on the host every read and write goes through
// src/files/host_transfer, confined to the operator's --allow-host-dir.
#include <algorithm>

#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "files/host_transfer.hpp"
#include "projects/apply.hpp"
#include "projects/baseline.hpp"
#include "projects/changes.hpp"
#include "projects/ignore.hpp"
#include "tools/args.hpp"
#include "tools/budget.hpp"
#include "tools/support.hpp"
#include "tools/tools.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;
using sandbox::Sandbox;

// The project's place in the workspace: never the workspace itself or cubicle's own .cubicle.
std::string project_path(std::string_view asked) {
    auto path = files::workspace_path(asked);
    if (path == ".") throw ToolError("path names the workspace itself; name a directory inside it");
    if (path == ".cubicle" || path.starts_with(".cubicle/")) throw ToolError("path may not be inside .cubicle (cubicle's own files)");
    return path;
}

// Baselines of sandboxes that stopped go the next time any project tool runs.
std::shared_ptr<projects::Baselines> baselines(const Env& env) {
    env.projects->forget_unless([&env](const std::string& id) { return env.manager.find(id) != nullptr; });
    return env.projects;
}

// Replaces the destination with the archive (stdin), unpacked by tar as the
// sandbox user; the path may not pass through a link the sandbox made. Exit 3:
// the image has no tar.
constexpr std::string_view replace_with_archive = R"SH(
        command -v tar >/dev/null || { echo "open_project needs tar in the sandbox image" >&2; exit 3; }
        rm -rf -- "$1" || exit 2
        exec tar -x -p -f - --no-same-owner)SH";

// Every entry of the copy but directories and .git internals (projects::parse_listing reads it).
constexpr std::string_view list_copy = R"SH(
        if [ -L "$1" ] || [ ! -d "$1" ]; then echo "$1 is no longer a directory in the workspace" >&2; exit 2; fi
        cd -- "$1" && exec find . -path ./.git -prune -o ! -type d -printf '%y\t%m\t%s\t%T@\t%P\0%l\0')SH";

// The named files (stdin, NUL-separated, "./"-prefixed so no name reads as an option), as a tar archive.
constexpr std::string_view archive_named = R"SH(
        command -v tar >/dev/null || { echo "this needs tar in the sandbox image" >&2; exit 2; }
        cd -- "$1" && exec tar -c -f - --null --verbatim-files-from --no-recursion -T -)SH";

constexpr std::string_view save_diff = R"SH(mkdir -p .cubicle/diffs && cat > ".cubicle/diffs/$1")SH";

// The sandbox copy's changes since the baseline: a listing, then the contents of
// the files whose size or time moved.
asio::awaitable<std::vector<projects::Change>> changes_in(Env env, std::shared_ptr<Sandbox> box,
                                                          std::shared_ptr<projects::Baseline> baseline) {
    auto limits = transfer_limits(env.config);
    std::string list_script(list_copy);
    std::vector<std::string> list_args{baseline->path};
    std::string no_input;
    auto listed = co_await workspace_script(box, std::move(list_script), std::move(list_args), std::move(no_input),
                                            limits.max_entries * 4200);
    if (listed.status.truncated)
        throw ToolError(fmt::format("the project in the sandbox holds more than {} entries", limits.max_entries));
    auto listing = projects::parse_listing(listed.stdout_text);
    auto wanted = projects::files_to_fetch(*baseline, listing);
    std::map<std::string, std::string> fetched;
    if (!wanted.empty()) {
        std::string names;
        for (const auto& path : wanted) names.append("./").append(path).push_back('\0');
        std::string fetch_script(archive_named);
        std::vector<std::string> fetch_args{baseline->path};
        auto archive_limit = limits.max_bytes + limits.max_entries * 1536 + (1 << 20);
        auto made = co_await workspace_script(box, std::move(fetch_script), std::move(fetch_args), std::move(names), archive_limit);
        if (made.status.truncated)
            throw ToolError(fmt::format("the changed files are larger than the transfer limit of {} MiB", env.config.max_transfer_mb));
        for (const auto& member : files::read_tar(made.stdout_text, limits)) {
            if (member.type == files::EntryType::file) fetched[member.path] = std::string(member.data);
        }
    }
    co_return projects::compare(*baseline, listing, fetched);
}

void write_change_list(json::Writer& w, const std::vector<projects::Change>& changes) {
    w.key("changes").begin_array();
    for (const auto& change : changes) {
        w.begin_object().field("path", json::sanitize_utf8(change.path)).field("status", projects::status_name(change.status));
        w.field("type", change.type).field("binary", change.binary);
        if (change.status != projects::ChangeStatus::added) w.field("old_mode", fmt::format("{:04o}", change.old_mode));
        if (change.status != projects::ChangeStatus::deleted) w.field("new_mode", fmt::format("{:04o}", change.new_mode));
        w.end_object();
    }
    w.end_array();
}

// ---- open_project ---------------------------------------------------------------

asio::awaitable<ToolResult> open_project(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "host_path", "path", "include_ignored"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto host_path = args.required_string("host_path");
    files::HostDirs dirs(env.config.allow_host_dirs);
    dirs.locate(host_path);  // refuses early, with the allowed roots in the message
    auto path = project_path(args.string("path").value_or(base_name(host_path)));
    bool include_ignored = args.boolean("include_ignored").value_or(false);

    files::require_host_directory(dirs, host_path);  // before libgit2 reads the rules by name
    auto baseline = std::make_shared<projects::Baseline>();
    baseline->host_path = host_path;
    baseline->path = path;
    if (!include_ignored) baseline->ignore = std::make_shared<projects::IgnoreRules>(host_path);
    files::PackOptions options;
    options.keep_links = true;
    // .git travels whole (git works in the sandbox) but is no part of the baseline.
    options.excluded = [&baseline](const std::string& p, bool directory) {
        return baseline->ignore && !projects::is_git_internal(p) && baseline->ignore->ignored(p, directory);
    };
    options.on_entry = [&baseline](const files::PackedEntry& entry) {
        if (!projects::is_git_internal(entry.path))
            baseline->record(std::string(entry.path), entry.link, entry.mode, static_cast<double>(entry.mtime), std::string(entry.data));
    };
    auto packed = files::pack_host_path(dirs, host_path, path, box->uid(), transfer_limits(env.config), options);

    std::string script = std::string(no_link_on_the_way) + std::string(replace_with_archive);
    std::vector<std::string> script_args{path};
    co_await workspace_script(box, std::move(script), std::move(script_args), std::move(packed.tar), 64 * 1024);
    // A sandbox stopped meanwhile keeps no baseline.
    if (env.manager.find(box->id()) == nullptr) throw ToolError("the sandbox was stopped while the project was copied");
    baselines(env)->put(box->id(), baseline, transfer_limits(env.config).max_bytes);

    json::Writer w;
    w.begin_object().field("path", path).field("host_path", host_path).field("files", packed.files);
    w.field("directories", packed.directories).field("bytes", packed.bytes).field("ignored", packed.ignored);
    w.field("ignore_rules", include_ignored ? "none (include_ignored)"
                            : baseline->ignore->in_repository() ? "the git repository's"
                                                                 : ".gitignore files (not a git repository)");
    w.key("skipped").begin_array();
    for (const auto& skipped : packed.skipped)
        w.begin_object().field("path", json::sanitize_utf8(skipped.path)).field("reason", skipped.reason).end_object();
    w.end_array().key("links").begin_array();
    for (const auto& link : packed.links) {
        w.begin_object().field("path", json::sanitize_utf8(link.path)).field("target", json::sanitize_utf8(link.target));
        w.field("outside", link.outside).end_object();
    }
    w.end_array();
    if (std::ranges::any_of(packed.links, [](const files::PackedLink& l) { return l.outside; }))
        w.field("note", "links that point outside the project were copied as links; cubicle never followed them");
    w.end_object();
    co_return structured(w.take());
}

// ---- diff_project ---------------------------------------------------------------

// The diff's file name under .cubicle/diffs: the project path with '/' as '_'.
std::string diff_file_name(std::string path) {
    std::ranges::replace(path, '/', '_');
    return path + ".diff";
}

asio::awaitable<ToolResult> diff_project(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "path"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto asked = args.string("path");
    auto baseline = baselines(env)->get(box->id(), asked ? project_path(*asked) : std::string());
    auto changes = co_await changes_in(env, box, baseline);
    auto diff = projects::unified_diff(*baseline, changes);
    std::uint64_t diff_bytes = diff.size();

    ToolResult result;
    std::string saved;
    if (!diff.empty()) {
        saved = ".cubicle/diffs/" + diff_file_name(baseline->path);
        std::string script(save_diff);
        std::vector<std::string> script_args{diff_file_name(baseline->path)};
        co_await workspace_script(box, std::move(script), std::move(script_args), diff, 64 * 1024);
        result.links.push_back({sandbox_uri(box->id(), saved), saved, "text/x-diff", "the whole diff of this project"});
    }
    // The list takes at most a quarter of the budget, the diff text what is left.
    std::size_t budget = env.config.result_budget;
    bool truncated = cut_to_encoded(diff, budget - std::min(budget, budget / 4 + changes.size() * 120));
    json::Writer w;
    w.begin_object().field("path", baseline->path).field("host_path", baseline->host_path);
    write_change_list(w, changes);
    w.field("diff", diff).field("diff_bytes", diff_bytes).field("truncated", truncated);
    if (!saved.empty()) w.field("diff_file", saved);
    w.end_object();
    result.structured = w.take();
    co_return result;
}

// ---- apply_project --------------------------------------------------------------

asio::awaitable<ToolResult> apply_project(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "path", "files", "dry_run", "delete"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto asked = args.string("path");
    auto baseline = baselines(env)->get(box->id(), asked ? project_path(*asked) : std::string());
    projects::ApplyRequest request;
    for (auto& file : args.strings("files").value_or(std::vector<std::string>())) request.files.insert(std::move(file));
    request.dry_run = args.boolean("dry_run").value_or(false);
    request.delete_all = args.boolean("delete").value_or(false);
    files::HostDirs dirs(env.config.allow_host_dirs);
    dirs.locate(baseline->host_path);
    auto changes = co_await changes_in(env, box, baseline);
    auto applied = projects::apply_changes(*baseline, changes, request, dirs, transfer_limits(env.config));

    json::Writer w;
    w.begin_object().field("path", baseline->path).field("host_path", baseline->host_path).field("dry_run", request.dry_run);
    w.key("written").begin_array();
    for (const auto& file : applied.written) {
        w.begin_object().field("path", json::sanitize_utf8(file.path)).field("bytes", file.bytes);
        w.field("mode", fmt::format("{:04o}", file.mode)).end_object();
    }
    w.end_array().key("deleted").begin_array();
    for (const auto& path : applied.deleted) w.value(json::sanitize_utf8(path));
    w.end_array().key("conflicts").begin_array();
    for (const auto& conflict : applied.conflicts) {
        w.begin_object().field("path", json::sanitize_utf8(conflict.path)).field("baseline_sha256", conflict.baseline_sha256);
        w.field("host_sha256", conflict.host_sha256).end_object();
    }
    w.end_array().key("refused").begin_array();
    for (const auto& refused : applied.refused)
        w.begin_object().field("path", json::sanitize_utf8(refused.path)).field("reason", refused.reason).end_object();
    w.end_array().end_object();
    co_return structured(w.take());
}

} // namespace

Handlers project_handlers(Env env) {
    return {
        {"open_project", bind<open_project>(env)},
        {"diff_project", bind<diff_project>(env)},
        {"apply_project", bind<apply_project>(env)},
    };
}

} // namespace cubicle::tools
