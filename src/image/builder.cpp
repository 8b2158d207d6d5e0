#include "image/builder.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/process/v2/environment.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <fmt/format.h>

#include "common/cancellation.hpp"
#include "common/child_fds.hpp"
#include "image/recipe.hpp"
#include "mcp/session.hpp"
#include "sandbox/languages.hpp"

namespace cubicle::image {
namespace {

namespace bp = boost::process::v2;
using asio::use_awaitable;
constexpr auto use_tuple = asio::as_tuple(use_awaitable);

constexpr std::string_view merged_usr_hooks = "/usr/share/mmdebstrap/hooks/maybe-merged-usr";

std::string shell_quote(std::string_view text) {
    std::string out = "'";
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

std::string join(const std::vector<std::string>& items, std::string_view separator) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : std::string(separator)) + item;
    return out;
}

bool has_entries(const std::filesystem::path& file) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
        auto start = line.find_first_not_of(" \t");
        if (start == std::string::npos) continue;
        std::string_view text = std::string_view(line).substr(start);
        if (text.starts_with("deb ") || text.starts_with("deb\t") || text.starts_with("URIs:")) return true;
    }
    return false;
}

// This machine's own apt sources, passed to mmdebstrap as they are (it reads .list
// and .sources files): no mirror is ever named here.
std::vector<std::string> apt_sources() {
    std::vector<std::string> files;
    std::error_code ec;
    if (has_entries("/etc/apt/sources.list")) files.push_back("/etc/apt/sources.list");
    std::vector<std::string> parts;
    for (const auto& entry : std::filesystem::directory_iterator("/etc/apt/sources.list.d", ec)) {
        auto path = entry.path();
        if ((path.extension() == ".list" || path.extension() == ".sources") && has_entries(path)) parts.push_back(path.string());
    }
    std::sort(parts.begin(), parts.end());
    files.insert(files.end(), parts.begin(), parts.end());
    if (files.empty()) throw std::runtime_error("this machine has no apt sources (/etc/apt/sources.list or /etc/apt/sources.list.d/): images are built from them");
    return files;
}

std::vector<std::string> mmdebstrap_arguments(const Profile& profile, const std::string& suite) {
    std::vector<std::string> args{"--variant=minbase", "--format=tar", "--include=" + join(profile.packages, ",")};
    // Merged /usr the debootstrap way, instead of the usrmerge package (and the perl it needs).
    if (std::filesystem::is_directory(merged_usr_hooks)) args.push_back(fmt::format("--hook-dir={}", merged_usr_hooks));
    for (auto option : dpkg_excludes()) args.push_back(fmt::format("--dpkgopt={}", option));
    // With manuals excluded, postinst scripts that register man pages (OpenJDK's update-alternatives) fail.
    args.push_back("--essential-hook=mkdir -p \"$1/usr/share/man/man1\"");
    // Hooks run on this machine with "$1" the new root.
    if (!profile.binary.empty()) {
        // Exactly the running binary (the one the recipe digest was taken of), even if the
        // file it was started from has been replaced since.
        args.push_back(fmt::format("--customize-hook=install -D -m 0755 /proc/{}/exe \"$1\"{}", ::getpid(), shell_quote(profile.binary)));
    }
    for (const auto& command : finishing_commands(profile, "\"$1\"", "chroot \"$1\" ")) args.push_back("--customize-hook=" + command);
    args.push_back(suite);
    args.push_back("-");  // the tarball on stdout
    for (auto& source : apt_sources()) args.push_back(std::move(source));
    return args;
}

// What mmdebstrap says on stderr: its "I:" lines are the steps of the build, the rest
// (apt's and dpkg's lines) shows what it is doing now; the last lines explain a failure.
struct BuildLog {
    std::shared_ptr<BuildOutput> output;
    std::deque<std::string> tail;
    bool done = false;

    void add(std::string line) {
        if (line.empty()) return;
        if (line.starts_with("I: ")) output->line("  " + line.substr(3));
        else output->status("  " + line);
        tail.push_back(std::move(line));
        if (tail.size() > 25) tail.pop_front();
    }
    std::string last_lines() const {
        std::string out;
        for (const auto& line : tail) out += "\n  " + line;
        return out;
    }
};

asio::awaitable<void> read_log(std::shared_ptr<asio::readable_pipe> pipe, std::shared_ptr<BuildLog> build_log) {
    std::string pending;
    char buffer[4096];
    for (;;) {
        auto [ec, n] = co_await pipe->async_read_some(asio::buffer(buffer), use_tuple);
        if (ec) break;
        pending.append(buffer, n);
        for (std::size_t end; (end = pending.find_first_of("\r\n")) != std::string::npos; pending.erase(0, end + 1)) {
            build_log->add(pending.substr(0, end));
        }
    }
    build_log->add(std::move(pending));
    build_log->done = true;
}

// The write ends of the stdout/stderr pipes would stay open in mmdebstrap
// (common/child_fds.hpp); its own descriptors then land above 9, and the shell it
// starts apt through fails with "Bad fd number".
struct CloseInheritedDescriptors {
    template <typename Launcher>
    bp::error_code on_exec_setup(Launcher&, const bp::filesystem::path&, const char* const*) {
        close_inherited_descriptors();
        return {};
    }
};

// mmdebstrap's tarball as the body of the image import. At its end the process must
// have succeeded: otherwise the import is abandoned (the daemon sees the body cut off
// and makes no image).
class Mmdebstrap final : public docker::ByteSource {
public:
    Mmdebstrap(asio::any_io_executor executor, std::string image, std::shared_ptr<BuildLog> log)
        : executor_(executor), image_(std::move(image)), out_(executor), err_(std::make_shared<asio::readable_pipe>(executor)),
          log_(std::move(log)) {}

    ~Mmdebstrap() override {
        // Abandoned half-way (the import failed): stop it, so that it cleans up after itself.
        if (process_ && !exited_) ::kill(process_->id(), SIGTERM);
    }

    void start(std::vector<std::string> args) {
        auto program = bp::environment::find_executable("mmdebstrap");
        // In a mount namespace of its own: the chroot's /proc, /sys and /dev mounts are then
        // nobody else's. On the host's shared mounts a container started meanwhile gets
        // copies of them, and mmdebstrap's unmounting fails ("target is busy"), then its tar.
        // (unshare execs mmdebstrap: the process is mmdebstrap's, its exit status too.)
        if (auto unshare = bp::environment::find_executable("unshare"); !unshare.empty()) {
            args.insert(args.begin(), {"--mount", "--propagation", "private", "--", program.string()});
            program = unshare;
        }
        process_.emplace(executor_, program, args, bp::process_stdio{nullptr, out_, *err_}, CloseInheritedDescriptors{});
        asio::co_spawn(executor_, read_log(err_, log_), asio::detached);
    }

    asio::awaitable<std::size_t> read_some(char* data, std::size_t size) override {
        auto [ec, n] = co_await out_.async_read_some(asio::buffer(data, size), use_tuple);
        if (!ec) {
            bytes_ += n;
            auto now = std::chrono::steady_clock::now();
            if (now - last_report_ > std::chrono::milliseconds(200)) {
                last_report_ = now;
                log_->output->status(fmt::format("  streaming the root filesystem into Docker: {} MB", bytes_ / 1000000));
            }
            co_return n;
        }
        int code = co_await process_->async_wait(use_awaitable);
        exited_ = true;
        // Its last words on stderr may still be in the pipe.
        asio::steady_timer timer(executor_);
        for (int i = 0; i < 100 && !log_->done; ++i) {
            timer.expires_after(std::chrono::milliseconds(20));
            co_await timer.async_wait(use_awaitable);
        }
        if (code != 0) throw std::runtime_error(fmt::format("mmdebstrap failed (exit status {}) building {}:{}", code, image_, log_->last_lines()));
        co_return 0;
    }

    std::uint64_t bytes() const { return bytes_; }

private:
    asio::any_io_executor executor_;
    std::string image_;
    asio::readable_pipe out_;
    std::shared_ptr<asio::readable_pipe> err_;
    std::shared_ptr<BuildLog> log_;
    std::optional<bp::process> process_;
    bool exited_ = false;
    std::uint64_t bytes_ = 0;
    std::chrono::steady_clock::time_point last_report_{};
};

// A program each language prints 42 with.
std::string answer_program(std::string_view language) {
    if (language == "python") return "print(6*7)";
    if (language == "javascript") return "console.log(6*7)";
    return "echo $((6*7))";
}

// Runs the image as the server will: a locked-down sandbox with the agent. Each
// language prints 42, the workspace belongs to the sandbox user, nothing is setuid.
asio::awaitable<void> check_image(sandbox::Manager& manager, std::string id, Profile profile) {
    sandbox::SandboxSpec spec;
    spec.image = id;
    auto box = co_await manager.create(std::move(spec), std::string(mcp::local_principal), true);
    std::exception_ptr failure;
    try {
        auto expect = [](const sandbox::ExecResult& result, std::string_view what, std::string_view want) {
            if (result.status.exit_code != 0 || result.stdout_text != want) {
                throw std::runtime_error(fmt::format("the new image failed its check ({}): exit status {}, output '{}', errors '{}'", what,
                                                     result.status.exit_code, result.stdout_text, result.stderr_text));
            }
        };
        for (const auto& name : profile.languages) {
            const auto* language = sandbox::find_language(name);
            if (!language) throw std::runtime_error(fmt::format("profile {} names an unknown language: {}", profile.name, name));
            // Interpreters answer a program; for the others their compiler or runtime must be on PATH.
            auto request = language->source_file.empty()
                               ? sandbox::program_for(*language, answer_program(language->name))
                               : sandbox::shell_command(fmt::format("command -v {} >/dev/null && echo 42", language->program));
            request.timeout_ms = 60000;
            request.fork = false;  // the image's own interpreter is under test, and one run needs no zygote
            auto result = co_await box->run(std::move(request), {}, std::make_shared<Cancellation>());
            expect(result, name, "42\n");
        }
        if (!profile.binary.empty()) {
            // The binary finds every library it links in the image.
            auto request = sandbox::shell_command(profile.binary + " --version");
            request.timeout_ms = 60000;
            request.fork = false;  // the image's own interpreter is under test, and one run needs no zygote
            auto result = co_await box->run(std::move(request), {}, std::make_shared<Cancellation>());
            expect(result, profile.binary, "cubicle " CUBICLE_VERSION "\n");
        }
        auto request = sandbox::shell_command("stat -c %u /workspace; find / -xdev -type f -perm /6000 2>/dev/null | head -3");
        request.timeout_ms = 60000;
        auto result = co_await box->run(std::move(request), {}, std::make_shared<Cancellation>());
        expect(result, "/workspace owned by uid 1000, no setuid programs", "1000\n");
    } catch (...) {
        failure = std::current_exception();
    }
    co_await manager.destroy(box->id());
    if (failure) std::rethrow_exception(failure);
}

std::string duration(double seconds) {
    return seconds < 60 ? fmt::format("{:.0f}s", seconds) : fmt::format("{}m{:02.0f}s", static_cast<int>(seconds) / 60, std::fmod(seconds, 60));
}

} // namespace

std::string build_problem() {
    if (bp::environment::find_executable("mmdebstrap").empty()) {
        return "mmdebstrap is not installed; install it with: apt-get install mmdebstrap";
    }
    if (::geteuid() != 0) {
        return "building images needs root (mmdebstrap installs packages into a new root filesystem); run it with sudo: "
               "sudo cubicle image build";
    }
    return {};
}

asio::awaitable<BuildResult> build(docker::Client& docker, sandbox::Manager& manager, Profile profile, bool force,
                                   std::shared_ptr<BuildOutput> output) {
    auto started = std::chrono::steady_clock::now();
    auto suite = host_suite();
    if (suite.empty()) throw std::runtime_error("cannot tell this machine's Debian suite (VERSION_CODENAME in /etc/os-release)");
    auto digest = recipe_digest(profile, suite);
    BuildResult result{.image = profile.image};
    auto previous = co_await docker.inspect_image(profile.image);
    if (previous && previous->labels[std::string(recipe_label)] == digest && !force) {
        result.id = previous->id;
        result.size = previous->size;
        output->line(fmt::format("{} is current (recipe {}, {} MB)", profile.image, digest, previous->size / 1000000));
        co_return result;
    }
    if (auto problem = build_problem(); !problem.empty()) throw std::runtime_error(problem);

    output->line(fmt::format("building {} from Debian {} ({} packages, recipe {})", profile.image, suite, profile.packages.size(), digest));
    auto executor = co_await asio::this_coro::executor;
    auto build_log = std::make_shared<BuildLog>(BuildLog{.output = output});
    auto tarball = std::make_shared<Mmdebstrap>(executor, profile.image, build_log);
    tarball->start(mmdebstrap_arguments(profile, suite));

    auto changes = image_config(profile);
    changes.push_back(fmt::format("LABEL {}={} {}={}", recipe_label, digest, profile_label, profile.name));
    result.id = co_await docker.import_image(tarball, std::move(changes), fmt::format("cubicle image build {} ({})", profile.name, suite));
    output->line(fmt::format("  imported {} MB as {}; checking it", tarball->bytes() / 1000000, result.id.substr(7, 12)));

    std::exception_ptr failure;
    try {
        co_await check_image(manager, result.id, profile);
    } catch (...) {
        failure = std::current_exception();
    }
    if (failure) {
        co_await docker.remove_image(result.id);
        std::rethrow_exception(failure);
    }
    co_await docker.tag_image(result.id, profile.repository(), profile.tag());
    // The build succeeded once tagged: the image it replaces goes if it can (a
    // daemon busy deleting gigabytes may not answer in time), else it is named.
    if (previous && previous->id != result.id) {
        std::string left;
        try {
            co_await docker.remove_image(previous->id);
        } catch (const std::exception& e) {
            left = e.what();
        }
        if (!left.empty())
            output->line(fmt::format("  the image it replaces is still there ({}); `docker image rm {}` removes it", left,
                                     previous->id.substr(7, 12)));
    }
    auto info = co_await docker.inspect_image(result.id);
    result.size = info ? info->size : 0;
    result.built = true;
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    output->line(fmt::format("built {} ({} MB) in {}", profile.image, result.size / 1000000, duration(result.seconds)));
    co_return result;
}

} // namespace cubicle::image
