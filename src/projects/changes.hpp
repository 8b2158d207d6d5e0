// What changed in a sandbox's copy of a project since open_project, found in two
// steps so that only changed files travel: a listing of the copy (type, mode,
// size, time of every entry) picks the files whose content must be fetched (new
// ones, and those whose size or time moved, as git's index does), and the fetched
// contents decide, by hash, what really changed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "projects/baseline.hpp"

namespace cubicle::projects {

// One entry of the sandbox copy, as the listing script prints it.
struct SandboxEntry {
    char type = 'f';  // find's %y: f file, l link, d directory, p FIFO, s socket, c/b device
    unsigned mode = 0;
    std::uint64_t size = 0;
    double mtime = 0;
    std::string link_target;
};
using Listing = std::map<std::string, SandboxEntry>;

// The listing script's output: records "%y\t%m\t%s\t%T@\t%P\0%l\0". Directories
// and .git internals are dropped. Throws ToolError on a malformed record.
Listing parse_listing(std::string_view text);

// The regular files whose content must be fetched to compare them.
std::vector<std::string> files_to_fetch(const Baseline& baseline, const Listing& listing);

enum class ChangeStatus { added, deleted, modified, mode };
std::string_view status_name(ChangeStatus status);

struct Change {
    std::string path;
    ChangeStatus status;
    std::string type = "file";  // what the sandbox has now: file, symlink, or special (FIFO, socket, device)
    bool binary = false;
    unsigned old_mode = 0, new_mode = 0;  // git's: 0100644, 0100755, 0120000; 0 where absent
    std::string new_data;                 // a file's content or a link's target in the sandbox
    std::string new_sha256;
    double new_mtime = 0;
};

// The changes, in path order. `fetched` holds the contents of files_to_fetch.
std::vector<Change> compare(const Baseline& baseline, const Listing& listing,
                            const std::map<std::string, std::string>& fetched);

// The changes as `git diff` prints them (a/ and b/ prefixes, git's path quoting,
// index lines with blob ids, "Binary files … differ").
std::string unified_diff(const Baseline& baseline, const std::vector<Change>& changes);

} // namespace cubicle::projects
