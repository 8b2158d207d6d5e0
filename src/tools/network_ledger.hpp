// What tools add around a run of a networked sandbox: its network ledger (what the
// run's connections through the egress proxy reached, sandbox/egress_ledger.hpp) and
// the egress approvals its client is asked for while it runs.
#pragma once

#include <memory>

#include <boost/asio/awaitable.hpp>

#include "common/json.hpp"
#include "sandbox/egress_ledger.hpp"
#include "sandbox/sandbox.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {

// Opens the run's ledger before it starts (nullptr for a sandbox without network); with
// --egress-approval ask, hosts the allowlist refuses are put to `context`'s client while
// the ledger is held. Close it with env.manager.egress().close_run() when the run ends.
boost::asio::awaitable<std::shared_ptr<sandbox::Ledger>> open_ledger(Env env, std::shared_ptr<sandbox::Sandbox> box, Context context);

// `network` and, when the allowlist refused hosts, `network_refused`: which, and the flag.
void write_network(json::Writer& w, const sandbox::Ledger* ledger);

} // namespace cubicle::tools
