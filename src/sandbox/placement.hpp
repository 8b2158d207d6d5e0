// Where a sandbox runs: a container of the engine at --docker-host (local_placement.hpp)
// or a service of the Swarm it manages (swarm_placement.hpp); a pod would be one more
// implementation (docs/kubernetes.md). The manager asks the placement to make, remove
// and list the hosts of sandboxes, and to report the ones it lost; everything else
// (ownership, pools, runs, files) goes through the sandbox's agent and is the same on all.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "common/errors.hpp"
#include "docker/client.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {

class Sandbox;

// The agent did not start in a sandbox (say, an image for another CPU): the manager
// may fall back to Docker exec where the placement offers it.
class AgentUnavailable : public ToolError {
public:
    using ToolError::ToolError;
};

// What the manager's Engine API can do to a sandbox's container besides talk to its
// agent: a placement's quirks, named, as docker::Engine names an engine's.
struct PlacementOffers {
    bool pause = true;      // idle pause: POST /containers/{id}/pause (the cgroup freezer)
    bool container = true;  // archive and exec reach the container (uploads without tar, exec fallback, workspaces)
    bool volumes = true;    // a volume of the engine at --docker-host reaches it (persistent sandboxes, their mirror)
    bool egress = true;     // the egress proxy's networks reach it (network: true)
    bool losses = false;    // lost() can say that a sandbox's host went away (its node left)
    // A client's image may run. Swarm derives each image with the agent by a build that runs
    // the base's own programs on the manager as root: only the operator's images there.
    bool any_image = true;
};

// A sandbox whose host went away behind the server's back, and why (node loss).
struct LostSandbox {
    std::string host_id;     // Sandbox::container_id()
    bool node_lost = false;  // its node left (else its task ended, or it was removed: `detail`)
    std::string detail;
};

class Placement {
public:
    virtual ~Placement() = default;
    virtual const char* name() const = 0;  // "local", "swarm"
    virtual PlacementOffers offers() const = 0;
    // Makes and starts the host of sandbox `sandbox_id` and connects its agent (Docker exec
    // when not `agent`). Throws ToolError (AgentUnavailable: the agent did not start).
    virtual boost::asio::awaitable<std::shared_ptr<Sandbox>> launch(SandboxSpec spec, std::string sandbox_id, bool agent) = 0;
    // Removes a sandbox's host (Sandbox::container_id(), or one hosts() listed) with what was
    // made for it alone (its network). Throws docker::Error.
    virtual boost::asio::awaitable<void> remove(std::string host_id) = 0;
    // The hosts carrying `label_filter` (KEY=VALUE): for shutdown's leftovers and the orphan sweep.
    virtual boost::asio::awaitable<std::vector<docker::ContainerSummary>> hosts(std::string label_filter) = 0;
    // Hosts of `host_ids` lost since they were made (their node left, their task failed).
    virtual boost::asio::awaitable<std::vector<LostSandbox>> lost(std::vector<std::string> host_ids) = 0;
    // Removes what this placement made for every sandbox (relays, networks, the endpoint);
    // the sandboxes must be gone. Never throws.
    virtual boost::asio::awaitable<void> teardown() = 0;
};

} // namespace cubicle::sandbox
