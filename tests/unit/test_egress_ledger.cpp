// The network ledger: the proxy's report lines, and how they add up per sandbox and per run.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "sandbox/egress_ledger.hpp"

using namespace cubicle::sandbox;

namespace {

ProxyReport connection(std::string client, std::string host, int port, bool allowed, std::uint64_t out, std::uint64_t in,
                       std::uint64_t requests = 1) {
    ProxyReport r;
    r.client = std::move(client);
    r.host = std::move(host);
    r.port = port;
    r.allowed = allowed;
    r.bytes_out = out;
    r.bytes_in = in;
    r.requests = requests;
    if (!allowed) r.refused = "not in the allow list";
    return r;
}

} // namespace

TEST(EgressLedger, ParsesTheProxysLines) {
    auto c = parse_proxy_report(R"({"event":"connection","client":"172.20.0.3","host":"pypi.org","port":443,"allowed":true,)"
                                R"("approved":"sandbox","requests":1,"bytes_out":517,"bytes_in":4096})");
    ASSERT_TRUE(c);
    EXPECT_EQ(c->kind, ProxyReport::Kind::connection);
    EXPECT_EQ(c->client, "172.20.0.3");
    EXPECT_EQ(c->host, "pypi.org");
    EXPECT_EQ(c->port, 443);
    EXPECT_TRUE(c->allowed);
    EXPECT_EQ(c->approved, "sandbox");
    EXPECT_EQ(c->bytes_out, 517u);
    EXPECT_EQ(c->bytes_in, 4096u);
    auto s = parse_proxy_report(R"({"event":"sync","id":42})");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->kind, ProxyReport::Kind::sync);
    EXPECT_EQ(s->id, 42u);
    auto a = parse_proxy_report(R"({"event":"ask","id":7,"client":"172.20.0.3","host":"example.com","port":80})");
    ASSERT_TRUE(a);
    EXPECT_EQ(a->kind, ProxyReport::Kind::ask);
    EXPECT_EQ(a->id, 7u);
}

TEST(EgressLedger, RefusesLinesThatAreNotReports) {
    for (const char* line : {"", "cubicle-proxy: listening", R"({"event":"connection"})", R"({"event":"nonsense","id":1})",
                             R"({"event":"connection","client":"a","host":"h","port":0,"allowed":true,"requests":1,"bytes_out":0,"bytes_in":0})",
                             R"({"event":"connection","client":"a","host":"h","port":80,"allowed":true,"approved":"forever","requests":1,"bytes_out":0,"bytes_in":0})",
                             R"({"event":"connection","client":"a","host":"h","port":80,"allowed":"yes","requests":1,"bytes_out":0,"bytes_in":0})"}) {
        EXPECT_FALSE(parse_proxy_report(line)) << line;
    }
}

TEST(EgressLedger, AddsUpBySandboxAndByOpenRun) {
    EgressLedgers ledgers("allowlist");
    ledgers.watch("172.20.0.3", "sb-a");
    ledgers.watch("172.20.0.4", "sb-b");
    ledgers.add(connection("172.20.0.3", "pypi.org", 443, true, 100, 1000));  // before any run: totals only
    auto run = ledgers.open_run("sb-a");
    ledgers.add(connection("172.20.0.3", "pypi.org", 443, true, 10, 20));
    ledgers.add(connection("172.20.0.3", "pypi.org", 443, true, 5, 5, 0));  // a later delta of the same connection
    ledgers.add(connection("172.20.0.3", "evil.example", 80, false, 0, 0));
    ledgers.add(connection("172.20.0.4", "pypi.org", 443, true, 7, 7));      // another sandbox's
    ledgers.add(connection("172.20.0.9", "pypi.org", 443, true, 7, 7));      // nobody's
    ASSERT_EQ(run->entries().size(), 2u);
    EXPECT_EQ(run->entries()[0].requests, 1u);
    EXPECT_EQ(run->entries()[0].bytes_out, 15u);
    EXPECT_EQ(run->entries()[0].approved_by, "allowlist");
    EXPECT_FALSE(run->entries()[1].allowed);
    EXPECT_EQ(run->refused_by_allowlist(), std::vector<std::string>{"evil.example:80"});
    const auto* totals = ledgers.totals("sb-a");
    ASSERT_TRUE(totals);
    EXPECT_EQ(totals->entries()[0].requests, 2u);
    EXPECT_EQ(totals->entries()[0].bytes_in, 1025u);
    run.reset();  // the run ended: no more for it, the totals go on
    ledgers.add(connection("172.20.0.3", "pypi.org", 443, true, 1, 1));
    EXPECT_EQ(ledgers.totals("sb-a")->entries()[0].requests, 3u);
}

TEST(EgressLedger, AnAddressGoesWithItsSandbox) {
    EgressLedgers ledgers("open");
    ledgers.watch("172.20.0.3", "sb-a");
    ledgers.forget("sb-a");
    EXPECT_FALSE(ledgers.sandbox_at("172.20.0.3"));
    EXPECT_FALSE(ledgers.totals("sb-a"));
    ledgers.watch("172.20.0.3", "sb-b");  // Docker gave the address to a new sandbox
    ledgers.add(connection("172.20.0.3", "pypi.org", 443, true, 1, 1));
    ASSERT_TRUE(ledgers.sandbox_at("172.20.0.3"));
    EXPECT_EQ(*ledgers.sandbox_at("172.20.0.3"), "sb-b");
    EXPECT_EQ(ledgers.totals("sb-b")->entries()[0].approved_by, "open");
}

TEST(EgressLedger, UserApprovalsAreNamed) {
    Ledger ledger;
    auto r = connection("172.20.0.3", "example.com", 443, true, 1, 1);
    r.approved = "once";
    ledger.add(r, "allowlist");
    EXPECT_EQ(ledger.entries()[0].approved_by, "user-once");
}

TEST(EgressLedger, ManyHostsAreSummedPastTheCap) {
    // A program trying thousands of hosts grows neither the ledger nor its results.
    Ledger ledger;
    for (int i = 0; i < 1000; ++i) ledger.add(connection("172.20.0.3", fmt::format("h{}.example", i), 443, false, 10, 0), "allowlist");
    ledger.add(connection("172.20.0.3", "h0.example", 443, false, 5, 0), "allowlist");  // a known one still adds up
    const auto& entries = ledger.entries();
    ASSERT_EQ(entries.size(), Ledger::max_entries + 1);
    EXPECT_EQ(entries.front().host, "h0.example");
    EXPECT_EQ(entries.front().bytes_out, 15u);
    EXPECT_EQ(entries.back().host, "(other hosts)");
    EXPECT_EQ(entries.back().port, 0);
    EXPECT_EQ(entries.back().requests, 1000u - Ledger::max_entries);
    EXPECT_EQ(ledger.refused_by_allowlist().size(), Ledger::max_entries) << "the summed entry names no host";
}

TEST(EgressLedger, SecretsAreNamedNeverValued) {
    auto c = parse_proxy_report(R"({"event":"connection","client":"172.20.0.3","host":"api.example","port":443,"allowed":true,)"
                                R"("secret":["OPENAI","Q"],"requests":1,"bytes_out":5,"bytes_in":6})");
    ASSERT_TRUE(c);
    EXPECT_EQ(c->secrets, (std::vector<std::string>{"OPENAI", "Q"}));
    auto p = parse_proxy_report(R"({"event":"connection","client":"172.20.0.3","host":"other","port":80,"allowed":true,)"
                                R"("placeholder":["OPENAI"],"requests":1,"bytes_out":5,"bytes_in":6})");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->placeholders, std::vector<std::string>{"OPENAI"});
    EXPECT_FALSE(parse_proxy_report(R"({"event":"connection","client":"a","host":"h","port":80,"allowed":true,"secret":"OPENAI",)"
                                    R"("requests":1,"bytes_out":0,"bytes_in":0})"));
    // A connection's names are told once (its first record) and kept, each name once.
    Ledger ledger;
    ledger.add(*c, "allowlist");
    auto again = connection("172.20.0.3", "api.example", 443, true, 1, 1, 0);
    ledger.add(again, "allowlist");
    ledger.add(*c, "allowlist");
    ASSERT_EQ(ledger.entries().size(), 1u);
    EXPECT_EQ(ledger.entries()[0].secret, (std::vector<std::string>{"OPENAI", "Q"}));
    cubicle::json::Writer w;
    write_ledger(w, ledger);
    auto text = w.take();
    EXPECT_NE(text.find(R"("secret":["OPENAI","Q"])"), std::string::npos) << text;
    EXPECT_EQ(text.find("placeholder"), std::string::npos) << text;
}
