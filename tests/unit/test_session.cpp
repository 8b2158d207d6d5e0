// The MCP session: lifecycle, dispatch, errors, tool calls, progress,
// cancellation and concurrency, driven through handle_message with fake tools.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
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
                         .handler = wait_tool});
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
            EXPECT_FALSE(error) << m.text;
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

TEST_F(SessionTest, ServerDiscoverListsSupportedVersions) {
    const auto& m = call("1", "server/discover");
    simdjson::dom::array versions;
    ASSERT_EQ(m.result()["supportedVersions"].get(versions), simdjson::SUCCESS) << m.text;
    std::vector<std::string> got;
    for (auto v : versions) got.emplace_back(std::string_view(v));
    for (std::string expected : {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"}) {
        EXPECT_NE(std::find(got.begin(), got.end(), expected), got.end()) << expected;
    }
    EXPECT_EQ(got, supported_versions());
    EXPECT_EQ(str(m.result()["serverInfo"]["name"]), "cubicle-test");
}

TEST_F(SessionTest, StatelessRequestsGetResultType) {
    const std::string meta = R"({"io.modelcontextprotocol/protocolVersion":"2026-07-28"})";
    const auto& ping = call("1", "ping", R"({"_meta":)" + meta + "}");
    EXPECT_EQ(str(ping.result()["resultType"]), "complete") << ping.text;

    const auto& list = call("2", "tools/list", R"({"_meta":)" + meta + "}");
    EXPECT_EQ(str(list.result()["resultType"]), "complete") << list.text;
    EXPECT_TRUE(list.result()["tools"].is_array());

    const auto& tool = call_tool("3", "echo", R"({"x":1})", meta);
    EXPECT_EQ(str(tool.result()["resultType"]), "complete") << tool.text;
    EXPECT_TRUE(tool.result()["structuredContent"].is_object());

    // Without the stateless revision: no resultType.
    const auto& plain = call("4", "ping");
    EXPECT_TRUE(plain.result()["resultType"].error() == simdjson::NO_SUCH_FIELD) << plain.text;
    const auto& other = call("5", "ping", R"({"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}})");
    EXPECT_TRUE(other.result()["resultType"].error() == simdjson::NO_SUCH_FIELD) << other.text;
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

TEST_F(SessionTest, BatchIsInvalidRequest) {
    send(R"([{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}])");
    drain();
    ASSERT_EQ(messages().size(), 1u);
    expect_error(messages()[0], "null", error_code::invalid_request);
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
    ASSERT_FALSE(logs.empty());
    EXPECT_EQ(str(logs[0]->root()["params"]["level"]), "error");
    EXPECT_NE(str(logs[0]->root()["params"]["data"]).find("boom"), std::string::npos) << logs[0]->text;
}

} // namespace
} // namespace cubicle::mcp
