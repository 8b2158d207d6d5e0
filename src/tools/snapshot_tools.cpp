// snapshot_sandbox, fork_sandbox, list_snapshots, delete_snapshot, and what
// initialize_sandbox {from_snapshot} needs (sandbox/snapshots.hpp does the work).
#include <cmath>
#include <ctime>

#include <boost/asio/this_coro.hpp>
#include <fmt/format.h>

#include "common/all_at_once.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "common/utc_text.hpp"
#include "tools/args.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;
using sandbox::Sandbox;

constexpr std::int64_t most_forks = 8;

void write_snapshot(json::Writer& w, const store::Snapshot& snapshot) {
    w.begin_object().field("snapshot_id", snapshot.snapshot_id).field("name", snapshot.name);
    w.field("source_sandbox_id", snapshot.source_sandbox_id).field("image", snapshot.spec.image);
    w.field("size_mb", mib(snapshot.size_bytes)).field("created", utc_text(std::chrono::system_clock::time_point(std::chrono::milliseconds(snapshot.created_ms)))).end_object();
}

asio::awaitable<ToolResult> snapshot_sandbox(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "name"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto snapshot = co_await env.manager.snapshots().take(box, context->principal(), args.string("name").value_or(""));
    json::Writer w;
    w.begin_object().field("snapshot_id", snapshot.snapshot_id).field("name", snapshot.name);
    w.field("size_mb", mib(snapshot.size_bytes)).field("created", utc_text(std::chrono::system_clock::time_point(std::chrono::milliseconds(snapshot.created_ms)))).end_object();
    co_return structured(w.take());
}

// One copy of a fork: a sandbox like the source, filled from the snapshot as it is taken.
struct Copy {
    std::shared_ptr<Sandbox> box;
    std::exception_ptr failure;
};

asio::awaitable<void> make_copy(Env env, sandbox::SandboxSpec spec, bool stateful, bool auto_install, std::string owner,
                                std::shared_ptr<sandbox::Growing> growing, std::shared_ptr<Copy> copy) {
    try {
        copy->box = co_await env.manager.create(std::move(spec), owner, false);
        copy->box->set_stateful(stateful);
        copy->box->set_auto_install(auto_install);
        co_await env.manager.snapshots().restore_growing(copy->box, growing);
    } catch (...) {
        copy->failure = std::current_exception();
    }
}

struct Taken {
    store::Snapshot snapshot;
    std::exception_ptr failure;
};

asio::awaitable<void> take_for_fork(Env env, std::shared_ptr<Sandbox> box, std::string owner,
                                    std::shared_ptr<sandbox::Growing> growing, std::shared_ptr<Taken> taken) {
    try {
        taken->snapshot = co_await env.manager.snapshots().take(box, owner, "fork of " + box->id(), false, growing);
    } catch (...) {
        taken->failure = std::current_exception();
        growing->failed = true;  // also when it failed before it began: the copies stop waiting
    }
}

asio::awaitable<ToolResult> fork_sandbox(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "count", "keep_snapshot"});
    auto owner = context->principal();
    auto box = env.manager.get(args.required_string("sandbox_id"), owner);
    auto count = args.integer("count", 1, most_forks).value_or(1);
    bool keep_snapshot = args.boolean("keep_snapshot").value_or(false);
    auto& snapshots = env.manager.snapshots();
    auto executor = co_await asio::this_coro::executor;
    // All at once: the copies' containers start while the source is archived, and each is
    // filled from the archive as it grows.
    auto growing = std::make_shared<sandbox::Growing>();
    auto taken = std::make_shared<Taken>();
    std::vector<std::shared_ptr<Copy>> copies;
    std::vector<asio::awaitable<void>> steps;
    steps.push_back(take_for_fork(env, box, owner, growing, taken));
    auto spec = sandbox::Snapshots::spec_like(*box);
    for (std::int64_t i = 0; i < count; ++i) {
        copies.push_back(std::make_shared<Copy>());
        steps.push_back(make_copy(env, spec, box->stateful(), box->auto_install(), owner, growing, copies.back()));
    }
    co_await all_at_once(executor, std::move(steps));
    std::exception_ptr failure = taken->failure;
    for (const auto& copy : copies) {
        if (copy->failure && !failure) failure = copy->failure;
    }
    // The implicit snapshot has done its work once every copy is filled, unless asked to stay
    // (and then only when the fork worked: nobody would hear of it otherwise).
    if (!taken->failure && (!keep_snapshot || failure || context->cancelled())) {
        try {
            snapshots.remove(taken->snapshot.snapshot_id, owner);
        } catch (const std::exception& e) {
            log::warning("removing the snapshot {} of a fork: {}", taken->snapshot.snapshot_id, e.what());
        }
    }
    if (failure || context->cancelled()) {
        // All or nothing: no copy stays when one could not be made.
        for (const auto& copy : copies) {
            if (copy->box) co_await env.manager.destroy(copy->box->id());
        }
        if (failure) std::rethrow_exception(failure);
        co_return ToolResult{};
    }
    // Asked to stay: from now on it is a snapshot like the others (on disk, counted by retention).
    if (keep_snapshot) co_await snapshots.keep(taken->snapshot);
    json::Writer w;
    w.begin_object().key("sandbox_ids").begin_array();
    for (const auto& copy : copies) w.value(copy->box->id());
    w.end_array();
    if (keep_snapshot) w.field("snapshot_id", taken->snapshot.snapshot_id);
    w.end_object();
    co_return structured(w.take());
}

asio::awaitable<ToolResult> list_snapshots(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {});
    json::Writer w;
    w.begin_object().key("snapshots").begin_array();
    for (const auto& snapshot : env.manager.snapshots().list(context->principal())) write_snapshot(w, snapshot);
    w.end_array().end_object();
    co_return structured(w.take());
}

asio::awaitable<ToolResult> delete_snapshot(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"snapshot_id"});
    auto id = args.required_string("snapshot_id");
    env.manager.snapshots().remove(id, context->principal());
    json::Writer w;
    w.begin_object().field("snapshot_id", id).field("deleted", true).end_object();
    co_return structured(w.take());
}

} // namespace

void check_within_ceilings(const sandbox::SandboxSpec& spec, const Config& c) {
    auto over = [](std::string_view name, double value, double ceiling, std::string_view flag) {
        if (value > ceiling) {
            throw ToolError(fmt::format("the snapshot's {} {} is over this server's ceiling of {} ({}); pass a {} of at most {}",
                                        name, value, ceiling, flag, name, ceiling));
        }
    };
    over("memory_mb", spec.memory_mb, c.memory_ceiling_mb(), "--max-memory-mb");
    over("cpus", spec.cpus, c.cpu_ceiling(), "--max-cpus");
    over("pids_limit", spec.pids_limit, c.max_pids_limit, "--max-pids-limit");
    over("disk_mb", spec.disk_mb, c.max_disk_mb, "--max-disk-mb");
    over("files_limit", spec.files_limit, c.max_files_limit, "--max-files-limit");
    over("tmp_size_mb", spec.tmp_size_mb, c.max_tmp_size_mb, "--max-tmp-size-mb");
}

Handlers snapshot_handlers(Env env) {
    return {{"snapshot_sandbox", bind<snapshot_sandbox>(env)},
            {"fork_sandbox", bind<fork_sandbox>(env)},
            {"list_snapshots", bind<list_snapshots>(env)},
            {"delete_snapshot", bind<delete_snapshot>(env)}};
}

} // namespace cubicle::tools
