#include "sandbox/swarm_placement.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <set>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "docker/registry.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

namespace {

// From its task running to its agent's hello (a local container's 15 s, and the way home).
constexpr auto agent_start_timeout = std::chrono::seconds(20);
// How long a task may stay pending with Swarm's reason (no node has room) before the launch fails.
constexpr auto unplaced_wait = std::chrono::seconds(3);
constexpr auto task_poll = std::chrono::milliseconds(100);
constexpr int task_polls = 600;  // 60 s
// After its service is removed, a network is in use until its tasks' containers are gone on their nodes.
constexpr auto network_poll = std::chrono::milliseconds(250);
constexpr int network_polls = 60;  // 15 s; the orphan sweep takes what is left
// The relay's port on each sandbox's network (agent/relay.h).
constexpr int relay_port = 4000;

bool task_ended(const std::string& state) {
    static const std::set<std::string> ended{"complete", "shutdown", "failed", "rejected", "remove", "orphaned"};
    return ended.count(state) != 0;
}

// The image sandboxes of `base` run on Swarm: the tag says the agent's digest, so a node
// holding one derived for another agent never serves it under this name.
std::string derived_name(const std::string& base) {
    auto colon = base.rfind(':');
    auto slash = base.rfind('/');
    std::string repository = base, tag = "latest";
    if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
        repository = base.substr(0, colon);
        tag = base.substr(colon + 1);
    }
    return fmt::format("{}:{}-agent-{}", repository, tag, agent_digest().substr(0, 12));
}

} // namespace

SwarmPlacement::SwarmPlacement(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance)
    : executor_(executor), docker_(docker), config_(config), instance_(std::move(instance)),
      started_(executor, asio::steady_timer::time_point::max()) {}

asio::awaitable<void> SwarmPlacement::start() {
    while (!endpoint_ && starting_) co_await started_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (endpoint_) co_return;
    starting_ = true;
    std::string failure;
    // Published together once both exist: a launch that finds the endpoint finds the network.
    std::unique_ptr<DialHome> endpoint;
    try {
        // --agent-listen is an address of this host the nodes reach (config.cpp checks it is given).
        auto colon = config_.agent_listen.rfind(':');
        auto host = config_.agent_listen.substr(0, colon);
        if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        auto port = static_cast<std::uint16_t>(std::stoi(config_.agent_listen.substr(colon + 1)));
        endpoint = DialHome::listen(executor_, host, port);
        dial_target_ = host_port(host, endpoint->port());
        // Not internal: the relays' way out to the endpoint (through each node's docker_gwbridge).
        if (agents_network_.empty())
            agents_network_ = co_await docker_.create_network(overlay_network_config("cubicle-agents-" + random_hex(8), instance_, false));
    } catch (const std::exception& e) {
        failure = e.what();
    }
    if (failure.empty()) endpoint_ = std::move(endpoint);
    starting_ = false;
    started_.cancel();
    if (!failure.empty()) throw ToolError(fmt::format("sandboxes cannot start on the Swarm: {}", failure));
}

asio::awaitable<std::string> SwarmPlacement::agent_image(std::string base) {
    // The agent must be on every node the task may land on: a volume or PUT /archive reaches
    // only the manager's engine, and a Swarm config holds 500 KB (the agent is ~6 MB, static
    // with its TLS). So it is baked into an image derived from the sandbox's, which reaches the
    // nodes as any image does (a registry, or docker save/load), named and labelled with the
    // agent's digest so that a stale one is never run.
    // One derivation of a base at a time: launches at once wait for the first (and try
    // themselves if it failed).
    while (deriving_.count(base)) {
        auto wait = deriving_[base];
        co_await wait->async_wait(asio::as_tuple(asio::use_awaitable));
    }
    if (auto known = images_.find(base); known != images_.end()) co_return known->second;
    auto done = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    deriving_[base] = done;
    struct Finished {
        std::map<std::string, std::shared_ptr<asio::steady_timer>>& deriving;
        std::string base;
        ~Finished() {
            if (auto it = deriving.find(base); it != deriving.end()) {
                it->second->cancel();
                deriving.erase(it);
            }
        }
    } finished{deriving_, base};
    if (base.find("-agent-") != std::string::npos)
        throw ToolError(fmt::format("{} looks like an image derived for Swarm already; name its base image", base));
    if (base.find('@') != std::string::npos)
        throw ToolError(fmt::format("--engine swarm derives the agent's image from a tag, not a digest: {}", base));
    auto derived = derived_name(base);
    auto info = co_await docker_.inspect_image(derived);
    if (!info) {
        log::info("building {} (the agent in {}) on the Swarm manager", derived, base);
        try {
            co_await docker_.build_image(agent_image_context(base, agent_binary(), agent_digest()), derived);
        } catch (const docker::Error& e) {
            throw ToolError(fmt::format("could not derive the sandbox image for Swarm from {}: {}", base, e.what()));
        }
        info = co_await docker_.inspect_image(derived);
    }
    auto digest = info ? info->labels.find(label_agent_digest) : decltype(info->labels.end()){};
    if (!info || digest == info->labels.end() || digest->second != agent_digest()) {
        throw ToolError(fmt::format("the image {} does not hold this server's agent (label {}); remove it and start again", derived,
                                    label_agent_digest));
    }
    // Nodes pull what they run: a base in a registry gets its derivation pushed there.
    // Without one, the operator loads the derived image onto every node (README).
    if (auto registry = docker::registry_of(derived); !registry.empty()) {
        log::info("pushing {} to {}, where the Swarm's nodes pull it", derived, registry);
        try {
            co_await docker_.push_image(derived);
        } catch (const docker::Error& e) {
            throw ToolError(fmt::format("could not push {} to its registry {}, which the Swarm's nodes pull from: {}", derived, registry,
                                        e.what()));
        }
    }
    images_[base] = derived;
    co_return derived;
}

asio::awaitable<std::shared_ptr<Sandbox>> SwarmPlacement::launch(SandboxSpec spec, std::string sandbox_id, bool agent) {
    if (!agent) throw ToolError("--engine swarm runs sandboxes with their agent only: Docker exec reaches no other node");
    co_await start();
    auto image = co_await agent_image(spec.image);
    // The relay, which has a way out, runs the operator's image whatever the sandbox's.
    auto relay_image = co_await agent_image(config_.default_image);
    auto suffix = random_hex(6);
    std::string network, relay, service;
    std::shared_ptr<Sandbox> sandbox;
    std::exception_ptr failure;
    bool running = false;  // its task ran: a failure after it may be Swarm's to tell
    try {
        network = co_await docker_.create_network(overlay_network_config("cubicle-sb-" + suffix, instance_, true));
        std::vector<std::string> relay_networks{network, agents_network_};
        auto relay_spec = relay_service_spec(relay_image, instance_, sandbox_id, "cubicle-relay-" + suffix, std::move(relay_networks),
                                             config_.swarm_constraints, docker_.engine(), relay_port, dial_target_);
        relay = co_await docker_.create_service(std::move(relay_spec));
        // The agent dials an address, not a name: the relay's, once its task runs.
        auto relay_address = co_await task_address(relay, network);
        if (!endpoint_) throw ToolError("the server is stopping");  // teardown() ran meanwhile
        auto channel = endpoint_->expect(network, relay_address, relay_port);
        SwarmSandbox swarm{.service_name = "cubicle-" + suffix,
                           .image = image,
                           .network = network,
                           .constraints = config_.swarm_constraints,
                           .dial = channel->wiring().dial};
        auto service_spec = sandbox_service_spec(spec, instance_, sandbox_id, docker_.engine(), swarm);
        service = co_await docker_.create_service(std::move(service_spec));
        parts_[service] = Parts{relay, network};
        sandbox = std::make_shared<Sandbox>(executor_, sandbox_id, service, std::move(spec));
        if (!docker_.engine().forks_and_recycles(sandbox->spec().runtime)) sandbox->disable_zygote();
        sandbox->set_zygote_preload(config_.zygote_preload);
        // Its agent dials once its task runs (the token waits for it meanwhile).
        std::string no_network;
        co_await task_address(service, no_network);
        running = true;
        co_await sandbox->connect_dialed(std::move(channel), agent_start_timeout);
        log::debug("sandbox {} ready (service {})", sandbox_id, service.substr(0, 12));
        co_return sandbox;
    } catch (...) {
        failure = std::current_exception();
    }
    if (sandbox) sandbox->shutdown("it did not start");
    std::string why;  // not a co_await inside ?: (GCC 12, PITFALLS.md)
    if (running) why = co_await task_failure(service);
    if (!service.empty()) {
        try {
            co_await remove(service);
        } catch (const std::exception& e) {
            log::warning("removing service {} after a failed start: {}", service.substr(0, 12), e.what());
        }
    } else {
        co_await remove_parts(relay, network);
    }
    if (!why.empty()) throw AgentUnavailable(fmt::format("the sandbox's Swarm task did not start: {}", why));
    std::rethrow_exception(failure);
}

asio::awaitable<std::string> SwarmPlacement::task_address(std::string service, std::string network) {
    asio::steady_timer pause(executor_);
    auto started = std::chrono::steady_clock::now();
    for (int poll = 0; poll < task_polls; ++poll) {
        std::vector<std::string> services{service};
        auto tasks = co_await docker_.list_tasks(std::move(services));
        if (!tasks.empty()) {
            const auto& task = tasks.front();  // the newest
            if (task_ended(task.state))
                throw ToolError(fmt::format("its Swarm task {}: {}", task.state, task.error.empty() ? "no reason given" : task.error));
            // Swarm keeps it pending until a node frees up: said at once rather than after the whole wait.
            if (task.state == "pending" && !task.error.empty() && std::chrono::steady_clock::now() - started > unplaced_wait)
                throw ToolError(fmt::format("Swarm has no node for it: {} (see --swarm-constraint and the sandbox's limits, "
                                            "which Swarm reserves)",
                                            task.error));
            auto addresses = task.addresses.find(network);
            if (task.state == "running" && (network.empty() || (addresses != task.addresses.end() && !addresses->second.empty()))) {
                if (network.empty()) co_return std::string();
                const auto& cidr = addresses->second.front();
                co_return cidr.substr(0, cidr.find('/'));
            }
        }
        pause.expires_after(task_poll);
        co_await pause.async_wait(asio::use_awaitable);
    }
    throw ToolError("its Swarm task did not start within 60 s");
}

asio::awaitable<std::string> SwarmPlacement::task_failure(std::string service) {
    try {
        std::vector<std::string> services{service};
        auto tasks = co_await docker_.list_tasks(std::move(services));
        if (tasks.empty()) co_return std::string("Swarm made no task for it");
        const auto& task = tasks.front();
        if (task.state == "running") co_return std::string();
        co_return fmt::format("{}{}{}", task.state, task.error.empty() ? "" : ": ", task.error);
    } catch (const std::exception& e) {
        co_return std::string();
    }
}

asio::awaitable<void> SwarmPlacement::remove(std::string host_id) {
    co_await docker_.remove_service(host_id);
    auto parts = parts_.find(host_id);
    if (parts == parts_.end()) co_return;
    auto [relay, network] = parts->second;
    parts_.erase(parts);
    co_await remove_parts(std::move(relay), std::move(network));
}

asio::awaitable<void> SwarmPlacement::remove_parts(std::string relay, std::string network) {
    try {
        if (!relay.empty()) co_await docker_.remove_service(relay);
    } catch (const std::exception& e) {
        log::warning("removing a sandbox's relay service: {}", e.what());
    }
    if (network.empty()) co_return;
    asio::steady_timer pause(executor_);
    std::string failure;
    for (int poll = 0; poll < network_polls; ++poll) {
        try {
            co_await docker_.remove_network(network);
            co_return;
        } catch (const std::exception& e) {
            failure = e.what();
        }
        pause.expires_after(network_poll);
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    log::warning("removing a sandbox's overlay network: {} (the orphan sweep tries again)", failure);
}

asio::awaitable<std::vector<docker::ContainerSummary>> SwarmPlacement::hosts(std::string label_filter) {
    co_return co_await docker_.list_services(std::move(label_filter));
}

asio::awaitable<std::vector<LostSandbox>> SwarmPlacement::lost(std::vector<std::string> host_ids) {
    std::vector<LostSandbox> out;
    if (host_ids.empty()) co_return out;
    auto tasks = co_await docker_.list_tasks(host_ids);
    auto down = co_await docker_.nodes_lost();
    std::set<std::string> seen;
    for (const auto& task : tasks) {
        if (!seen.insert(task.service_id).second) continue;  // only the newest task counts
        bool node_lost = std::find(down.begin(), down.end(), task.node_id) != down.end();
        if (node_lost) {
            out.push_back({.host_id = task.service_id, .node_lost = true, .detail = {}});
        } else if (task_ended(task.state)) {
            auto detail = fmt::format("its Swarm task ended ({}{}{})", task.state, task.error.empty() ? "" : ": ", task.error);
            out.push_back({.host_id = task.service_id, .node_lost = false, .detail = std::move(detail)});
        }
    }
    // A service with no task at all was removed behind the server's back.
    for (const auto& id : host_ids) {
        if (!seen.count(id)) out.push_back({.host_id = id, .node_lost = false, .detail = "its Swarm service was removed"});
    }
    co_return out;
}

asio::awaitable<void> SwarmPlacement::teardown() {
    endpoint_.reset();
    auto parts = std::exchange(parts_, {});
    for (auto& entry : parts) co_await remove_parts(entry.second.relay, entry.second.network);
    if (agents_network_.empty()) co_return;
    asio::steady_timer pause(executor_);
    for (int poll = 0; poll < network_polls; ++poll) {
        try {
            co_await docker_.remove_network(agents_network_);
            agents_network_.clear();
            co_return;
        } catch (const std::exception& e) {
            log::debug("removing the agents' overlay network: {}", e.what());
        }
        pause.expires_after(network_poll);
        co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

} // namespace cubicle::sandbox
