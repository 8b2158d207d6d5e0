// The sandbox side of /metrics (Prometheus text format): live sandboxes and
// the warm pools' gauges and counters, summed over profiles.
#pragma once

#include <cstddef>
#include <string>

#include "sandbox/pool.hpp"

namespace cubicle::sandbox {

std::string prometheus_text(std::size_t live_sandboxes, const PoolStats& pool);

} // namespace cubicle::sandbox
