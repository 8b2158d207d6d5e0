// The MCP session: lifecycle, dispatch, errors, tool calls, progress,
// cancellation and concurrency, driven through handle_message with fake tools.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <simdjson.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "mcp/session.hpp"
#include "mcp/tool.hpp"

namespace cubicle::mcp {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// ---------------------------------------------------------------- fake tools

struct ToolLog {
    int wait_started = 0;
    int wait_saw_cancel = 0;
    int wait_finished = 0;
    std::string last_arguments;
};
ToolLog tool_log;

asio::awaitable<ToolResult> echo_tool(simdjson::dom::element arguments, std::shared_ptr<RequestContext> context) {
    tool_log.last_arguments = json::to_string(arguments);
    json::Writer w;
    w.begin_object().key("echo").raw(json::to_string(arguments)).field("note", "line1\nline2").end_object();
    ToolResult result{.structured = w.take()};
    co_return result;
}

asio::awaitable<ToolResult> tool_error_tool(simdjson::dom::element, std::shared_ptr<RequestContext>) {
    throw ToolError("sandbox_id 'nope' is unknown; known: none");
    co_return ToolResult{};
}

asio::awaitable<ToolResult> crash_tool(simdjson::dom::element, std::shared_ptr<RequestContext>) {
    throw std::runtime_error("boom in the handler");
    co_return ToolResult{};
}

// Sends progress, then waits `ms` (default 10 s) unless cancelled.
asio::awaitable<ToolResult> wait_tool(simdjson::dom::element arguments, std::shared_ptr<RequestContext> context) {
    ++tool_log.wait_started;
    auto executor = co_await asio::this_coro::executor;
    std::int64_t ms = 10000;
    if (arguments["ms"].get(ms) != simdjson::SUCCESS) ms = 10000;
    auto timer = std::make_shared<asio::steady_timer>(executor);
    timer->expires_after(std::chrono::milliseconds(ms));
    std::weak_ptr<asio::steady_timer> weak = timer;
    auto on_cancel = [weak] {
        if (auto t = weak.lock()) t->cancel();
    };
    context->cancellation()->on_cancel(on_cancel);
    context->progress(1, "started");
    if (!context->cancelled()) {
        auto token = asio::as_tuple(asio::use_awaitable);
        auto waited = co_await timer->async_wait(token);
        (void)waited;
    }
    if (context->cancelled()) {
        ++tool_log.wait_saw_cancel;
        ToolResult cancelled{.text = "cancelled", .is_error = true};
        co_return cancelled;
    }
    context->progress(2, "done");
    ++tool_log.wait_finished;
    ToolResult result{.structured = R"({"waited":true})"};
    co_return result;
}

// Asks the client (elicitation/create), waiting `ms` (default 2 s) for the answer.
asio::awaitable<ToolResult> ask_tool(simdjson::dom::element arguments, std::shared_ptr<RequestContext> context) {
    std::int64_t ms = 2000;
    if (arguments["ms"].get(ms) != simdjson::SUCCESS) ms = 2000;
    json::Writer w;
    w.begin_object();
    if (!context->can_elicit()) {
        w.field("asked", false);
    } else {
        std::string params = R"({"mode":"form","message":"Allow?","requestedSchema":{"type":"object","properties":{}}})";
        auto answer = co_await context->elicit(std::move(params), std::chrono::milliseconds(ms));
        w.field("asked", true).key("answer");
        if (answer) w.raw(*answer);
        else w.null();
    }
    w.end_object();
    ToolResult result{.structured = w.take()};
    co_return result;
}

// Written readably, with newlines, as the real tools are.
const char* const pretty_input_schema = R"({
    "type": "object",
    "properties": {
        "ms": {"type": "integer"}
    },
    "additionalProperties": false
})";
const char* const pretty_output_schema = R"({
    "type": "object",
    "properties": {"waited": {"type": "boolean"}},
    "required": ["waited"]
})";

std::vector<Tool> fake_tools() {
    std::vector<Tool> tools;
    tools.push_back(Tool{.name = "echo", .title = "Echo", .description = "Echoes its arguments",
                         .input_schema = R"({"type":"object","properties":{},"additionalProperties":true})",
                         .output_schema = R"({"type":"object","properties":{"echo":{"type":"object","properties":{}}}})",
                         .read_only = true, .idempotent = true, .handler = echo_tool});
    tools.push_back(Tool{.name = "fail", .title = "Fail", .description = "Always a tool error",
                         .input_schema = R"({"type":"object","properties":{}})",
                         .output_schema = R"({"type":"object","properties":{}})", .handler = tool_error_tool});
    tools.push_back(Tool{.name = "crash", .title = "Crash", .description = "Always throws",
                         .input_schema = R"({"type":"object","properties":{}})",
                         .output_schema = R"({"type":"object","properties":{}})", .destructive = true,
                         .open_world = true, .handler = crash_tool});
    tools.push_back(Tool{.name = "wait", .title = "Wait", .description = "Waits until cancelled",
                         .input_schema = pretty_input_schema, .output_schema = pretty_output_schema,
                         .handler = wait_tool, .task_support = true});
    return tools;
}

// The fake tools and one that asks the client.
std::vector<Tool> tools_with_ask() {
    auto tools = fake_tools();
    tools.push_back(Tool{.name = "ask", .title = "Ask", .description = "Asks the user",
                         .input_schema = R"({"type":"object","properties":{}})",
                         .output_schema = R"({"type":"object","properties":{}})", .handler = ask_tool});
    return tools;
}

// ---------------------------------------------------------------- harness

struct Message {
    std::string text;
    std::unique_ptr<json::Document> doc;
    simdjson::dom::element root() const { return doc->root(); }
    std::string id() const {
        simdjson::dom::element id;
        if (root()["id"].get(id) != simdjson::SUCCESS) return {};
        return json::to_string(id);
    }
    bool is_response() const { return !root()["result"].error() || !root()["error"].error(); }
    std::string method() const {
        std::string_view m;
        if (root()["method"].get(m) != simdjson::SUCCESS) return {};
        return std::string(m);
    }
    std::int64_t error_code() const {
        std::int64_t code = 0;
        if (root()["error"]["code"].get(code) != simdjson::SUCCESS) return 0;
        return code;
    }
    std::string error_message() const {
        std::string_view m;
        if (root()["error"]["message"].get(m) != simdjson::SUCCESS) return {};
        return std::string(m);
    }
    simdjson::dom::element result() const {
        simdjson::dom::element r;
        EXPECT_EQ(root()["result"].get(r), simdjson::SUCCESS) << text;
        return r;
    }
};

class SessionTest : public ::testing::Test {
protected:
    void SetUp() override {
        tool_log = {};
        session_ = std::make_unique<Session>(io_.get_executor(), ServerInfo{"cubicle-test", "9.8.7", "Use the tools."},
                                             fake_tools(), [this](std::string m) { raw_.push_back(std::move(m)); });
    }
    void TearDown() override {
        // Let anything still running see its cancellation before the session goes.
        if (session_ && session_->in_flight() > 0) {
            auto shutdown = session_->shutdown();
            asio::co_spawn(io_, std::move(shutdown), asio::detached);
            run_until([this] { return session_->in_flight() == 0; }, 6s);
        }
        drain();
        session_.reset();
        // Every message ever sent is one line of valid, compact JSON.
        for (const auto& m : raw_) {
            EXPECT_EQ(m.find('\n'), std::string::npos) << m;
            EXPECT_EQ(m.find('\r'), std::string::npos) << m;
            json::Document doc;
            EXPECT_FALSE(doc.parse(m)) << m;
        }
    }

    void send(std::string line) { session_->handle_message(std::move(line)); }

    // Runs ready handlers (not timers in the future).
    void drain() {
        for (int i = 0; i < 100; ++i) {
            io_.restart();
            if (io_.poll() == 0) break;
        }
    }

    bool run_until(const std::function<bool()>& done, std::chrono::milliseconds timeout = 5s) {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!done()) {
            if (std::chrono::steady_clock::now() > deadline) return false;
            io_.restart();
            if (io_.run_one_for(10ms) == 0) std::this_thread::sleep_for(1ms);
        }
        return true;
    }

    // All messages sent so far, parsed.
    const std::deque<Message>& messages() {
        while (parsed_.size() < raw_.size()) {
            Message m;
            m.text = raw_[parsed_.size()];
            m.doc = std::make_unique<json::Document>();
            auto error = m.doc->parse(m.text);
            EXPECT_FALSE(error) << *error << ": " << m.text;
            parsed_.push_back(std::move(m));
        }
        return parsed_;
    }

    const Message* response(const std::string& id_json) {
        for (const auto& m : messages()) {
            if (m.is_response() && m.id() == id_json) return &m;
        }
        return nullptr;
    }

    std::size_t index_of(const Message* message) {
        for (std::size_t i = 0; i < messages().size(); ++i) {
            if (&messages()[i] == message) return i;
        }
        return messages().size();
    }

    std::size_t count_responses(const std::string& id_json) {
        std::size_t n = 0;
        for (const auto& m : messages()) n += m.is_response() && m.id() == id_json;
        return n;
    }

    std::vector<const Message*> notifications(std::string_view method) {
        std::vector<const Message*> out;
        for (const auto& m : messages()) {
            if (m.method() == method) out.push_back(&m);
        }
        return out;
    }

    // Sends a request and runs until its response arrives.
    const Message& call(const std::string& id_json, const std::string& method, const std::string& params = "") {
        std::string line = R"({"jsonrpc":"2.0","id":)" + id_json + R"(,"method":")" + method + "\"";
        if (!params.empty()) line += ",\"params\":" + params;
        line += "}";
        send(line);
        EXPECT_TRUE(run_until([&] { return response(id_json) != nullptr; })) << "no response to " << line;
        static Message none = [] {
            Message m;
            m.text = "{}";
            m.doc = std::make_unique<json::Document>();
            (void)m.doc->parse("{}");
            return m;
        }();
        const Message* r = response(id_json);
        return r ? *r : none;
    }

    const Message& call_tool(const std::string& id_json, const std::string& name, const std::string& arguments = "",
                             const std::string& meta = "") {
        std::string params = R"({"name":")" + name + "\"";
        if (!arguments.empty()) params += ",\"arguments\":" + arguments;
        if (!meta.empty()) params += ",\"_meta\":" + meta;
        params += "}";
        return call(id_json, "tools/call", params);
    }

    void expect_error(const Message& m, const std::string& id_json, int code) {
        EXPECT_EQ(m.id(), id_json) << m.text;
        EXPECT_EQ(m.error_code(), code) << m.text;
        EXPECT_FALSE(m.error_message().empty()) << m.text;
        EXPECT_TRUE(m.root()["result"].error()) << m.text;
        std::string_view version;
        EXPECT_EQ(m.root()["jsonrpc"].get(version), simdjson::SUCCESS);
        EXPECT_EQ(version, "2.0");
    }

    asio::io_context io_;
    std::vector<std::string> raw_;
    std::deque<Message> parsed_;  // references stay valid as it grows
    std::unique_ptr<Session> session_;
};

std::string str(simdjson::simdjson_result<simdjson::dom::element> e) {
    std::string_view s;
    EXPECT_EQ(e.get(s), simdjson::SUCCESS);
    return std::string(s);
}

bool boolean(simdjson::simdjson_result<simdjson::dom::element> e) {
    bool b = false;
    EXPECT_EQ(e.get(b), simdjson::SUCCESS);
    return b;
}

// ---------------------------------------------------------------- lifecycle

TEST_F(SessionTest, InitializeEchoesEachSupportedVersion) {
    int id = 1;
    for (std::string version : {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"}) {
        std::string id_json = std::to_string(id++);
        const auto& m = call(id_json, "initialize",
                             R"({"protocolVersion":")" + version +
                                 R"(","capabilities":{},"clientInfo":{"name":"t","version":"1"}})");
        EXPECT_EQ(str(m.result()["protocolVersion"]), version) << m.text;
    }
}

TEST_F(SessionTest, InitializeAnswersUnknownVersionWithNewest) {
    const auto& m = call("1", "initialize", R"({"protocolVersion":"1999-01-01","capabilities":{}})");
    EXPECT_EQ(str(m.result()["protocolVersion"]), "2025-11-25");
    // The stateless revision is not negotiated through initialize.
    const auto& s = call("2", "initialize", R"({"protocolVersion":"2026-07-28","capabilities":{}})");
    EXPECT_EQ(str(s.result()["protocolVersion"]), "2025-11-25");
}

TEST_F(SessionTest, InitializeResultContents) {
    const auto& m = call("\"init\"", "initialize", R"({"protocolVersion":"2025-06-18","capabilities":{}})");
    EXPECT_EQ(m.id(), "\"init\"");
    auto r = m.result();
    EXPECT_EQ(str(r["serverInfo"]["name"]), "cubicle-test");
    EXPECT_EQ(str(r["serverInfo"]["version"]), "9.8.7");
    EXPECT_TRUE(r["capabilities"]["tools"].is_object());
    EXPECT_TRUE(r["capabilities"]["logging"].is_object());
    EXPECT_EQ(str(r["instructions"]), "Use the tools.");
}

TEST_F(SessionTest, InitializeWithoutVersionIsInvalidParams) {
    expect_error(call("1", "initialize", "{}"), "1", error_code::invalid_params);
    expect_error(call("2", "initialize"), "2", error_code::invalid_params);
}

TEST_F(SessionTest, InitializedNotificationGetsNoReply) {
    send(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
    send(R"({"jsonrpc":"2.0","method":"notifications/some_unknown_thing","params":{}})");
    drain();
    EXPECT_TRUE(raw_.empty());
}

TEST_F(SessionTest, Ping) {
    const auto& m = call("42", "ping");
    EXPECT_EQ(m.text, R"({"jsonrpc":"2.0","id":42,"result":{}})");
    const auto& s = call("\"p\"", "ping", "{}");
    EXPECT_EQ(s.text, R"({"jsonrpc":"2.0","id":"p","result":{}})");
}

// ---------------------------------------------------------------- 2026-07-28: stateless requests

// The per-request envelope of the stateless revision, with extra _meta members.
std::string modern_meta(const std::string& extra = "") {
    std::string meta = R"({"io.modelcontextprotocol/protocolVersion":"2026-07-28",)"
                       R"("io.modelcontextprotocol/clientCapabilities":{},)"
                       R"("io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"})";
    if (!extra.empty()) meta += "," + extra;
    return meta + "}";
}
std::string modern_params(const std::string& members = "", const std::string& meta_extra = "") {
    return "{" + (members.empty() ? "" : members + ",") + R"("_meta":)" + modern_meta(meta_extra) + "}";
}

std::vector<std::string> strings(simdjson::simdjson_result<simdjson::dom::element> e) {
    simdjson::dom::array array;
    EXPECT_EQ(e.get(array), simdjson::SUCCESS);
    std::vector<std::string> out;
    for (auto v : array) out.emplace_back(std::string_view(v));
    return out;
}

bool missing(simdjson::simdjson_result<simdjson::dom::element> e) { return e.error() == simdjson::NO_SUCH_FIELD; }

// Every 2026-07-28 result: resultType and the server's identity in _meta.
void expect_stateless_result(const Message& m) {
    auto r = m.result();
    EXPECT_EQ(str(r["resultType"]), "complete") << m.text;
    EXPECT_EQ(str(r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"]), "cubicle-test") << m.text;
    EXPECT_EQ(str(r["_meta"]["io.modelcontextprotocol/serverInfo"]["version"]), "9.8.7") << m.text;
}

void expect_cache_hints(const Message& m) {
    std::int64_t ttl = -1;
    EXPECT_EQ(m.result()["ttlMs"].get(ttl), simdjson::SUCCESS) << m.text;
    EXPECT_GE(ttl, 0);
    EXPECT_EQ(str(m.result()["cacheScope"]), "public") << m.text;
}

TEST_F(SessionTest, ServerDiscover) {
    const auto& m = call("1", "server/discover", modern_params());
    expect_stateless_result(m);
    expect_cache_hints(m);
    auto versions = strings(m.result()["supportedVersions"]);
    EXPECT_EQ(versions, supported_versions());
    EXPECT_EQ(versions.front(), "2026-07-28");
    EXPECT_TRUE(m.result()["capabilities"]["tools"].is_object()) << m.text;
    EXPECT_TRUE(m.result()["capabilities"]["logging"].is_object()) << m.text;
    EXPECT_EQ(str(m.result()["instructions"]), "Use the tools.");
    // The identity lives in _meta in this revision, not beside the result's fields.
    EXPECT_TRUE(missing(m.result()["serverInfo"])) << m.text;
}

TEST_F(SessionTest, ServerDiscoverNeedsTheEnvelope) {
    expect_error(call("1", "server/discover"), "1", error_code::invalid_params);
    expect_error(call("2", "server/discover", "{}"), "2", error_code::invalid_params);
}

TEST_F(SessionTest, StatelessToolsListIsCacheable) {
    const auto& m = call("1", "tools/list", modern_params());
    expect_stateless_result(m);
    expect_cache_hints(m);
    // The same tools as in the handshake era.
    json::Document legacy;
    ASSERT_FALSE(legacy.parse(session_->tools_json()));
    EXPECT_EQ(json::to_string(m.result()["tools"].value()), json::to_string(legacy.root()["tools"].value()));
}

TEST_F(SessionTest, StatelessToolCallResult) {
    const auto& m = call("1", "tools/call", modern_params(R"("name":"echo","arguments":{"x":1})"));
    expect_stateless_result(m);
    EXPECT_TRUE(missing(m.result()["ttlMs"])) << m.text;  // not a cacheable result
    EXPECT_TRUE(m.result()["structuredContent"].is_object()) << m.text;
    EXPECT_FALSE(boolean(m.result()["isError"]));
    const auto& e = call("2", "tools/call", modern_params(R"("name":"fail")"));
    expect_stateless_result(e);
    EXPECT_TRUE(boolean(e.result()["isError"]));
}

TEST_F(SessionTest, HandshakeResultsCarryNoStatelessFields) {
    call("1", "initialize", R"({"protocolVersion":"2025-11-25","capabilities":{}})");
    for (const auto* m : {&call("2", "tools/list"), &call("3", "ping"), &call_tool("4", "echo", "{}")}) {
        for (const char* field : {"resultType", "ttlMs", "cacheScope", "_meta"}) {
            EXPECT_TRUE(missing(m->result()[field])) << field << " in " << m->text;
        }
    }
}

TEST_F(SessionTest, UnsupportedProtocolVersion) {
    int id = 1;
    for (std::string version : {"2027-01-01", "2025-11-25", ""}) {
        std::string id_json = std::to_string(id++);
        std::string params = R"({"_meta":{"io.modelcontextprotocol/protocolVersion":")" + version +
                             R"(","io.modelcontextprotocol/clientCapabilities":{}}})";
        const auto& m = call(id_json, "tools/list", params);
        expect_error(m, id_json, error_code::unsupported_protocol_version);
        EXPECT_EQ(strings(m.root()["error"]["data"]["supported"]), supported_versions()) << m.text;
        EXPECT_EQ(str(m.root()["error"]["data"]["requested"]), version) << m.text;
    }
}

TEST_F(SessionTest, MalformedEnvelopeIsInvalidParams) {
    const std::string version = R"("io.modelcontextprotocol/protocolVersion":"2026-07-28")";
    expect_error(call("1", "tools/list", R"({"_meta":{)" + version + "}}"), "1", error_code::invalid_params);
    expect_error(call("2", "tools/list", R"({"_meta":{)" + version + R"(,"io.modelcontextprotocol/clientCapabilities":[]}})"),
                 "2", error_code::invalid_params);
    expect_error(call("3", "tools/list",
                      R"({"_meta":{"io.modelcontextprotocol/protocolVersion":20260728,"io.modelcontextprotocol/clientCapabilities":{}}})"),
                 "3", error_code::invalid_params);
    expect_error(call("4", "tools/call", modern_params(R"("name":"echo")", R"("io.modelcontextprotocol/logLevel":"loud")")),
                 "4", error_code::invalid_params);
    expect_error(call("5", "tools/call", modern_params(R"("name":"echo")", R"("io.modelcontextprotocol/logLevel":3)")),
                 "5", error_code::invalid_params);
    EXPECT_TRUE(tool_log.last_arguments.empty());  // the tool never ran
}

TEST_F(SessionTest, MethodsRemovedIn20260728) {
    expect_error(call("1", "ping", modern_params()), "1", error_code::method_not_found);
    const auto& set = call("2", "logging/setLevel", modern_params(R"("level":"debug")"));
    expect_error(set, "2", error_code::method_not_found);
    EXPECT_NE(set.error_message().find("io.modelcontextprotocol/logLevel"), std::string::npos) << set.text;
    expect_error(call("3", "resources/list", modern_params()), "3", error_code::method_not_found);
}

TEST_F(SessionTest, InitializeIsTheHandshakeEvenWithAnEnvelope) {
    const auto& m = call("1", "initialize", modern_params(R"("protocolVersion":"2025-06-18","capabilities":{})"));
    EXPECT_EQ(str(m.result()["protocolVersion"]), "2025-06-18") << m.text;
    EXPECT_TRUE(missing(m.result()["resultType"])) << m.text;
}

// Log lines of a stateless request go to the client only at or above the level its _meta names.
TEST_F(SessionTest, PerRequestLogLevel) {
    call("1", "tools/call", modern_params(R"("name":"crash")"));
    EXPECT_TRUE(notifications("notifications/message").empty());

    call("2", "tools/call", modern_params(R"("name":"crash")", R"("io.modelcontextprotocol/logLevel":"critical")"));
    EXPECT_TRUE(notifications("notifications/message").empty());

    const auto& m = call("3", "tools/call", modern_params(R"("name":"crash")", R"("io.modelcontextprotocol/logLevel":"error")"));
    expect_error(m, "3", error_code::internal_error);
    auto logs = notifications("notifications/message");
    ASSERT_EQ(logs.size(), 1u);
    EXPECT_EQ(str(logs[0]->root()["params"]["level"]), "error");
    EXPECT_NE(str(logs[0]->root()["params"]["data"]).find("boom"), std::string::npos) << logs[0]->text;
    EXPECT_LT(index_of(logs[0]), index_of(&m));  // before the response

    call("4", "tools/call", modern_params(R"("name":"echo")", R"("io.modelcontextprotocol/logLevel":"debug")"));
    logs = notifications("notifications/message");
    ASSERT_EQ(logs.size(), 3u);  // started, done
    EXPECT_EQ(str(logs[1]->root()["params"]["level"]), "debug");
}

TEST_F(SessionTest, SubscriptionIsAcknowledgedAndEndsOnCancel) {
    send(R"({"jsonrpc":"2.0","id":"sub","method":"subscriptions/listen","params":)" +
         modern_params(R"("notifications":{"toolsListChanged":true})") + "}");
    drain();
    auto acks = notifications("notifications/subscriptions/acknowledged");
    ASSERT_EQ(acks.size(), 1u);
    EXPECT_EQ(str(acks[0]->root()["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]), "sub");
    EXPECT_EQ(json::to_string(acks[0]->root()["params"]["notifications"].value()), "{}");  // nothing ever changes
    EXPECT_EQ(session_->in_flight(), 1u);
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"sub"}})");
    ASSERT_TRUE(run_until([this] { return session_->in_flight() == 0; }, 3s));
    drain();
    EXPECT_EQ(count_responses("\"sub\""), 0u);
}

TEST_F(SessionTest, SubscriptionClosesGracefullyOnShutdown) {
    send(R"({"jsonrpc":"2.0","id":4,"method":"subscriptions/listen","params":)" + modern_params(R"("notifications":{})") + "}");
    drain();
    bool done = false;
    auto shutdown = [](Session* session, bool* flag) -> asio::awaitable<void> {
        co_await session->shutdown();
        *flag = true;
    };
    asio::co_spawn(io_, shutdown(session_.get(), &done), asio::detached);
    ASSERT_TRUE(run_until([&] { return done; }, 3s));
    const auto* m = response("4");
    ASSERT_NE(m, nullptr);
    expect_stateless_result(*m);
    std::int64_t subscription = 0;
    EXPECT_EQ(m->result()["_meta"]["io.modelcontextprotocol/subscriptionId"].get(subscription), simdjson::SUCCESS) << m->text;
    EXPECT_EQ(subscription, 4);
}

TEST_F(SessionTest, SubscriptionNeedsAFilterAndTheStatelessRevision) {
    expect_error(call("1", "subscriptions/listen", modern_params()), "1", error_code::invalid_params);
    expect_error(call("2", "subscriptions/listen", R"({"notifications":{}})"), "2", error_code::method_not_found);
}

TEST_F(SessionTest, HandshakeLogLevelDoesNotReachStatelessRequests) {
    call("1", "logging/setLevel", R"({"level":"debug"})");
    call("2", "tools/call", modern_params(R"("name":"crash")"));
    EXPECT_TRUE(notifications("notifications/message").empty());
}

// ---------------------------------------------------------------- protocol errors

TEST_F(SessionTest, ParseErrorHasNullId) {
    send("{not json");
    send(R"({"jsonrpc":"2.0","id":1,"method":"ping")");
    drain();
    ASSERT_EQ(messages().size(), 2u);
    for (const auto& m : messages()) {
        expect_error(m, "null", error_code::parse_error);
    }
}

TEST_F(SessionTest, BatchOutside20250326IsInvalidRequest) {
    const std::string batch = R"([{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}])";
    send(batch);  // before initialize
    call("3", "initialize", R"({"protocolVersion":"2025-06-18","capabilities":{}})");
    send(batch);
    drain();
    ASSERT_EQ(messages().size(), 3u);
    expect_error(messages()[0], "null", error_code::invalid_request);
    expect_error(messages()[2], "null", error_code::invalid_request);
}

// A number no 64-bit integer or double holds is no reason to leave a request unanswered.
TEST_F(SessionTest, NumberOutOfRangeIsAnsweredUnderItsId) {
    send(R"({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"n":1e400}}})");
    send(R"({"jsonrpc":"2.0","method":"tools/call","id":"big","params":{"name":"echo","arguments":{"n":123456789012345678901234567890}}})");
    send(R"({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"n":[-18446744073709551617]}}})");
    // Not readable: the id itself out of range, or a number that is no number at all.
    send(R"({"jsonrpc":"2.0","id":1e400,"method":"ping"})");
    send(R"({"jsonrpc":"2.0","id":10,"method":"ping","params":{"n":01}})");
    send(R"({"jsonrpc":"2.0","id":11,"method":"ping","params":{"n":1.}})");
    // Nor a misspelt literal beside such a number (found by fuzz_session: it threw).
    send(R"({"jsonrpc":"2.0","id":12,"method":"ping","params":{"n":1e400,"m":nulx}})");
    send(R"({"jsonrpc":"2.0","id":13,"method":"ping","params":{"n":1e400,"m":[trux]}})");
    drain();
    ASSERT_EQ(messages().size(), 8u);
    expect_error(messages()[0], "7", error_code::invalid_params);
    expect_error(messages()[1], "\"big\"", error_code::invalid_params);
    expect_error(messages()[2], "9", error_code::invalid_params);
    for (std::size_t i = 3; i < 8; ++i) expect_error(messages()[i], "null", error_code::parse_error);
    EXPECT_TRUE(tool_log.last_arguments.empty());
}

TEST_F(SessionTest, NonObjectMessageIsInvalidRequest) {
    send("42");
    send("\"ping\"");
    drain();
    ASSERT_EQ(messages().size(), 2u);
    for (const auto& m : messages()) expect_error(m, "null", error_code::invalid_request);
}

TEST_F(SessionTest, MissingOrWrongJsonrpcIsInvalidRequest) {
    send(R"({"id":1,"method":"ping"})");
    send(R"({"jsonrpc":"1.0","id":2,"method":"ping"})");
    send(R"({"jsonrpc":2.0,"id":3,"method":"ping"})");
    drain();
    ASSERT_EQ(messages().size(), 3u);
    expect_error(messages()[0], "1", error_code::invalid_request);
    expect_error(messages()[1], "2", error_code::invalid_request);
    expect_error(messages()[2], "3", error_code::invalid_request);
}

TEST_F(SessionTest, BadIdIsInvalidRequest) {
    send(R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})");
    send(R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})");
    send(R"({"jsonrpc":"2.0","id":null,"method":"ping"})");
    drain();
    ASSERT_EQ(messages().size(), 3u);
    for (const auto& m : messages()) expect_error(m, "null", error_code::invalid_request);
}

TEST_F(SessionTest, MissingMethodIsInvalidRequest) {
    send(R"({"jsonrpc":"2.0","id":7})");
    drain();
    ASSERT_EQ(messages().size(), 1u);
    expect_error(messages()[0], "7", error_code::invalid_request);
}

TEST_F(SessionTest, ResponsesFromTheClientAreIgnored) {
    send(R"({"jsonrpc":"2.0","id":7,"result":{}})");
    send(R"({"jsonrpc":"2.0","id":8,"error":{"code":-1,"message":"x"}})");
    drain();
    EXPECT_TRUE(raw_.empty());
}

TEST_F(SessionTest, UnknownMethod) {
    const auto& m = call("9", "resources/list");
    expect_error(m, "9", error_code::method_not_found);
    EXPECT_NE(m.error_message().find("resources/list"), std::string::npos);
}

TEST_F(SessionTest, NonObjectParamsIsInvalidParams) {
    expect_error(call("1", "ping", "[1,2]"), "1", error_code::invalid_params);
    expect_error(call("2", "tools/call", "\"echo\""), "2", error_code::invalid_params);
}

TEST_F(SessionTest, IdsAreEchoedExactly) {
    EXPECT_EQ(call("\"a \\\"quoted\\\" id\"", "ping").id(), "\"a \\\"quoted\\\" id\"");
    EXPECT_EQ(call("0", "ping").id(), "0");
    EXPECT_EQ(call("-5", "ping").id(), "-5");
    EXPECT_EQ(call("9007199254740993", "ping").id(), "9007199254740993");
}

// ---------------------------------------------------------------- tools/list

TEST_F(SessionTest, ToolsList) {
    const auto& m = call("1", "tools/list");
    simdjson::dom::array tools;
    ASSERT_EQ(m.result()["tools"].get(tools), simdjson::SUCCESS) << m.text;
    ASSERT_EQ(tools.size(), 4u);
    std::vector<std::string> names;
    for (auto tool : tools) {
        names.push_back(str(tool["name"]));
        EXPECT_FALSE(str(tool["title"]).empty());
        EXPECT_FALSE(str(tool["description"]).empty());
        EXPECT_EQ(str(tool["inputSchema"]["type"]), "object");
        EXPECT_EQ(str(tool["outputSchema"]["type"]), "object");
        auto annotations = tool["annotations"];
        EXPECT_TRUE(annotations.is_object());
        for (const char* hint : {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}) {
            bool b;
            EXPECT_EQ(annotations[hint].get(b), simdjson::SUCCESS) << hint;
        }
    }
    EXPECT_EQ(names, (std::vector<std::string>{"echo", "fail", "crash", "wait"}));
    auto echo = tools.at(0);
    EXPECT_TRUE(boolean(echo["annotations"]["readOnlyHint"]));
    EXPECT_TRUE(boolean(echo["annotations"]["idempotentHint"]));
    EXPECT_FALSE(boolean(echo["annotations"]["destructiveHint"]));
    auto crash = tools.at(2);
    EXPECT_TRUE(boolean(crash["annotations"]["destructiveHint"]));
    EXPECT_TRUE(boolean(crash["annotations"]["openWorldHint"]));
    // The pretty schema was compacted, with its content intact.
    auto wait = tools.at(3);
    EXPECT_EQ(str(wait["inputSchema"]["properties"]["ms"]["type"]), "integer");
    EXPECT_FALSE(boolean(wait["inputSchema"]["additionalProperties"]));
    EXPECT_EQ(m.text.find('\n'), std::string::npos);
    EXPECT_EQ(m.text.find("    "), std::string::npos);
    // tools_json() is exactly what tools/list returns.
    EXPECT_EQ(json::to_string(m.result()), session_->tools_json());
}

TEST(SessionConstruction, InvalidSchemaIsRejected) {
    asio::io_context io;
    auto tools = fake_tools();
    tools[1].output_schema = R"({"type":"object",)";
    EXPECT_THROW(Session(io.get_executor(), ServerInfo{"n", "v", ""}, tools, [](std::string) {}), std::logic_error);
}

// ---------------------------------------------------------------- tools/call

TEST_F(SessionTest, StructuredResult) {
    const auto& m = call_tool("1", "echo", R"({"a":[1,2],"s":"x"})");
    auto r = m.result();
    EXPECT_FALSE(boolean(r["isError"]));
    simdjson::dom::element structured;
    ASSERT_EQ(r["structuredContent"].get(structured), simdjson::SUCCESS) << m.text;
    EXPECT_EQ(json::to_string(structured["echo"].value()), R"({"a":[1,2],"s":"x"})");
    simdjson::dom::array content;
    ASSERT_EQ(r["content"].get(content), simdjson::SUCCESS);
    ASSERT_EQ(content.size(), 1u);
    EXPECT_EQ(str(content.at(0)["type"]), "text");
    // The text content is the serialization of structuredContent.
    std::string text = str(content.at(0)["text"]);
    json::Document reparsed;
    ASSERT_FALSE(reparsed.parse(text)) << text;
    EXPECT_EQ(json::to_string(reparsed.root()), json::to_string(structured));
    EXPECT_EQ(str(structured["note"]), "line1\nline2");
}

TEST_F(SessionTest, OmittedArgumentsAreAnEmptyObject) {
    const auto& m = call_tool("1", "echo");
    EXPECT_FALSE(boolean(m.result()["isError"])) << m.text;
    EXPECT_EQ(tool_log.last_arguments, "{}");
    EXPECT_EQ(json::to_string(m.result()["structuredContent"]["echo"].value()), "{}");
}

// ---------------------------------------------------------------- requests to the client

class ElicitationTest : public SessionTest {
protected:
    void SetUp() override {
        SessionTest::SetUp();
        session_ = std::make_unique<Session>(io_.get_executor(), ServerInfo{"cubicle-test", "9.8.7", "Use the tools."},
                                             tools_with_ask(), [this](std::string m) { raw_.push_back(std::move(m)); });
    }
};

TEST_F(ElicitationTest, NoElicitationWithoutTheCapability) {
    call("0", "initialize", R"({"protocolVersion":"2025-11-25","capabilities":{}})");
    const auto& m = call_tool("1", "ask", "{}");
    EXPECT_FALSE(boolean(m.result()["structuredContent"]["asked"])) << m.text;
    call("2", "initialize", R"({"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}}})");
    const auto& url_only = call_tool("3", "ask", "{}");
    EXPECT_FALSE(boolean(url_only.result()["structuredContent"]["asked"])) << url_only.text;  // url mode is no form
}

TEST_F(ElicitationTest, IsARequestAnsweredByTheClientsResponse) {
    call("0", "initialize", R"({"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"form":{}}}})");
    send(R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ask","arguments":{}}})");
    ASSERT_TRUE(run_until([&] { return !notifications("elicitation/create").empty(); }));
    const auto* question = notifications("elicitation/create").front();
    EXPECT_EQ(question->id(), R"("cubicle-1")") << question->text;
    EXPECT_EQ(str(question->root()["params"]["message"]), "Allow?");
    // A response nobody waits for changes nothing; the one awaited ends the wait.
    send(R"({"jsonrpc":"2.0","id":"cubicle-99","result":{"action":"decline"}})");
    send(R"({"jsonrpc":"2.0","id":"cubicle-1","result":{"action":"accept","content":{"decision":"once"}}})");
    ASSERT_TRUE(run_until([&] { return response("1") != nullptr; }));
    auto answer = response("1")->result()["structuredContent"]["answer"];
    EXPECT_EQ(str(answer["action"]), "accept") << response("1")->text;
    EXPECT_EQ(str(answer["content"]["decision"]), "once");
    EXPECT_EQ(count_responses(R"("cubicle-99")"), 0u);  // never answered back
}

TEST_F(ElicitationTest, WithoutAnswerOrWithAnErrorIsNone) {
    call("0", "initialize", R"({"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}}})");
    const auto& timed_out = call_tool("1", "ask", R"({"ms":50})");
    EXPECT_TRUE(timed_out.result()["structuredContent"]["answer"].is_null()) << timed_out.text;
    send(R"({"jsonrpc":"2.0","id":"cubicle-1","result":{"action":"accept"}})");  // late: ignored
    send(R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ask","arguments":{}}})");
    ASSERT_TRUE(run_until([&] { return notifications("elicitation/create").size() == 2; }));
    send(R"({"jsonrpc":"2.0","id":"cubicle-2","error":{"code":-32600,"message":"Elicitation not supported"}})");
    ASSERT_TRUE(run_until([&] { return response("2") != nullptr; }));
    EXPECT_TRUE(response("2")->result()["structuredContent"]["answer"].is_null()) << response("2")->text;
}

TEST_F(SessionTest, ToolErrorBecomesIsErrorResult) {
    const auto& m = call_tool("1", "fail", "{}");
    auto r = m.result();
    EXPECT_TRUE(boolean(r["isError"])) << m.text;
    EXPECT_EQ(str(r["content"].at(0)["type"]), "text");
    EXPECT_EQ(str(r["content"].at(0)["text"]), "sandbox_id 'nope' is unknown; known: none");
    EXPECT_TRUE(r["structuredContent"].error() == simdjson::NO_SUCH_FIELD) << m.text;
    EXPECT_EQ(session_->in_flight(), 0u);
}

TEST_F(SessionTest, RuntimeErrorBecomesInternalError) {
    const auto& m = call_tool("1", "crash", "{}");
    expect_error(m, "1", error_code::internal_error);
    EXPECT_NE(m.error_message().find("boom in the handler"), std::string::npos) << m.text;
    EXPECT_EQ(session_->in_flight(), 0u);
}

TEST_F(SessionTest, UnknownToolIsInvalidParams) {
    const auto& m = call_tool("1", "no_such_tool", "{}");
    expect_error(m, "1", error_code::invalid_params);
    EXPECT_NE(m.error_message().find("no_such_tool"), std::string::npos) << m.text;
    EXPECT_NE(m.error_message().find("echo"), std::string::npos) << m.text;  // names the available tools
}

TEST_F(SessionTest, MissingToolNameIsInvalidParams) {
    expect_error(call("1", "tools/call", R"({"arguments":{}})"), "1", error_code::invalid_params);
    expect_error(call("2", "tools/call"), "2", error_code::invalid_params);
    expect_error(call("3", "tools/call", R"({"name":5})"), "3", error_code::invalid_params);
}

TEST_F(SessionTest, NonObjectArgumentsAreInvalidParams) {
    expect_error(call_tool("1", "echo", "[1,2]"), "1", error_code::invalid_params);
    expect_error(call_tool("2", "echo", "\"text\""), "2", error_code::invalid_params);
    expect_error(call_tool("3", "echo", "7"), "3", error_code::invalid_params);
    EXPECT_TRUE(tool_log.last_arguments.empty());  // the handler never ran
}

// ---------------------------------------------------------------- progress

TEST_F(SessionTest, NoProgressWithoutToken) {
    const auto& m = call_tool("1", "wait", R"({"ms":1})");
    EXPECT_TRUE(boolean(m.result()["structuredContent"]["waited"])) << m.text;
    EXPECT_TRUE(notifications("notifications/progress").empty());
    // _meta without a progressToken: still none.
    call_tool("2", "wait", R"({"ms":1})", R"({"other":"x"})");
    EXPECT_TRUE(notifications("notifications/progress").empty());
}

TEST_F(SessionTest, ProgressWithStringToken) {
    call_tool("1", "wait", R"({"ms":1})", R"({"progressToken":"tok-\"1\""})");
    auto progress = notifications("notifications/progress");
    ASSERT_EQ(progress.size(), 2u);
    for (const auto* p : progress) {
        EXPECT_EQ(json::to_string(p->root()["params"]["progressToken"].value()), R"("tok-\"1\"")") << p->text;
        EXPECT_TRUE(p->root()["id"].error() == simdjson::NO_SUCH_FIELD) << p->text;
    }
    double first = 0, second = 0;
    ASSERT_EQ(progress[0]->root()["params"]["progress"].get(first), simdjson::SUCCESS);
    ASSERT_EQ(progress[1]->root()["params"]["progress"].get(second), simdjson::SUCCESS);
    EXPECT_LT(first, second);
    EXPECT_EQ(str(progress[0]->root()["params"]["message"]), "started");
}

TEST_F(SessionTest, ProgressWithIntegerToken) {
    call_tool("1", "wait", R"({"ms":1})", R"({"progressToken":12345678901})");
    auto progress = notifications("notifications/progress");
    ASSERT_EQ(progress.size(), 2u);
    for (const auto* p : progress) {
        EXPECT_EQ(json::to_string(p->root()["params"]["progressToken"].value()), "12345678901") << p->text;
    }
    // Progress comes before the response.
    std::size_t last_progress = 0, response_at = 0;
    for (std::size_t i = 0; i < messages().size(); ++i) {
        if (messages()[i].method() == "notifications/progress") last_progress = i;
        if (messages()[i].is_response() && messages()[i].id() == "1") response_at = i;
    }
    EXPECT_LT(last_progress, response_at);
}

// ---------------------------------------------------------------- cancellation, concurrency

TEST_F(SessionTest, CancelledRequestGetsNoResponse) {
    send(R"({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"progressToken":"t"}}})");
    ASSERT_TRUE(run_until([this] { return !notifications("notifications/progress").empty(); }));
    EXPECT_EQ(session_->in_flight(), 1u);
    auto start = std::chrono::steady_clock::now();
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"user gave up"}})");
    ASSERT_TRUE(run_until([this] { return session_->in_flight() == 0; }, 3s));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    drain();
    EXPECT_EQ(tool_log.wait_saw_cancel, 1);
    EXPECT_EQ(tool_log.wait_finished, 0);
    EXPECT_EQ(count_responses("5"), 0u);
    // The session still works, and the id can be reused.
    EXPECT_EQ(call("5", "ping").text, R"({"jsonrpc":"2.0","id":5,"result":{}})");
}

TEST_F(SessionTest, CancelledBeforeItStarted) {
    send(R"({"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"wait","arguments":{}}})");
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"s"}})");
    ASSERT_TRUE(run_until([this] { return session_->in_flight() == 0; }, 3s));
    drain();
    EXPECT_EQ(count_responses("\"s\""), 0u);
    EXPECT_EQ(tool_log.wait_finished, 0);
}

TEST_F(SessionTest, CancelOfUnknownOrFinishedRequestIsIgnored) {
    call("1", "ping");
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}})");
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"never"}})");
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled"})");
    drain();
    EXPECT_EQ(messages().size(), 1u);
}

TEST_F(SessionTest, CancelMatchesIdTypeExactly) {
    // A string "5" is not the integer 5.
    send(R"({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"wait","arguments":{"ms":200}}})");
    drain();
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"5"}})");
    ASSERT_TRUE(run_until([this] { return response("5") != nullptr; }));
    EXPECT_TRUE(boolean(response("5")->result()["structuredContent"]["waited"]));
}

TEST_F(SessionTest, ConcurrentCallsDoNotBlockEachOther) {
    send(R"({"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"wait","arguments":{"ms":300}}})");
    drain();
    EXPECT_EQ(session_->in_flight(), 1u);
    const auto& ping = call("2", "ping");
    EXPECT_EQ(ping.id(), "2");
    const auto& echo = call_tool("3", "echo", R"({"n":3})");
    EXPECT_FALSE(boolean(echo.result()["isError"]));
    EXPECT_EQ(response("\"slow\""), nullptr);  // still running
    EXPECT_EQ(session_->in_flight(), 1u);
    ASSERT_TRUE(run_until([this] { return response("\"slow\"") != nullptr; }));
    EXPECT_TRUE(boolean(response("\"slow\"")->result()["structuredContent"]["waited"]));
    EXPECT_EQ(session_->in_flight(), 0u);
}

TEST_F(SessionTest, TwoSlowCallsRunConcurrently) {
    auto start = std::chrono::steady_clock::now();
    send(R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{"ms":400}}})");
    send(R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{"ms":400}}})");
    ASSERT_TRUE(run_until([this] { return response("1") && response("2"); }));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 750ms);
    EXPECT_EQ(tool_log.wait_finished, 2);
}

TEST_F(SessionTest, DuplicateInFlightIdRefused) {
    send(R"({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wait","arguments":{}}})");
    drain();
    ASSERT_EQ(session_->in_flight(), 1u);
    send(R"({"jsonrpc":"2.0","id":7,"method":"ping"})");
    send(R"({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}})");
    drain();
    ASSERT_EQ(count_responses("7"), 2u);
    for (const auto& m : messages()) {
        if (m.is_response()) expect_error(m, "7", error_code::invalid_request);
    }
    EXPECT_EQ(session_->in_flight(), 1u);
    EXPECT_TRUE(tool_log.last_arguments.empty());  // the echo never ran
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}})");
    ASSERT_TRUE(run_until([this] { return session_->in_flight() == 0; }, 3s));
    drain();
    EXPECT_EQ(count_responses("7"), 2u);  // still only the two refusals
}

TEST_F(SessionTest, ShutdownCancelsEverything) {
    send(R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{}}})");
    send(R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{}}})");
    drain();
    ASSERT_EQ(session_->in_flight(), 2u);
    bool done = false;
    auto shutdown = [](Session* session, bool* flag) -> asio::awaitable<void> {
        co_await session->shutdown();
        *flag = true;
    };
    auto task = shutdown(session_.get(), &done);
    asio::co_spawn(io_, std::move(task), asio::detached);
    ASSERT_TRUE(run_until([&] { return done; }, 3s));
    EXPECT_EQ(session_->in_flight(), 0u);
    EXPECT_EQ(tool_log.wait_saw_cancel, 2);
}

// ---------------------------------------------------------------- logging

TEST_F(SessionTest, SetLevelValidLevels) {
    int id = 1;
    for (const char* level : {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}) {
        std::string id_json = std::to_string(id++);
        const auto& m = call(id_json, "logging/setLevel", std::string(R"({"level":")") + level + "\"}");
        EXPECT_TRUE(m.result().is_object()) << level << ": " << m.text;
        EXPECT_EQ(m.error_code(), 0) << level;
    }
}

TEST_F(SessionTest, SetLevelInvalid) {
    expect_error(call("1", "logging/setLevel", R"({"level":"verbose"})"), "1", error_code::invalid_params);
    expect_error(call("2", "logging/setLevel", R"({"level":3})"), "2", error_code::invalid_params);
    expect_error(call("3", "logging/setLevel", "{}"), "3", error_code::invalid_params);
    expect_error(call("4", "logging/setLevel"), "4", error_code::invalid_params);
}

TEST_F(SessionTest, LogMessagesForwardedAfterSetLevel) {
    call_tool("1", "crash", "{}");
    EXPECT_TRUE(notifications("notifications/message").empty());
    call("2", "logging/setLevel", R"({"level":"error"})");
    call_tool("3", "crash", "{}");
    auto logs = notifications("notifications/message");
    ASSERT_EQ(logs.size(), 1u);
    EXPECT_EQ(str(logs[0]->root()["params"]["level"]), "error");
    EXPECT_NE(str(logs[0]->root()["params"]["data"]).find("boom"), std::string::npos) << logs[0]->text;
}

// Each of the eight syslog levels is its own threshold: after critical, an error is not sent.
TEST_F(SessionTest, SetLevelThresholdIsExact) {
    const std::vector<std::string> levels = {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"};
    int id = 1;
    for (std::size_t i = 0; i < levels.size(); ++i) {
        call(std::to_string(id++), "logging/setLevel", R"({"level":")" + levels[i] + "\"}");
        auto before = notifications("notifications/message").size();
        call_tool(std::to_string(id++), "crash", "{}");  // a debug line, then an error line
        auto logs = notifications("notifications/message");
        std::vector<std::string> sent;
        for (auto k = before; k < logs.size(); ++k) sent.push_back(str(logs[k]->root()["params"]["level"]));
        std::vector<std::string> expected;
        if (i == 0) expected.push_back("debug");
        if (i <= 4) expected.push_back("error");
        EXPECT_EQ(sent, expected) << "after logging/setLevel " << levels[i];
    }
}

TEST(LogLevels, NamesRoundTrip) {
    const std::vector<std::string> levels = {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"};
    for (std::size_t i = 0; i < levels.size(); ++i) {
        auto level = log::parse_level(levels[i]);
        ASSERT_TRUE(level) << levels[i];
        EXPECT_EQ(static_cast<std::size_t>(*level), i);
        EXPECT_EQ(log::level_name(*level), levels[i]);
    }
    EXPECT_FALSE(log::parse_level("fatal"));
    EXPECT_FALSE(log::parse_level("ERROR"));
}

// ---------------------------------------------------------------- pagination

TEST_F(SessionTest, UnknownCursorIsInvalidParams) {
    expect_error(call("1", "tools/list", R"({"cursor":"abc"})"), "1", error_code::invalid_params);
    expect_error(call("2", "tools/list", R"({"cursor":7})"), "2", error_code::invalid_params);
    expect_error(call("3", "tools/list", modern_params(R"("cursor":"abc")")), "3", error_code::invalid_params);
    EXPECT_TRUE(call("4", "tools/list", "{}").result()["tools"].is_array());
}

// ---------------------------------------------------------------- 2025-03-26 batches

class BatchTest : public SessionTest {
protected:
    void SetUp() override {
        SessionTest::SetUp();
        call("0", "initialize", R"({"protocolVersion":"2025-03-26","capabilities":{}})");
        raw_.clear();
        parsed_.clear();
    }

    // The single array message sent, with its responses by id.
    std::map<std::string, std::string> batch_responses() {
        std::map<std::string, std::string> out;
        std::size_t arrays = 0;
        for (const auto& m : messages()) {
            simdjson::dom::array array;
            if (m.root().get(array) != simdjson::SUCCESS) continue;
            ++arrays;
            for (auto response : array) out[json::to_string(response["id"].value())] = json::to_string(response);
        }
        EXPECT_EQ(arrays, 1u);
        return out;
    }
};

TEST_F(BatchTest, RequestsAndNotificationsAnsweredInOneArray) {
    send(R"([{"jsonrpc":"2.0","id":1,"method":"ping"},)"
         R"({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}},)"
         R"({"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"wait","arguments":{"ms":100}}},)"
         R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"k":3}}}])");
    drain();
    EXPECT_TRUE(messages().empty());  // the slow call is still running: the batch waits for it
    ASSERT_TRUE(run_until([this] { return !messages().empty(); }));
    auto responses = batch_responses();
    ASSERT_EQ(responses.size(), 3u);
    EXPECT_EQ(responses["1"], R"({"jsonrpc":"2.0","id":1,"result":{}})");
    EXPECT_NE(responses["\"slow\""].find(R"("waited":true)"), std::string::npos);
    EXPECT_NE(responses["3"].find(R"("k":3)"), std::string::npos);
}

TEST_F(BatchTest, ErrorsTakeTheirPlaceInTheArray) {
    send(R"([42,{"jsonrpc":"2.0","id":1,"method":"nope"},{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2025-03-26"}},)"
         R"({"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}])");
    drain();
    auto responses = batch_responses();
    ASSERT_EQ(responses.size(), 4u);
    EXPECT_NE(responses["null"].find("-32600"), std::string::npos);
    EXPECT_NE(responses["1"].find("-32601"), std::string::npos);
    EXPECT_NE(responses["2"].find("-32600"), std::string::npos);  // initialize is never batched
    EXPECT_NE(responses["4"].find("-32600"), std::string::npos);  // nor are stateless requests
}

TEST_F(BatchTest, OnlyNotificationsGetNoResponse) {
    send(R"([{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}])");
    drain();
    EXPECT_TRUE(messages().empty());
}

TEST_F(BatchTest, EmptyBatchIsInvalidRequest) {
    send("[]");
    drain();
    ASSERT_EQ(messages().size(), 1u);
    expect_error(messages()[0], "null", error_code::invalid_request);
}

TEST_F(BatchTest, CancelledElementIsLeftOut) {
    send(R"([{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"progressToken":"p"}}},)"
         R"({"jsonrpc":"2.0","id":6,"method":"ping"}])");
    ASSERT_TRUE(run_until([this] { return !notifications("notifications/progress").empty(); }));  // progress is not held back
    send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}})");
    ASSERT_TRUE(run_until([this] { return session_->in_flight() == 0; }, 3s));
    drain();
    auto responses = batch_responses();
    ASSERT_EQ(responses.size(), 1u);
    EXPECT_EQ(responses.count("6"), 1u);
}

// ---------------------------------------------------------------- tasks

class TaskTest : public SessionTest {
protected:
    void handshake(const std::string& version) {
        call("0", "initialize", R"({"protocolVersion":")" + version + R"(","capabilities":{},"clientInfo":{"name":"t","version":"0"}})");
    }
    std::string task_status(const std::string& id_json, const std::string& task_id) {
        return str(call(id_json, "tasks/get", R"({"taskId":")" + task_id + R"("})").result()["status"]);
    }
    static constexpr const char* stateless_meta =
        R"("_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}})";
};

TEST_F(TaskTest, CapabilityAndToolSupportFrom2025_11_25) {
    handshake("2025-11-25");
    auto init = response("0")->result();
    EXPECT_FALSE(init["capabilities"]["tasks"]["requests"]["tools"]["call"].error());
    simdjson::dom::array tools;
    ASSERT_EQ(call("1", "tools/list").result()["tools"].get(tools), simdjson::SUCCESS);
    for (auto tool : tools) {
        std::string name = str(tool["name"]);
        EXPECT_EQ(!tool["execution"].error(), name == "wait") << name;
    }
    // A tool without task support refuses a task.
    expect_error(call("2", "tools/call", R"({"name":"echo","arguments":{},"task":{}})"), "2", error_code::method_not_found);
}

TEST_F(TaskTest, TaskRunsToCompletionAndGivesItsResult) {
    handshake("2025-11-25");
    auto created = call("1", "tools/call", R"({"name":"wait","arguments":{"ms":100},"task":{"ttl":5000}})").result()["task"];
    std::string id = str(created["taskId"]);
    EXPECT_EQ(str(created["status"]), "working");
    std::int64_t ttl = 0;
    EXPECT_EQ(created["ttl"].get(ttl), simdjson::SUCCESS);
    EXPECT_EQ(ttl, 5000);
    const auto& result = call("2", "tasks/result", R"({"taskId":")" + id + R"("})");
    EXPECT_TRUE(boolean(result.result()["structuredContent"]["waited"])) << result.text;
    EXPECT_EQ(str(result.result()["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]), id);
    EXPECT_EQ(task_status("3", id), "completed");
    EXPECT_EQ(notifications("notifications/tasks/status").size(), 1u);
    expect_error(call("4", "tasks/cancel", R"({"taskId":")" + id + R"("})"), "4", error_code::invalid_params);
}

TEST_F(TaskTest, CancelStopsTheCall) {
    handshake("2025-11-25");
    std::string id = str(call("1", "tools/call", R"({"name":"wait","arguments":{"ms":10000},"task":{}})").result()["task"]["taskId"]);
    EXPECT_TRUE(run_until([] { return tool_log.wait_started == 1; }));
    EXPECT_EQ(str(call("2", "tasks/cancel", R"({"taskId":")" + id + R"("})").result()["status"]), "cancelled");
    EXPECT_TRUE(run_until([] { return tool_log.wait_saw_cancel == 1; }));
    EXPECT_EQ(task_status("3", id), "cancelled");
}

TEST_F(TaskTest, AnotherPrincipalFindsNothing) {
    handshake("2025-11-25");
    std::string id = str(call("1", "tools/call", R"({"name":"wait","arguments":{"ms":10000},"task":{}})").result()["task"]["taskId"]);
    std::vector<std::string> theirs;
    Peer other{.send = [&theirs](std::string m) { theirs.push_back(std::move(m)); }, .principal = "mallory"};
    for (std::string method : {"tasks/get", "tasks/cancel", "tasks/result"}) {
        session_->handle_message(R"({"jsonrpc":"2.0","id":9,"method":")" + method + R"(","params":{"taskId":")" + id + R"("}})", other);
        EXPECT_TRUE(run_until([&] { return !theirs.empty(); }));
        EXPECT_NE(theirs.back().find("-32602"), std::string::npos) << theirs.back();
        theirs.clear();
    }
    session_->handle_message(R"({"jsonrpc":"2.0","id":10,"method":"tasks/list"})", other);
    EXPECT_TRUE(run_until([&] { return !theirs.empty(); }));
    EXPECT_NE(theirs.back().find(R"("tasks":[])"), std::string::npos) << theirs.back();
    EXPECT_EQ(task_status("3", id), "working");
    call("4", "tasks/cancel", R"({"taskId":")" + id + R"("})");
}

TEST_F(TaskTest, NoTaskBefore2025_11_25) {
    handshake("2025-06-18");
    const auto& m = call("1", "tools/call", R"({"name":"wait","arguments":{"ms":1},"task":{}})");
    EXPECT_TRUE(m.result()["task"].error()) << m.text;
    EXPECT_TRUE(boolean(m.result()["structuredContent"]["waited"]));
    expect_error(call("2", "tasks/list"), "2", error_code::method_not_found);
}

TEST_F(TaskTest, ExtensionMakesSlowCallsTasks) {
    const auto& quick = call("1", "tools/call", std::string(R"({"name":"wait","arguments":{"ms":1},)") + stateless_meta + "}");
    EXPECT_EQ(str(quick.result()["resultType"]), "complete") << quick.text;
    const auto& slow = call("2", "tools/call", std::string(R"({"name":"wait","arguments":{"ms":1500},)") + stateless_meta + "}");
    EXPECT_EQ(str(slow.result()["resultType"]), "task") << slow.text;
    std::string id = str(slow.result()["taskId"]);
    EXPECT_TRUE(run_until([] { return tool_log.wait_finished == 2; }));
    const auto& got = call("3", "tasks/get", R"({"taskId":")" + id + R"(",)" + stateless_meta + "}");
    EXPECT_EQ(str(got.result()["status"]), "completed") << got.text;
    EXPECT_TRUE(boolean(got.result()["result"]["structuredContent"]["waited"]));
    // Without the extension in the request: refused with -32021.
    const auto& refused = call("4", "tasks/get", R"({"taskId":")" + id +
        R"(","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}})");
    expect_error(refused, "4", error_code::missing_client_capability);
}

} // namespace
} // namespace cubicle::mcp

