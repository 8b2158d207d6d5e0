#include "auth/quotas.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace cubicle::auth {

std::optional<std::string> Quotas::admit_call(const std::string& principal) {
    if (settings_.calls_per_minute <= 0) return std::nullopt;
    // A token bucket: a full minute's worth may come at once, then the rate holds.
    auto now = std::chrono::steady_clock::now();
    double capacity = settings_.calls_per_minute;
    auto& bucket = buckets_[principal];
    if (!bucket.started) {
        bucket = {capacity, now, true};
    } else {
        double minutes = std::chrono::duration<double>(now - bucket.refilled).count() / 60.0;
        bucket.tokens = std::min(capacity, bucket.tokens + minutes * capacity);
        bucket.refilled = now;
    }
    if (bucket.tokens < 1) {
        double wait_s = (1 - bucket.tokens) * 60.0 / capacity;
        return fmt::format("rate limit: at most {} tool calls per minute; try again in {:.1f} s", settings_.calls_per_minute, wait_s);
    }
    bucket.tokens -= 1;
    return std::nullopt;
}

std::optional<std::string> Quotas::start_execution(const std::string& principal) {
    auto& running = executing_[principal];
    if (settings_.concurrent_executions > 0 && running >= settings_.concurrent_executions) {
        return fmt::format("you already run {} executions at once, your maximum; wait for one to finish", running);
    }
    ++running;
    return std::nullopt;
}

void Quotas::end_execution(const std::string& principal) {
    auto it = executing_.find(principal);
    if (it == executing_.end()) return;
    if (--it->second <= 0) executing_.erase(it);
}

} // namespace cubicle::auth
