#include "projects/apply.hpp"

#include <sys/stat.h>

#include <algorithm>

#include "common/errors.hpp"

namespace cubicle::projects {
namespace {

// 0755 for an executable, else 0644, narrowed by the server's umask: what git
// would check out.
unsigned git_mode(unsigned mode) {
    static const unsigned umask_bits = [] {
        auto bits = ::umask(022);
        ::umask(bits);
        return static_cast<unsigned>(bits);
    }();
    return ((mode & 0111) != 0 ? 0755u : 0644u) & ~umask_bits;
}

std::string host_state(const files::HostFile& host) {
    switch (host.kind) {
    case files::HostFile::Kind::absent: return "absent";
    case files::HostFile::Kind::symlink: return "symlink";
    case files::HostFile::Kind::other: return "special";
    case files::HostFile::Kind::regular: return sha256_hex(host.data);
    }
    return "special";
}

// Why a change is never applied, or empty.
std::string refusal(const Change& change, const BaselineFile* old, const ApplyRequest& request) {
    if (is_git_internal(change.path)) return ".git internals are never applied";
    if (old && old->link) return "a symbolic link on the host when the project was opened; links are never applied";
    if (change.status == ChangeStatus::deleted) {
        if (request.delete_all || request.files.contains(change.path)) return {};
        return "deleted in the sandbox; name it in files or pass delete: true to delete it on the host";
    }
    if (change.type == "symlink") return "a symbolic link in the sandbox; links are never applied";
    if (change.type == "special") return "a FIFO, socket or device in the sandbox; only regular files are applied";
    return {};
}

} // namespace

ApplyResult apply_changes(Baseline& baseline, const std::vector<Change>& changes, const ApplyRequest& request,
                          const files::HostDirs& dirs, const files::Limits& limits) {
    ApplyResult result;
    for (const auto& named : request.files) {
        bool known = std::ranges::any_of(changes, [&named](const Change& c) { return c.path == named; });
        if (!known) result.refused.push_back({named, "not changed in the sandbox since open_project"});
    }
    for (const auto& change : changes) {
        if (!request.files.empty() && !request.files.contains(change.path)) continue;
        auto base = baseline.files.find(change.path);
        const BaselineFile* old = base == baseline.files.end() ? nullptr : &base->second;
        if (auto why = refusal(change, old, request); !why.empty()) {
            result.refused.push_back({change.path, std::move(why)});
            continue;
        }
        try {
            auto host = files::read_host_file(dirs, baseline.host_path, change.path, limits);
            auto state = host_state(host);
            bool deleting = change.status == ChangeStatus::deleted;
            if (old && state != old->sha256) {
                result.conflicts.push_back({change.path, old->sha256, state});
                continue;
            }
            if (!old && host.kind != files::HostFile::Kind::absent) {
                if (state != change.new_sha256) result.conflicts.push_back({change.path, "absent", state});
                else if (!request.dry_run) baseline.record(change.path, false, change.new_mode, change.new_mtime, change.new_data);
                continue;  // the same file is there already
            }
            if (deleting) {
                if (!request.dry_run) {
                    files::remove_host_file(dirs, baseline.host_path, change.path);
                    baseline.files.erase(change.path);
                }
                result.deleted.push_back(change.path);
                continue;
            }
            // The host file's own mode where the sandbox kept it (a chmod on the host stays), else git's
            // idea of one: a sandbox's 0777 or setuid bit never reaches the host.
            unsigned mode = !old || change.new_mode != old->mode ? git_mode(change.new_mode) : host.mode & 0777;
            if (!request.dry_run) {
                files::write_host_file(dirs, baseline.host_path, change.path, change.new_data, mode);
                baseline.record(change.path, false, change.new_mode, change.new_mtime, change.new_data);
            }
            result.written.push_back({change.path, change.new_data.size(), mode});
        } catch (const ToolError& e) {
            result.refused.push_back({change.path, e.what()});
        }
    }
    return result;
}

} // namespace cubicle::projects
