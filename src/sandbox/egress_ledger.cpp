#include "sandbox/egress_ledger.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace cubicle::sandbox {
namespace {

// The proxy's strings are short; anything longer is not a record of ours.
constexpr std::size_t max_text = 300;

bool read_text(simdjson::dom::element object, const char* key, std::string& out) {
    std::string_view text;
    if (object[key].get(text) != simdjson::SUCCESS || text.size() > max_text) return false;
    out = std::string(text);
    return true;
}

bool read_count(simdjson::dom::element object, const char* key, std::uint64_t& out) {
    return object[key].get(out) == simdjson::SUCCESS;
}

} // namespace

std::optional<ProxyReport> parse_proxy_report(std::string_view line) {
    json::Document doc;
    if (doc.parse(line)) return std::nullopt;
    auto root = doc.root();
    std::string_view event;
    if (root["event"].get(event) != simdjson::SUCCESS) return std::nullopt;
    ProxyReport report;
    if (event == "sync" || event == "dropped") {
        report.kind = event == "sync" ? ProxyReport::Kind::sync : ProxyReport::Kind::dropped;
        if (!read_count(root, event == "sync" ? "id" : "records", report.id)) return std::nullopt;
        return report;
    }
    std::uint64_t port = 0;
    if (event == "ask") {
        report.kind = ProxyReport::Kind::ask;
        if (!read_count(root, "id", report.id) || !read_text(root, "client", report.client) || !read_text(root, "host", report.host) ||
            !read_count(root, "port", port) || port == 0 || port > 65535) {
            return std::nullopt;
        }
        report.port = static_cast<int>(port);
        return report;
    }
    if (event != "connection" || !read_text(root, "client", report.client) || !read_text(root, "host", report.host) ||
        !read_count(root, "port", port) || port == 0 || port > 65535 || root["allowed"].get(report.allowed) != simdjson::SUCCESS ||
        !read_count(root, "requests", report.requests) || !read_count(root, "bytes_out", report.bytes_out) ||
        !read_count(root, "bytes_in", report.bytes_in)) {
        return std::nullopt;
    }
    report.port = static_cast<int>(port);
    if (root["refused"].error() != simdjson::NO_SUCH_FIELD && !read_text(root, "refused", report.refused)) return std::nullopt;
    if (root["error"].error() != simdjson::NO_SUCH_FIELD && !read_text(root, "error", report.error)) return std::nullopt;
    if (root["approved"].error() != simdjson::NO_SUCH_FIELD &&
        (!read_text(root, "approved", report.approved) || (report.approved != "once" && report.approved != "sandbox"))) {
        return std::nullopt;
    }
    for (auto [key, names] : {std::pair{"secret", &report.secrets}, std::pair{"placeholder", &report.placeholders}}) {
        simdjson::dom::array list;
        auto field = root[key];
        if (field.error() == simdjson::NO_SUCH_FIELD) continue;
        if (field.get(list) != simdjson::SUCCESS) return std::nullopt;
        for (auto item : list) {
            std::string_view name;
            if (item.get(name) != simdjson::SUCCESS || name.empty() || name.size() > 64) return std::nullopt;
            names->emplace_back(name);
        }
    }
    return report;
}

namespace {
void add_names(std::vector<std::string>& to, const std::vector<std::string>& names) {
    for (const auto& name : names) {
        if (std::find(to.begin(), to.end(), name) == to.end()) to.push_back(name);
    }
}
} // namespace

void Ledger::add(const ProxyReport& report, std::string_view approved_by) {
    std::tuple<std::string, int, bool> key{report.host, report.port, report.allowed};
    if (!index_.count(key) && index_.size() >= max_entries) key = {"(other hosts)", 0, report.allowed};
    auto [found, fresh] = index_.try_emplace(key, entries_.size());
    if (fresh) {
        LedgerEntry entry;
        entry.host = std::get<0>(key);
        entry.port = std::get<1>(key);
        entry.allowed = report.allowed;
        entries_.push_back(std::move(entry));
    }
    auto it = entries_.begin() + static_cast<std::ptrdiff_t>(found->second);
    if (report.allowed) it->approved_by = report.approved.empty() ? std::string(approved_by) : "user-" + report.approved;
    if (!report.refused.empty()) it->refused = report.refused;
    if (!report.error.empty()) it->error = report.error;
    add_names(it->secret, report.secrets);
    add_names(it->placeholder, report.placeholders);
    it->requests += report.requests;
    it->bytes_out += report.bytes_out;
    it->bytes_in += report.bytes_in;
}

std::vector<std::string> Ledger::refused_by_allowlist() const {
    std::vector<std::string> hosts;
    for (const auto& e : entries_) {
        if (e.allowed || e.port == 0 || !e.refused.starts_with("not in the allow list")) continue;
        bool v6 = e.host.find(':') != std::string::npos;
        hosts.push_back(fmt::format("{}{}{}:{}", v6 ? "[" : "", e.host, v6 ? "]" : "", e.port));
    }
    return hosts;
}

void write_ledger(json::Writer& w, const Ledger& ledger) {
    w.begin_array();
    for (const auto& e : ledger.entries()) {
        w.begin_object().field("host", e.host).field("port", e.port).field("allowed", e.allowed);
        w.key("approved_by");
        if (e.allowed) w.value(e.approved_by);
        else w.null();
        w.field("requests", e.requests).field("bytes_out", e.bytes_out).field("bytes_in", e.bytes_in);
        if (!e.refused.empty()) w.field("refused", e.refused);
        if (!e.error.empty()) w.field("error", e.error);
        for (auto [key, names] : {std::pair{"secret", &e.secret}, std::pair{"placeholder", &e.placeholder}}) {
            if (names->empty()) continue;
            w.key(key).begin_array();
            for (const auto& name : *names) w.value(name);
            w.end_array();
        }
        w.end_object();
    }
    w.end_array();
}

void EgressLedgers::watch(const std::string& address, const std::string& sandbox_id) {
    auto& watched = sandboxes_[sandbox_id];
    if (!watched.address.empty()) by_address_.erase(watched.address);
    watched.address = address;
    // An address of a sandbox gone before this one had it: the newer holds it.
    if (auto it = by_address_.find(address); it != by_address_.end() && it->second != sandbox_id) {
        if (auto old = sandboxes_.find(it->second); old != sandboxes_.end()) old->second.address.clear();
    }
    by_address_[address] = sandbox_id;
}

void EgressLedgers::forget(const std::string& sandbox_id) {
    auto it = sandboxes_.find(sandbox_id);
    if (it == sandboxes_.end()) return;
    if (auto found = by_address_.find(it->second.address); found != by_address_.end() && found->second == sandbox_id) by_address_.erase(found);
    sandboxes_.erase(it);
}

std::shared_ptr<Ledger> EgressLedgers::open_run(const std::string& sandbox_id) {
    auto run = std::make_shared<Ledger>();
    auto& runs = sandboxes_[sandbox_id].runs;
    std::erase_if(runs, [](const std::weak_ptr<Ledger>& r) { return r.expired(); });
    runs.push_back(run);
    return run;
}

void EgressLedgers::add(const ProxyReport& report) {
    auto owner = by_address_.find(report.client);
    if (owner == by_address_.end()) return;  // a sandbox already gone, or not one we watch
    auto& watched = sandboxes_[owner->second];
    watched.totals.add(report, approved_by_);
    for (const auto& weak : watched.runs) {
        if (auto run = weak.lock()) run->add(report, approved_by_);
    }
}

const std::string* EgressLedgers::sandbox_at(const std::string& address) const {
    auto it = by_address_.find(address);
    return it == by_address_.end() ? nullptr : &it->second;
}

const Ledger* EgressLedgers::totals(const std::string& sandbox_id) const {
    auto it = sandboxes_.find(sandbox_id);
    return it == sandboxes_.end() ? nullptr : &it->second.totals;
}

} // namespace cubicle::sandbox
