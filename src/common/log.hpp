// Logging: to stderr, and to the MCP client when one asked for it
// (logging/setLevel); never to stdout, which carries only the protocol.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace cubicle::log {

enum class Level { debug = 0, info = 1, warning = 2, error = 3 };

void set_stderr_level(Level level);
// Where log lines also go (the MCP session), or an empty function.
void set_forwarder(std::function<void(Level, std::string_view)> forwarder);
void write(Level level, std::string_view message);
bool enabled(Level level);
std::optional<Level> parse_level(std::string_view name);
std::string_view level_name(Level level);

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
