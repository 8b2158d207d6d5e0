#include "common/utc_text.hpp"

#include <ctime>

#include <fmt/format.h>

namespace cubicle {

std::string utc_text(std::chrono::system_clock::time_point at, bool milliseconds) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count();
    auto seconds = static_cast<std::time_t>(ms / 1000);
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
    if (!milliseconds) return fmt::format("{}Z", text);
    return fmt::format("{}.{:03}Z", text, ms % 1000);
}

} // namespace cubicle
