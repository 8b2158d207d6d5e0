// A moment as RFC 3339 text in UTC, the one way results and records spell time.
#pragma once

#include <chrono>
#include <string>

namespace cubicle {

// "2026-11-27T09:21:05Z", or with `milliseconds` "2026-11-27T09:21:05.123Z".
std::string utc_text(std::chrono::system_clock::time_point at, bool milliseconds = false);

} // namespace cubicle
