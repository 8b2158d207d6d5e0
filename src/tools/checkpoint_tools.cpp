// checkpoint_session and restore_checkpoint: undo for a sandbox's Python interpreter,
// its whole memory kept as a parked copy-on-write fork (agent/checkpoint.h).
#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "common/json.hpp"
#include "sandbox/sandbox.hpp"
#include "tools/args.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;

std::string utc_time(std::chrono::system_clock::time_point at) {
    std::time_t seconds = std::chrono::system_clock::to_time_t(at);
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return text;
}

double memory_mb(const sandbox::Checkpoint& c) { return std::round(static_cast<double>(c.memory_kb) / 102.4) / 10.0; }

asio::awaitable<ToolResult> checkpoint_session(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "language"});
    auto id = args.required_string("sandbox_id");
    auto language = args.string("language").value_or("python");
    auto box = env.manager.get(id, context->principal());
    if (!box->uses_agent()) throw ToolError("this sandbox runs programs without its agent (exec mode): it has no interpreter to checkpoint");
    auto before = box->checkpoints();
    auto made = co_await box->checkpoint(language, static_cast<std::size_t>(env.config.max_checkpoints));
    auto now = box->checkpoints();
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("checkpoint_id", made.id).field("language", made.language);
    w.field("memory_mb", memory_mb(made)).field("checkpoints", static_cast<std::int64_t>(now.size()));
    w.key("dropped").begin_array();
    for (const auto& old : before) {
        bool kept = std::ranges::any_of(now, [&](const sandbox::Checkpoint& c) { return c.id == old.id; });
        if (!kept) w.value(old.id);
    }
    w.end_array().end_object();
    co_return structured(w.take());
}

asio::awaitable<ToolResult> restore_checkpoint(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "checkpoint_id"});
    auto id = args.required_string("sandbox_id");
    auto checkpoint_id = args.required_string("checkpoint_id");
    auto box = env.manager.get(id, context->principal());
    auto restored = co_await box->restore_checkpoint(checkpoint_id);
    auto now = box->checkpoints();
    bool reusable = std::ranges::any_of(now, [&](const sandbox::Checkpoint& c) { return c.id == checkpoint_id; });
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("checkpoint_id", checkpoint_id).field("language", restored.language);
    w.field("restored", true).field("reusable", reusable).end_object();
    co_return structured(w.take());
}

} // namespace

void write_checkpoints(json::Writer& w, sandbox::Sandbox& box) {
    w.key("checkpoints").begin_array();
    for (const auto& c : box.checkpoints()) {
        w.begin_object().field("checkpoint_id", c.id).field("language", c.language).field("created", utc_time(c.created));
        w.field("memory_mb", memory_mb(c)).end_object();
    }
    w.end_array();
}

Handlers checkpoint_handlers(Env env) {
    return {{"checkpoint_session", bind<checkpoint_session>(env)}, {"restore_checkpoint", bind<restore_checkpoint>(env)}};
}

} // namespace cubicle::tools
