#include "image/recipe.hpp"

#include <algorithm>
#include <array>
#include <filesystem>

#include <fmt/format.h>

namespace cubicle::image {
namespace {

constexpr std::string_view image_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// The Debian release the published Dockerfiles start from when no BASE is given.
constexpr std::string_view dockerfile_suite = "bookworm";
constexpr std::string_view dockerfile_base = "debian:bookworm-slim";

constexpr std::array<std::string_view, 8> excludes{
    "path-exclude=/usr/share/doc/*",     "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",    "path-exclude=/usr/share/groff/*",          "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/locale/*",  "path-include=/usr/share/locale/locale.alias",
};

std::string join(const std::vector<std::string>& items, std::string_view separator) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : std::string(separator)) + item;
    return out;
}

// A long shell command broken at spaces into continued lines (none of these commands
// quotes a space).
std::string wrapped(std::string_view command, std::size_t width = 96) {
    constexpr std::string_view indent = "        ";
    std::string out;
    std::string line;
    for (std::size_t start = 0; start <= command.size();) {
        auto end = std::min(command.find(' ', start), command.size());
        auto word = command.substr(start, end - start);
        start = end + 1;
        if (word.empty()) continue;
        if (line.size() > indent.size() && line.size() + 1 + word.size() > width) {
            out += line + " \\\n";
            line = indent;
        } else if (!line.empty() && line != indent) {
            line += ' ';
        }
        line += word;
    }
    return out + line;
}

} // namespace

std::span<const std::string_view> dpkg_excludes() { return excludes; }

std::vector<std::string> finishing_commands(const Profile& profile, std::string_view root, std::string_view in_root) {
    std::vector<std::string> commands;
    if (!profile.remove.empty()) commands.push_back(fmt::format("{}dpkg --purge --force-depends {} >/dev/null", in_root, join(profile.remove, " ")));
    commands.push_back(fmt::format("{}groupadd --gid 1000 sandbox", in_root));
    commands.push_back(fmt::format("{}useradd --uid 1000 --gid 1000 --home-dir /workspace --no-create-home --shell /bin/bash sandbox", in_root));
    commands.push_back(fmt::format("mkdir -p {0}/workspace && chown 1000:1000 {0}/workspace && chmod 0755 {0}/workspace", root));
    // Nothing setuid or setgid: the sandbox user gains nothing by running a program.
    commands.push_back(fmt::format("find {}/ -xdev -type f -perm /6000 -exec chmod ug-s {{}} +", root));
    commands.push_back(fmt::format("rm -rf {0}/var/lib/apt/lists/* {0}/var/cache/apt/* {0}/var/cache/debconf/*-old {0}/var/lib/dpkg/*-old "
                                   "{0}/var/log/apt/* {0}/var/log/*.log {0}/root/.cache {0}/tmp/*",
                                   root));
    return commands;
}

std::vector<std::string> image_config(const Profile& profile) {
    std::vector<std::string> config{fmt::format("ENV PATH={}", image_path), "ENV LANG=C.UTF-8"};
    for (const auto& variable : profile.env) config.push_back("ENV " + variable);
    for (const auto& label : profile.labels) config.push_back("LABEL " + label);
    auto start = profile.entrypoint.empty() ? std::string(R"(CMD ["/bin/bash"])") : fmt::format(R"(ENTRYPOINT ["{}"])", profile.entrypoint);
    config.insert(config.end(), {"WORKDIR /workspace", "USER " + profile.user, std::move(start)});
    return config;
}

std::string dockerfile(const Profile& profile) {
    std::string out = fmt::format(
        "# Generated from images/{0}.profile by `cubicle image dockerfile {0}`: edit the profile, then regenerate.\n"
        "# {1}: {2}.\n"
        "# The same image `cubicle image build {0}` makes offline, for a registry:\n"
        "#   docker build -f images/{0}.Dockerfile -t {1} images/\n"
        "# BASE may be any Debian {3} image whose apt sources work on the building machine.\n"
        "ARG BASE={4}\n"
        "FROM ${{BASE}}\n",
        profile.name, profile.image, profile.description, dockerfile_suite, dockerfile_base);
    if (!profile.binary.empty()) {
        out += fmt::format("# The cubicle binary, built for this Debian release, next to this file: cp build/cubicle images/\n"
                           "COPY {} {}\n",
                           std::filesystem::path(profile.binary).filename().string(), profile.binary);
    }
    std::string excludes_file;
    for (auto option : excludes) excludes_file += fmt::format(" '{}'", option);
    std::vector<std::string> steps{
        "printf '%s\\n'" + excludes_file + " > /etc/dpkg/dpkg.cfg.d/cubicle-excludes",
        // With manuals excluded, postinst scripts that register man pages (OpenJDK's update-alternatives) fail.
        "mkdir -p /usr/share/man/man1",
        "apt-get update",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends " + join(profile.packages, " "),
    };
    for (auto& command : finishing_commands(profile, "", "")) steps.push_back(std::move(command));
    for (auto& step : steps) step = wrapped(step);
    out += "RUN " + join(steps, " \\\n    && ") + "\n";
    for (const auto& line : image_config(profile)) out += line + "\n";
    out += fmt::format("LABEL {}={}\n", profile_label, profile.name);
    return out;
}

} // namespace cubicle::image
