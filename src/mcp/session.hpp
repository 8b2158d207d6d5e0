// The MCP protocol: lifecycle, dispatch, in-flight requests, cancellation,
// progress and logging. Knows nothing of Docker; transports feed it lines.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "mcp/tool.hpp"

namespace cubicle::mcp {

namespace asio = boost::asio;

struct ServerInfo {
    std::string name;
    std::string version;
    std::string instructions;
};

// Protocol revisions this server speaks, newest first.
const std::vector<std::string>& supported_versions();

class Session {
public:
    // `send` writes one complete JSON-RPC message (without the newline).
    Session(asio::any_io_executor executor, ServerInfo info, std::vector<Tool> tools, std::function<void(std::string)> send);
    ~Session();

    // Handles one inbound message (one line of stdio).
    void handle_message(std::string text);
    // Cancels every request still running and waits (bounded) for them to end.
    asio::awaitable<void> shutdown();
    std::size_t in_flight() const { return in_flight_.size(); }

    // The tool list as sent in tools/list (also used for golden tests).
    std::string tools_json() const;

private:
    struct Request;
    void handle_request(std::shared_ptr<Request> request);
    void handle_notification(std::shared_ptr<Request> request);
    void call_tool(std::shared_ptr<Request> request);
    asio::awaitable<void> run_tool(const Tool* tool, std::shared_ptr<Request> request);
    void reply(const Request& request, std::string result_json);
    void reply_error(std::string_view id_json, int code, std::string_view message);
    void set_client_log_level(std::string_view level);

    asio::any_io_executor executor_;
    ServerInfo info_;
    std::vector<Tool> tools_;
    std::function<void(std::string)> send_;
    std::map<std::string, std::shared_ptr<RequestContext>> in_flight_;  // by serialized id
    std::string protocol_version_;
};

// JSON-RPC error codes.
namespace error_code {
inline constexpr int parse_error = -32700;
inline constexpr int invalid_request = -32600;
inline constexpr int method_not_found = -32601;
inline constexpr int invalid_params = -32602;
inline constexpr int internal_error = -32603;
} // namespace error_code

} // namespace cubicle::mcp
