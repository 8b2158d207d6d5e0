#include "projects/baseline.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/errors.hpp"

namespace cubicle::projects {

void Baseline::record(std::string file_path, bool link, unsigned mode, double mtime, std::string data) {
    auto hash = sha256_hex(data);
    files[std::move(file_path)] = {link, mode, mtime, std::move(hash), std::move(data)};
}

bool is_git_internal(std::string_view path) {
    while (!path.empty()) {
        auto slash = path.find('/');
        if (path.substr(0, slash) == ".git") return true;
        if (slash == std::string_view::npos) break;
        path.remove_prefix(slash + 1);
    }
    return false;
}

std::uint64_t Baseline::bytes() const {
    std::uint64_t total = 0;
    for (const auto& [name, file] : files) total += name.size() + file.data.size();
    return total;
}

void Baselines::put(const std::string& sandbox_id, std::shared_ptr<Baseline> baseline, std::uint64_t max_bytes) {
    auto path = baseline->path;
    baseline->opened_at = ++opened_;
    auto& opened = by_sandbox_[sandbox_id];
    opened[path] = std::move(baseline);
    auto total = [&opened] {
        std::uint64_t sum = 0;
        for (const auto& entry : opened) sum += entry.second->bytes();
        return sum;
    };
    while (opened.size() > 1 && total() > max_bytes) {
        auto oldest = std::min_element(opened.begin(), opened.end(),
                                       [](const auto& a, const auto& b) { return a.second->opened_at < b.second->opened_at; });
        opened.erase(oldest);
    }
}

std::shared_ptr<Baseline> Baselines::get(const std::string& sandbox_id, const std::string& path) const {
    auto sandbox = by_sandbox_.find(sandbox_id);
    if (sandbox == by_sandbox_.end() || sandbox->second.empty())
        throw ToolError("no project is open in this sandbox; call open_project first");
    const auto& opened = sandbox->second;
    if (path.empty() && opened.size() == 1) return opened.begin()->second;
    if (auto found = opened.find(path); found != opened.end()) return found->second;
    std::string names;
    for (const auto& entry : opened) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", entry.first);
    if (path.empty()) throw ToolError(fmt::format("several projects are open in this sandbox ({}); give path", names));
    throw ToolError(fmt::format("no project was opened at '{}'; open ones: {}", path, names));
}

void Baselines::forget_unless(const std::function<bool(const std::string&)>& alive) {
    std::erase_if(by_sandbox_, [&alive](const auto& entry) { return !alive(entry.first); });
}

} // namespace cubicle::projects
