// MCP tasks: a tools/call that runs on after its request has been answered,
// polled with tasks/get and collected with tasks/result (2025-11-25) or with
// tasks/get alone (the 2026-07-28 io.modelcontextprotocol/tasks extension).
//
// The store knows nothing of the Session: a task's call runs in a coroutine
// of its own, so it outlives the request, the HTTP exchange and the MCP
// session that created it. A task belongs to the principal that created it;
// to anyone else it does not exist. Ids are 128 random bits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/json.hpp"
#include "mcp/tool.hpp"

namespace cubicle::mcp {

// The two wire shapes of a task.
enum class TaskEra {
    y2025,  // 2025-11-25: {"task": {…}} on creation, ttl/pollInterval, tool errors are "failed"
    y2026,  // the 2026-07-28 extension: flat, ttlMs/pollIntervalMs, result/error inlined, tool errors "completed"
};

struct Task {
    enum class State { working, done, failed, cancelled };

    std::string id;
    std::string principal;
    std::string tool;
    State state = State::working;
    std::string status_message;
    std::chrono::system_clock::time_point created = std::chrono::system_clock::now();
    std::chrono::system_clock::time_point updated = created;
    std::chrono::steady_clock::time_point expires;
    std::int64_t ttl_ms = 0;
    std::uint64_t sequence = 0;  // creation order, for tasks/list cursors
    // done: the CallToolResult (serialized) and whether it reports a tool error.
    std::string result_json;
    bool tool_error = false;
    // failed: the JSON-RPC error the call would have answered with.
    int error_code = 0;
    std::string error_message;
    std::shared_ptr<RequestContext> context;  // the call's: cancelling it stops the program
    bool promoted = false;                    // answered with a CreateTaskResult (else still a plain call)
    std::function<void(std::string)> notify;  // notifications/tasks/status (may be empty)
    TaskEra era = TaskEra::y2025;
    std::vector<std::shared_ptr<boost::asio::steady_timer>> waiters;

    bool terminal() const { return state != State::working; }
};

class TaskStore : public std::enable_shared_from_this<TaskStore> {
public:
    static constexpr std::int64_t default_ttl_ms = 3'600'000;
    static constexpr std::int64_t min_ttl_ms = 1'000;
    static constexpr std::int64_t max_ttl_ms = 86'400'000;
    static constexpr std::int64_t poll_interval_ms = 1'000;
    static constexpr std::size_t max_per_principal = 100;         // working at once
    static constexpr std::size_t max_ended_per_principal = 1000;  // kept for collection
    static constexpr std::size_t page_size = 50;

    explicit TaskStore(boost::asio::any_io_executor executor) : executor_(std::move(executor)) {}

    // Creates a task for `principal` (ttl as asked, clamped) and runs `handler`
    // in it, on its own; throws std::length_error when the principal has too
    // many tasks still working.
    std::shared_ptr<Task> start(std::string principal, const Tool& tool, std::shared_ptr<json::Document> document,
                                simdjson::dom::element arguments, std::shared_ptr<RequestContext> context,
                                std::optional<std::int64_t> ttl_ms, TaskEra era);
    // The task, if `principal` created it and it has not expired.
    std::shared_ptr<Task> find(const std::string& principal, const std::string& id);
    // Cancels a working task (stops its call); false if it had already ended.
    bool cancel(const std::shared_ptr<Task>& task);
    // Forgets a task at once (a call answered with its plain result).
    void erase(const std::string& id);
    // Waits until the task ends or `deadline`.
    boost::asio::awaitable<void> wait(std::shared_ptr<Task> task, std::chrono::steady_clock::time_point deadline);
    // The principal's tasks after `cursor` (empty: from the start); the next cursor, empty at the end.
    std::vector<std::shared_ptr<Task>> list(const std::string& principal, const std::string& cursor, std::string& next);
    // Cancels every working task (the server is stopping).
    void cancel_all();
    std::size_t working() const;

    // The Task object as `era` writes it, status-specific fields included where the era inlines them.
    static void write(json::Writer& w, const Task& task, TaskEra era, bool detailed);

private:
    boost::asio::awaitable<void> run(std::shared_ptr<Task> task, ToolHandler handler, std::shared_ptr<json::Document> document,
                                     simdjson::dom::element arguments);
    boost::asio::awaitable<void> expire(std::shared_ptr<Task> task);
    void settle(Task& task);
    void purge();

    boost::asio::any_io_executor executor_;
    std::map<std::string, std::shared_ptr<Task>> tasks_;
    std::uint64_t next_sequence_ = 1;
};

// The CallToolResult of `result`; resource_link content only where `links`.
std::string call_result_json(const ToolResult& result, bool links);

} // namespace cubicle::mcp
