// `cubicle doctor`: checks, one line each, everything cubicle needs on this host, with
// the fix for what is wrong. The exit status is 1 when something needed is broken.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/support.hpp"
#include "cli/terminal.hpp"
#include "common/cancellation.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "docker/client.hpp"
#include "image/profiles.hpp"
#include "sandbox/languages.hpp"
#include "mcp/session.hpp"
#include "sandbox/manager.hpp"

namespace cubicle::cli {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

class Report {
public:
    void pass(std::string_view text) { terminal_.line(fmt::format("✓ {}", text)); }
    // `needed`: cubicle cannot work as configured without it (the exit status says so).
    void fail(std::string_view text, std::string_view fix, bool needed = true) {
        terminal_.line(fmt::format("✗ {}{}", text, needed ? "" : " (optional)"));
        terminal_.line(fmt::format("    fix: {}", fix));
        if (needed) ++broken_;
    }
    int status() const { return broken_ ? 1 : 0; }

private:
    Terminal terminal_;
    int broken_ = 0;
};

double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

std::string json_string(const std::string& body, const char* key) {
    json::Document doc;
    std::string_view value;
    if (doc.parse(body) || doc.root()[key].get(value) != simdjson::SUCCESS) return {};
    return std::string(value);
}

// ", TLS with ca.pem, client certificate cert.pem" for doctor's endpoint line.
std::string tls_summary(const docker::Endpoint& endpoint) {
    if (!endpoint.tls.enabled) return {};
    std::string out = endpoint.tls.verify ? fmt::format("; TLS, server checked against {}", endpoint.tls.ca.empty() ? "the system's CAs" : endpoint.tls.ca)
                                          : "; TLS, server certificate NOT checked";
    out += endpoint.tls.cert.empty() ? ", no client certificate" : ", client certificate " + endpoint.tls.cert;
    return out;
}

// The fix for a daemon that cannot be reached, by what went wrong.
std::string connection_fix(std::string_view error) {
    if (error.find("permission denied") != std::string_view::npos) {
        return "add your user to the docker group (sudo usermod -aG docker $USER, then log in again), "
               "or set DOCKER_HOST to a daemon you may use";
    }
    if (error.find("ssh") != std::string_view::npos) {
        return "check that `ssh -o BatchMode=yes HOST docker system dial-stdio` works from this account (host, port, user, key, "
               "docker on the remote PATH)";
    }
    if (error.find("TLS") != std::string_view::npos) {
        return "check DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem) against the daemon's certificates, or the docker context's TLS files";
    }
    return "start Docker (sudo systemctl start docker), or point --docker-host / DOCKER_HOST / DOCKER_CONTEXT at a running daemon";
}

// Reads the sandbox's own cgroup: memory limit (bytes), pids limit, CPU quota (CPUs).
constexpr std::string_view cgroup_script = R"sh(
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  echo v2; cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max; cat /sys/fs/cgroup/cpu.max
else
  echo v1; cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max
  echo "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
fi)sh";

asio::awaitable<void> check_sandbox(Report& report, sandbox::Manager& manager, const Config& config, std::string image) {
    auto started = Clock::now();
    sandbox::SandboxSpec spec;
    spec.image = image;
    std::shared_ptr<sandbox::Sandbox> box;
    try {
        box = co_await manager.create(std::move(spec), std::string(mcp::local_principal), true);
    } catch (const std::exception& e) {
        report.fail(fmt::format("starting a sandbox of {}: {}", image, e.what()), "run with --log-level debug to see each Docker call");
        co_return;
    }
    if (box->uses_agent()) {
        report.pass(fmt::format("sandbox of {} started with its agent in {:.0f} ms", image, ms_since(started)));
    } else {
        report.fail(fmt::format("the agent cannot run in {}: programs fall back to Docker exec", image),
                    "use an x86-64 image (cubicle image build)");
    }
    try {
        auto request = sandbox::shell_command(std::string(cgroup_script));
        request.timeout_ms = 10000;
        auto result = co_await box->run(std::move(request), {}, std::make_shared<Cancellation>());
        std::istringstream lines(result.stdout_text);
        std::string version, memory, pids, quota, period;
        lines >> version >> memory >> pids >> quota >> period;
        // The cgroup holds the hard ceiling (programs, files, the sandbox's own
        // processes); the agent holds the programs to memory_mb.
        auto limits = manager.memory_limits(box->spec());
        auto want_memory = std::to_string(static_cast<std::int64_t>(limits.ceiling_mb) * 1024 * 1024);
        double cpus = quota == "max" || quota == "-1" || period.empty() ? 0 : std::stod(quota) / std::stod(period);
        if (memory == want_memory && pids == std::to_string(config.pids_limit) && std::abs(cpus - config.cpus) < 0.01) {
            report.pass(fmt::format("limits enforced: programs' memory {} MiB (by the agent), {} processes, {:g} CPUs; "
                                    "hard memory ceiling {} MiB with files and the sandbox's own processes (cgroup {})",
                                    limits.programs_mb, config.pids_limit, cpus, limits.ceiling_mb, version));
        } else {
            report.fail(fmt::format("limits not enforced as set: the sandbox's cgroup ({}) says memory {}, pids {}, cpu {} {}", version, memory,
                                    pids, quota, period),
                        "use a daemon whose cgroup controllers (memory, pids, cpu) are enabled");
        }
        // Named, not built inside the co_await expressions: GCC 12 double-frees such temporaries.
        sandbox::OutputSink no_sink;
        sandbox::RunOptions first_options, again_options;
        auto first = Clock::now();
        co_await box->run_cell("python", "print(1)", false, 10000, 1 << 20, no_sink, std::make_shared<Cancellation>(), std::move(first_options));
        auto first_ms = ms_since(first);
        auto again = Clock::now();
        auto round_trip = co_await box->run_cell("python", "print(1)", false, 10000, 1 << 20, no_sink, std::make_shared<Cancellation>(),
                                                 std::move(again_options));
        if (round_trip.stdout_text == "1\n") {
            report.pass(fmt::format("round trip print(1): {:.1f} ms (the first, starting Python: {:.0f} ms)", ms_since(again), first_ms));
        } else {
            report.fail(fmt::format("print(1) printed '{}' ({})", round_trip.stdout_text, round_trip.stderr_text),
                        fmt::format("check that {} has python3 (cubicle image build)", image));
        }
    } catch (const std::exception& e) {
        report.fail(fmt::format("running a program in the sandbox: {}", e.what()), "run with --log-level debug to see each Docker call");
    }
    co_await manager.destroy(box->id());
}

asio::awaitable<int> doctor(CommandLine command_line) {
    const Config& config = command_line.config;
    Report report;
    auto executor = co_await asio::this_coro::executor;
    docker::Endpoint endpoint;
    std::optional<docker::Client> client;
    try {
        endpoint = docker::resolve_endpoint(docker::endpoint_settings(config));
        client.emplace(executor, endpoint);
    } catch (const std::exception& e) {
        report.fail(e.what(), "set --docker-host / DOCKER_HOST to unix:///path/to/docker.sock, tcp://host:port or ssh://[user@]host[:port], "
                              "or DOCKER_CONTEXT to an existing docker context");
        co_return report.status();
    }
    docker::Client& docker = *client;
    auto where = fmt::format("Docker endpoint {} ({}), from {}{}", endpoint.describe(), endpoint.kind_name(), endpoint.source, tls_summary(endpoint));
    if (endpoint.kind == docker::Endpoint::Kind::tcp && !endpoint.tls.enabled && endpoint.port == "2376") {
        report.fail("plain tcp to port 2376, Docker's TLS port", "set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH (or --docker-tls-verify) if the daemon expects TLS",
                    false);
    }
    try {
        co_await docker.connect();
        report.pass(fmt::format("{}: reachable, {}, Engine API {}", where, docker.engine().describe(), docker.api_version()));
    } catch (const std::exception& e) {
        report.fail(fmt::format("{}: {}", where, e.what()), connection_fix(e.what()));
        co_return report.status();
    }
    docker::DaemonInfo info;
    std::string default_runtime;
    try {
        auto raw = co_await docker.request("GET", "/info");
        if (raw.status >= 400) throw docker::Error(raw.status, fmt::format("HTTP {}", raw.status));
        info = docker::parse_daemon_info(raw.body);
        default_runtime = json_string(raw.body, "DefaultRuntime");
        report.pass("permission to use the Docker API");
    } catch (const std::exception& e) {
        report.fail(fmt::format("reading the daemon's /info: {}", e.what()), connection_fix(e.what()));
        co_return report.status();
    }

    bool default_present = false;
    auto suite = image::host_suite();
    for (const auto& profile : image::profiles()) {
        bool is_default = image::find_profile(config.default_image) == &profile;
        auto present = co_await docker.inspect_image(profile.image);
        auto what = fmt::format("image {}{}", profile.image, is_default ? " (the default)" : "");
        if (!present) {
            report.fail(what + ": not built", fmt::format("cubicle image build {}", profile.name), is_default);
        } else if (present->labels[std::string(image::recipe_label)] != image::recipe_digest(profile, suite)) {
            report.fail(fmt::format("{}: present ({} MB) but built from an older recipe", what, present->size / 1000000),
                        fmt::format("cubicle image build {}", profile.name), false);
        } else {
            report.pass(fmt::format("{}: current, {} MB", what, present->size / 1000000));
        }
        default_present = default_present || (is_default && present);
    }
    if (!image::find_profile(config.default_image)) {
        default_present = (co_await docker.inspect_image(config.default_image)).has_value();
        if (default_present) report.pass(fmt::format("default image {} present", config.default_image));
        else report.fail(fmt::format("default image {} is not on this host", config.default_image), "pull or build it, or drop --default-image");
    }

    // The engine's own runtime first; Podman lists runtimes it merely knows a path for.
    const auto& engine = docker.engine();
    if (!engine.default_runtime.empty()) default_runtime = engine.default_runtime;
    std::string runtimes = default_runtime + " (default)";
    for (const auto& runtime : info.runtimes) {
        if (runtime != default_runtime) runtimes += ", " + runtime;
    }
    report.pass(fmt::format("{}: container runtimes {}{}", engine.describe(), runtimes,
                            engine.runtime_per_container() ? "" : " (Podman uses only its service's runtime)"));
    if (!config.runtime.empty()) {
        if (engine.offers(config.runtime)) report.pass(fmt::format("--runtime {}: offered by the engine", config.runtime));
        else report.fail(fmt::format("--runtime {} cannot be used: {}", config.runtime, engine.why_not(config.runtime)),
                         "pick a runtime the engine offers, or drop --runtime");
    }
    if (engine.offers("runsc")) {
        report.pass(docker::is_gvisor(config.runtime) ? "gVisor (runsc) is in use"
                                                      : "gVisor (runsc) is available: --runtime runsc gives a stronger boundary");
    } else {
        report.fail("gVisor (runsc) is not usable: sandboxes share the host kernel", engine.why_not("runsc"), false);
    }
    if (info.nvidia_runtime()) report.pass("NVIDIA runtime: initialize_sandbox {gpu: true} works");
    else report.fail("no NVIDIA runtime: gpu: true is refused", "install the NVIDIA Container Toolkit if sandboxes need GPUs", false);

    if (default_present) {
        Config probe = config;
        probe.pool_size = 0;
        sandbox::Manager manager(executor, docker, probe);
        co_await check_sandbox(report, manager, probe, config.default_image);
        co_await manager.destroy_all();
    } else {
        report.fail("no sandbox started: the default image is missing", "cubicle image build");
    }
    co_return report.status();
}

} // namespace

int doctor_command(int argc, char** argv) {
    try {
        auto command_line = parse_command_line(argc, argv, {});
        if (command_line.help || !command_line.words.empty()) {
            std::fputs("usage: cubicle doctor [server options]\n\nChecks that cubicle can run sandboxes here, one line per check with "
                       "the fix for what is wrong;\nexits 1 when something it needs is broken.\n",
                       command_line.help ? stdout : stderr);
            return command_line.help ? 0 : 2;
        }
        log::set_stderr_level(*log::parse_level(command_line.config.log_level));
        return run(doctor, std::move(command_line));
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }
}

} // namespace cubicle::cli
