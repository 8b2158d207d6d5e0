// Which files of a host directory its .gitignore rules leave out, as git decides
// it (libgit2): the patterns of every .gitignore, .git/info/exclude and the user's
// core.excludesFile; a file the repository tracks is never left out.
#pragma once

#include <memory>
#include <string>

namespace cubicle::projects {

class IgnoreRules {
public:
    // The rules of the repository at `directory` (the directory itself, never a
    // parent); outside a repository, only the .gitignore files below it.
    explicit IgnoreRules(const std::string& directory);
    ~IgnoreRules();
    IgnoreRules(const IgnoreRules&) = delete;
    IgnoreRules& operator=(const IgnoreRules&) = delete;

    // `path` is relative to the directory; patterns that end in '/' match a directory only.
    bool ignored(const std::string& path, bool directory) const;
    bool in_repository() const { return index_ != nullptr; }

private:
    struct Repository;
    std::unique_ptr<Repository> repository_;
    void* index_ = nullptr;  // git_index*, of a repository only
};

} // namespace cubicle::projects
