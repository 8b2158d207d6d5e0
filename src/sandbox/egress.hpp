// Network egress for sandboxes that ask for it: each principal's networked
// sandboxes join an internal Docker network of that principal's (on stdio there
// is one principal, so one network), with no route out; the only way out of
// every one of them is one HTTP(S) proxy (the agent in proxy mode) in its own
// container, joined to each under the same name. Sandboxes of one principal
// reach each other; those of two principals do not. The proxy applies the
// operator's allowlist and never lets a sandbox reach private, link-local or
// loopback addresses, whatever the sandbox does.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "sandbox/agent_volume.hpp"
#include "sandbox/egress_ledger.hpp"
#include "sandbox/secret_tls.hpp"
#include "sandbox/secrets.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

// The tool error for a network the Engine would not create (`why`: its error); used-up
// address pools are named as such, with what to do.
std::string network_refused(std::string_view why);
// The tool error past --max-egress-networks (`most`).
std::string no_network_left(std::size_t most);

// How a run asks its user whether its sandbox may reach HOST:PORT that the allowlist
// refuses (egress approvals): "once", "sandbox", or "no REASON" (declined, timeout, unasked).
using Approver = std::function<asio::awaitable<std::string>(std::string host, int port)>;

class Egress {
public:
    Egress(asio::any_io_executor executor, docker::Client& docker, const Config& config, std::string instance, AgentVolume& agent_volume);

    // The name of the network a networked sandbox of `principal` joins: created, with
    // the proxy joined to it, for the principal's first; held until leave(). Calls of one
    // principal take turns, so two sandboxes created at once share one network and none
    // joins a network being removed. Throws ToolError when it cannot (--max-egress-networks
    // reached, the Engine's address pools used up).
    asio::awaitable<std::string> join(std::string principal);
    // A sandbox that joined is gone (its container removed): the principal's last one
    // takes the network with it. Never throws.
    asio::awaitable<void> leave(std::string principal);
    std::string proxy_url() const;

    // The ledger (egress_ledger.hpp). A run of a networked sandbox opens its ledger
    // before it starts (the first learns the sandbox's address from the Engine) and
    // closes it when it ends: closing waits, briefly, until the proxy has reported
    // every connection that closed before, and those still open so far.
    // With --egress-approval ask, `approver` answers for the sandbox while the run lasts.
    asio::awaitable<std::shared_ptr<Ledger>> open_run(std::string sandbox_id, std::string container_id, Approver approver = {});
    // Learns a new networked sandbox's address, so that its totals count from the start;
    // false (logged) when the Engine does not say. Never throws.
    asio::awaitable<bool> watch(std::string sandbox_id, std::string container_id);
    asio::awaitable<void> close_run(std::shared_ptr<Ledger> run);
    const Ledger* totals(const std::string& sandbox_id) const { return reports_->ledgers.totals(sandbox_id); }
    // The sandbox is gone: its address goes back to the pool.
    void forget(const std::string& sandbox_id) {
        unbind_secrets(sandbox_id);
        reports_->ledgers.forget(sandbox_id);
        askers_.erase(sandbox_id);
        approved_.erase(sandbox_id);
        declined_.erase(sandbox_id);
    }
    // Secrets (secrets.hpp): the operator's set, read at start; reload_secrets() re-reads
    // it (SIGHUP) and hands the proxy the new values of the secrets sandboxes hold.
    // `trust`: the certificates (PEM) the proxy verifies the secrets' hosts against.
    void set_secrets(Secrets secrets, std::vector<std::string> trust) {
        secrets_ = std::move(secrets);
        upstream_trust_ = std::move(trust);
    }
    void reload_secrets();
    const Secrets& secrets() const { return secrets_; }
    // Gives the proxy the values of a watched sandbox's secrets, as NAME -> placeholder,
    // and a new CA of the sandbox's (secret_tls.hpp); returns the CA's certificate for the
    // sandbox, or nullopt (logged) when the sandbox has no known address.
    // The principal (and any_principal, stdio) is checked again at each reload_secrets().
    std::optional<std::string> bind_secrets(const std::string& sandbox_id, std::vector<std::pair<std::string, std::string>> placeholders,
                                            std::string principal, bool any_principal);
    // Takes them back from the proxy: before the container goes, so that its address,
    // free again, never carries them for the next sandbox to get it.
    void unbind_secrets(const std::string& sandbox_id);
    // The server is stopping: no more joins, and a proxy that goes from now on (the exit's
    // sweep removes it) is not replaced. Called before anything is removed.
    void close();
    // Removes the proxy and every network of this instance (the sandboxes on them must be gone).
    asio::awaitable<void> teardown();

private:
    // What the proxy's reports feed; shared with the coroutine that reads them.
    struct Reports {
        explicit Reports(std::string approved_by) : ledgers(std::move(approved_by)) {}
        EgressLedgers ledgers;
        std::uint64_t sent = 0, answered = 0;  // sync ids
        std::vector<std::shared_ptr<asio::steady_timer>> waiting;  // close_run()s
        std::function<void(ProxyReport)> on_ask;
        std::function<void(const docker::RawStream*)> on_exit;  // the proxy's stream ended
        void line(std::string_view text);
    };
    // The proxy asks about a connection: the answer goes back on its stdin.
    asio::awaitable<void> answer(ProxyReport ask);
    asio::awaitable<std::string> decide(ProxyReport ask);
    struct Asker {
        std::weak_ptr<Ledger> run;  // asks while this run is open
        Approver approve;
    };
    // Sends the proxy a sandbox's secrets (all it holds, replacing what it had).
    struct Bound {
        std::vector<std::pair<std::string, std::string>> placeholders;  // NAME -> placeholder
        SandboxCa ca;
        std::string principal;  // who holds them: a re-read file may no longer list it
        bool any_principal = false;
    };
    // first: the sandbox's CA too, after forgetting all the address had; else (a re-read
    // file) each secret replaces its old value by name and `dropped` names are forgotten.
    void send_secrets(const std::string& address, const Bound& bound, bool first, const std::vector<std::string>& dropped = {});
    Secrets secrets_;
    std::vector<std::string> upstream_trust_;
    std::map<std::string, Bound> bound_secrets_;  // by sandbox id
    std::map<std::string, std::vector<Asker>> askers_;         // by sandbox id
    std::map<std::string, std::set<std::string>> approved_;    // by sandbox id: HOST:PORT the user allowed for it
    std::map<std::string, std::set<std::string>> declined_;    // ... and refused: not asked again
    // A question under way, by sandbox id and HOST:PORT: connections to the same place
    // meanwhile wait for its answer instead of asking again.
    struct Question {
        explicit Question(asio::any_io_executor executor) : answered(std::move(executor)) {}
        asio::steady_timer answered;
        std::string verdict = "no unasked";
    };
    std::map<std::string, std::shared_ptr<Question>> questions_;
    static asio::awaitable<void> read_reports(std::shared_ptr<docker::RawStream> stream, std::shared_ptr<Reports> reports);

    struct Network {
        enum class State { creating, ready, removing } state = State::creating;
        std::string name;
        std::string id;
        std::size_t members = 0;  // sandboxes on it, and those being created for it
        std::vector<std::shared_ptr<asio::steady_timer>> waiting;  // joins until it is ready or gone
    };

    // Starts the proxy on first use; later calls wait for that.
    asio::awaitable<void> ensure_proxy();
    // Returns once no proxy is being started.
    asio::awaitable<void> wait_while_starting();
    asio::awaitable<void> start_proxy();
    asio::awaitable<void> remove_proxy();
    // The proxy exited by itself (killed, out of memory): a new one takes its place, on
    // every network and with every sandbox's secrets (a few times a minute at most).
    asio::awaitable<void> proxy_exited();
    std::vector<std::chrono::steady_clock::time_point> proxy_restarts_;
    // Disconnects the proxy and removes the network; a failure is logged (teardown retries).
    asio::awaitable<void> remove_network(std::string id);
    // Wakes those waiting: they look again.
    static void wake(std::vector<std::shared_ptr<asio::steady_timer>> waiting);

    asio::any_io_executor executor_;
    docker::Client& docker_;
    const Config& config_;
    std::string instance_;
    AgentVolume& agent_volume_;
    std::string proxy_id_;
    std::shared_ptr<docker::RawStream> proxy_stdin_;  // held open: closing it stops the proxy
    std::shared_ptr<Reports> reports_;
    enum class State { idle, starting, ready } proxy_state_ = State::idle;
    std::vector<std::shared_ptr<asio::steady_timer>> waiting_for_proxy_;
    std::string proxy_failure_;
    std::map<std::string, std::shared_ptr<Network>> networks_;  // by principal
    bool closed_ = false;  // torn down: no more joins
};

} // namespace cubicle::sandbox
