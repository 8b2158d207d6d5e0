// Files in and out of a sandbox's workspace. Inside the sandbox every file
// operation runs as the sandbox user, so nothing there can reach the host;
// transfers to and from the host go through src/files/host_transfer, which
// only touches the directories the operator allowed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <utility>
#include <regex>

#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/base64.hpp"
#include "common/json.hpp"
#include "files/edit.hpp"
#include "files/host_transfer.hpp"
#include "sandbox/languages.hpp"
#include "tools/args.hpp"
#include "tools/support.hpp"
#include "tools/tools.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;
using sandbox::Sandbox;

constexpr std::uint64_t default_read_bytes = 1 << 20;
constexpr std::uint64_t script_timeout_ms = 120'000;


// Shell lines that refuse a path ($1) which, through symbolic links inside the
// sandbox, leads out of the workspace.
constexpr std::string_view inside_workspace_check = R"SH(
        case "$(realpath -m -- "$1")" in
            "$PWD"|"$PWD"/*) ;;
            *) echo "$1 leads outside the workspace through a symbolic link" >&2; exit 2 ;;
        esac
)SH";

// Runs a short shell script in the workspace as the sandbox user.
// A helper run of the file tools: the scripts' timeout, output collected, not streamed.
asio::awaitable<sandbox::ExecResult> run_helper(std::shared_ptr<Sandbox> box, std::vector<std::string> argv, std::string stdin_data,
                                                std::uint64_t max_output) {
    sandbox::agent::RunRequest request;
    request.argv = std::move(argv);
    request.stdin_data = std::move(stdin_data);
    request.timeout_ms = script_timeout_ms;
    request.max_output_bytes = max_output;
    sandbox::OutputSink no_sink;
    co_return co_await box->run(std::move(request), std::move(no_sink), nullptr);
}

asio::awaitable<sandbox::ExecResult> run_sh(std::shared_ptr<Sandbox> box, std::string script, std::vector<std::string> args,
                                            std::string stdin_data, std::uint64_t max_output) {
    auto argv = sandbox::shell_command(std::move(script)).argv;
    argv.push_back("sh");  // $0
    for (auto& arg : args) argv.push_back(std::move(arg));
    co_return co_await run_helper(std::move(box), std::move(argv), std::move(stdin_data), max_output);
}

bool failed(const sandbox::ExecResult& result) { return result.status.exit_code != 0 || result.status.signal != 0; }

// A failed script as a ToolError carrying what it said on stderr.
ToolError script_failure(const sandbox::ExecResult& result) {
    std::string message = result.stderr_text;
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
    return ToolError(message.empty() ? fmt::format("the file operation failed (exit code {})", result.status.exit_code)
                                     : json::sanitize_utf8(message));
}

// run_sh, where a non-zero exit becomes a ToolError.
asio::awaitable<sandbox::ExecResult> sandbox_sh(std::shared_ptr<Sandbox> box, std::string script, std::vector<std::string> args,
                                                std::string stdin_data, std::uint64_t max_output) {
    auto result = co_await run_sh(std::move(box), std::move(script), std::move(args), std::move(stdin_data), max_output);
    if (failed(result)) throw script_failure(result);
    co_return result;
}

std::string file_path_argument(const Args& args, std::string_view key) {
    auto path = files::workspace_path(args.required_string(key));
    if (path == ".") throw ToolError(fmt::format("'{}' names the workspace itself; name a file inside it", key));
    return path;
}

// The image type of `data`, by its magic bytes (SVG by its text), or empty.
std::string image_mime(std::string_view path, std::string_view data) {
    auto starts = [&](std::string_view magic) { return data.substr(0, magic.size()) == magic; };
    if (starts("\x89PNG\r\n\x1a\n")) return "image/png";
    if (starts("\xFF\xD8\xFF")) return "image/jpeg";
    if (starts("GIF87a") || starts("GIF89a")) return "image/gif";
    if (starts("RIFF") && data.size() >= 12 && data.substr(8, 4) == "WEBP") return "image/webp";
    bool svg_name = path.size() >= 4 && std::equal(path.end() - 4, path.end(), ".svg", [](char a, char b) { return std::tolower(a) == b; });
    if (svg_name && data.substr(0, 1024).find("<svg") != std::string_view::npos) return "image/svg+xml";
    return {};
}

bool is_text(std::string_view data) {
    return data.find('\0') == std::string_view::npos && simdjson::validate_utf8(data.data(), data.size());
}

// ---- write_file -----------------------------------------------------------

asio::awaitable<ToolResult> write_file(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "path", "content", "encoding", "mode"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto path = file_path_argument(args, "path");
    auto content = args.required_string("content");
    auto encoding = args.string("encoding").value_or("utf-8");
    if (encoding == "base64") {
        auto decoded = base64::decode(content);
        if (!decoded) throw ToolError("content is not valid base64");
        content = std::move(*decoded);
    } else if (encoding != "utf-8") {
        throw ToolError(fmt::format("encoding must be utf-8 or base64, not '{}'", encoding));
    }
    auto mode = args.string("mode").value_or("");
    static const std::regex octal_mode("[0-7]{3,4}");
    if (!mode.empty() && !std::regex_match(mode, octal_mode)) {
        throw ToolError(fmt::format("mode must be octal digits such as 644 or 755, not '{}'", mode));
    }
    auto limit = transfer_limits(env.config).max_bytes;
    if (content.size() > limit) throw ToolError(fmt::format("content is {} bytes; the limit is {} bytes", content.size(), limit));
    std::uint64_t bytes = content.size();
    // Arguments are named, not braced inside co_await: GCC 12 mishandles such temporaries.
    std::string script = std::string(inside_workspace_check) +
                         R"SH(set -e; mkdir -p -- "$(dirname -- "$1")"; cat > "$1"; if [ -n "$2" ]; then chmod -- "$2" "$1"; fi)SH";
    std::vector<std::string> script_args{path, mode};
    co_await sandbox_sh(box, std::move(script), std::move(script_args), std::move(content), 64 * 1024);
    json::Writer w;
    w.begin_object().field("path", path).field("bytes", bytes).end_object();
    co_return structured(w.take());
}

// ---- read_file ------------------------------------------------------------

// The checks every read of a workspace file makes first ($1 the path).
constexpr std::string_view readable_file_check = R"SH(
        if [ -d "$1" ]; then echo "$1 is a directory; use list_files" >&2; exit 2; fi
        if [ ! -e "$1" ]; then echo "no such file in the workspace: $1" >&2; exit 2; fi
        if [ ! -f "$1" ]; then echo "$1 is not a regular file" >&2; exit 2; fi
        if [ ! -r "$1" ]; then echo "$1 is not readable by the sandbox user" >&2; exit 2; fi
)SH";

// What read_file read: `data` from byte `start` of a file of `size` bytes.
struct ReadPart {
    std::uint64_t size = 0, start = 0;
    std::string data;
    bool truncated = false;
};

// Bytes [offset, offset + max_bytes), or the last `tail` bytes.
asio::awaitable<ReadPart> read_bytes(std::shared_ptr<Sandbox> box, std::string path, std::uint64_t max_bytes,
                                     std::optional<std::int64_t> offset, std::optional<std::int64_t> tail) {
    std::string script = std::string(inside_workspace_check) + std::string(readable_file_check) + R"SH(
        wc -c < "$1" || exit 2
        if [ -n "$3" ]; then tail -c "$3" -- "$1"; else tail -c +"$4" -- "$1" | head -c "$2"; fi)SH";
    // No temporaries inside ?: in a coroutine: GCC 12 frees them wrongly.
    std::string tail_arg;
    if (tail) tail_arg = std::to_string(*tail);
    std::vector<std::string> script_args{path, std::to_string(max_bytes), tail_arg, std::to_string(offset.value_or(0) + 1)};
    auto result = co_await sandbox_sh(box, std::move(script), std::move(script_args), std::string(), max_bytes + 32);
    auto& out = result.stdout_text;
    auto newline = out.find('\n');
    ReadPart part;
    part.size = newline == std::string::npos ? 0 : std::strtoull(out.c_str(), nullptr, 10);
    part.data = newline == std::string::npos ? std::string() : out.substr(newline + 1);
    part.start = tail ? part.size - std::min<std::uint64_t>(part.size, part.data.size())
                      : std::min<std::uint64_t>(part.size, offset.value_or(0));
    // A read that starts inside a UTF-8 character starts at the next one instead.
    std::size_t partial = 0;
    auto& data = part.data;
    while (part.start > 0 && partial < 3 && partial < data.size() && (static_cast<unsigned char>(data[partial]) & 0xC0) == 0x80)
        ++partial;
    if (partial && is_text(std::string_view(data).substr(partial))) {
        data.erase(0, partial);
        part.start += partial;
    }
    part.truncated = part.start + data.size() < part.size || part.start > 0;
    co_return part;
}

// Lines [first, last] (1-based, inclusive) within max_bytes: whole lines only.
struct LinePart {
    std::uint64_t first = 0, last = 0, total = 0;
};

// Without the agent (the exec fallback), a shell does what the read-file builtin
// does with a line range: the lines first, then a NUL, then "SIZE _ _ _ LINES".
constexpr std::string_view read_lines_sh = R"SH(
        size=$(wc -c < "$1") && newlines=$(wc -l < "$1") || exit 2
        partial=0
        if [ "$size" -gt 0 ] && [ "$(tail -c 1 -- "$1" | wc -l)" -eq 0 ]; then partial=1; fi
        sed -n "$3,$4p;$4q" -- "$1" | head -c "$2"
        printf '\0%s - - - %s' "$size" "$((newlines + partial))")SH";

asio::awaitable<std::pair<ReadPart, LinePart>> read_lines(std::shared_ptr<Sandbox> box, std::string path, std::uint64_t max_bytes,
                                                          std::uint64_t first, std::uint64_t last) {
    // One byte more than asked says whether there was more.
    std::vector<std::string> args{path, std::to_string(max_bytes + 1), std::to_string(first), std::to_string(last)};
    sandbox::ExecResult result;
    if (box->uses_agent()) {
        args.insert(args.begin(), std::string(sandbox::agent::builtin_read_file));
        result = co_await run_helper(box, std::move(args), std::string(), max_bytes + 256);
        if (failed(result)) throw script_failure(result);
    } else {
        std::string script = std::string(inside_workspace_check) + std::string(readable_file_check) + std::string(read_lines_sh);
        result = co_await sandbox_sh(box, std::move(script), std::move(args), std::string(), max_bytes + 256);
    }
    auto& out = result.stdout_text;
    auto nul = out.rfind('\0');
    unsigned long long size = 0, total = 0;
    if (nul == std::string::npos || std::sscanf(out.c_str() + nul + 1, "%llu %*s %*s %*s %llu", &size, &total) != 2)
        throw ToolError(fmt::format("{} could not be read", path));
    ReadPart part;
    LinePart lines;
    part.size = size;
    lines.total = total;
    part.data = out.substr(0, nul);
    lines.first = first;
    // Over max_bytes: whole lines only, and at least the line the range starts with.
    if (part.data.size() > max_bytes) {
        part.truncated = true;
        auto cut = part.data.rfind('\n', max_bytes - 1);
        part.data.resize(cut == std::string::npos ? max_bytes : cut + 1);
    }
    auto returned = static_cast<std::uint64_t>(std::count(part.data.begin(), part.data.end(), '\n'));
    if (!part.data.empty() && part.data.back() != '\n') ++returned;
    lines.last = first + returned - 1;  // first - 1 when nothing was returned
    if (lines.last < std::min(last, lines.total)) part.truncated = true;
    co_return std::pair{std::move(part), lines};
}

asio::awaitable<ToolResult> read_file(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "path", "encoding", "max_bytes", "offset", "tail", "start_line", "end_line"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto path = file_path_argument(args, "path");
    auto encoding = args.string("encoding").value_or("");
    if (!encoding.empty() && encoding != "utf-8" && encoding != "base64") {
        throw ToolError(fmt::format("encoding must be utf-8 or base64, not '{}'", encoding));
    }
    auto limit = transfer_limits(env.config).max_bytes;
    auto max_bytes = static_cast<std::uint64_t>(args.integer("max_bytes", 1, static_cast<std::int64_t>(limit)).value_or(
        static_cast<std::int64_t>(std::min(default_read_bytes, limit))));
    auto offset = args.integer("offset", 0, INT64_MAX);
    auto tail = args.integer("tail", 1, static_cast<std::int64_t>(limit));
    auto start_line = args.integer("start_line", 1, INT64_MAX);
    auto end_line = args.integer("end_line", 1, INT64_MAX);
    bool by_lines = start_line || end_line;
    if (offset && tail) throw ToolError("give offset or tail, not both");
    if (by_lines && (offset || tail)) throw ToolError("give start_line/end_line or offset/tail, not both");
    if (start_line && end_line && *end_line < *start_line)
        throw ToolError(fmt::format("end_line {} is before start_line {}", *end_line, *start_line));
    if (tail) max_bytes = static_cast<std::uint64_t>(*tail);

    ReadPart part;
    LinePart lines;
    if (by_lines) {
        auto first = static_cast<std::uint64_t>(start_line.value_or(1));
        auto last = static_cast<std::uint64_t>(end_line.value_or(INT64_MAX));
        auto read = co_await read_lines(box, path, max_bytes, first, last);
        part = std::move(read.first);
        lines = read.second;
    } else {
        part = co_await read_bytes(box, path, max_bytes, offset, tail);
    }
    auto& data = part.data;
    bool truncated = part.truncated;

    // What is sent stays within one message whatever max_bytes said: base64 takes
    // 4 bytes per 3, escaped text up to 6 per byte.
    auto read_size = data.size();
    bool as_base64 = encoding == "base64" || !is_text(data);
    if (as_base64 && data.size() > max_output_encoded / 4 * 3) {
        data.resize(max_output_encoded / 4 * 3);
        truncated = true;
    } else if (!as_base64 && cut_to_encoded(data, max_output_encoded)) {
        truncated = true;
    }
    // Lines cut to fit the message end at the last whole line, which end_line names.
    if (by_lines && data.size() < read_size) {
        auto newline = data.rfind('\n');
        if (newline != std::string::npos) data.resize(newline + 1);
        lines.last = lines.first + static_cast<std::uint64_t>(std::count(data.begin(), data.end(), '\n')) - 1;
    }
    json::Writer w;
    w.begin_object().field("path", path).field("size", part.size);
    if (part.start > 0) w.field("offset", part.start);
    if (by_lines) w.field("start_line", lines.first).field("end_line", lines.last).field("total_lines", lines.total);
    ToolResult tool_result;
    auto mime = image_mime(path, data);
    if (!mime.empty() && !truncated && encoding.empty() && !by_lines) {
        w.field("mime", mime).field("encoding", "base64").field("truncated", false);
        tool_result.images.push_back({base64::encode(data), mime});
    } else if (encoding != "base64" && is_text(data)) {
        if (truncated) data.resize(json::complete_utf8_prefix(data));
        w.field("encoding", "utf-8").field("content", data).field("truncated", truncated);
    } else {
        w.field("encoding", "base64").field("content", base64::encode(data)).field("truncated", truncated);
    }
    w.end_object();
    tool_result.structured = w.take();
    co_return tool_result;
}

// ---- edit_file ------------------------------------------------------------

// A file as edit_file read it: its stamp (size, modification time and inode, which the
// write checks so that a file changed meanwhile is left alone) and bytes.
struct FileForEdit {
    std::string stamp;
    std::string content;
};

// Without the agent (the exec fallback), the builtins' steps in a shell.
constexpr std::string_view read_for_edit_sh = R"SH(
        size=$(wc -c < "$1") || exit 2
        if [ "$size" -gt "$2" ]; then echo "$1 is $size bytes; the limit is $2 bytes" >&2; exit 2; fi
        stat -L -c '%s %.9Y %i %a' -- "$1" && exec cat -- "$1")SH";
constexpr std::string_view replace_after_edit_sh = R"SH(
        f=$(realpath -- "$1") || exit 2
        if [ "$(stat -c '%s %.9Y %i' -- "$f")" != "$2" ]; then
            echo "$1 changed while it was being edited; read it again and retry" >&2; exit 2
        fi
        t=$(mktemp -- "$(dirname -- "$f")/.$(basename -- "$f").cubicle-edit-XXXXXX") || exit 2
        if cat > "$t" && chmod --reference="$f" -- "$t" && mv -f -- "$t" "$f"; then exit 0; fi
        rm -f -- "$t"; exit 2)SH";

asio::awaitable<FileForEdit> read_for_edit(std::shared_ptr<Sandbox> box, std::string path, std::uint64_t limit) {
    sandbox::ExecResult result;
    if (box->uses_agent()) {
        std::vector<std::string> argv{std::string(sandbox::agent::builtin_read_file), path, std::to_string(limit)};
        result = co_await run_helper(box, std::move(argv), std::string(), limit + 128);
        if (failed(result)) throw script_failure(result);
    } else {
        std::string script = std::string(inside_workspace_check) + std::string(readable_file_check) + std::string(read_for_edit_sh);
        std::vector<std::string> script_args{path, std::to_string(limit)};
        result = co_await sandbox_sh(box, std::move(script), std::move(script_args), std::string(), limit + 128);
    }
    auto& out = result.stdout_text;
    auto newline = out.find('\n');
    auto mode = out.rfind(' ', newline);  // the stamp is "SIZE MTIME INODE", then " MODE"
    if (newline == std::string::npos || mode == std::string::npos) throw ToolError(fmt::format("{} could not be read", path));
    co_return FileForEdit{out.substr(0, mode), out.substr(newline + 1)};
}

asio::awaitable<void> replace_after_edit(std::shared_ptr<Sandbox> box, std::string path, std::string stamp, std::string content) {
    if (box->uses_agent()) {
        std::vector<std::string> argv{std::string(sandbox::agent::builtin_replace_file), path, stamp};
        auto result = co_await run_helper(box, std::move(argv), std::move(content), 64 * 1024);
        if (failed(result)) throw script_failure(result);
    } else {
        std::string script = std::string(inside_workspace_check) + std::string(replace_after_edit_sh);
        std::vector<std::string> script_args{path, stamp};
        co_await sandbox_sh(box, std::move(script), std::move(script_args), std::move(content), 64 * 1024);
    }
}

asio::awaitable<ToolResult> edit_file(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "path", "old_text", "new_text", "replace_all"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto path = file_path_argument(args, "path");
    files::Edit edit{args.required_string("old_text"), args.required_string("new_text"), args.boolean("replace_all").value_or(false)};
    auto limit = transfer_limits(env.config).max_bytes;
    auto file = co_await read_for_edit(box, path, limit);
    auto outcome = files::apply_edit(path, file.content, edit, limit);
    std::uint64_t bytes = outcome.content.size();
    co_await replace_after_edit(box, path, std::move(file.stamp), std::move(outcome.content));
    json::Writer w;
    w.begin_object().field("path", path).field("replacements", outcome.replacements).field("first_line", outcome.first_line);
    w.field("bytes", bytes).field("encoding", outcome.encoding).field("line_ending", outcome.line_ending);
    w.field("diff", outcome.diff).end_object();
    co_return structured(w.take());
}

// ---- list_files -----------------------------------------------------------

std::string_view entry_type(char find_type) {
    switch (find_type) {
    case 'f': return "file";
    case 'd': return "directory";
    case 'l': return "symlink";
    default: return "other";
    }
}

asio::awaitable<ToolResult> list_files(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "path", "recursive", "max_entries"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto path = files::workspace_path(args.string("path").value_or("."));
    bool recursive = args.boolean("recursive").value_or(false);
    auto max_entries = args.integer("max_entries", 1, 100000).value_or(1000);
    std::string script = std::string(inside_workspace_check) + R"SH(
        if [ -L "$1" ]; then echo "$1 is a symbolic link, not a directory" >&2; exit 2; fi
        if [ ! -d "$1" ]; then echo "not a directory in the workspace: $1" >&2; exit 2; fi
        find "$1" -mindepth 1 -maxdepth "$3" -path ./.cubicle -prune -o -printf '%y\t%s\t%m\t%T@\t%P\0' | head -z -n "$2")SH";
    std::vector<std::string> script_args{path, std::to_string(max_entries + 1), recursive ? "4096" : "1"};
    auto result = co_await sandbox_sh(box, std::move(script), std::move(script_args), std::string(),
                                      static_cast<std::uint64_t>(max_entries + 1) * 4200);
    struct Entry {
        std::string path, type, mode;
        std::uint64_t size;
        double mtime;
    };
    std::vector<Entry> entries;
    std::string_view rest = result.stdout_text;
    while (!rest.empty()) {
        auto end = rest.find('\0');
        auto record = rest.substr(0, end);
        rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
        std::string_view fields[5];
        for (int i = 0; i < 4; ++i) {
            auto tab = record.find('\t');
            if (tab == std::string_view::npos) break;
            fields[i] = record.substr(0, tab);
            record.remove_prefix(tab + 1);
        }
        fields[4] = record;
        if (fields[0].empty() || fields[4].empty()) continue;
        entries.push_back({std::string(fields[4]), std::string(entry_type(fields[0][0])), fmt::format("{:0>4}", fields[2]),
                           std::strtoull(std::string(fields[1]).c_str(), nullptr, 10), std::strtod(std::string(fields[3]).c_str(), nullptr)});
    }
    bool truncated = entries.size() > static_cast<std::size_t>(max_entries);
    if (truncated) entries.resize(static_cast<std::size_t>(max_entries));
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.path < b.path; });
    json::Writer w;
    w.begin_object().field("path", path).key("entries").begin_array();
    for (const auto& e : entries) {
        w.begin_object().field("path", e.path).field("type", e.type).field("size", e.size).field("mode", e.mode);
        w.field("mtime", e.mtime).end_object();
    }
    w.end_array().field("truncated", truncated).end_object();
    co_return structured(w.take());
}

// ---- clean_workspace ------------------------------------------------------

asio::awaitable<ToolResult> clean_workspace(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id"});
    auto id = args.required_string("sandbox_id");
    auto box = env.manager.get(id, context->principal());
    // Directories the code made read-only would stop the delete; their owner may reopen them.
    auto script = fmt::format("chmod -R u+rwx {0} 2>/dev/null; find {0} -mindepth 1 -delete 2>&1 >/dev/null | head -5 >&2; "
                              "[ -z \"$(ls -A {0})\" ] || {{ echo 'some files could not be deleted' >&2; exit 1; }}",
                              box->workspace());
    co_await sandbox_sh(box, std::move(script), std::vector<std::string>(), std::string(), 64 * 1024);
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("cleaned", true).end_object();
    co_return structured(w.take());
}

// ---- upload_file / download_file ----------------------------------------------



// The upload's archive (stdin) is unpacked by tar running as the sandbox user, so
// it reaches nothing that user could not. The archive is cubicle's own (relative
// names, no links); -p keeps its modes whatever the umask. Exit status 3 (no_tar_exit;
// tar's own are 0 to 2, the checks' 2) says that the image has no tar.
constexpr int no_tar_exit = 3;
constexpr std::string_view extract_as_sandbox_user = R"SH(
        command -v tar >/dev/null || { echo "upload_file needs tar in the sandbox image" >&2; exit 3; }
        exec tar -x -p -f - --no-same-owner)SH";

// Empty when the upload may fall back on the Engine's archive API (a sandbox without
// tar needs it), else why it may not.
std::string why_no_archive_api(const Env& env, const Sandbox& box) {
    if (!env.manager.placement().offers().container) {
        return fmt::format("upload_file needs tar in the sandbox image here: the Engine cannot reach a container of "
                           "--engine {} to put files into",
                           env.manager.placement().name());
    }
    const auto& engine = env.docker.engine();
    if (engine.archive_on_running(box.spec().runtime)) return {};
    return fmt::format("upload_file needs tar in the sandbox image here: {} cannot put files into a running container "
                       "under the runtime {}",
                       engine.describe(), engine.runtime_or_default(box.spec().runtime));
}

asio::awaitable<ToolResult> upload_file(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "host_path", "path"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto host_path = args.required_string("host_path");
    files::HostDirs dirs(env.config.allow_host_dirs);
    dirs.locate(host_path);  // refuses early, with the allowed roots in the message
    auto path = files::workspace_path(args.string("path").value_or(base_name(host_path)));
    if (path == ".") throw ToolError("path names the workspace itself; name the file or directory to create inside it");
    auto limits = transfer_limits(env.config);
    auto packed = files::pack_host_path(dirs, host_path, path, box->uid(), limits);
    // Through the agent wherever it runs; the Engine's archive API only where it does
    // not (Docker exec mode) or the image has no tar.
    bool through_archive_api = !box->uses_agent();
    if (!through_archive_api) {
        std::string script = std::string(no_link_on_the_way) + std::string(inside_workspace_check) + std::string(extract_as_sandbox_user);
        std::vector<std::string> script_args{path};
        auto extracted = co_await run_sh(box, std::move(script), std::move(script_args), std::move(packed.tar), 64 * 1024);
        through_archive_api = extracted.status.exit_code == no_tar_exit;
        if (through_archive_api) {
            if (auto why = why_no_archive_api(env, *box); !why.empty()) throw ToolError(why);
            packed = files::pack_host_path(dirs, host_path, path, box->uid(), limits);  // the first archive went to the sandbox
        } else if (failed(extracted)) {
            throw script_failure(extracted);
        }
    }
    if (through_archive_api) {
        std::string script(no_link_on_the_way);
        std::vector<std::string> script_args{path};
        co_await sandbox_sh(box, std::move(script), std::move(script_args), std::string(), 64 * 1024);
        co_await env.manager.lifetimes().thaw(box->id());  // the Engine refuses a paused container
        co_await env.docker.put_archive(box->container_id(), box->workspace(), std::move(packed.tar));
    }
    json::Writer w;
    w.begin_object().field("path", path).field("files", packed.files).field("directories", packed.directories);
    w.field("bytes", packed.bytes).key("skipped").begin_array();
    for (const auto& skipped : packed.skipped) w.value(skipped.path);
    w.end_array().end_object();
    co_return structured(w.take());
}

// The archive is made in the sandbox by the sandbox user (tar, through the agent),
// never by the Engine's archive API, which resolves paths as root: a link to /etc
// would hand out files the sandbox user cannot read. Links are refused exactly as
// read_file refuses them; one inside the tree travels as a link, and the host side
// refuses the archive.
constexpr std::string_view archive_as_sandbox_user = R"SH(
        if [ -L "$1" ]; then echo "$1 is a symbolic link; download what it points to" >&2; exit 2; fi
        if [ ! -e "$1" ]; then echo "no such file or directory in the workspace: $1" >&2; exit 2; fi
        command -v tar >/dev/null || { echo "download_file needs tar in the sandbox image" >&2; exit 2; }
        big=$(find "$1" -type f -size +"$2"c 2>/dev/null | head -n 1)
        if [ -n "$big" ]; then echo "$big is larger than the transfer limit of $3 MiB" >&2; exit 2; fi
        if [ "$1" = . ]; then set -- "$PWD"; fi
        cd -- "$(dirname -- "$1")" && exec tar -c -f - --numeric-owner -- "$(basename -- "$1")")SH";

asio::awaitable<ToolResult> download_file(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "path", "host_path"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto path = files::workspace_path(args.required_string("path"));
    auto host_path = args.required_string("host_path");
    files::HostDirs dirs(env.config.allow_host_dirs);
    dirs.locate(host_path);
    auto limits = transfer_limits(env.config);
    // Tar adds a header and padding per entry on top of the file data.
    auto archive_limit = limits.max_bytes + limits.max_entries * 1536 + (1 << 20);
    std::string script = std::string(inside_workspace_check) + std::string(archive_as_sandbox_user);
    // A sparse file costs nothing in the workspace's quota but its whole size in the archive.
    std::vector<std::string> script_args{path, std::to_string(limits.max_bytes), std::to_string(env.config.max_transfer_mb)};
    auto made = co_await sandbox_sh(box, std::move(script), std::move(script_args), std::string(), archive_limit);
    if (made.status.truncated)
        throw ToolError(fmt::format("{} is larger than the transfer limit of {} MiB", path, env.config.max_transfer_mb));
    auto members = files::read_tar(made.stdout_text, limits);
    auto written = files::unpack_to_host(dirs, members, host_path, limits);
    json::Writer w;
    w.begin_object().field("host_path", host_path).field("files", written.files).field("directories", written.directories);
    w.field("bytes", written.bytes).end_object();
    co_return structured(w.take());
}

// ---- schemas ------------------------------------------------------------------

} // namespace

asio::awaitable<sandbox::ExecResult> workspace_script(std::shared_ptr<Sandbox> box, std::string script, std::vector<std::string> args,
                                                     std::string stdin_data, std::uint64_t max_output) {
    co_return co_await sandbox_sh(std::move(box), std::move(script), std::move(args), std::move(stdin_data), max_output);
}

asio::awaitable<std::vector<CollectedImage>> collect_images(Env env, std::shared_ptr<Sandbox> box, double since) {
    constexpr int max_images = 5;
    constexpr std::uint64_t max_image_bytes = 2 << 20;
    std::string script = R"SH(
        find "$1" -path "$1/.cubicle" -prune -o -type f -newermt "@$2" \( -iname '*.png' -o -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.gif' \
            -o -iname '*.webp' -o -iname '*.svg' \) -size -2049k -printf '%P\0' | head -z -n "$3")SH";
    std::vector<std::string> script_args{box->workspace(), fmt::format("{:.3f}", since), std::to_string(max_images)};
    auto listing = co_await sandbox_sh(box, std::move(script), std::move(script_args), std::string(), 64 * 1024);
    std::vector<CollectedImage> images;
    std::string_view rest = listing.stdout_text;
    while (!rest.empty()) {
        auto end = rest.find('\0');
        std::string path(rest.substr(0, end));
        rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
        if (path.empty()) continue;
        std::string cat = R"SH(cat -- "$1")SH";
        std::vector<std::string> cat_args{path};
        auto content = co_await sandbox_sh(box, std::move(cat), std::move(cat_args), std::string(), max_image_bytes);
        auto mime = image_mime(path, content.stdout_text);
        if (mime.empty() || content.status.truncated) continue;
        images.push_back({path, mime, content.stdout_text.size(), base64::encode(content.stdout_text)});
    }
    co_return images;
}

asio::awaitable<FileHead> read_workspace_file(std::shared_ptr<Sandbox> box, std::string path, std::uint64_t max_bytes) {
    std::string script = std::string(inside_workspace_check) + R"SH(
        if [ ! -f "$1" ] || [ ! -r "$1" ]; then echo "no such file in the workspace: $1" >&2; exit 2; fi
        wc -c < "$1" && head -c "$2" -- "$1")SH";
    std::vector<std::string> script_args{path, std::to_string(max_bytes)};
    auto result = co_await sandbox_sh(box, std::move(script), std::move(script_args), std::string(), max_bytes + 32);
    auto newline = result.stdout_text.find('\n');
    if (newline == std::string::npos) throw ToolError("the file could not be read");
    co_return FileHead{std::strtoull(result.stdout_text.c_str(), nullptr, 10), result.stdout_text.substr(newline + 1)};
}

std::string image_mime_of(std::string_view path, std::string_view data) { return image_mime(path, data); }

// File times come from the kernel's coarse clock, up to a tick (4-10 ms) behind the
// precise clock a call's start is read from: a file written right after the start
// can look older than it. Links to changed files allow for that much (a file written
// just before the call may be linked too); returned images do not (an image a client
// uploaded just before must not come back as the run's).
constexpr double file_clock_slack = 0.05;

asio::awaitable<void> add_changed_file_links(mcp::ToolResult& result, std::shared_ptr<Sandbox> box, double since) {
    // Bounded: stops after max_changed_links + 1 names, skips the trees that
    // hold thousands of files nobody asked about, and gives up after the
    // script timeout (a partial list is still a list). The agent lists them
    // itself (agent/changed.h); without one, find does.
    std::vector<std::string> list_args{box->workspace(), fmt::format("{:.3f}", since - file_clock_slack), std::to_string(max_changed_links + 1)};
    sandbox::ExecResult listing;
    try {
        if (box->uses_agent()) {
            list_args.insert(list_args.begin(), std::string(sandbox::agent::builtin_changed_files));
            listing = co_await run_helper(box, std::move(list_args), std::string(), 64 * 1024);
        } else {
            std::string script = R"SH(
        find "$1" -xdev \( -path "$1/.cubicle" -o -name node_modules -o -name .git -o -name __pycache__ -o -name .venv \) -prune \
            -o -type f -newermt "@$2" -printf '%P\0' 2>/dev/null | head -z -n "$3"; true)SH";
            listing = co_await sandbox_sh(box, std::move(script), std::move(list_args), std::string(), 64 * 1024);
        }
    } catch (const ToolError&) {
        co_return;  // links are a convenience: a slow or failed listing costs the result nothing
    }
    std::vector<std::string> paths;
    std::string_view rest = listing.stdout_text;
    while (!rest.empty()) {
        auto end = rest.find('\0');
        if (end == std::string_view::npos) break;  // cut short: not a whole name
        if (end > 0) paths.emplace_back(rest.substr(0, end));
        rest = rest.substr(end + 1);
    }
    bool more = paths.size() > max_changed_links;
    if (more) paths.resize(max_changed_links);
    for (std::size_t i = 0; i < paths.size(); ++i) {
        auto description = std::string("created or changed by this run");
        if (more && i + 1 == paths.size()) {
            description += fmt::format("; more files changed than the {} linked here (list_files shows them)", max_changed_links);
        }
        result.links.push_back({sandbox_uri(box->id(), paths[i]), json::sanitize_utf8(paths[i]), "", std::move(description)});
    }
}

asio::awaitable<CollectedFigures> collect_figures(Env env, std::shared_ptr<Sandbox> box, std::string dir, int count) {
    constexpr std::size_t max_images = 4;
    constexpr std::uint64_t max_image_bytes = 1 << 20;
    CollectedFigures figures;
    std::string_view relative_dir = dir;
    if (relative_dir.starts_with(box->workspace() + "/")) relative_dir.remove_prefix(box->workspace().size() + 1);
    for (int i = 1; i <= count; ++i) {
        auto path = fmt::format("{}/figure-{}.png", dir, i);
        auto relative = fmt::format("{}/figure-{}.png", relative_dir, i);
        if (figures.images.size() < max_images) {
            std::string cat = R"SH(cat -- "$1")SH";
            std::vector<std::string> cat_args{path};
            try {
                auto content = co_await sandbox_sh(box, std::move(cat), std::move(cat_args), std::string(), max_image_bytes);
                if (!content.status.truncated && image_mime(path, content.stdout_text) == "image/png") {
                    figures.images.push_back({relative, "image/png", content.stdout_text.size(), base64::encode(content.stdout_text)});
                    continue;
                }
            } catch (const ToolError&) {
                continue;  // the figure could not be saved; the cell said why on stderr
            }
        }
        figures.saved.push_back(std::move(relative));
    }
    co_return figures;
}

Handlers file_handlers(Env env) {
    return {
        {"write_file", bind<write_file>(env)},       {"read_file", bind<read_file>(env)},
        {"list_files", bind<list_files>(env)},       {"upload_file", bind<upload_file>(env)},
        {"download_file", bind<download_file>(env)}, {"clean_workspace", bind<clean_workspace>(env)},
        {"edit_file", bind<edit_file>(env)},
    };
}

} // namespace cubicle::tools
