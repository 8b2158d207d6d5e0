// The ledger of what networked sandboxes reached: the egress proxy reports each
// connection (host, port, allowed or refused, requests, bytes each way; never what
// was sent) with the client's address; this room maps the address to the sandbox
// and adds the record to the sandbox's totals and to the runs it has open.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/json.hpp"

namespace cubicle::sandbox {

// One line of the proxy's stdout (src/agent/proxy_report.h).
struct ProxyReport {
    enum class Kind { connection, sync, dropped, ask } kind = Kind::connection;
    std::string client, host;
    int port = 0;
    bool allowed = false;
    std::string refused, error;
    std::string approved;  // how the user allowed it: once, sandbox (empty: a rule did)
    std::uint64_t requests = 0, bytes_out = 0, bytes_in = 0;
    std::vector<std::string> secrets;       // names of the secrets the proxy put into it
    std::vector<std::string> placeholders;  // names whose placeholder went to this host unchanged (not theirs)
    std::uint64_t id = 0;  // sync and ask: its id; dropped: how many records
};

// nullopt for a line that is not a report (logged and skipped by the caller).
std::optional<ProxyReport> parse_proxy_report(std::string_view line);

struct LedgerEntry {
    std::string host;
    int port = 0;
    bool allowed = false;
    // allowed: "allowlist", "open" (there is no allowlist), "user-once" or "user-sandbox"
    std::string approved_by;
    std::string refused;      // refused: why (the latest)
    std::string error;        // allowed but the connection failed: why (the latest)
    std::uint64_t requests = 0, bytes_out = 0, bytes_in = 0;
    std::vector<std::string> secret;       // secrets put into its requests (names, never values)
    std::vector<std::string> placeholder;  // secrets whose placeholder went here unchanged: not their host
};

// Entries by host, port and outcome, in the order first seen. At most max_entries
// distinct ones: a program trying thousands of hosts must not grow the server's memory
// or its results; the rest are summed in one entry of host "(other hosts)", port 0.
class Ledger {
public:
    static constexpr std::size_t max_entries = 256;
    void add(const ProxyReport& report, std::string_view approved_by);
    const std::vector<LedgerEntry>& entries() const { return entries_; }
    // The hosts the allowlist refused (and no user allowed), as HOST:PORT.
    std::vector<std::string> refused_by_allowlist() const;

private:
    std::vector<LedgerEntry> entries_;
    std::map<std::tuple<std::string, int, bool>, std::size_t> index_;  // into entries_
};

// `network: [...]` as tool results and get_sandbox_status show it.
void write_ledger(json::Writer& w, const Ledger& ledger);

class EgressLedgers {
public:
    explicit EgressLedgers(std::string approved_by) : approved_by_(std::move(approved_by)) {}

    bool watched(const std::string& sandbox_id) const { return sandboxes_.contains(sandbox_id); }
    // Records from `address` are the sandbox's from now on.
    void watch(const std::string& address, const std::string& sandbox_id);
    // The sandbox is gone: its address may go to another.
    void forget(const std::string& sandbox_id);
    // A run of the sandbox starts: it collects what arrives until it is dropped.
    std::shared_ptr<Ledger> open_run(const std::string& sandbox_id);
    void add(const ProxyReport& report);
    // The sandbox a client address is (nullptr: none watched).
    const std::string* sandbox_at(const std::string& address) const;
    // The address of a watched sandbox (nullptr: none).
    const std::string* address_of(const std::string& sandbox_id) const {
        auto it = sandboxes_.find(sandbox_id);
        return it == sandboxes_.end() ? nullptr : &it->second.address;
    }
    // The sandbox's totals since it was first watched (nullptr: none).
    const Ledger* totals(const std::string& sandbox_id) const;

private:
    struct Watched {
        std::string address;
        Ledger totals;
        std::vector<std::weak_ptr<Ledger>> runs;
    };
    std::string approved_by_;
    std::map<std::string, std::string> by_address_;  // client address -> sandbox id
    std::map<std::string, Watched> sandboxes_;
};

} // namespace cubicle::sandbox
