// The Swarm placement (placement.hpp, --engine swarm): --docker-host is a Swarm manager
// and each sandbox is a service of one task, on a node Swarm chooses. Its agent is in
// an image derived from the sandbox's (the agent at its path, labelled with its digest:
// the only way onto every node, see agent_image()), and dials home (dial_home.hpp)
// through a relay task of its own: the sandbox's internal overlay network holds the two
// of them alone, and the relay's second network, the server's agents' overlay, is its
// way to --agent-listen. Nothing else answers a sandbox there.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/dial_home.hpp"
#include "sandbox/placement.hpp"

namespace cubicle::sandbox {

class SwarmPlacement : public Placement {
public:
    SwarmPlacement(boost::asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance);

    const char* name() const override { return "swarm"; }
    // Only the agent reaches a task on another node: no pause, archive or exec through the
    // manager, and no volume or bridge network of the manager's host.
    PlacementOffers offers() const override {
        return {.pause = false, .container = false, .volumes = false, .egress = false, .losses = true, .any_image = false};
    }
    boost::asio::awaitable<std::shared_ptr<Sandbox>> launch(SandboxSpec spec, std::string sandbox_id, bool agent) override;
    boost::asio::awaitable<void> remove(std::string host_id) override;
    boost::asio::awaitable<std::vector<docker::ContainerSummary>> hosts(std::string label_filter) override;
    boost::asio::awaitable<std::vector<LostSandbox>> lost(std::vector<std::string> host_ids) override;
    boost::asio::awaitable<void> teardown() override;

private:
    // The endpoint and the agents' overlay, made for the first sandbox.
    boost::asio::awaitable<void> start();
    // The image sandboxes of `base` run: derived once per base and agent (built on the
    // manager when missing). Throws ToolError.
    boost::asio::awaitable<std::string> agent_image(std::string base);
    // Once `service`'s task runs: its address on `network` (none asked: ""). Throws ToolError
    // when the task ended or Swarm has no node for it.
    boost::asio::awaitable<std::string> task_address(std::string service, std::string network);
    // Why `service`'s task is not running, when Swarm says (for the launch's error).
    boost::asio::awaitable<std::string> task_failure(std::string service);
    // Removes a sandbox's relay and network (its service must be gone). Never throws.
    boost::asio::awaitable<void> remove_parts(std::string relay, std::string network);

    struct Parts {
        std::string relay;    // the relay's service
        std::string network;  // the sandbox's overlay
    };

    boost::asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    std::unique_ptr<DialHome> endpoint_;
    std::string dial_target_;  // HOST:PORT the relays dial
    std::string agents_network_;
    std::map<std::string, std::string> images_;  // derived, by base image
    std::map<std::string, std::shared_ptr<boost::asio::steady_timer>> deriving_;  // cancelled when done
    std::map<std::string, Parts> parts_;         // by the sandbox's service id
    bool starting_ = false;
    boost::asio::steady_timer started_;
};

} // namespace cubicle::sandbox
