#include "sandbox/metrics.hpp"

#include <fmt/format.h>

namespace cubicle::sandbox {

std::string prometheus_text(std::size_t live_sandboxes, const PoolStats& pool) {
    std::string out;
    auto metric = [&](std::string_view type, std::string_view name, std::string_view help, auto value) {
        out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n{0} {3}\n", name, help, type, value);
    };
    metric("gauge", "cubicle_sandboxes", "Live sandboxes", live_sandboxes);
    // Summed over the pools of every profile.
    metric("gauge", "cubicle_pool_profiles", "Profiles with a warm pool (the default one and others in demand)", pool.profiles);
    metric("gauge", "cubicle_pool_target", "Warm sandboxes the pools want ready (--pool-size up to --pool-max)", pool.target);
    metric("gauge", "cubicle_pool_ready", "Warm sandboxes ready to be taken", pool.ready);
    metric("gauge", "cubicle_pool_starting", "Warm sandboxes being started", pool.starting);
    metric("counter", "cubicle_pool_hits_total", "New sandboxes of a pooled profile served from its pool", pool.hits);
    metric("counter", "cubicle_pool_misses_total", "New sandboxes of a pooled profile that found its pool empty", pool.misses);
    metric("counter", "cubicle_pool_bypassed_total",
           "New sandboxes of a profile without a pool (network, GPU, or not yet asked for twice within 10 s)", pool.bypassed);
    metric("counter", "cubicle_pool_start_failures_total", "Warm sandboxes that failed to start", pool.start_failures);
    return out;
}

} // namespace cubicle::sandbox
