// search_files: a regular-expression search over a tree of the workspace. The
// agent does the walking and matching itself (agent/search.h), as the sandbox
// user, so it works in every image and never leaves the workspace; this side
// checks the arguments and fits what was found into the result budget.
#include <algorithm>

#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "files/host_transfer.hpp"
#include "sandbox/agent_protocol.hpp"
#include "tools/args.hpp"
#include "tools/search_records.hpp"
#include "tools/support.hpp"
#include "tools/tools.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;

constexpr std::int64_t default_max_results = 200;
constexpr std::int64_t max_max_results = 10'000;
constexpr std::int64_t max_context_lines = 10;  // agent/search.c's MAX_CONTEXT
constexpr std::uint64_t search_timeout_ms = 60'000;
// The longest record the agent writes past its byte budget: a path and 21 cut
// lines, each NUL in them written as three bytes (U+FFFD).
constexpr std::uint64_t last_record_bytes = 4096 + 21 * (3 * 500 + 8) + 64;

// One match as JSON, with every string made valid UTF-8 (a Latin-1 line, say).
std::string match_json(const SearchMatch& match) {
    json::Writer w;
    w.begin_object().field("path", json::sanitize_utf8(match.path)).field("line", match.line).field("column", match.column);
    w.field("text", json::sanitize_utf8(match.text)).key("before").begin_array();
    for (const auto& line : match.before) w.value(json::sanitize_utf8(line));
    w.end_array().key("after").begin_array();
    for (const auto& line : match.after) w.value(json::sanitize_utf8(line));
    w.end_array().end_object();
    return w.take();
}

asio::awaitable<ToolResult> search_files(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "pattern", "path", "glob", "ignore_case", "fixed_strings", "context_lines", "max_results"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto pattern = args.required_string("pattern");
    if (pattern.empty()) throw ToolError("pattern is empty");
    auto path = files::workspace_path(args.string("path").value_or("."));
    auto glob = args.string("glob").value_or("");
    // Arguments travel as C strings to the agent.
    if (pattern.find('\0') != std::string::npos || glob.find('\0') != std::string::npos)
        throw ToolError("pattern and glob cannot contain a NUL character");
    std::string flags;
    if (args.boolean("ignore_case").value_or(false)) flags += 'i';
    if (args.boolean("fixed_strings").value_or(false)) flags += 'F';
    auto context_lines = args.integer("context_lines", 0, max_context_lines).value_or(0);
    auto max_results = args.integer("max_results", 1, max_max_results).value_or(default_max_results);
    if (!box->uses_agent()) throw ToolError("search_files needs the in-sandbox agent, and this sandbox runs without one");

    // The agent stops writing records somewhat past what the budget can show
    // (escaping only makes them longer); it goes on counting.
    std::uint64_t budget = env.config.result_budget;
    std::uint64_t agent_budget = std::max<std::uint64_t>(2 * budget, 64 << 10);
    sandbox::agent::RunRequest request;
    request.argv = {std::string(sandbox::agent::builtin_search), box->workspace(), path, pattern, flags,
                    std::to_string(context_lines), std::to_string(max_results), std::to_string(agent_budget), glob};
    request.timeout_ms = search_timeout_ms;
    request.max_output_bytes = agent_budget + last_record_bytes;
    sandbox::OutputSink no_sink;
    auto result = co_await box->run(std::move(request), std::move(no_sink), nullptr);
    if (result.status.exit_code == 2 || (result.status.exit_code != 0 && !result.status.timed_out)) {
        auto message = result.stderr_text;
        while (!message.empty() && message.back() == '\n') message.pop_back();
        throw ToolError(message.empty() ? fmt::format("the search failed (exit code {})", result.status.exit_code)
                                        : json::sanitize_utf8(message));
    }
    auto records = parse_search_records(result.stdout_text);

    json::Writer w;
    w.begin_object().key("matches").begin_array();
    std::size_t spent = 0, shown = 0;
    for (const auto& match : records.matches) {
        if (shown == static_cast<std::size_t>(max_results)) break;
        auto entry = match_json(match);
        // Sent twice: as structured content and escaped inside the text block.
        std::size_t cost = entry.size() + encoded_size(entry);
        if (shown > 0 && spent + cost > budget) break;
        spent += cost;
        w.raw(entry);
        ++shown;
    }
    w.end_array();
    bool truncated = records.cut || shown < records.matches.size() || !records.finished;
    w.field("count", records.count).field("truncated", truncated).field("files_searched", records.files_searched);
    if (!records.finished) {
        auto why = result.status.timed_out ? fmt::format("the search stopped after {} s", search_timeout_ms / 1000)
                                           : std::string("the search's output was cut short");
        w.field("note", fmt::format("{}; count covers only the matches shown; narrow it with path or glob", why));
    } else if (truncated) {
        w.field("note", fmt::format("{} of {} matching lines shown; narrow the search (path, glob, a more precise pattern) "
                                    "or raise max_results",
                                    shown, records.count));
    }
    w.end_object();
    co_return structured(w.take());
}

} // namespace

Handlers search_handlers(Env env) { return {{"search_files", bind<search_files>(env)}}; }

} // namespace cubicle::tools
