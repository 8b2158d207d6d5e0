// Writing a sandbox's changes back to the host directory a project was opened
// from. The host side goes through files::read_host_file/write_host_file/
// remove_host_file only (the one host-path guard). A host file that changed since
// open_project is a conflict and stays as it is.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "files/host_transfer.hpp"
#include "projects/baseline.hpp"
#include "projects/changes.hpp"

namespace cubicle::projects {

struct ApplyRequest {
    std::set<std::string> files;  // only these (deletions among them are applied); empty: every change
    bool dry_run = false;
    bool delete_all = false;      // apply every deletion
};

struct Written {
    std::string path;
    std::uint64_t bytes;
    unsigned mode;
};
struct Conflict {
    std::string path, baseline_sha256, host_sha256;  // host_sha256: or "absent", "symlink", "special"
};
struct Refused {
    std::string path, reason;
};
struct ApplyResult {
    std::vector<Written> written;
    std::vector<std::string> deleted;
    std::vector<Conflict> conflicts;
    std::vector<Refused> refused;
};

// Applies `changes` (from compare) to the host. Unless dry_run, the baseline then
// records what was applied, so that a diff shows those files unchanged; conflicts
// and refusals keep their old baseline.
ApplyResult apply_changes(Baseline& baseline, const std::vector<Change>& changes, const ApplyRequest& request,
                          const files::HostDirs& dirs, const files::Limits& limits);

} // namespace cubicle::projects
