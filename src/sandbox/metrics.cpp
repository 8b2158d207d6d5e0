#include "sandbox/metrics.hpp"

#include <fmt/format.h>

namespace cubicle::sandbox {

std::string prometheus_text(std::size_t live_sandboxes, const PoolStats& pool, const ContainerMemory& pool_memory) {
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
    // Read from the host's /proc and memory cgroups: 0 sandboxes measured where
    // the engine is remote or its processes cannot be read.
    metric("gauge", "cubicle_pool_memory_measured", "Ready warm sandboxes whose memory the figures below cover", pool_memory.measured);
    metric("gauge", "cubicle_pool_memory_uss_bytes",
           "Memory only the ready warm sandboxes' processes hold (USS: private pages, from /proc/PID/smaps_rollup)", pool_memory.uss);
    metric("gauge", "cubicle_pool_memory_pss_bytes", "The ready warm sandboxes' processes' proportional share of all they map (PSS)",
           pool_memory.pss);
    metric("gauge", "cubicle_pool_memory_cgroup_rss_bytes", "Anonymous memory charged to the ready warm sandboxes' memory cgroups",
           pool_memory.cgroup_rss);
    metric("gauge", "cubicle_pool_memory_cgroup_cache_bytes",
           "Page cache charged to the ready warm sandboxes' memory cgroups (files read, tmpfs)", pool_memory.cgroup_cache);
    return out;
}

} // namespace cubicle::sandbox
