// A sandbox whose workspace is a named volume on disk, made and driven by the server's
// own Manager and Sandbox (what a persistent sandbox will be), for
// tests/integration/test_disk_quota.py: each SCRIPT runs in turn through the agent and
// prints one JSON line, {exit_code, signal, disk_limit, stdout, stderr} or {error}.
//   cubicle-test-disk-sandbox [--pool] IMAGE VOLUME DISK_MB FILES_LIMIT SCRIPT...
// --pool: a warm pool of the same profile (but for the volume) runs meanwhile.
// The volume is the caller's (it makes and removes it); the container and the agent
// volume go with the Manager (destroy_all).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>

#include "common/cancellation.hpp"
#include "common/errors.hpp"
#include "common/json.hpp"
#include "config.hpp"
#include "docker/client.hpp"
#include "docker/endpoint.hpp"
#include "sandbox/languages.hpp"
#include "sandbox/manager.hpp"

namespace asio = boost::asio;
using namespace cubicle;

namespace {

std::string result_line(const sandbox::ExecResult& result) {
    json::Writer w;
    w.begin_object().field("exit_code", result.status.exit_code).field("signal", result.status.signal);
    w.field("disk_limit", result.status.disk_limit).field("stdout", result.stdout_text).field("stderr", result.stderr_text);
    w.end_object();
    return w.take();
}

std::string error_line(const std::string& error) {
    json::Writer w;
    w.begin_object().field("error", error).end_object();
    return w.take();
}

asio::awaitable<void> drive(docker::Client& docker, const Config& config, sandbox::SandboxSpec spec, std::vector<std::string> scripts,
                            bool pool) {
    co_await docker.connect();
    sandbox::Manager manager(co_await asio::this_coro::executor, docker, config);
    if (pool) manager.start_pool();
    std::exception_ptr failure;
    try {
        auto box = co_await manager.create(std::move(spec), "local", false);
        for (auto& script : scripts) {
            auto request = sandbox::shell_command(std::move(script));
            request.timeout_ms = 30000;
            std::string line;
            try {
                sandbox::OutputSink no_sink;
                auto result = co_await box->run(std::move(request), std::move(no_sink), std::make_shared<Cancellation>());
                line = result_line(result);
            } catch (const ToolError& e) {
                line = error_line(e.what());
            }
            std::printf("%s\n", line.c_str());
            std::fflush(stdout);
        }
    } catch (...) {
        failure = std::current_exception();
    }
    co_await manager.destroy_all();
    if (failure) std::rethrow_exception(failure);
}

} // namespace

int main(int argc, char** argv) {
    bool pool = argc > 1 && std::string(argv[1]) == "--pool";
    if (pool) {
        --argc;
        ++argv;
    }
    if (argc < 6) {
        std::fprintf(stderr, "usage: %s [--pool] IMAGE VOLUME DISK_MB FILES_LIMIT SCRIPT...\n", argv[0]);
        return 2;
    }
    sandbox::SandboxSpec spec;
    spec.image = argv[1];
    spec.workspace_volume = argv[2];
    spec.disk_mb = std::atoi(argv[3]);
    spec.files_limit = std::atoi(argv[4]);
    std::vector<std::string> scripts(argv + 5, argv + argc);
    // The pool's profile is the spec's, but for the volume.
    Config config;
    config.pool_size = pool ? 1 : 0;
    config.default_image = spec.image;
    config.disk_mb = spec.disk_mb;
    config.files_limit = spec.files_limit;

    asio::io_context io(1);
    docker::Client docker(io.get_executor(), docker::resolve_endpoint(docker::endpoint_settings(config)));
    int status = 0;
    asio::co_spawn(io, drive(docker, config, std::move(spec), std::move(scripts), pool), [&status](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& error) {
            std::fprintf(stderr, "cubicle-test-disk-sandbox: %s\n", error.what());
        }
        status = 1;
    });
    io.run();
    return status;
}
