// checkpoint_session and restore_checkpoint: undo for a sandbox's Python interpreter,
// its whole memory kept as a parked copy-on-write fork (agent/checkpoint.h).
#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "common/json.hpp"
#include "common/utc_text.hpp"
#include "sandbox/sandbox.hpp"
#include "tools/args.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;

double memory_mb(const sandbox::Checkpoint& c) { return std::round(static_cast<double>(c.memory_kb) / 102.4) / 10.0; }

// files: true keeps a copy of the workspace here, in the sandbox's own /tmp (a tmpfs its
// /tmp quota and memory ceiling count), one directory per checkpoint, at most this much.
constexpr std::string_view files_root = "/tmp/.cubicle-checkpoints";
constexpr std::uint64_t files_max_bytes = 64ull << 20;

// $1 root, $2 the checkpoint ("": none, only the sweep), $3 the bound; the rest: checkpoints
// whose copies stay (any other copy there is of a checkpoint that ended, and goes).
constexpr std::string_view copy_files_script = R"SH(
root=$1 id=$2 bound=$3; shift 3
mkdir -p "$root" && chmod 700 "$root" || exit 1
for old in "$root"/*; do
    [ -e "$old" ] || continue
    keep=; for k in "$@"; do [ "${old##*/}" = "$k" ] && keep=1; done
    [ -n "$keep" ] || rm -rf "$old"
done
[ -n "$id" ] || exit 0
size=$(du -sb . | cut -f1)
if [ "$size" -gt "$bound" ]; then
    echo "the workspace holds $((size >> 20)) MiB, more than the $((bound >> 20)) MiB a checkpoint keeps of it: take the checkpoint without files" >&2
    exit 3
fi
cp -a . "$root/$id" 2>/dev/null || { rm -rf "$root/$id"; echo "the workspace could not be copied to $root (is /tmp full? tmp_size_mb sets its size)" >&2; exit 1; }
)SH";

// $1 root, $2 the checkpoint: the workspace becomes its copy again.
constexpr std::string_view restore_files_script = R"SH(
src=$1/$2
[ -d "$src" ] || { echo "the copy of the workspace kept with $2 is gone" >&2; exit 1; }
chmod -R u+rwx . 2>/dev/null; find . -mindepth 1 -delete 2>/dev/null
cp -a "$src"/. . || { echo "the workspace's files could not all be brought back" >&2; exit 1; }
)SH";

asio::awaitable<sandbox::ExecResult> run_script(std::shared_ptr<sandbox::Sandbox> box, std::string_view script,
                                                std::vector<std::string> args) {
    auto request = sandbox::shell_command(std::string(script));
    request.argv.push_back("sh");  // $0
    for (auto& arg : args) request.argv.push_back(std::move(arg));
    request.timeout_ms = 120'000;
    request.max_output_bytes = 16 * 1024;
    sandbox::OutputSink no_sink;
    co_return co_await box->run(std::move(request), std::move(no_sink), nullptr);
}

std::string script_error(const sandbox::ExecResult& result) {
    auto why = result.stderr_text;
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    return why.empty() ? fmt::format("the workspace copy failed (exit code {})", result.status.exit_code) : why;
}

bool failed(const sandbox::ExecResult& result) { return result.status.exit_code != 0 || result.status.signal != 0; }

asio::awaitable<ToolResult> checkpoint_session(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "language", "files"});
    auto id = args.required_string("sandbox_id");
    auto language = args.string("language").value_or("python");
    bool files = args.boolean("files").value_or(false);
    auto box = env.manager.get(id, context->principal());
    if (!box->uses_agent()) throw ToolError("this sandbox runs programs without its agent (exec mode): it has no interpreter to checkpoint");
    if (files && box->shared()) throw ToolError("files: true is not offered by a workspace: true sandbox (its /tmp is shared with other workspaces)");
    auto before = box->checkpoints();
    auto made = co_await box->checkpoint(language, static_cast<std::size_t>(env.config.max_checkpoints));
    auto now = box->checkpoints();
    bool dropped_files = false;
    for (const auto& old : before) {
        bool kept = std::ranges::any_of(now, [&](const sandbox::Checkpoint& c) { return c.id == old.id; });
        dropped_files |= !kept && old.files;
    }
    if (files || dropped_files) {
        std::vector<std::string> script_args{std::string(files_root), made.id, std::to_string(files ? files_max_bytes : 0)};
        for (const auto& c : now) {
            if (c.files) script_args.push_back(c.id);
        }
        if (!files) script_args[1] = "";  // only the sweep of the dropped ones' copies
        auto result = co_await run_script(box, copy_files_script, std::move(script_args));
        if (files && failed(result)) {
            box->drop_checkpoint(made.id);
            throw ToolError(script_error(result));
        }
        if (files) box->set_checkpoint_files(made.id);
    }
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("checkpoint_id", made.id).field("language", made.language);
    w.field("memory_mb", memory_mb(made)).field("checkpoints", static_cast<std::int64_t>(now.size())).field("files", files);
    w.key("dropped").begin_array();
    for (const auto& old : before) {
        bool kept = std::ranges::any_of(now, [&](const sandbox::Checkpoint& c) { return c.id == old.id; });
        if (!kept) w.value(old.id);
    }
    w.end_array().end_object();
    co_return structured(w.take());
}

asio::awaitable<ToolResult> restore_checkpoint(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "checkpoint_id", "files"});
    auto id = args.required_string("sandbox_id");
    auto checkpoint_id = args.required_string("checkpoint_id");
    bool files = args.boolean("files").value_or(false);
    auto box = env.manager.get(id, context->principal());
    if (files) {
        auto known = box->checkpoints();
        auto it = std::ranges::find(known, checkpoint_id, &sandbox::Checkpoint::id);
        if (it != known.end() && !it->files) {
            throw ToolError(fmt::format("checkpoint {} was taken without its files (checkpoint_session {{\"files\": true}} keeps them); "
                                        "restore it without files: true",
                                        checkpoint_id));
        }
    }
    auto restored = co_await box->restore_checkpoint(checkpoint_id);
    if (files) {
        std::vector<std::string> script_args{std::string(files_root), checkpoint_id};  // named: GCC 12, see sandbox.hpp's run()
        auto result = co_await run_script(box, restore_files_script, std::move(script_args));
        if (failed(result)) {
            throw ToolError(fmt::format("the interpreter was restored, but not the files: {}", script_error(result)));
        }
    }
    auto now = box->checkpoints();
    bool reusable = std::ranges::any_of(now, [&](const sandbox::Checkpoint& c) { return c.id == checkpoint_id; });
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("checkpoint_id", checkpoint_id).field("language", restored.language);
    w.field("restored", true).field("reusable", reusable).field("files", files).end_object();
    co_return structured(w.take());
}

} // namespace

void write_checkpoints(json::Writer& w, sandbox::Sandbox& box) {
    w.key("checkpoints").begin_array();
    for (const auto& c : box.checkpoints()) {
        w.begin_object().field("checkpoint_id", c.id).field("language", c.language).field("created", utc_text(c.created));
        w.field("memory_mb", memory_mb(c)).field("files", c.files).end_object();
    }
    w.end_array();
}

Handlers checkpoint_handlers(Env env) {
    return {{"checkpoint_session", bind<checkpoint_session>(env)}, {"restore_checkpoint", bind<restore_checkpoint>(env)}};
}

} // namespace cubicle::tools
