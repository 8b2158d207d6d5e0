#include "projects/ignore.hpp"

#include <git2.h>
#include <git2/sys/repository.h>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "projects/libgit.hpp"

namespace cubicle::projects {

struct IgnoreRules::Repository {
    git_repository* handle = nullptr;
    ~Repository() { git_repository_free(handle); }
};

IgnoreRules::IgnoreRules(const std::string& directory) : repository_(std::make_unique<Repository>()) {
    ensure_libgit();
    auto& repo = repository_->handle;
    if (git_repository_open_ext(&repo, directory.c_str(), GIT_REPOSITORY_OPEN_NO_SEARCH, nullptr) == 0) {
        git_index* index = nullptr;
        if (git_repository_index(&index, repo) == 0) index_ = index;
        return;
    }
    // Not a repository: an empty one in memory whose work tree is the directory
    // reads the .gitignore files there and writes nothing.
    if (git_repository_new(&repo) != 0 || git_repository_set_workdir(repo, directory.c_str(), 0) != 0)
        throw ToolError(fmt::format("cannot read the .gitignore rules of '{}': {}", directory, libgit_error()));
}

IgnoreRules::~IgnoreRules() { git_index_free(static_cast<git_index*>(index_)); }

bool IgnoreRules::ignored(const std::string& path, bool directory) const {
    int ignored = 0;
    auto query = directory ? path + "/" : path;
    if (git_ignore_path_is_ignored(&ignored, repository_->handle, query.c_str()) != 0 || !ignored) return false;
    auto* index = static_cast<git_index*>(index_);
    if (!index) return true;
    // What git tracks stays, whatever the patterns say (git status would call it deleted).
    if (!directory) return git_index_get_bypath(index, path.c_str(), 0) == nullptr;
    std::size_t position = 0;
    return git_index_find_prefix(&position, index, query.c_str()) != 0;
}

} // namespace cubicle::projects
