// The MCP protocol: lifecycle, dispatch, in-flight requests, cancellation,
// progress and logging. Knows nothing of Docker; transports feed it messages.
//
// One Session serves both eras of the protocol, request by request: a request
// whose _meta carries io.modelcontextprotocol/protocolVersion is served
// statelessly under that (2026-07-28) revision; any other request under the
// revision the initialize handshake agreed on. No state of a stateless
// request outlives it, so a transport may give many clients one Session.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "common/log.hpp"
#include "mcp/resource.hpp"
#include "mcp/tool.hpp"

namespace cubicle::mcp {
class TaskStore;
struct Task;
} // namespace cubicle::mcp

namespace cubicle::mcp {

namespace asio = boost::asio;

struct ServerInfo {
    std::string name;
    std::string version;
    std::string instructions;
};

// The principal of the stdio transport: the local user, who owns every sandbox.
inline constexpr std::string_view local_principal = "local";

// Where the messages one inbound message causes go, and on whose behalf it
// runs. Over stdio everything shares one stream; over HTTP each POST has its own.
struct Peer {
    std::function<void(std::string)> send;
    std::function<void()> finished;  // once no more messages for it will come (may be empty)
    std::string principal;
    std::string scope;  // keeps equal request ids of different clients apart in one Session
    std::shared_ptr<Cancellation> gone;  // fires when the client stops listening: cancels its call
};

// Protocol revisions this server speaks, newest first.
const std::vector<std::string>& supported_versions();

class Session {
public:
    // `send` writes one complete JSON-RPC message (without the newline); it is
    // called on the executor's thread only.
    Session(asio::any_io_executor executor, ServerInfo info, std::vector<Tool> tools, std::function<void(std::string)> send);
    ~Session();

    // Handles one inbound message (one line of stdio): an object, or under
    // 2025-03-26 a batch (array) of them.
    void handle_message(std::string text);
    void handle_message(std::string text, Peer peer);
    // Cancels every request still running and waits (bounded) for them to end.
    asio::awaitable<void> shutdown();
    std::size_t in_flight() const { return in_flight_.size(); }

    // The tool list as sent in tools/list before 2026-07-28 (also used for golden tests);
    // `task_support`: with each tool's execution.taskSupport (2025-11-25).
    std::string tools_json(bool task_support = false) const;
    // Off for HTTP: server-wide log lines name other clients' sandboxes.
    void set_forward_logs(bool forward) { forward_logs_ = forward; }

    // Serves resources/list, resources/templates/list and resources/read (and
    // announces the capability) from `provider`.
    void set_resources(ResourceProvider provider) { resources_ = std::move(provider); }
    // Shares a task store with other Sessions (HTTP: tasks outlive an MCP
    // session and are found by principal). Without one, the Session keeps its
    // own and cancels its tasks on shutdown.
    void set_tasks(std::shared_ptr<TaskStore> store);

private:
    struct Request;
    struct Batch;
    void handle_batch(std::shared_ptr<Request> batch_message);
    void handle_element(std::shared_ptr<Request> request, simdjson::dom::element element);
    bool accept_envelope(Request& request);
    void handle_request(std::shared_ptr<Request> request);
    void handle_stateless_request(std::shared_ptr<Request> request);
    void handle_notification(const Request& request);
    void initialize(const Request& request);
    void discover(const Request& request);
    void list_tools(const Request& request);
    void set_log_level(const Request& request);
    void call_tool(std::shared_ptr<Request> request);
    asio::awaitable<void> run_tool(const Tool* tool, std::shared_ptr<Request> request);
    void listen(std::shared_ptr<Request> request);
    bool handle_resources(std::shared_ptr<Request> request);
    asio::awaitable<void> serve_resources(std::shared_ptr<Request> request);
    // Whether results may carry resource_link content (2025-06-18 and later).
    bool links_allowed(const Request& request) const;
    asio::awaitable<void> hold_subscription(std::shared_ptr<Request> request);
    // Tasks (mcp/tasks.hpp): a call that becomes a task, and tasks/*.
    void start_task(std::shared_ptr<Request> request, const Tool& tool, std::optional<std::int64_t> ttl_ms);
    asio::awaitable<void> answer_task_call(std::shared_ptr<Request> request, std::shared_ptr<Task> task,
                                           std::shared_ptr<bool> outlet);
    void handle_task_request(std::shared_ptr<Request> request);
    asio::awaitable<void> task_result(std::shared_ptr<Request> request, std::shared_ptr<Task> task);
    bool tasks_negotiated() const;
    // Requests of ours to the client (elicitation), answered by its responses. The waits
    // share the table with the Session, not the Session itself: a question may outlive the
    // call that asked it (the egress proxy's) and the Session (a client that leaves).
    struct Outbound;
    struct Outbounds {
        std::map<std::string, std::shared_ptr<Outbound>> pending;  // by scope and serialized id
        std::uint64_t next = 0;
        bool closed = false;  // the Session ended: nothing more is asked
    };
    static asio::awaitable<std::optional<std::string>> ask_client(std::shared_ptr<Outbounds> outbound, asio::any_io_executor executor,
                                                                  std::function<void(std::string)> send, std::string scope,
                                                                  std::string method, std::string params_json,
                                                                  std::chrono::milliseconds timeout);
    // Ends every wait: no answer will come.
    void close_outbound();
    // A response from the client: to the request of ours it answers, if one waits.
    void take_response(const Request& response, simdjson::dom::object message);

    enum class Caching { none, cacheable };
    // `extra_meta`: serialized members for a stateless result's _meta, beside the server's identity.
    void reply(const Request& request, std::string result_json, Caching caching = Caching::none,
               std::string_view extra_meta = {}, std::string_view result_type = "complete");
    void reply_error(const Request& request, int code, std::string_view message, std::string_view data_json = {});
    // Delivers a response, or records that none will come (empty `message`):
    // directly, or into the batch the request came in.
    void settle(const Request& request, std::string message);

    asio::any_io_executor executor_;
    ServerInfo info_;
    std::string server_info_json_;  // the Implementation object that names this server
    std::vector<Tool> tools_;
    std::optional<ResourceProvider> resources_;
    std::shared_ptr<TaskStore> tasks_;
    bool owns_tasks_ = true;
    std::function<void(std::string)> send_;
    std::map<std::string, std::shared_ptr<RequestContext>> in_flight_;  // by serialized id
    bool shutting_down_ = false;
    // Handshake-era state: the agreed revision and the client's log level.
    std::string protocol_version_;
    std::unique_ptr<log::Subscription> log_subscription_;
    bool client_elicits_ = false;  // the client declared form-mode elicitation at initialize
    std::shared_ptr<Outbounds> outbound_ = std::make_shared<Outbounds>();
    bool forward_logs_ = true;
};

// JSON-RPC error codes.
namespace error_code {
inline constexpr int parse_error = -32700;
inline constexpr int invalid_request = -32600;
inline constexpr int method_not_found = -32601;
inline constexpr int invalid_params = -32602;
inline constexpr int internal_error = -32603;
inline constexpr int resource_not_found = -32002;
// 2026-07-28: the request names a revision this server does not serve.
inline constexpr int unsupported_protocol_version = -32022;
// 2026-07-28: the request lacks a client capability (an extension) the method needs.
inline constexpr int missing_client_capability = -32021;
} // namespace error_code

} // namespace cubicle::mcp
