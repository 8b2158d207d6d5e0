// expose_port and unexpose_port: a sandbox's servers seen from this machine
// through its agent (sandbox/previews.hpp), the sandbox itself keeping no network.
#include <fmt/format.h>

#include "common/json.hpp"
#include "mcp/http.hpp"
#include "mcp/preview_http.hpp"
#include "sandbox/previews.hpp"
#include "tools/args.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;

unsigned short port_argument(const Args& args) {
    auto port = args.integer("port", 1, 65535);
    if (!port) throw ToolError("argument 'port' is required: the port a program in the sandbox listens on (1-65535)");
    return static_cast<unsigned short>(*port);
}

asio::awaitable<ToolResult> expose_port(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "port"});
    auto id = args.required_string("sandbox_id");
    auto box = env.manager.get(id, context->principal());
    auto port = port_argument(args);
    if (auto refusal = box->relay_refusal(); !refusal.empty()) throw ToolError(refusal);
    // Over HTTP the authenticated preview path serves it; a loopback listener, which
    // every local user reaches, only if the operator asks (over stdio it is the only way).
    bool http = env.config.transport == "http";
    bool listen = !http || env.config.preview_listeners;
    auto host_port = box->previews().expose(box, port, static_cast<std::size_t>(env.config.max_exposed_ports), listen);
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("port", static_cast<std::int64_t>(port));
    if (host_port != 0) {
        w.field("host_port", static_cast<std::int64_t>(host_port));
        w.field("url", fmt::format("http://127.0.0.1:{}/", host_port));
    }
    if (http) w.field("preview_path", mcp::preview_path(env.config.http_path, id, port));
    w.end_object();
    co_return structured(w.take());
}

asio::awaitable<ToolResult> unexpose_port(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "port"});
    auto id = args.required_string("sandbox_id");
    auto box = env.manager.get(id, context->principal());
    auto port = port_argument(args);
    bool closed = box->previews().unexpose(port);
    json::Writer w;
    w.begin_object().field("sandbox_id", id).field("port", static_cast<std::int64_t>(port)).field("closed", closed).end_object();
    co_return structured(w.take());
}

// An exposed port's stream, as the HTTP transport proxies it.
class SandboxPreviewStream : public mcp::PreviewStream {
public:
    explicit SandboxPreviewStream(std::shared_ptr<sandbox::AgentStream> stream) : stream_(std::move(stream)) {}
    asio::awaitable<std::size_t> read_some(char* data, std::size_t size) override { return stream_->read_some(data, size); }
    asio::awaitable<bool> write(std::string_view data) override { return stream_->write(data); }

private:
    std::shared_ptr<sandbox::AgentStream> stream_;
};

asio::awaitable<std::unique_ptr<mcp::PreviewStream>> open_preview(sandbox::Manager* manager, std::string principal,
                                                                 std::string sandbox_id, unsigned short port) {
    std::shared_ptr<sandbox::Sandbox> box;
    try {
        box = manager->get(sandbox_id, principal);
    } catch (const ToolError&) {
        co_return nullptr;  // not theirs, or none
    }
    if (!box->previews().exposed().contains(port)) co_return nullptr;
    auto stream = co_await box->open_stream(port);
    co_return std::make_unique<SandboxPreviewStream>(std::move(stream));
}

} // namespace

mcp::PreviewOpener preview_opener(sandbox::Manager& manager) {
    // Not a coroutine itself: it forwards to one, so nothing it captures dangles.
    return [manager = &manager](std::string principal, std::string sandbox_id, unsigned short port) {
        return open_preview(manager, std::move(principal), std::move(sandbox_id), port);
    };
}

Handlers preview_handlers(Env env) {
    return {{"expose_port", bind<expose_port>(env)}, {"unexpose_port", bind<unexpose_port>(env)}};
}

} // namespace cubicle::tools
