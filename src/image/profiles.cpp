#include "image/profiles.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "common/file_text.hpp"

namespace cubicle::image {
namespace {

// Bump when the builder's steps change what an image holds: every image is rebuilt.
constexpr int builder_revision = 1;

std::string_view trim(std::string_view text) {
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) text.remove_suffix(1);
    return text;
}

std::vector<std::string> words(std::string_view text) {
    std::vector<std::string> out;
    std::istringstream in{std::string(text)};
    for (std::string word; in >> word;) out.push_back(word);
    return out;
}

// FNV-1a: the digest only tells whether a recipe changed, it guards nothing.
struct Fnv64 {
    std::uint64_t state = 0xcbf29ce484222325ULL;
    void add(std::string_view data) {
        for (unsigned char c : data) {
            state ^= c;
            state *= 0x100000001b3ULL;
        }
        state ^= 0xff;  // a separator, so that "ab"+"c" differs from "a"+"bc"
        state *= 0x100000001b3ULL;
    }
};

} // namespace

std::string Profile::repository() const {
    auto colon = image.rfind(':');
    auto slash = image.rfind('/');
    return colon != std::string::npos && (slash == std::string::npos || colon > slash) ? image.substr(0, colon) : image;
}

std::string Profile::tag() const {
    auto repo = repository();
    return repo.size() < image.size() ? image.substr(repo.size() + 1) : "latest";
}

Profile parse_profile(std::string name, std::string_view text) {
    Profile profile;
    profile.name = std::move(name);
    profile.text = text;
    std::string key;
    std::map<std::string, std::string> values;
    int line_number = 0;
    for (std::size_t start = 0; start < text.size();) {
        auto end = std::min(text.find('\n', start), text.size());
        auto line = text.substr(start, end - start);
        start = end + 1;
        ++line_number;
        if (trim(line).empty() || trim(line).starts_with('#')) continue;
        if (line.front() == ' ' || line.front() == '\t') {
            if (key.empty()) throw std::invalid_argument(fmt::format("profile {}, line {}: a continuation line without a key", profile.name, line_number));
            values[key] += " ";
            values[key] += trim(line);
            continue;
        }
        auto colon = line.find(':');
        if (colon == line.npos) throw std::invalid_argument(fmt::format("profile {}, line {}: expected 'key: value'", profile.name, line_number));
        key = trim(line.substr(0, colon));
        if (values.count(key)) throw std::invalid_argument(fmt::format("profile {}, line {}: '{}' given twice", profile.name, line_number, key));
        values[key] = trim(line.substr(colon + 1));
    }
    for (auto& [k, v] : values) {
        if (k == "image") profile.image = v;
        else if (k == "description") profile.description = v;
        else if (k == "languages") profile.languages = words(v);
        else if (k == "packages") profile.packages = words(v);
        else if (k == "remove") profile.remove = words(v);
        else if (k == "env") profile.env = words(v);
        else if (k == "labels") profile.labels = words(v);
        else if (k == "binary") profile.binary = v;
        else if (k == "entrypoint") profile.entrypoint = v;
        else if (k == "user") profile.user = v;
        else throw std::invalid_argument(fmt::format("profile {}: unknown key '{}'", profile.name, k));
    }
    if (profile.image.empty()) throw std::invalid_argument(fmt::format("profile {}: no image", profile.name));
    if (profile.packages.empty()) throw std::invalid_argument(fmt::format("profile {}: no packages", profile.name));
    for (const auto& variable : profile.env) {
        if (variable.find('=') == std::string::npos) throw std::invalid_argument(fmt::format("profile {}: env '{}' is not NAME=value", profile.name, variable));
    }
    for (const auto& label : profile.labels) {
        if (label.find('=') == std::string::npos) throw std::invalid_argument(fmt::format("profile {}: label '{}' is not NAME=value", profile.name, label));
    }
    return profile;
}

const std::vector<Profile>& profiles() {
    static const std::vector<Profile> all = [] {
        std::vector<Profile> out;
        for (const auto& source : profile_sources()) out.push_back(parse_profile(std::string(source.name), source.text));
        std::sort(out.begin(), out.end(), [](const Profile& a, const Profile& b) { return a.name < b.name; });
        return out;
    }();
    return all;
}

const Profile* find_profile(std::string_view name) {
    for (const auto& profile : profiles()) {
        if (profile.name == name || profile.image == name || (profile.tag() == "latest" && profile.repository() == name)) return &profile;
    }
    return nullptr;
}

std::string host_suite() {
    std::istringstream in(file_text("/etc/os-release"));
    for (std::string line; std::getline(in, line);) {
        if (!line.starts_with("VERSION_CODENAME=")) continue;
        auto value = line.substr(17);
        value.erase(std::remove(value.begin(), value.end(), '"'), value.end());
        return value;
    }
    return {};
}

std::string recipe_digest(const Profile& profile, std::string_view suite) {
    Fnv64 digest;
    digest.add(fmt::format("builder {}", builder_revision));
    digest.add(profile.text);
    digest.add(suite);
    if (!profile.binary.empty()) digest.add(file_text("/proc/self/exe"));
    return fmt::format("{:016x}", digest.state);
}

} // namespace cubicle::image
