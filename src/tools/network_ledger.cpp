#include "tools/network_ledger.hpp"

#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace cubicle::tools {

namespace asio = boost::asio;

namespace {

// Egress approvals: asks the user, through the client of the run in progress, whether
// the sandbox may reach host:port. Answers as Approver does.
asio::awaitable<std::string> ask_user(Context context, std::string sandbox_id, std::string host, int port, std::chrono::seconds timeout) {
    if (!context->can_elicit()) co_return "no unasked";
    bool v6 = host.find(':') != std::string::npos;
    auto target = fmt::format("{}{}{}:{}", v6 ? "[" : "", host, v6 ? "]" : "", port);
    json::Writer w;
    w.begin_object().field("mode", "form");
    w.field("message", fmt::format("A program in sandbox {} wants to connect to {}, which the server's egress allowlist does "
                                   "not admit. Allow it once (this connection), for this sandbox (until it stops), or not?",
                                   sandbox_id, target));
    w.key("requestedSchema").begin_object().field("type", "object").key("properties").begin_object();
    w.key("decision").begin_object().field("type", "string").field("title", fmt::format("Allow {}?", target));
    w.key("enum").begin_array().value("once").value("sandbox").value("no").end_array().end_object();
    w.end_object().key("required").begin_array().value("decision").end_array().end_object();
    w.end_object();
    auto params = w.take();  // named: no temporary inside the co_await (GCC 12, PITFALLS.md)
    auto answer = co_await context->elicit(std::move(params), timeout);
    if (!answer) co_return "no timeout";
    json::Document doc;
    std::string_view action, decision;
    if (doc.parse(*answer) || doc.root()["action"].get(action) != simdjson::SUCCESS || action != "accept" ||
        doc.root()["content"]["decision"].get(decision) != simdjson::SUCCESS || (decision != "once" && decision != "sandbox")) {
        co_return "no declined";
    }
    co_return std::string(decision);
}

} // namespace

// What a run of a networked sandbox reached (nullptr for another sandbox).
asio::awaitable<std::shared_ptr<sandbox::Ledger>> open_ledger(Env env, std::shared_ptr<sandbox::Sandbox> box, Context context) {
    if (!box->spec().network) co_return nullptr;
    sandbox::Approver approver;
    if (env.config.egress_asks()) {
        auto timeout = std::chrono::seconds(env.config.egress_approval_timeout_s);
        approver = [context, id = box->id(), timeout](std::string host, int port) { return ask_user(context, id, std::move(host), port, timeout); };
    }
    co_return co_await env.manager.egress().open_run(box->id(), box->container_id(), std::move(approver));
}

// `network` and, when the allowlist refused hosts, `network_refused`: which, and the flag.
void write_network(json::Writer& w, const sandbox::Ledger* ledger) {
    if (!ledger) return;
    w.key("network");
    sandbox::write_ledger(w, *ledger);
    auto refused = ledger->refused_by_allowlist();
    if (refused.empty()) return;
    std::string hosts, flags;
    for (const auto& host : refused) {
        hosts += (hosts.empty() ? "" : ", ") + host;
        flags += (flags.empty() ? "--egress-allow " : " --egress-allow ") + host;
    }
    w.field("network_refused", fmt::format("the server's egress allowlist refused {}; the operator can allow them with {}", hosts, flags));
}

} // namespace cubicle::tools
