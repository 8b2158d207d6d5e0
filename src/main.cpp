// cubicle: an MCP server (stdio or streamable HTTP) that runs code in locked-down Docker sandboxes.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "auth/authenticator.hpp"
#include "auth/quotas.hpp"
#include "cli/commands.hpp"
#include "common/listen_fds.hpp"
#include "common/log.hpp"
#include "config.hpp"
#include "docker/client.hpp"
#include "mcp/http.hpp"
#include "mcp/session.hpp"
#include "mcp/tasks.hpp"
#include "mcp/stdio.hpp"
#include "sandbox/manager.hpp"
#include "sandbox/metrics.hpp"
#include "sandbox/secret_tls.hpp"
#include "tools/tools.hpp"

namespace asio = boost::asio;
using namespace cubicle;

namespace {

constexpr std::string_view instructions =
    "cubicle runs code in disposable, locked-down Linux sandboxes (Docker containers without network, "
    "capabilities or root). Use execute_code for a one-off run, or initialize_sandbox first to keep files "
    "and installed state between calls, then stop_sandbox when done.";

// A daemon that is down at start is asked again, less and less often, until it answers.
constexpr auto start_up_first_retry = std::chrono::milliseconds(500);
constexpr auto start_up_longest_retry = std::chrono::seconds(5);
// Shutdown ends by then whatever the daemon does; what is not removed yet is
// removed by the next cubicle's orphan sweep (this process is then provably gone).
constexpr auto shutdown_deadline = std::chrono::seconds(4);

// Blocks from this size up are mmap'd and go back to the system when freed. glibc's
// default threshold slides up to the largest block freed so far: after the first
// sandbox start frees its 1.2 MB agent archive, every later archive (and each
// sandbox's 64 KiB read buffer) lands in the heap, and a burst of concurrent starts
// left it tens of MB large for good (HTTP server: 9 MB idle, 42 MB after 50 starts).
// Setting the threshold also stops it from sliding.
constexpr int mmap_threshold = 64 << 10;

// `transport` names how clients reach this server, for the startup line.
// SIGHUP, each time it comes: `reload` re-reads the operator's files.
void on_every_hangup(asio::signal_set& hangup, std::function<void()> reload) {
    hangup.async_wait([&hangup, reload = std::move(reload)](const boost::system::error_code& ec, int) mutable {
        if (ec) return;
        reload();
        on_every_hangup(hangup, std::move(reload));
    });
}

asio::awaitable<void> start_up(docker::Client& docker, sandbox::Manager& manager, std::string transport) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (std::chrono::milliseconds delay = start_up_first_retry; !manager.closed();
         delay = std::min<std::chrono::milliseconds>(delay * 2, start_up_longest_retry)) {
        bool retried = delay != start_up_first_retry;
        try {
            co_await docker.connect();
            manager.set_daemon_info(co_await docker.info());
            bool image_present = co_await manager.check_default_image();
            // The pool first: a client's first call waits for its first sandbox (Manager::create).
            if (image_present) manager.start_pool();
            manager.start_up_attempted();
            log::info("cubicle {} serving on {}; {} at {} ({}, API {}); default image {} ({}); warm pool of {}", CUBICLE_VERSION, transport,
                      docker.engine().describe(), docker.endpoint().describe(), docker.endpoint().source, docker.api_version(), manager.default_image(), image_present ? "present" : "missing",
                      image_present ? manager.pool_size() : 0);
            co_await manager.remove_orphans();
            asio::co_spawn(co_await asio::this_coro::executor, manager.sweep_orphans(), asio::detached);
            asio::co_spawn(co_await asio::this_coro::executor, manager.watch_lifetimes(), asio::detached);
            asio::co_spawn(co_await asio::this_coro::executor, manager.copy_workspaces(), asio::detached);
            asio::co_spawn(co_await asio::this_coro::executor, manager.watch_placement(), asio::detached);
            if (retried) log::info("the Docker daemon answers now: start-up complete");
            co_return;
        } catch (const std::exception& e) {
            manager.start_up_attempted(std::current_exception());
            // Keep serving: every tool call explains the problem to the client meanwhile.
            if (retried) {
                log::debug("{}", e.what());
            } else {
                log::error("{} (retrying in the background)", e.what());
            }
        }
        timer.expires_after(delay);
        co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<void> shut_down(mcp::Session& session, sandbox::Manager& manager) {
    using namespace asio::experimental::awaitable_operators;
    // Both at once: requests end as their sandboxes go.
    auto cancel_requests = session.shutdown();
    auto remove_sandboxes = manager.destroy_all();
    co_await (std::move(cancel_requests) && std::move(remove_sandboxes));
}

// ---- the HTTP transport ------------------------------------------------------

asio::awaitable<void> shut_down_http(mcp::HttpServer& server, sandbox::Manager& manager) {
    co_await server.shutdown();
    try {
        co_await manager.destroy_all();
    } catch (const std::exception& e) {
        log::error("removing sandboxes at exit: {}", e.what());
    }
}

// Serves streamable HTTP until SIGINT or SIGTERM; SIGHUP re-reads the token file.
// Returns the exit status.
int serve_http(asio::io_context& io, const Config& config, docker::Client& docker, sandbox::Manager& manager) {
    // Socket activation (cubicle.socket): the listening socket and its address come from systemd.
    std::optional<systemd::ListenSocket> activated;
    std::unique_ptr<auth::Authenticator> authenticator;
    try {
        activated = systemd::take_listen_socket();
        authenticator = std::make_unique<auth::Authenticator>(auth::AuthSettings{
            .tokens_file = config.auth_tokens,
            .jwt = {.jwks_file = config.jwks_file, .issuer = config.jwt_issuer, .audience = config.jwt_audience}});
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }
    const std::string& host = activated ? activated->address : config.host;
    if (!authenticator->enabled() && !mcp::is_loopback_host(host)) {
        if (!config.insecure_no_auth) {
            std::fprintf(stderr,
                         "cubicle: refusing to serve %s without authentication: give --auth-tokens or --jwks-file, or --insecure-no-auth "
                         "when an authenticating proxy stands in front\n",
                         host.c_str());
            return 2;
        }
        log::warning("serving {} WITHOUT authentication (--insecure-no-auth): anyone who reaches it can run code", host);
    }
    manager.set_sandboxes_per_owner(static_cast<std::size_t>(config.client_max_sandboxes));
    auto metrics = std::make_shared<mcp::Metrics>();
    auto quotas = std::make_shared<auth::Quotas>(auth::QuotaSettings{config.client_calls_per_minute, config.client_max_executions});
    auto services = tools::sandbox_services(manager, docker, config);
    auto tools = mcp::metered_tools(std::move(services.tools), quotas, metrics);
    auto tasks = std::make_shared<mcp::TaskStore>(io.get_executor());  // shared: a task is its principal's, not its session's
    auto make_session = [&io, tools, tasks, resources = std::move(services.resources)] {
        auto session = std::make_unique<mcp::Session>(io.get_executor(), mcp::ServerInfo{"cubicle", CUBICLE_VERSION, std::string(instructions)},
                                                      tools, [](std::string) {});
        session->set_forward_logs(false);
        session->set_tasks(tasks);
        session->set_resources(resources);
        return session;
    };
    mcp::HttpAuth http_auth;
    if (authenticator->enabled()) {
        http_auth.authenticate = [&authenticator](std::string_view header) { return authenticator->authenticate(header); };
        http_auth.challenge = authenticator->challenge();
    }
    mcp::HttpSettings settings{.host = host,
                               .port = activated ? activated->port : static_cast<unsigned short>(config.port),
                               .listen_fd = activated ? activated->fd : -1,
                               .path = config.http_path,
                               .allow_origins = config.allow_origins,
                               .allow_hosts = config.allow_hosts,
                               .max_body_bytes = static_cast<std::size_t>(config.http_max_body_mb) << 20,
                               .max_connections = static_cast<std::size_t>(config.http_max_connections),
                               .header_timeout = std::chrono::seconds(config.http_header_timeout_s),
                               .session_idle = std::chrono::seconds(config.http_session_idle_s),
                               .drain = std::chrono::seconds(config.drain_s),
                               .tls_cert = config.tls_cert,
                               .tls_key = config.tls_key,
                               .resource_metadata = authenticator->resource_metadata()};
    auto sandbox_metrics = [&manager] { return sandbox::prometheus_text(manager.live(), manager.pool_stats(), manager.pool_memory()); };
    mcp::HttpServer server(io.get_executor(), settings, make_session, http_auth, metrics, sandbox_metrics);
    server.set_preview(tools::preview_opener(manager));
    try {
        server.start();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }

    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int signal_number) {
        if (ec) return;
        log::info("signal {}: draining, removing sandboxes and exiting", signal_number);
        asio::co_spawn(io, shut_down_http(server, manager), [&io](std::exception_ptr) { io.stop(); });
    });
    asio::signal_set hangup(io, SIGHUP);
    on_every_hangup(hangup, [&] {
        authenticator->reload();
        manager.egress().reload_secrets();
    });
    manager.start_up_begins();
    asio::co_spawn(io, start_up(docker, manager, "streamable HTTP"), asio::detached);
    io.run();
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    std::signal(SIGPIPE, SIG_IGN);
    mallopt(M_MMAP_THRESHOLD, mmap_threshold);
    // Subcommands; serving on stdio is the default.
    if (argc > 1 && argv[1] == std::string_view("image")) return cli::image_command(argc - 1, argv + 1);
    if (argc > 1 && argv[1] == std::string_view("doctor")) return cli::doctor_command(argc - 1, argv + 1);
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
        endpoint = docker::resolve_endpoint(docker::endpoint_settings(config));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }

    asio::io_context io(1);
    std::chrono::milliseconds step = std::chrono::seconds(config.docker_timeout_s);
    docker::Deadlines deadlines{.connect = std::min<std::chrono::milliseconds>(step, docker::Deadlines{}.connect), .step = step};
    std::optional<docker::Client> client;
    try {
        client.emplace(io.get_executor(), endpoint, deadlines);
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }
    docker::Client& docker = *client;
    sandbox::Manager manager(io.get_executor(), docker, config);
    try {
        sandbox::Secrets secrets(config.secrets_file);
        // The proxy needs a trust store only when it may have to verify a secret's host.
        auto trust = secrets.empty() ? std::vector<std::string>{} : sandbox::upstream_trust(config.test_upstream_ca);
        manager.egress().set_secrets(std::move(secrets), std::move(trust));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }
    if (config.transport == "http") return serve_http(io, config, docker, manager);
    mcp::StdioTransport transport(io.get_executor(), STDIN_FILENO, STDOUT_FILENO);
    auto services = tools::sandbox_services(manager, docker, config);
    mcp::Session session(io.get_executor(), {"cubicle", CUBICLE_VERSION, std::string(instructions)},
                         std::move(services.tools), [&transport](std::string message) { transport.send(std::move(message)); });
    session.set_resources(std::move(services.resources));

    asio::signal_set signals(io, SIGINT, SIGTERM);
    // SIGHUP re-reads the --secrets file.
    asio::signal_set hangup(io, SIGHUP);
    on_every_hangup(hangup, [&] { manager.egress().reload_secrets(); });
    asio::steady_timer deadline(io);
    bool stopping = false;
    bool gave_up = false;
    auto stop = [&] {
        if (stopping) return;
        stopping = true;
        signals.cancel();
        hangup.cancel();
        deadline.expires_after(shutdown_deadline);
        deadline.async_wait([&](const boost::system::error_code& ec) {
            if (ec) return;
            log::warning("stopping took longer than {} s; leaving what is left to the next cubicle's orphan sweep",
                         std::chrono::duration_cast<std::chrono::seconds>(shutdown_deadline).count());
            gave_up = true;
            io.stop();
        });
        asio::co_spawn(io, shut_down(session, manager), [&](std::exception_ptr) {
            deadline.cancel();
            io.stop();
        });
    };
    signals.async_wait([&](const boost::system::error_code& ec, int signal_number) {
        if (ec) return;
        log::info("signal {}: removing sandboxes and exiting", signal_number);
        stop();
    });
    manager.start_up_begins();
    asio::co_spawn(io, start_up(docker, manager, "stdio"), asio::detached);
    transport.start([&](std::string line) { if (!stopping) session.handle_message(std::move(line)); },
                    [&] {
                        log::debug("stdin closed: removing sandboxes and exiting");
                        stop();
                    });
    io.run();
    transport.flush_and_stop();
    // Work cut short still refers to the objects above: end without unwinding it.
    if (gave_up) std::_Exit(0);
    return 0;
}
