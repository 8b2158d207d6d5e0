// cubicle: an MCP stdio server that runs code in locked-down Docker sandboxes.
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/log.hpp"
#include "config.hpp"
#include "docker/client.hpp"
#include "mcp/session.hpp"
#include "mcp/stdio.hpp"
#include "sandbox/manager.hpp"
#include "tools/tools.hpp"

namespace asio = boost::asio;
using namespace cubicle;

namespace {

constexpr std::string_view instructions =
    "cubicle runs code in disposable, locked-down Linux sandboxes (Docker containers without network, "
    "capabilities or root). Use execute_code for a one-off run, or initialize_sandbox first to keep files "
    "and installed state between calls, then stop_sandbox when done.";

asio::awaitable<void> start_up(docker::Client& docker, sandbox::Manager& manager) {
    try {
        co_await docker.connect();
        log::debug("Docker Engine API {}", docker.api_version());
        manager.set_daemon_info(co_await docker.info());
        co_await manager.remove_orphans();
        manager.start_pool();
        asio::co_spawn(co_await asio::this_coro::executor, manager.sweep_orphans(), asio::detached);
    } catch (const std::exception& e) {
        // Keep serving: every tool call will explain the problem to the client.
        log::error("{}", e.what());
    }
}

asio::awaitable<void> shut_down(mcp::Session& session, sandbox::Manager& manager) {
    co_await session.shutdown();
    try {
        co_await manager.destroy_all();
    } catch (const std::exception& e) {
        log::error("removing sandboxes at exit: {}", e.what());
    }
}

} // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);
    ParsedArgs parsed;
    try {
        parsed = parse_args(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }
    if (parsed.show_help) {
        std::fputs(usage().c_str(), stdout);
        return 0;
    }
    if (parsed.show_version) {
        std::puts("cubicle " CUBICLE_VERSION);
        return 0;
    }
    const Config& config = parsed.config;
    log::set_stderr_level(*log::parse_level(config.log_level));

    docker::Endpoint endpoint;
    try {
        endpoint = docker::parse_docker_host(config.docker_host);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }

    asio::io_context io(1);
    docker::Client docker(io.get_executor(), endpoint);
    sandbox::Manager manager(io.get_executor(), docker, config);
    mcp::StdioTransport transport(io.get_executor(), STDIN_FILENO, STDOUT_FILENO);
    mcp::Session session(io.get_executor(), {"cubicle", CUBICLE_VERSION, std::string(instructions)},
                         tools::sandbox_tools(manager, docker, config), [&transport](std::string message) { transport.send(std::move(message)); });

    asio::signal_set signals(io, SIGINT, SIGTERM);
    bool stopping = false;
    auto stop = [&] {
        if (stopping) return;
        stopping = true;
        signals.cancel();
        asio::co_spawn(io, shut_down(session, manager), [&io](std::exception_ptr) { io.stop(); });
    };
    signals.async_wait([&](const boost::system::error_code& ec, int signal_number) {
        if (ec) return;
        log::info("signal {}: removing sandboxes and exiting", signal_number);
        stop();
    });
    asio::co_spawn(io, start_up(docker, manager), asio::detached);
    transport.start([&](std::string line) { if (!stopping) session.handle_message(std::move(line)); },
                    [&] {
                        log::debug("stdin closed: removing sandboxes and exiting");
                        stop();
                    });
    io.run();
    transport.flush_and_stop();
    return 0;
}
