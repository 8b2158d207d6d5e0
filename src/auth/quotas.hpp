// Per-principal limits on tool calls: calls per minute and concurrent executions.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace cubicle::auth {

struct QuotaSettings {
    int calls_per_minute = 0;       // 0: unlimited
    int concurrent_executions = 0;  // 0: unlimited
};

class Quotas {
public:
    explicit Quotas(QuotaSettings settings) : settings_(settings) {}

    // Counts a tool call; the message to return when it goes past the rate.
    std::optional<std::string> admit_call(const std::string& principal);
    // Holds an execution slot; the message to return when none is free.
    std::optional<std::string> start_execution(const std::string& principal);
    void end_execution(const std::string& principal);

private:
    struct Bucket {
        double tokens = 0;
        std::chrono::steady_clock::time_point refilled;
        bool started = false;
    };
    QuotaSettings settings_;
    std::map<std::string, Bucket> buckets_;
    std::map<std::string, int> executing_;
};

} // namespace cubicle::auth
