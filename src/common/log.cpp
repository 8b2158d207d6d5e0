#include "common/log.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace cubicle::log {
namespace {

constexpr std::array<std::string_view, 8> names = {"debug", "info", "notice", "warning",
                                                   "error", "critical", "alert", "emergency"};

std::atomic<Level> stderr_level{Level::info};
std::mutex subscribers_mutex;
std::vector<Subscription*> subscribers;
std::atomic<std::size_t> subscriber_count{0};
thread_local bool inside_sink = false;

} // namespace

void set_stderr_level(Level level) { stderr_level = level; }

bool enabled(Level level) { return level >= stderr_level || subscriber_count > 0; }

std::optional<Level> parse_level(std::string_view name) {
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) return std::nullopt;
    return static_cast<Level>(it - names.begin());
}

std::string_view level_name(Level level) { return names.at(static_cast<std::size_t>(level)); }

void write_local(Level level, std::string_view message) {
    if (level < stderr_level) return;
    auto line = fmt::format("cubicle {}: {}\n", level_name(level), message);
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());
}

void write(Level level, std::string_view message) {
    write_local(level, message);
    if (subscriber_count == 0 || inside_sink) return;
    std::lock_guard lock(subscribers_mutex);
    inside_sink = true;
    for (auto* subscriber : subscribers) {
        if (subscriber->thread_ == std::this_thread::get_id()) subscriber->sink_(level, message);
    }
    inside_sink = false;
}

Subscription::Subscription(std::function<void(Level, std::string_view)> sink)
    : sink_(std::move(sink)), thread_(std::this_thread::get_id()) {
    std::lock_guard lock(subscribers_mutex);
    subscribers.push_back(this);
    ++subscriber_count;
}

Subscription::~Subscription() {
    std::lock_guard lock(subscribers_mutex);
    subscribers.erase(std::find(subscribers.begin(), subscribers.end(), this));
    --subscriber_count;
}

} // namespace cubicle::log
