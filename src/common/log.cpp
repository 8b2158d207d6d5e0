#include "common/log.hpp"

#include <unistd.h>

#include <chrono>
#include <ctime>

namespace cubicle::log {
namespace {

Level stderr_level = Level::info;
std::function<void(Level, std::string_view)> forward;

} // namespace

void set_stderr_level(Level level) { stderr_level = level; }

void set_forwarder(std::function<void(Level, std::string_view)> forwarder) { forward = std::move(forwarder); }

bool enabled(Level level) { return level >= stderr_level || forward; }

std::optional<Level> parse_level(std::string_view name) {
    if (name == "debug") return Level::debug;
    if (name == "info" || name == "notice") return Level::info;
    if (name == "warning") return Level::warning;
    if (name == "error" || name == "critical" || name == "alert" || name == "emergency") return Level::error;
    return std::nullopt;
}

std::string_view level_name(Level level) {
    switch (level) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warning: return "warning";
    case Level::error: return "error";
    }
    return "info";
}

void write(Level level, std::string_view message) {
    if (level >= stderr_level) {
        auto line = fmt::format("cubicle {}: {}\n", level_name(level), message);
        [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());
    }
    if (forward) forward(level, message);
}

} // namespace cubicle::log
