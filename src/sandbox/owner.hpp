// Who owns a container: a liveness record kept in its labels, so that another
// cubicle on the same engine can tell a dead owner from a live one.
#pragma once

#include <string>
#include <string_view>

namespace cubicle::sandbox {

// This process's record: "v1/<machine id>/<hostname>/<boot id>/<pid namespace>/<pid>/<start time>".
const std::string& owner_record();

// The record of process `pid` as seen from here; empty when it does not exist.
std::string owner_record_of(int pid);

enum class OwnerState { alive, dead, unknown };

// Dead only when provably so: the record was made on this machine (same machine
// id and hostname) before its last boot, or in this boot and pid namespace by a
// process that no longer exists (its pid is free, or taken by a process that
// started at another time). Another host, another pid namespace or an unreadable
// record is unknown, and a container of an unknown owner is never removed.
OwnerState owner_state(std::string_view record);

} // namespace cubicle::sandbox
