// The sandbox side of /metrics (Prometheus text format): live sandboxes and
// the warm pools' gauges and counters, summed over profiles, and what their
// ready sandboxes hold (container_memory.hpp).
#pragma once

#include <cstddef>
#include <string>

#include "sandbox/container_memory.hpp"
#include "sandbox/pool.hpp"

namespace cubicle::sandbox {

std::string prometheus_text(std::size_t live_sandboxes, const PoolStats& pool, const ContainerMemory& pool_memory);

} // namespace cubicle::sandbox
