// What open_project copied into a sandbox: each file's mode, time and content as
// it left the host, so that diff_project can tell what the sandbox changed (and
// show the original text after the host file changed too), and apply_project can
// tell whether the host file changed meanwhile (a conflict).
//
// Baselines stay in the server's memory, bounded by --max-transfer-mb per sandbox: no
// temporary file can outlive a crash, and the sandbox's copy is never trusted as
// the original. One per (sandbox, path); a sandbox's go when it does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/hex.hpp"  // sha256_hex: a baseline file's digest

namespace cubicle::projects {

class IgnoreRules;

struct BaselineFile {
    bool link = false;   // a symbolic link; `data` is its target
    unsigned mode = 0;   // permission bits
    double mtime = 0;    // the sandbox copy's time while nobody touched it
    std::string sha256;  // of `data`
    std::string data;
};

struct Baseline {
    std::string host_path;  // the host directory opened
    std::string path;       // its copy, relative to the workspace
    // Below `path`. Not here: .git internals, what the ignore rules left out.
    std::map<std::string, BaselineFile> files;
    // The rules the copy left files out by (null with include_ignored): a new
    // file in the sandbox they match is not a change either.
    std::shared_ptr<const IgnoreRules> ignore;

    void record(std::string path, bool link, unsigned mode, double mtime, std::string data);
    std::uint64_t bytes() const;
    std::uint64_t opened_at = 0;  // order of opening in its sandbox
};

// .git and what lies below it, at any depth: never part of a diff, never applied.
bool is_git_internal(std::string_view path);

class Baselines {
public:
    // Replaces the one at its path; the sandbox's others go, oldest first, while
    // all of them together hold more than max_bytes (a sandbox holds at most one
    // transfer's worth of the server's memory, however often it opens a project).
    void put(const std::string& sandbox_id, std::shared_ptr<Baseline> baseline, std::uint64_t max_bytes);
    // The baseline of `path` in the sandbox; with `path` empty, its only one.
    // Throws ToolError naming the opened paths when there is none or a choice.
    std::shared_ptr<Baseline> get(const std::string& sandbox_id, const std::string& path) const;
    // Drops the baselines of sandboxes that are gone.
    void forget_unless(const std::function<bool(const std::string& sandbox_id)>& alive);

private:
    std::map<std::string, std::map<std::string, std::shared_ptr<Baseline>>> by_sandbox_;
    std::uint64_t opened_ = 0;
};

} // namespace cubicle::projects
