#include "sandbox/egress.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/all_at_once.hpp"
#include "common/errors.hpp"
#include "common/hex.hpp"
#include "common/ids.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "docker/stream.hpp"
#include "sandbox/agent_blob.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

// What the Engine (Docker 20.10 and later) says when no subnet of its default
// address pools is free for another network.
constexpr std::string_view pools_used_up = "could not find an available, non-overlapping IPv4 address pool";

// How long a run's end waits for the proxy's reports: the proxy answers in
// milliseconds; a proxy that does not cannot hold every run up.
constexpr auto report_wait = std::chrono::seconds(1);

// A proxy that exits this often within proxy_restart_window is not started again at
// once: the next networked sandbox's call starts it.
constexpr std::size_t max_proxy_restarts = 3;
constexpr auto proxy_restart_window = std::chrono::minutes(1);

// A report line longer than this is not one of ours.
constexpr std::size_t max_report_line = 4096;

// The sandbox's address on its egress network, from the Engine; empty if it has none.
std::string egress_address(std::string_view inspect_json) {
    json::Document doc;
    if (doc.parse(inspect_json)) return {};
    simdjson::dom::object networks;
    if (doc.root()["NetworkSettings"]["Networks"].get(networks) != simdjson::SUCCESS) return {};
    for (auto [name, network] : networks) {
        std::string_view address;
        if (name.starts_with("cubicle-egress-") && network["IPAddress"].get(address) == simdjson::SUCCESS) return std::string(address);
    }
    return {};
}

} // namespace

std::string network_refused(std::string_view why) {
    if (why.find(pools_used_up) != std::string_view::npos) {
        return "no network could be made for this sandbox: the Docker daemon has no address range left for another "
               "network (its default-address-pools are used up, by this server's networks and others on the host). "
               "Create the sandbox without network: true, or try again once networked sandboxes have stopped; the "
               "operator can remove unused Docker networks (`docker network prune`), give the daemon more pools "
               "(default-address-pools in daemon.json) or lower --max-egress-networks";
    }
    return fmt::format("could not set up network access for sandboxes: {}", why);
}

std::string no_network_left(std::size_t most) {
    return fmt::format("no network is left for this sandbox: the server keeps at most {} egress networks (one per "
                       "principal with networked sandboxes) and all are in use by others. Create the sandbox without "
                       "network: true, or try again once other principals' networked sandboxes have stopped; the "
                       "operator can raise --max-egress-networks if the Docker daemon's address pools have room",
                       most);
}

Egress::Egress(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance,
               AgentVolume& agent_volume)
    : executor_(std::move(executor)), docker_(docker), config_(config), instance_(std::move(instance)), agent_volume_(agent_volume),
      reports_(std::make_shared<Reports>(config.egress_allow.empty() ? "open" : "allowlist")) {
    reports_->on_ask = [this](ProxyReport ask) { asio::co_spawn(executor_, answer(std::move(ask)), asio::detached); };
    reports_->on_exit = [this](const docker::RawStream* stream) {
        // Not the stream of a proxy removed on purpose (remove_proxy() lets go of it first).
        if (stream == proxy_stdin_.get()) asio::co_spawn(executor_, proxy_exited(), asio::detached);
    };
}

std::string Egress::proxy_url() const { return fmt::format("http://{}:{}", proxy_alias, proxy_port); }

asio::awaitable<std::string> Egress::join(std::string principal) {
    co_await ensure_proxy();
    // Another call of this principal's creates or removes its network: wait, then look again.
    for (;;) {
        if (closed_) throw ToolError("the server is stopping; no new sandbox can start");
        auto it = networks_.find(principal);
        if (it == networks_.end()) break;
        auto network = it->second;
        if (network->state == Network::State::ready) {
            ++network->members;
            co_return network->name;
        }
        log::debug("a sandbox waits for egress network {} to be {}", network->name,
                   network->state == Network::State::creating ? "created" : "removed");
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        network->waiting.push_back(turn);
        co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
    }
    const auto most = static_cast<std::size_t>(config_.max_egress_networks);
    if (networks_.size() >= most) throw ToolError(no_network_left(most));
    auto network = std::make_shared<Network>();
    // Random, and never the principal's: a sandbox on the network can look its name up
    // (Docker's DNS answers reverse lookups with container.network).
    network->name = "cubicle-egress-" + random_hex(8);
    networks_[principal] = network;
    std::string failure;
    try {
        auto config = egress_network_config(network->name, instance_);
        network->id = co_await docker_.create_network(std::move(config));
        // Under the same name on every network: the sandboxes' proxy settings are all alike.
        std::vector<std::string> aliases{proxy_alias};
        co_await docker_.connect_network(network->id, proxy_id_, std::move(aliases));
        if (closed_) failure = "the server is stopping; no new sandbox can start";
    } catch (const std::exception& e) {
        failure = network_refused(e.what());
    }
    if (failure.empty()) {
        network->state = Network::State::ready;
        network->members = 1;
        wake(std::move(network->waiting));
        log::debug("egress network {} ready", network->name);
        co_return network->name;
    }
    if (auto it = networks_.find(principal); it != networks_.end() && it->second == network) networks_.erase(it);
    if (!network->id.empty()) co_await remove_network(network->id);
    wake(std::move(network->waiting));
    throw ToolError(failure);
}

asio::awaitable<void> Egress::leave(std::string principal) {
    auto it = networks_.find(principal);
    if (it == networks_.end()) co_return;
    auto network = it->second;
    if (network->state != Network::State::ready || --network->members > 0) co_return;
    // Joins of this principal wait until it is gone, then make a new one.
    network->state = Network::State::removing;
    co_await remove_network(network->id);
    if (auto found = networks_.find(principal); found != networks_.end() && found->second == network) networks_.erase(found);
    wake(std::move(network->waiting));
    log::debug("egress network {} removed with its last sandbox", network->name);
}

asio::awaitable<bool> Egress::watch(std::string sandbox_id, std::string container_id) {
    std::string address;
    try {
        auto target = "/containers/" + container_id + "/json";
        auto response = co_await docker_.request("GET", std::move(target));
        if (response.status == 200) address = egress_address(response.body);
    } catch (const std::exception& e) {
        log::debug("inspecting sandbox {}: {}", sandbox_id, e.what());
    }
    if (address.empty()) {
        log::warning("sandbox {} has no address on an egress network: its runs show no network ledger", sandbox_id);
        co_return false;
    }
    // An address Docker hands out again: whatever the proxy still holds for it was
    // another sandbox's (a missed unbind); this one's secrets come after.
    if (proxy_stdin_ && !bound_secrets_.contains(sandbox_id)) {
        proxy_stdin_->send(fmt::format("unsecret {}\nunca {}\n", address, address));
    }
    reports_->ledgers.watch(address, sandbox_id);
    co_return true;
}

asio::awaitable<std::shared_ptr<Ledger>> Egress::open_run(std::string sandbox_id, std::string container_id, Approver approver) {
    // A sandbox made before its network was watched (a recycled one comes under a new id).
    if (!reports_->ledgers.watched(sandbox_id)) {
        bool watched = co_await watch(sandbox_id, std::move(container_id));  // not inside && (GCC 12, PITFALLS.md)
        if (!watched) co_return nullptr;
    }
    auto run = reports_->ledgers.open_run(sandbox_id);
    if (approver) {
        auto& askers = askers_[sandbox_id];
        std::erase_if(askers, [](const Asker& a) { return a.run.expired(); });
        askers.push_back({run, std::move(approver)});
    }
    co_return run;
}

asio::awaitable<void> Egress::answer(ProxyReport ask) {
    std::string verdict = "no unasked";
    try {
        verdict = co_await decide(ask);
    } catch (const std::exception& e) {
        log::warning("asking about egress to {}:{}: {}", ask.host, ask.port, e.what());
    }
    if (proxy_stdin_) proxy_stdin_->send(fmt::format("answer {} {}\n", ask.id, verdict));
}

asio::awaitable<std::string> Egress::decide(ProxyReport ask) {
    const auto* found = reports_->ledgers.sandbox_at(ask.client);
    if (!found) co_return "no unasked";
    auto sandbox_id = *found;
    auto target = fmt::format("{}{}{}:{}", ask.host.find(':') != std::string::npos ? "[" : "", ask.host,
                              ask.host.find(':') != std::string::npos ? "]" : "", ask.port);
    if (auto it = approved_.find(sandbox_id); it != approved_.end() && it->second.contains(target)) co_return "sandbox";
    if (auto it = declined_.find(sandbox_id); it != declined_.end() && it->second.contains(target)) co_return "no declined";
    auto key = sandbox_id + " " + target;
    if (auto it = questions_.find(key); it != questions_.end()) {
        auto question = it->second;  // one question for the connections that come while it is open
        co_await question->answered.async_wait(asio::as_tuple(asio::use_awaitable));
        co_return question->verdict;
    }
    // One question at a time per sandbox: a program trying many hosts at once must not
    // flood the user with questions (nor hold the proxy's connections while they wait).
    auto of_sandbox = questions_.lower_bound(sandbox_id + " ");
    if (of_sandbox != questions_.end() && of_sandbox->first.starts_with(sandbox_id + " ")) co_return "no busy";
    // The newest open run of the sandbox asks its client.
    Approver approve;
    if (auto it = askers_.find(sandbox_id); it != askers_.end()) {
        for (const auto& asker : it->second) {
            if (!asker.run.expired()) approve = asker.approve;
        }
    }
    if (!approve) co_return "no unasked";
    auto question = std::make_shared<Question>(executor_);
    question->answered.expires_at(asio::steady_timer::time_point::max());
    questions_[key] = question;
    std::string verdict = "no unasked";
    try {
        verdict = co_await approve(ask.host, ask.port);
    } catch (...) {
        questions_.erase(key);
        question->answered.cancel();
        throw;
    }
    questions_.erase(key);
    question->verdict = verdict;
    question->answered.cancel();
    // Only while the sandbox lives (forget() drops what it was allowed or refused).
    if (reports_->ledgers.watched(sandbox_id)) {
        if (verdict == "sandbox") approved_[sandbox_id].insert(target);
        if (verdict == "no declined") declined_[sandbox_id].insert(target);
    }
    log::info("egress from sandbox {} to {}: {}", sandbox_id, target, verdict);
    co_return verdict;
}

asio::awaitable<void> Egress::close_run(std::shared_ptr<Ledger> run) {
    if (!run || !proxy_stdin_) co_return;
    // The proxy answers "sync N" after every record owed before it; records come
    // in order on one stream, so by then this run's are in.
    auto reports = reports_;
    auto id = ++reports->sent;
    auto turn = std::make_shared<asio::steady_timer>(executor_, report_wait);
    reports->waiting.push_back(turn);
    proxy_stdin_->send(fmt::format("sync {}\n", id));
    while (reports->answered < id) {
        auto [error] = co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
        if (!error) break;  // the time ran out; a report wakes us (cancelled) to look again
    }
    std::erase(reports->waiting, turn);
    if (reports->answered < id) log::debug("the egress proxy did not report in time: a run's network ledger may lack connections");
}

void Egress::Reports::line(std::string_view text) {
    auto report = parse_proxy_report(text);
    if (!report) {
        log::debug("egress proxy: unreadable report line");
        return;
    }
    switch (report->kind) {
    case ProxyReport::Kind::connection:
        ledgers.add(*report);
        break;
    case ProxyReport::Kind::dropped:
        log::warning("the egress proxy dropped {} ledger records (the server read them too slowly)", report->id);
        break;
    case ProxyReport::Kind::ask:
        if (on_ask) on_ask(std::move(*report));
        break;
    case ProxyReport::Kind::sync:
        answered = std::max(answered, report->id);
        for (auto& turn : waiting) turn->cancel();
        break;
    }
}

asio::awaitable<void> Egress::read_reports(std::shared_ptr<docker::RawStream> stream, std::shared_ptr<Reports> reports) {
    docker::Demuxer demuxer;
    std::string out, err;
    std::string buffer(16 * 1024, '\0');
    // stdout carries reports, stderr the proxy's log lines (at debug level here).
    auto split = [](std::string& pending, std::string_view data, auto&& each) {
        pending.append(data);
        std::size_t start = 0;
        for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
            each(std::string_view(pending).substr(start, nl - start));
        }
        pending.erase(0, start);
        if (pending.size() > max_report_line) pending.clear();
    };
    auto on_report = [&reports](std::string_view line) { reports->line(line); };
    auto on_log = [](std::string_view line) { log::debug("{}", json::sanitize_utf8(line)); };
    try {
        for (;;) {
            std::size_t n = co_await stream->read_some(buffer.data(), buffer.size());
            if (n == 0) break;
            bool framed = demuxer.feed(std::string_view(buffer.data(), n), [&](docker::StreamKind kind, std::string_view data) {
                if (kind == docker::StreamKind::stdout_) split(out, data, on_report);
                else if (kind == docker::StreamKind::stderr_) split(err, data, on_log);
            });
            if (!framed) throw std::runtime_error("malformed attach stream");
        }
    } catch (const std::exception& e) {
        log::debug("reading the egress proxy's reports: {}", e.what());
    }
    // Nobody waits for a proxy that is gone.
    reports->answered = reports->sent;
    for (auto& turn : reports->waiting) turn->cancel();
    if (reports->on_exit) reports->on_exit(stream.get());
}

void Egress::send_secrets(const std::string& address, const Bound& bound, bool first, const std::vector<std::string>& dropped) {
    if (!proxy_stdin_) return;
    // One write: the proxy never sees a sandbox without the secrets it keeps.
    std::string commands = first ? fmt::format("unsecret {}\nca {} {} {}\n", address, address, to_hex(bound.ca.cert_pem), to_hex(bound.ca.key_pem)) : "";
    for (const auto& name : dropped) commands += fmt::format("unsecret {} {}\n", address, name);
    for (const auto& [name, placeholder] : bound.placeholders) {
        const auto* secret = secrets_.find(name);
        if (!secret) continue;  // gone from a re-read file: no longer sent anywhere
        std::string hosts;
        for (const auto& h : secret->hosts) hosts += (hosts.empty() ? "" : ",") + h;
        bool query = secret->header.empty();
        commands += fmt::format("secret {} {} {} {} {} {} {} {}\n", address, name, placeholder, hosts, query ? "query" : "header",
                                to_hex(query ? secret->query : secret->header), to_hex(secret->value), to_hex(secret->filled()));
    }
    proxy_stdin_->send(std::move(commands));
}

std::optional<std::string> Egress::bind_secrets(const std::string& sandbox_id, std::vector<std::pair<std::string, std::string>> placeholders,
                                                std::string principal, bool any_principal) {
    const auto* address = reports_->ledgers.address_of(sandbox_id);
    if (!address || address->empty()) {
        log::warning("sandbox {} has no known address on its egress network: its secrets cannot be given to the proxy", sandbox_id);
        return std::nullopt;
    }
    Bound bound{std::move(placeholders), make_sandbox_ca(sandbox_id), std::move(principal), any_principal};
    send_secrets(*address, bound, true);
    auto cert = bound.ca.cert_pem;
    bound_secrets_[sandbox_id] = std::move(bound);
    return cert;
}

void Egress::unbind_secrets(const std::string& sandbox_id) {
    auto it = bound_secrets_.find(sandbox_id);
    if (it == bound_secrets_.end()) return;
    if (const auto* address = reports_->ledgers.address_of(sandbox_id); address && !address->empty() && proxy_stdin_) {
        proxy_stdin_->send(fmt::format("unsecret {}\nunca {}\n", *address, *address));
    }
    bound_secrets_.erase(it);
}

void Egress::reload_secrets() {
    if (!secrets_.reload()) return;
    for (auto& entry : bound_secrets_) {
        // (not a structured binding: clang 14 cannot capture one in the lambda below)
        const std::string& sandbox_id = entry.first;
        auto& bound = entry.second;
        // A name the file no longer gives this principal is dropped for good (its placeholder stays inert).
        std::vector<std::string> dropped;
        std::erase_if(bound.placeholders, [&](const auto& held) {
            bool keep = secrets_.allows(held.first, bound.principal, bound.any_principal);
            if (!keep) {
                log::info("sandbox {} no longer holds secret {}: the re-read --secrets file does not give it to its principal", sandbox_id, held.first);
                dropped.push_back(held.first);
            }
            return !keep;
        });
        // By name: no moment in which the sandbox's requests go without their secrets.
        if (const auto* address = reports_->ledgers.address_of(sandbox_id); address && !address->empty()) send_secrets(*address, bound, false, dropped);
    }
}

asio::awaitable<void> Egress::remove_network(std::string id) {
    // The proxy first: the Engine removes no network that a container is still on.
    if (!proxy_id_.empty()) {
        try {
            co_await docker_.disconnect_network(id, proxy_id_);
        } catch (const std::exception& e) {
            log::debug("disconnecting the egress proxy from network {}: {}", id.substr(0, 12), e.what());
        }
    }
    try {
        co_await docker_.remove_network(id);
    } catch (const std::exception& e) {
        log::warning("removing egress network {}: {} (it goes at exit)", id.substr(0, 12), e.what());
    }
}

void Egress::wake(std::vector<std::shared_ptr<asio::steady_timer>> waiting) {
    for (auto& turn : waiting) turn->cancel();
}

asio::awaitable<void> Egress::ensure_proxy() {
    if (closed_) throw ToolError("the server is stopping; no new sandbox can start");
    if (proxy_state_ == State::ready) co_return;
    if (proxy_state_ == State::starting) {
        co_await wait_while_starting();
        if (proxy_state_ != State::ready) throw ToolError(proxy_failure_);
        co_return;
    }
    proxy_state_ = State::starting;
    try {
        co_await start_proxy();
        proxy_state_ = State::ready;
    } catch (const std::exception& e) {
        proxy_failure_ = fmt::format("could not set up network access for sandboxes: {}", e.what());
    }
    if (proxy_state_ != State::ready) {
        try {
            co_await remove_proxy();  // the next request starts from scratch
        } catch (const std::exception& e) {
            log::warning("cleaning up a failed egress set-up: {}", e.what());
        }
    }
    wake(std::move(waiting_for_proxy_));
    waiting_for_proxy_.clear();
    if (proxy_state_ != State::ready) throw ToolError(proxy_failure_);
}

asio::awaitable<void> Egress::wait_while_starting() {
    while (proxy_state_ == State::starting) {
        auto turn = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
        waiting_for_proxy_.push_back(turn);
        co_await turn->async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<void> Egress::start_proxy() {
    auto agent_volume = co_await agent_volume_.ensure(config_.default_image);
    // On the default bridge, its way out; the principals' networks are joined as they come.
    // The proxy waits a little longer than the server: the server's "no answer" comes first.
    int ask_wait_s = config_.egress_asks() && !config_.egress_allow.empty() ? config_.egress_approval_timeout_s + 5 : 0;
    auto config = proxy_config(config_.default_image, instance_, config_.egress_allow, docker_.engine(), agent_volume, ask_wait_s);
    proxy_id_ = co_await docker_.create_container(std::move(config), "cubicle-proxy-" + random_hex(8));
    if (agent_volume.empty()) co_await docker_.put_archive(proxy_id_, agent_dir, agent_archive());
    proxy_stdin_ = co_await docker_.attach(proxy_id_);
    asio::co_spawn(executor_, read_reports(proxy_stdin_, reports_), asio::detached);
    co_await docker_.start_container(proxy_id_);
    // What the secrets' hosts are verified against (proxy_tls.h): over stdin, like the
    // secrets, so the proxy's container config holds none of it.
    if (!upstream_trust_.empty()) {
        std::string commands;
        for (const auto& pem : upstream_trust_) commands += fmt::format("trust {}\n", to_hex(pem));
        proxy_stdin_->send(std::move(commands));
    }
    // A proxy started after the last one exited: back on every network (under the same
    // name, so the sandboxes' settings hold), with every sandbox's secrets and CA.
    std::vector<std::shared_ptr<Network>> networks;
    for (const auto& entry : networks_) networks.push_back(entry.second);
    for (const auto& network : networks) {
        if (network->state != Network::State::ready) continue;
        try {
            std::vector<std::string> aliases{proxy_alias};
            co_await docker_.connect_network(network->id, proxy_id_, std::move(aliases));
        } catch (const std::exception& e) {
            log::warning("joining the new egress proxy to network {}: {}", network->name, e.what());
        }
    }
    for (const auto& [sandbox_id, bound] : bound_secrets_) {
        if (const auto* address = reports_->ledgers.address_of(sandbox_id); address && !address->empty()) send_secrets(*address, bound, true);
    }
    log::debug("egress proxy {} ready", proxy_id_.substr(0, 12));
}

asio::awaitable<void> Egress::proxy_exited() {
    if (closed_ || proxy_state_ != State::ready) co_return;
    auto gone = std::exchange(proxy_id_, {});
    proxy_stdin_.reset();
    proxy_state_ = State::idle;
    try {
        co_await docker_.remove_container(gone);
    } catch (const std::exception& e) {
        log::debug("removing the exited egress proxy {}: {}", gone.substr(0, 12), e.what());
    }
    if (closed_) co_return;
    auto now = std::chrono::steady_clock::now();
    std::erase_if(proxy_restarts_, [&](auto at) { return now - at > proxy_restart_window; });
    if (proxy_restarts_.size() >= max_proxy_restarts) {
        log::error("the egress proxy {} exited, the {}th time within a minute: networked sandboxes have no network "
                   "until the next one is created", gone.substr(0, 12), proxy_restarts_.size() + 1);
        co_return;
    }
    proxy_restarts_.push_back(now);
    log::warning("the egress proxy {} exited; starting a new one", gone.substr(0, 12));
    try {
        co_await ensure_proxy();
        log::info("a new egress proxy serves the networked sandboxes");
    } catch (const std::exception& e) {
        log::error("{}", e.what());
    }
}

asio::awaitable<void> Egress::remove_proxy() {
    if (proxy_stdin_) proxy_stdin_->close();
    proxy_stdin_.reset();
    if (!proxy_id_.empty()) co_await docker_.remove_container(proxy_id_);
    proxy_id_.clear();
    proxy_state_ = State::idle;
}

void Egress::close() {
    closed_ = true;
    reports_->on_exit = nullptr;
}

asio::awaitable<void> Egress::teardown() {
    close();
    co_await wait_while_starting();  // a proxy being started (a replacement) is removed below, not left
    auto networks = std::move(networks_);
    networks_.clear();
    for (auto& [principal, network] : networks) wake(std::move(network->waiting));
    co_await remove_proxy();
    // Every network of this instance, those a creation cut short included, all at once
    // (shutdown has a deadline).
    auto of_this_instance = fmt::format("{}={}", label_instance, instance_);
    auto ours = co_await docker_.list_networks(std::move(of_this_instance));
    std::vector<asio::awaitable<void>> removals;
    for (const auto& network : ours) removals.push_back(remove_network(network.id));
    co_await all_at_once(executor_, std::move(removals));
}

} // namespace cubicle::sandbox
