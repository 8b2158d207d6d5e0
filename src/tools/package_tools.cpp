// Package installation: install_package, and installing a workspace's
// requirements.txt / package.json before code runs when it has changed.
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/this_coro.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "sandbox/languages.hpp"
#include "tools/args.hpp"
#include "tools/progress.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;
using mcp::ToolResult;
using sandbox::Sandbox;

constexpr std::size_t output_tail = 4000;

std::string tail(std::string_view text) {
    if (text.size() > output_tail) text = text.substr(text.size() - output_tail);
    return json::sanitize_utf8(text);
}

void require_network(const Sandbox& box, std::string_view what) {
    if (box.spec().network) return;
    throw ToolError(fmt::format("{} needs network access, and sandbox {} has none. Create a sandbox with "
                                "initialize_sandbox {{\"network\": true}} (the server must be started with --allow-network), "
                                "or upload the packages' files instead.",
                                what, box.id()));
}

// The installer command for `manager` ("pip" or "npm"); packages are appended.
sandbox::agent::RunRequest installer(std::string_view manager) {
    sandbox::agent::RunRequest request;
    if (manager == "pip") {
        // Into the sandbox user's site (/workspace/.local): the root filesystem is read-only.
        request.argv = {"python3", "-m", "pip", "install", "--user", "--no-input", "--disable-pip-version-check",
                        "--progress-bar", "off"};
        request.env = {"PIP_BREAK_SYSTEM_PACKAGES=1"};
    } else {
        request.argv = {"npm", "install", "--no-fund", "--no-audit", "--no-update-notifier"};
    }
    return request;
}

struct InstallOutcome {
    int exit_code;
    std::string stdout_text, stderr_text;
    bool timed_out;
};

asio::awaitable<InstallOutcome> run_installer(Env env, std::shared_ptr<Sandbox> box, sandbox::agent::RunRequest request, Context context) {
    request.timeout_ms = static_cast<std::uint64_t>(env.config.max_timeout_s) * 1000;
    // Kept in memory for the result's tail: installers say little that matters past this.
    request.max_output_bytes = std::min<std::uint64_t>(env.config.max_output_bytes, 1 << 20);
    auto executor = co_await asio::this_coro::executor;
    auto progress = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
    auto sink = progress->sink();
    auto result = co_await box->run(std::move(request), std::move(sink), context->cancellation());
    progress->close();
    int code = result.status.signal ? 128 + result.status.signal : result.status.exit_code;
    co_return InstallOutcome{code, std::move(result.stdout_text), std::move(result.stderr_text), result.status.timed_out};
}

asio::awaitable<ToolResult> install_package(Env env, simdjson::dom::element arguments, Context context) {
    Args args(arguments, {"sandbox_id", "packages", "manager"});
    auto box = env.manager.get(args.required_string("sandbox_id"), context->principal());
    auto packages = args.strings("packages");
    if (!packages) throw ToolError("argument 'packages' is required: a list of package names");
    auto manager = args.string("manager").value_or("pip");
    if (manager != "pip" && manager != "npm") throw ToolError(fmt::format("manager must be pip or npm, not '{}'", manager));
    for (const auto& package : *packages) {
        // A leading '-' would be read as an installer option.
        if (package.empty() || package.front() == '-' || package.size() > 200 ||
            package.find_first_of(std::string_view(" \t\n\r\0", 5)) != std::string::npos) {
            throw ToolError(fmt::format("'{}' is not a package name", json::sanitize_utf8(package)));
        }
    }
    require_network(*box, "Installing packages");
    auto request = installer(manager);
    for (const auto& package : *packages) request.argv.push_back(package);
    auto outcome = co_await run_installer(env, box, std::move(request), context);
    json::Writer w;
    w.begin_object().field("manager", manager).key("packages").begin_array();
    for (const auto& package : *packages) w.value(package);
    w.end_array().field("installed", outcome.exit_code == 0).field("exit_code", outcome.exit_code);
    w.field("stdout", tail(outcome.stdout_text)).field("stderr", tail(outcome.stderr_text)).end_object();
    ToolResult result = structured(w.take());
    if (outcome.exit_code != 0) {
        result.is_error = true;
        result.text = fmt::format("{} install failed (exit code {}{}):\n{}", manager, outcome.exit_code,
                                  outcome.timed_out ? ", timed out" : "", tail(outcome.stderr_text + outcome.stdout_text));
    }
    co_return result;
}

} // namespace

asio::awaitable<void> install_workspace_dependencies(Env env, std::shared_ptr<Sandbox> box, Context context) {
    if (!box->auto_install() || !box->spec().network) co_return;
    // A cheap fingerprint of the dependency files; unchanged means nothing to do.
    auto probe = sandbox::shell_command(
        R"SH(for f in requirements.txt package.json; do [ -f "$f" ] && printf '%s:%s;' "$f" "$(cksum < "$f")"; done; true)SH");
    probe.timeout_ms = 30'000;
    probe.max_output_bytes = 4096;
    sandbox::OutputSink no_sink;
    auto fingerprint = (co_await box->run(std::move(probe), std::move(no_sink), nullptr)).stdout_text;
    if (fingerprint == box->dependencies_fingerprint()) co_return;
    auto executor = co_await asio::this_coro::executor;
    auto progress = std::make_shared<ProgressStream>(context, executor, env.config.progress_max_bytes);
    if (fingerprint.find("requirements.txt:") != std::string::npos) {
        progress->note("requirements.txt changed: installing it with pip");
        auto request = installer("pip");
        request.argv.insert(request.argv.end(), {"-r", "requirements.txt"});
        auto outcome = co_await run_installer(env, box, std::move(request), context);
        if (outcome.exit_code != 0) {
            throw ToolError(fmt::format("installing requirements.txt failed (exit code {}); fix it or pass auto_install: false:\n{}",
                                        outcome.exit_code, tail(outcome.stderr_text + outcome.stdout_text)));
        }
    }
    if (fingerprint.find("package.json:") != std::string::npos) {
        progress->note("package.json changed: installing it with npm");
        auto outcome = co_await run_installer(env, box, installer("npm"), context);
        if (outcome.exit_code != 0) {
            throw ToolError(fmt::format("installing package.json failed (exit code {}); fix it or pass auto_install: false:\n{}",
                                        outcome.exit_code, tail(outcome.stderr_text + outcome.stdout_text)));
        }
    }
    box->set_dependencies_fingerprint(std::move(fingerprint));
}

Handlers package_handlers(Env env) { return {{"install_package", bind<install_package>(env)}}; }

} // namespace cubicle::tools
