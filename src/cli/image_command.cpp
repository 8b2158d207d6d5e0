// `cubicle image build [PROFILE…] [--force] [--push REGISTRY]`, `cubicle image list` and
// `cubicle image dockerfile PROFILE`.
#include <cstdio>
#include <functional>
#include <string_view>

#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/support.hpp"
#include "cli/terminal.hpp"
#include "common/log.hpp"
#include "docker/client.hpp"
#include "docker/registry.hpp"
#include "image/builder.hpp"
#include "image/profiles.hpp"
#include "image/recipe.hpp"
#include "sandbox/manager.hpp"

namespace cubicle::cli {
namespace {

namespace asio = boost::asio;

std::string help() {
    std::string out =
        "usage: cubicle image build [PROFILE...] [--force] [--push REGISTRY]\n"
        "                                                    build images (default: every sandbox profile); --push\n"
        "                                                    also tags each REGISTRY/NAME and pushes it there (for\n"
        "                                                    --engine swarm, whose nodes pull: --default-image REGISTRY/NAME)\n"
        "       cubicle image list                           the profiles and whether their images are current\n"
        "       cubicle image dockerfile PROFILE             print the profile as a Dockerfile (images/PROFILE.Dockerfile)\n\n"
        "Images are built offline from this machine's apt sources with mmdebstrap (needs root) and\n"
        "imported through the Docker Engine API; an image whose recipe is unchanged is kept.\n"
        "Server options such as --docker-host apply too.\n\nprofiles:\n";
    for (const auto& profile : image::profiles()) out += fmt::format("  {:<17} {:<32} {}\n", profile.name, profile.image, profile.description);
    return out;
}

class TerminalBuildOutput final : public image::BuildOutput {
public:
    void line(std::string_view text) override { terminal_.line(text); }
    void status(std::string_view text) override { terminal_.status(text); }

private:
    Terminal terminal_;
};

// The profiles to build: those named, or every one but the server's (which is built
// on purpose, holding this very binary).
std::vector<image::Profile> selected(const std::vector<std::string>& names) {
    std::vector<image::Profile> out;
    for (const auto& name : names) {
        auto profile = image::find_profile(name);
        if (!profile) {
            std::string known;
            for (const auto& p : image::profiles()) known += (known.empty() ? "" : ", ") + p.name;
            throw std::invalid_argument(fmt::format("unknown image profile '{}' (profiles: {})", name, known));
        }
        out.push_back(*profile);
    }
    if (names.empty()) {
        for (const auto& profile : image::profiles()) {
            if (profile.binary.empty()) out.push_back(profile);
        }
    }
    return out;
}

// Tags `image` as REGISTRY/NAME and pushes it; throws saying what failed.
asio::awaitable<void> push(docker::Client& docker, std::string image, std::string registry, image::BuildOutput& output) {
    auto name = docker::in_registry(registry, image);
    auto colon = name.rfind(':');
    if (colon == std::string::npos || colon < name.rfind('/')) colon = name.size();  // no tag: "latest"
    std::string tag = colon < name.size() ? name.substr(colon + 1) : "latest";
    co_await docker.tag_image(image, name.substr(0, colon), tag);
    std::function<void(std::string_view)> progress = [&output](std::string_view text) { output.status(text); };
    co_await docker.push_image(name, std::move(progress));
    output.line(fmt::format("pushed {}", name));
}

asio::awaitable<int> build(CommandLine command_line) {
    auto profiles = selected(std::vector<std::string>(command_line.words.begin() + 1, command_line.words.end()));
    std::string registry;
    if (auto push = command_line.values.find("--push"); push != command_line.values.end()) registry = push->second;
    auto executor = co_await asio::this_coro::executor;
    auto endpoint = docker::resolve_endpoint(docker::endpoint_settings(command_line.config));
    docker::Client docker(executor, endpoint);
    co_await docker.connect();
    Config config = command_line.config;
    config.pool_size = 0;
    sandbox::Manager manager(executor, docker, config);
    auto output = std::make_shared<TerminalBuildOutput>();
    int status = 0;
    for (auto& profile : profiles) {
        try {
            auto built = co_await image::build(docker, manager, profile, command_line.switches.count("--force") > 0, output);
            if (!registry.empty()) co_await push(docker, built.image, registry, *output);
        } catch (const std::exception& e) {
            output->line(fmt::format("cubicle: building {} failed: {}", profile.image, e.what()));
            status = 1;
        }
    }
    co_await manager.destroy_all();
    co_return status;
}

asio::awaitable<int> list(CommandLine command_line) {
    auto executor = co_await asio::this_coro::executor;
    docker::Client docker(executor, docker::resolve_endpoint(docker::endpoint_settings(command_line.config)));
    co_await docker.connect();
    auto suite = image::host_suite();
    std::printf("%-17s %-32s %-9s %8s  %s\n", "PROFILE", "IMAGE", "STATE", "SIZE", "CONTENTS");
    for (const auto& profile : image::profiles()) {
        auto info = co_await docker.inspect_image(profile.image);
        std::string state = !info ? "missing" : info->labels[std::string(image::recipe_label)] == image::recipe_digest(profile, suite) ? "current" : "outdated";
        std::string size = info ? fmt::format("{} MB", info->size / 1000000) : "-";
        std::printf("%-17s %-32s %-9s %8s  %s\n", profile.name.c_str(), profile.image.c_str(), state.c_str(), size.c_str(), profile.description.c_str());
    }
    co_return 0;
}

} // namespace

int image_command(int argc, char** argv) {
    CommandLine command_line;
    try {
        command_line = parse_command_line(argc, argv, {"--force"}, {"--push"});
        log::set_stderr_level(*log::parse_level(command_line.config.log_level));
        if (command_line.help || command_line.words.empty()) {
            std::fputs(help().c_str(), command_line.help ? stdout : stderr);
            return command_line.help ? 0 : 2;
        }
        if (command_line.words[0] == "build") {
            selected(std::vector<std::string>(command_line.words.begin() + 1, command_line.words.end()));
            // A bad registry is told before anything is built.
            if (auto push = command_line.values.find("--push"); push != command_line.values.end()) docker::in_registry(push->second, "x");
            return run(build, std::move(command_line));
        }
        if (command_line.words[0] != "build" && !command_line.values.empty()) throw std::invalid_argument("--push is for `cubicle image build`");
        if (command_line.words[0] == "list" && command_line.words.size() == 1) return run(list, std::move(command_line));
        if (command_line.words[0] == "dockerfile") {
            if (command_line.words.size() != 2) throw std::invalid_argument("usage: cubicle image dockerfile PROFILE");
            std::fputs(image::dockerfile(selected({command_line.words[1]}).front()).c_str(), stdout);
            return 0;
        }
        throw std::invalid_argument(fmt::format("unknown image command '{}' (build, list or dockerfile)", command_line.words[0]));
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "cubicle: %s\n", e.what());
        return 2;
    }
}

} // namespace cubicle::cli
