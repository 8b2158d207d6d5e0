#include "mcp/tasks.hpp"

#include <algorithm>
#include <charconv>
#include <ctime>
#include <stdexcept>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/utc_text.hpp"

namespace cubicle::mcp {
namespace {

namespace asio = boost::asio;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

std::string_view status_name(const Task& task, TaskEra era) {
    switch (task.state) {
    case Task::State::working: return "working";
    case Task::State::cancelled: return "cancelled";
    case Task::State::failed: return "failed";
    case Task::State::done:
        // 2025-11-25 counts a tool error as a failed task; the extension as a completed one.
        return era == TaskEra::y2025 && task.tool_error ? "failed" : "completed";
    }
    return "working";
}

std::string status_notification(const Task& task) {
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").field("method", "notifications/tasks/status").key("params");
    TaskStore::write(w, task, TaskEra::y2025, false);
    w.end_object();
    return w.take();
}

} // namespace

std::string call_result_json(const ToolResult& result, bool links) {
    json::Writer w;
    w.begin_object().key("content").begin_array();
    w.begin_object().field("type", "text").field("text", result.text.empty() ? result.structured : result.text).end_object();
    for (const auto& image : result.images) {
        w.begin_object().field("type", "image").field("data", image.data).field("mimeType", image.mime_type).end_object();
    }
    if (links) {
        for (const auto& link : result.links) {
            w.begin_object().field("type", "resource_link").field("uri", link.uri).field("name", link.name);
            if (!link.mime_type.empty()) w.field("mimeType", link.mime_type);
            if (!link.description.empty()) w.field("description", link.description);
            w.end_object();
        }
    }
    w.end_array();
    if (!result.structured.empty()) w.key("structuredContent").raw(result.structured);
    w.field("isError", result.is_error);
    w.end_object();
    return w.take();
}

void TaskStore::write(json::Writer& w, const Task& task, TaskEra era, bool detailed) {
    bool y2025 = era == TaskEra::y2025;
    w.begin_object().field("taskId", task.id).field("status", status_name(task, era));
    if (!task.status_message.empty()) w.field("statusMessage", task.status_message);
    w.field("createdAt", utc_text(task.created, true)).field("lastUpdatedAt", utc_text(task.updated, true));
    w.field(y2025 ? "ttl" : "ttlMs", task.ttl_ms);
    if (!task.terminal()) w.field(y2025 ? "pollInterval" : "pollIntervalMs", poll_interval_ms);
    if (detailed && !y2025) {
        if (task.state == Task::State::done) w.key("result").raw(task.result_json);
        if (task.state == Task::State::failed) {
            w.key("error").begin_object().field("code", task.error_code).field("message", task.error_message).end_object();
        }
    }
    w.end_object();
}

std::shared_ptr<Task> TaskStore::start(std::string principal, const Tool& tool, std::shared_ptr<json::Document> document,
                                       simdjson::dom::element arguments, std::shared_ptr<RequestContext> context,
                                       std::optional<std::int64_t> ttl_ms, TaskEra era) {
    purge();
    auto working = std::count_if(tasks_.begin(), tasks_.end(), [&](const auto& entry) {
        return entry.second->principal == principal && !entry.second->terminal();
    });
    if (static_cast<std::size_t>(working) >= max_per_principal) {
        throw std::length_error(fmt::format("{} tasks are already working for this client; wait for one or cancel one "
                                            "(tasks/cancel) first",
                                            working));
    }
    // Ended tasks wait for their ttl, but a client cannot pile up results without bound: its oldest go first.
    std::vector<std::shared_ptr<Task>> ended;
    for (const auto& [id, t] : tasks_) {
        if (t->principal == principal && t->terminal()) ended.push_back(t);
    }
    if (ended.size() >= max_ended_per_principal) {
        std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) { return a->sequence < b->sequence; });
        for (std::size_t i = 0; i + max_ended_per_principal <= ended.size(); ++i) tasks_.erase(ended[i]->id);
    }
    auto task = std::make_shared<Task>();
    task->id = "task-" + random_hex(16);
    task->principal = std::move(principal);
    task->tool = tool.name;
    task->ttl_ms = std::clamp(ttl_ms.value_or(default_ttl_ms), min_ttl_ms, max_ttl_ms);
    task->expires = std::chrono::steady_clock::now() + std::chrono::milliseconds(task->ttl_ms);
    task->sequence = next_sequence_++;
    task->context = std::move(context);
    task->era = era;
    task->status_message = fmt::format("{} is running", tool.name);
    tasks_[task->id] = task;
    asio::co_spawn(executor_, run(task, tool.handler, std::move(document), arguments), [](std::exception_ptr) {});
    asio::co_spawn(executor_, expire(task), [](std::exception_ptr) {});
    return task;
}

asio::awaitable<void> TaskStore::run(std::shared_ptr<Task> task, ToolHandler handler, std::shared_ptr<json::Document> document,
                                     simdjson::dom::element arguments) {
    (void)document;  // keeps `arguments` alive until the call ends
    ToolResult result;
    std::string internal_error;
    try {
        result = co_await handler(arguments, task->context);
    } catch (const ToolError& e) {
        result = ToolResult{.text = e.what(), .is_error = true};
    } catch (const std::exception& e) {
        internal_error = e.what();
    }
    if (task->terminal()) co_return;  // cancelled meanwhile: it stays cancelled
    if (!internal_error.empty()) {
        task->state = Task::State::failed;
        task->error_code = -32603;
        task->error_message = fmt::format("Internal error in {}: {}", task->tool, internal_error);
        task->status_message = task->error_message;
    } else {
        task->state = Task::State::done;
        task->result_json = call_result_json(result, true);
        task->tool_error = result.is_error;
        task->status_message = fmt::format("{} {}", task->tool, result.is_error ? "reported an error" : "finished");
    }
    settle(*task);
}

asio::awaitable<void> TaskStore::expire(std::shared_ptr<Task> task) {
    asio::steady_timer timer(executor_, task->expires);
    co_await timer.async_wait(use_tuple);
    // Past its ttl nobody can collect the result: stop the work and forget it.
    if (!task->terminal()) task->context->cancellation()->cancel();
    tasks_.erase(task->id);
    task->notify = nullptr;
}

void TaskStore::settle(Task& task) {
    task.updated = std::chrono::system_clock::now();
    auto waiters = std::move(task.waiters);
    task.waiters.clear();
    for (auto& timer : waiters) timer->cancel();
    if (task.promoted && task.notify) task.notify(status_notification(task));
}

std::shared_ptr<Task> TaskStore::find(const std::string& principal, const std::string& id) {
    purge();
    auto it = tasks_.find(id);
    // Another principal's task looks exactly like one that never existed.
    if (it == tasks_.end() || it->second->principal != principal || !it->second->promoted) return nullptr;
    return it->second;
}

bool TaskStore::cancel(const std::shared_ptr<Task>& task) {
    if (task->terminal()) return false;
    task->state = Task::State::cancelled;
    task->status_message = "The task was cancelled by request; its program was stopped.";
    task->context->cancellation()->cancel();
    settle(*task);
    return true;
}

void TaskStore::erase(const std::string& id) { tasks_.erase(id); }

asio::awaitable<void> TaskStore::wait(std::shared_ptr<Task> task, std::chrono::steady_clock::time_point deadline) {
    if (task->terminal()) co_return;
    auto timer = std::make_shared<asio::steady_timer>(executor_, deadline);
    task->waiters.push_back(timer);
    co_await timer->async_wait(use_tuple);
}

std::vector<std::shared_ptr<Task>> TaskStore::list(const std::string& principal, const std::string& cursor, std::string& next) {
    purge();
    std::uint64_t after = 0;
    if (!cursor.empty()) {
        auto [end, ec] = std::from_chars(cursor.data(), cursor.data() + cursor.size(), after);
        if (ec != std::errc() || end != cursor.data() + cursor.size()) throw std::invalid_argument("unknown cursor");
    }
    std::vector<std::shared_ptr<Task>> mine;
    for (const auto& [id, task] : tasks_) {
        if (task->principal == principal && task->promoted && task->sequence > after) mine.push_back(task);
    }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a->sequence < b->sequence; });
    next.clear();
    if (mine.size() > page_size) {
        mine.resize(page_size);
        next = std::to_string(mine.back()->sequence);
    }
    return mine;
}

std::size_t TaskStore::working() const {
    return static_cast<std::size_t>(std::count_if(tasks_.begin(), tasks_.end(), [](const auto& e) { return !e.second->terminal(); }));
}

void TaskStore::cancel_all() {
    for (auto& [id, task] : tasks_) {
        if (!task->terminal()) task->context->cancellation()->cancel();
    }
}

void TaskStore::purge() {
    auto now = std::chrono::steady_clock::now();
    std::erase_if(tasks_, [&](const auto& entry) { return entry.second->terminal() && entry.second->expires <= now; });
}

} // namespace cubicle::mcp
