// Logging: to stderr, and to MCP clients that asked for it (logging/setLevel
// before 2026-07-28, a per-request level since); never to stdout, which
// carries only the protocol.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <fmt/format.h>

namespace cubicle::log {

// The eight syslog severities of RFC 5424, which MCP uses, least severe first.
enum class Level { debug, info, notice, warning, error, critical, alert, emergency };

void set_stderr_level(Level level);
// Writes to stderr (when at or above its level) and to every subscriber.
void write(Level level, std::string_view message);
// Writes to stderr only: for lines already delivered to their client another way.
void write_local(Level level, std::string_view message);
bool enabled(Level level);
// The MCP name of each level, and back; nullopt for an unknown name.
std::optional<Level> parse_level(std::string_view name);
std::string_view level_name(Level level);

// Receives every line written with write() on the thread that created it, while
// it lives (an MCP session forwarding server logs to its client, which must
// not be written to from another thread). A line logged from inside a sink is
// not delivered to sinks again.
class Subscription {
public:
    explicit Subscription(std::function<void(Level, std::string_view)> sink);
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

private:
    friend void write(Level, std::string_view);
    std::function<void(Level, std::string_view)> sink_;
    std::thread::id thread_;
};

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
    if (enabled(Level::debug)) write(Level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
    write(Level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warning(fmt::format_string<Args...> f, Args&&... args) {
    write(Level::warning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
    write(Level::error, fmt::format(f, std::forward<Args>(args)...));
}

} // namespace cubicle::log
