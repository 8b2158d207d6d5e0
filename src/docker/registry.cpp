#include "docker/registry.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include <fmt/format.h>

namespace cubicle::docker {

namespace {

bool is_host(std::string_view component) {
    return component == "localhost" || component.find_first_of(".:") != std::string_view::npos;
}

} // namespace

std::string registry_of(std::string_view image) {
    auto slash = image.find('/');
    if (slash == std::string_view::npos) return {};
    auto first = image.substr(0, slash);
    return is_host(first) ? std::string(first) : std::string();
}

std::string in_registry(std::string_view registry, std::string_view image) {
    while (registry.ends_with('/')) registry.remove_suffix(1);
    auto bad = [&](std::string_view why) {
        return std::invalid_argument(fmt::format("--push {}: {} (give HOST[:PORT][/PREFIX], e.g. 127.0.0.1:5000)", registry, why));
    };
    if (registry.empty()) throw bad("no registry given");
    if (registry.find("://") != std::string_view::npos) throw bad("a registry is named without a scheme");
    if (std::any_of(registry.begin(), registry.end(), [](unsigned char c) { return std::isspace(c) || std::iscntrl(c); }))
        throw bad("spaces are not allowed");
    if (registry.find("//") != std::string_view::npos || registry.starts_with('/')) throw bad("an empty path component");
    auto host = registry.substr(0, registry.find('/'));
    if (!is_host(host)) throw bad("its first part must be a host (with a '.' or a ':PORT', or localhost)");
    auto own = registry_of(image);
    auto path = own.empty() ? image : image.substr(own.size() + 1);
    return fmt::format("{}/{}", registry, path);
}

} // namespace cubicle::docker
