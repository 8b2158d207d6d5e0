// Moving files between the host and a sandbox: parsing the tar archives Docker
// hands out, packing host files for upload and unpacking downloads onto the host.
// This is where hostile input (archive bytes and file names chosen by the
// sandbox) meets the host filesystem, so every host access is confined to an
// operator-allowed directory with openat2(RESOLVE_BENEATH) and never follows a
// symbolic link the sandbox could have planted.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cubicle::files {

struct Limits {
    std::uint64_t max_bytes = 256ull << 20;
    std::uint64_t max_entries = 10000;
};

enum class EntryType { file, directory, symlink, hardlink, other };

struct TarMember {
    std::string path;         // normalised: no leading "./" or "/", no trailing "/"
    EntryType type = EntryType::other;
    std::uint64_t size = 0;   // file size
    unsigned mode = 0;        // permission bits from the header
    std::int64_t mtime = 0;
    std::string link_target;  // symlink/hardlink target
    std::string_view data;    // file content (points into the archive buffer)
};

// Parses ustar/v7/GNU/PAX archives. Throws ToolError on a corrupt archive or one
// over the limits; never reads outside `archive`.
std::vector<TarMember> read_tar(std::string_view archive, const Limits& limits);

// The operator's allowed host directories (--allow-host-dir), canonicalised.
class HostDirs {
public:
    explicit HostDirs(std::vector<std::string> roots);
    bool empty() const { return roots_.empty(); }
    const std::vector<std::string>& roots() const { return roots_; }
    // The allowed root containing the absolute `host_path` (compared lexically)
    // and the path relative to it ("." for the root itself).
    std::pair<std::string, std::string> locate(const std::string& host_path) const;

private:
    std::vector<std::string> roots_;
};

struct Skipped {
    std::string path;    // below the packed host path
    std::string reason;
};

struct PackedLink {
    std::string path, target;
    bool outside = false;  // absolute, or leads above the packed directory: copied, never followed
};

// One regular file or link as it went into the archive (its content, or a link's target).
struct PackedEntry {
    std::string_view path;  // below the packed host path
    bool link = false;
    unsigned mode = 0;
    std::int64_t mtime = 0;
    std::string_view data;
};

struct PackOptions {
    bool keep_links = false;  // symbolic links travel as links (never followed); otherwise they are skipped
    // Entries it says yes to are left out and counted as ignored (a directory with all it holds).
    std::function<bool(const std::string& path, bool directory)> excluded;
    std::function<void(const PackedEntry&)> on_entry;  // sees each file and link packed
};

struct PackResult {
    std::string tar;  // ready for PUT /containers/{id}/archive
    std::uint64_t files = 0, directories = 0, bytes = 0, ignored = 0;
    std::vector<Skipped> skipped;  // special files (and links, unless kept) not copied
    std::vector<PackedLink> links;
};

// Archives a host file or directory under the name `archive_root`, owned by `owner`.
PackResult pack_host_path(const HostDirs& dirs, const std::string& host_path, const std::string& archive_root,
                          unsigned owner, const Limits& limits, const PackOptions& options = {});

// Refuses `host_path` unless it is a directory inside an allowed root, reached
// without any symbolic link (so that tools reading it by name stay inside too).
void require_host_directory(const HostDirs& dirs, const std::string& host_path);

// A file below an allowed directory `base` (a host path) as the host has it now.
// Reached without following any symbolic link: a link on the way or at the end is
// reported as one, never read through.
struct HostFile {
    enum class Kind { absent, regular, symlink, other } kind = Kind::absent;
    unsigned mode = 0;
    std::string data;  // a regular file's content
};
HostFile read_host_file(const HostDirs& dirs, const std::string& base, const std::string& relative, const Limits& limits);

// Writes `relative` below `base` atomically (temporary file and rename in its
// directory) with exactly `mode` (set before the rename), creating missing parent directories; refuses a symbolic
// link or special file anywhere on the way or in its place.
void write_host_file(const HostDirs& dirs, const std::string& base, const std::string& relative, std::string_view data,
                     unsigned mode);

// Removes the regular file `relative` below `base`; refuses anything else.
void remove_host_file(const HostDirs& dirs, const std::string& base, const std::string& relative);

struct UnpackResult {
    std::uint64_t files = 0, directories = 0, bytes = 0;
};

// Writes a downloaded archive to `host_path`; its first path component maps to
// host_path itself. Refuses the whole archive before writing anything if any
// member is unsafe.
UnpackResult unpack_to_host(const HostDirs& dirs, const std::vector<TarMember>& members,
                            const std::string& host_path, const Limits& limits);

// Validates and normalises a path relative to the sandbox workspace ("." for the
// workspace itself).
std::string workspace_path(std::string_view path);

} // namespace cubicle::files
