#include "files/host_transfer.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "docker/tar.hpp"

namespace cubicle::files {
namespace {

constexpr std::size_t block = 512;

// ---------------------------------------------------------------- small utilities

class Fd {
public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    Fd& operator=(Fd&& other) noexcept { std::swap(fd_, other.fd_); return *this; }
    ~Fd() { if (fd_ >= 0) ::close(fd_); }
    int get() const { return fd_; }
    int release() { return std::exchange(fd_, -1); }

private:
    int fd_;
};

[[noreturn]] void refuse(const std::string& message) { throw ToolError(message); }

std::string errno_text(int err) { return std::strerror(err); }

// Splits on '/', dropping empty and "." components; ".." is kept for the caller to judge.
std::vector<std::string_view> components(std::string_view path) {
    std::vector<std::string_view> out;
    while (!path.empty()) {
        auto slash = path.find('/');
        auto part = path.substr(0, slash);
        if (!part.empty() && part != ".") out.push_back(part);
        if (slash == std::string_view::npos) break;
        path.remove_prefix(slash + 1);
    }
    return out;
}

std::string join(const std::vector<std::string_view>& parts) {
    std::string out;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        if (!out.empty()) out += '/';
        out += parts[i];
    }
    return out;
}

bool has_nul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// openat2 confined below `dirfd`; retries the EAGAIN the kernel returns when a
// concurrent rename makes it unsure the walk stayed beneath.
int open_beneath(int dirfd, const std::string& path, std::uint64_t flags, std::uint64_t resolve) {
    open_how how{};
    how.flags = flags | O_CLOEXEC;
    how.resolve = resolve;
    for (int attempt = 0;; ++attempt) {
        long fd = ::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof how);
        if (fd >= 0 || (errno != EAGAIN && errno != EINTR) || attempt == 10) return static_cast<int>(fd);
    }
}

std::string resolve_error(const std::string& shown, int err) {
    switch (err) {
    case ENOENT: return fmt::format("'{}' does not exist", shown);
    case EXDEV:
        return fmt::format("'{}' resolves outside its allowed directory (through a symbolic link); refusing it", shown);
    case ELOOP: return fmt::format("'{}' goes through a symbolic link; refusing to follow it", shown);
    case ENOTDIR: return fmt::format("a component of '{}' is not a directory", shown);
    default: return fmt::format("cannot open '{}': {}", shown, errno_text(err));
    }
}

Fd open_root(const std::string& root) {
    Fd fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) refuse(fmt::format("cannot open the allowed host directory '{}': {}", root, errno_text(errno)));
    return fd;
}

// ---------------------------------------------------------------- tar reading

[[noreturn]] void corrupt(std::size_t offset, std::string_view what) {
    refuse(fmt::format("the archive is corrupt at byte {}: {}", offset, what));
}

// Octal with optional space/NUL padding, or GNU base-256 (high bit set) for big values.
std::uint64_t parse_number(std::string_view field, std::size_t offset, std::string_view name) {
    if (!field.empty() && (static_cast<unsigned char>(field[0]) & 0x80)) {
        if (static_cast<unsigned char>(field[0]) == 0xff) corrupt(offset, fmt::format("negative {}", name));
        std::uint64_t value = static_cast<unsigned char>(field[0]) & 0x7f;
        for (char c : field.substr(1)) {
            if (value > (UINT64_MAX >> 8)) corrupt(offset, fmt::format("{} out of range", name));
            value = value << 8 | static_cast<unsigned char>(c);
        }
        return value;
    }
    std::size_t i = 0;
    while (i < field.size() && field[i] == ' ') ++i;
    std::uint64_t value = 0;  // at most 11 digits fit a field: no overflow
    for (; i < field.size() && field[i] != ' ' && field[i] != '\0'; ++i) {
        if (field[i] < '0' || field[i] > '7') corrupt(offset, fmt::format("bad octal {} field", name));
        value = value * 8 + static_cast<std::uint64_t>(field[i] - '0');
    }
    return value;
}

std::optional<std::uint64_t> parse_decimal(std::string_view text) {
    if (text.empty() || text.size() > 19) return std::nullopt;
    std::uint64_t value = 0;
    for (char c : text) {
        if (c < '0' || c > '9') return std::nullopt;
        value = value * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return value;
}

std::string_view c_string(std::string_view field) { return field.substr(0, field.find('\0')); }

// Metadata from GNU 'L'/'K' and PAX 'x' headers, applying to the next member.
struct Pending {
    std::optional<std::string> path, link;
    std::optional<std::uint64_t> size;
    std::optional<std::int64_t> mtime;
    bool any() const { return path || link || size || mtime; }
};

void parse_pax(std::string_view data, std::size_t offset, Pending& pending) {
    while (!data.empty() && data[0] != '\0') {
        auto space = data.find(' ');
        auto length = parse_decimal(data.substr(0, std::min(space, data.size())));
        if (space == std::string_view::npos || !length || *length <= space + 1 || *length > data.size())
            corrupt(offset, "bad PAX record length");
        auto record = data.substr(space + 1, *length - space - 1);
        data.remove_prefix(*length);
        auto eq = record.find('=');
        if (record.back() != '\n' || eq == std::string_view::npos) corrupt(offset, "bad PAX record");
        auto key = record.substr(0, eq);
        auto value = record.substr(eq + 1, record.size() - eq - 2);
        if (key == "path") pending.path = std::string(value);
        else if (key == "linkpath") pending.link = std::string(value);
        else if (key == "size") {
            pending.size = parse_decimal(value);
            if (!pending.size) corrupt(offset, "bad PAX size");
        } else if (key == "mtime") {
            bool negative = value.starts_with('-');
            auto seconds = parse_decimal(value.substr(negative, value.find('.') - negative));
            if (!seconds || *seconds > INT64_MAX) corrupt(offset, "bad PAX mtime");
            pending.mtime = negative ? -static_cast<std::int64_t>(*seconds) : static_cast<std::int64_t>(*seconds);
        }
    }
}

std::string normalise_member_path(std::string_view path) {
    for (;;) {
        if (path.starts_with("./")) path.remove_prefix(2);
        else if (path.starts_with('/')) path.remove_prefix(1);
        else break;
    }
    while (path.size() > 1 && path.ends_with('/')) path.remove_suffix(1);
    return path.empty() ? "." : std::string(path);
}

void verify_checksum(std::string_view header, std::size_t offset) {
    std::uint64_t stored = parse_number(header.substr(148, 8), offset, "checksum");
    std::uint64_t plain = 0;
    std::int64_t historic = 0;  // some old writers summed signed chars
    for (std::size_t i = 0; i < block; ++i) {
        bool in_field = i >= 148 && i < 156;
        plain += in_field ? ' ' : static_cast<unsigned char>(header[i]);
        historic += in_field ? ' ' : static_cast<signed char>(header[i]);
    }
    if (stored != plain && static_cast<std::int64_t>(stored) != historic) corrupt(offset, "bad header checksum");
}

EntryType entry_type(char flag, std::string_view raw_name) {
    switch (flag) {
    case '0': case '\0': case '7': return raw_name.ends_with('/') ? EntryType::directory : EntryType::file;
    case '1': return EntryType::hardlink;
    case '2': return EntryType::symlink;
    case '5': return EntryType::directory;
    default: return EntryType::other;
    }
}

// POSIX: these types never carry data, whatever their size field says.
bool header_only(char flag) { return flag >= '1' && flag <= '6'; }

std::string header_name(std::string_view header) {
    auto name = c_string(header.substr(0, 100));
    auto prefix = c_string(header.substr(345, 155));
    // Only POSIX ustar has a prefix field; GNU uses those bytes for other things.
    if (header.substr(257, 6) == std::string_view("ustar\0", 6) && !prefix.empty())
        return fmt::format("{}/{}", prefix, name);
    return std::string(name);
}


} // namespace

std::vector<TarMember> read_tar(std::string_view archive, const Limits& limits) {
    std::vector<TarMember> members;
    Pending pending;
    std::uint64_t bytes = 0;
    std::size_t pos = 0;
    for (;;) {
        if (archive.size() - pos < block) corrupt(pos, "truncated (no end-of-archive marker)");
        const std::size_t header_pos = pos;
        auto header = archive.substr(pos, block);
        if (header.find_first_not_of('\0') == std::string_view::npos) {
            if (pending.any()) corrupt(pos, "extended header without a member");
            return members;
        }
        verify_checksum(header, pos);
        char flag = header[156];
        bool meta = flag == 'L' || flag == 'K' || flag == 'x' || flag == 'g';
        std::uint64_t size = parse_number(header.substr(124, 12), pos, "size");
        if (!meta && pending.size) size = *pending.size;
        auto raw_name = header_name(header);
        auto type = meta ? EntryType::other : entry_type(flag, pending.path.value_or(raw_name));
        if (type == EntryType::file && size > limits.max_bytes - bytes)
            refuse(fmt::format("the archive holds more than {} bytes of file data; refusing it", limits.max_bytes));
        std::uint64_t data_size = header_only(flag) ? 0 : size;
        std::size_t data_pos = pos + block;
        if (data_size > archive.size() - data_pos) corrupt(pos, "truncated member data");
        auto data = archive.substr(data_pos, data_size);
        pos = data_pos + std::min<std::size_t>((data_size + block - 1) / block * block, archive.size() - data_pos);

        if (flag == 'L') { pending.path = std::string(c_string(data)); continue; }
        if (flag == 'K') { pending.link = std::string(c_string(data)); continue; }
        if (flag == 'x') { parse_pax(data, data_pos, pending); continue; }
        if (flag == 'g') continue;  // global defaults: nothing we use

        if (members.size() >= limits.max_entries)
            refuse(fmt::format("the archive has more than {} entries; refusing it", limits.max_entries));
        TarMember member;
        member.path = normalise_member_path(pending.path.value_or(raw_name));
        member.type = type;
        member.mode = static_cast<unsigned>(parse_number(header.substr(100, 8), header_pos, "mode") & 07777);
        auto mtime = static_cast<std::int64_t>(parse_number(header.substr(136, 12), header_pos, "mtime"));
        member.mtime = pending.mtime.value_or(mtime);
        member.link_target = pending.link.value_or(std::string(c_string(header.substr(157, 100))));
        if (type == EntryType::file) {
            member.size = size;
            member.data = data;
            bytes += size;
        }
        members.push_back(std::move(member));
        pending = {};
    }
}

// ---------------------------------------------------------------- allowed host directories

HostDirs::HostDirs(std::vector<std::string> roots) {
    for (const auto& root : roots) {
        char resolved[PATH_MAX];
        struct stat st{};
        if (has_nul(root) || !::realpath(root.c_str(), resolved) || ::stat(resolved, &st) != 0)
            refuse(fmt::format("--allow-host-dir '{}' does not exist or is not accessible", root));
        if (!S_ISDIR(st.st_mode)) refuse(fmt::format("--allow-host-dir '{}' is not a directory", root));
        roots_.emplace_back(resolved);
    }
}

std::pair<std::string, std::string> HostDirs::locate(const std::string& host_path) const {
    if (roots_.empty())
        refuse("host file transfers are disabled: start cubicle with --allow-host-dir DIR to allow a host directory");
    if (has_nul(host_path)) refuse("the host path contains a NUL byte");
    auto allowed = fmt::format("the allowed host directories are: {}", fmt::join(roots_, ", "));
    if (!host_path.starts_with('/'))
        refuse(fmt::format("host path '{}' must be absolute; {}", host_path, allowed));
    // Lexical normalisation only: the filesystem is consulted later, beneath the root.
    std::vector<std::string_view> parts;
    for (auto part : components(host_path)) {
        if (part != "..") parts.push_back(part);
        else if (!parts.empty()) parts.pop_back();
    }
    auto normal = "/" + join(parts);
    const std::string* best = nullptr;
    for (const auto& root : roots_) {
        bool inside = normal == root || root == "/" || normal.starts_with(root + "/");
        if (inside && (!best || root.size() > best->size())) best = &root;
    }
    if (!best) refuse(fmt::format("host path '{}' is outside the allowed host directories; {}", host_path, allowed));
    auto relative = normal.size() > best->size() ? normal.substr(best->size() == 1 ? 1 : best->size() + 1) : ".";
    return {*best, relative};
}

// ---------------------------------------------------------------- packing

namespace {

class Packer {
public:
    Packer(const Limits& limits, unsigned owner, std::string host_path, const PackOptions& options)
        : limits_(limits), owner_(owner), host_path_(std::move(host_path)), options_(options) {}

    void add_directory(const std::string& name, unsigned mode, std::int64_t mtime) {
        count_entry();
        tar_.add({.name = name, .directory = true, .mode = (mode & 0777) | 0755, .uid = owner_, .gid = owner_, .mtime = mtime});
    }

    void add_file(const std::string& name, int fd, const struct stat& st, const std::string& relative) {
        count_entry();
        auto budget = limits_.max_bytes - result_.bytes;
        if (static_cast<std::uint64_t>(st.st_size) > budget) too_many_bytes();  // before reading anything
        auto data = read_bounded(fd, budget, relative);
        tar_.add({.name = name, .content = data, .mode = static_cast<unsigned>(st.st_mode & 0777), .uid = owner_, .gid = owner_,
                  .mtime = st.st_mtime});
        if (options_.on_entry)
            options_.on_entry({.path = relative, .mode = static_cast<unsigned>(st.st_mode & 0777), .mtime = st.st_mtime, .data = data});
        result_.files += 1;
        result_.bytes += data.size();
    }

    // Copies the directory open as `dir` under the archive name `name`; `relative` is its path below host_path.
    void walk(Fd dir, const std::string& name, const std::string& relative) {
        std::unique_ptr<DIR, int (*)(DIR*)> stream(::fdopendir(dir.get()), ::closedir);
        if (!stream) refuse(fmt::format("cannot read directory '{}': {}", shown(relative), errno_text(errno)));
        dir.release();
        std::vector<std::string> entries;
        while (auto* entry = ::readdir(stream.get())) {
            std::string_view entry_name = entry->d_name;
            if (entry_name != "." && entry_name != "..") entries.emplace_back(entry_name);
        }
        std::sort(entries.begin(), entries.end());  // reproducible archives
        for (const auto& entry : entries)
            visit(::dirfd(stream.get()), entry, name + "/" + entry, relative.empty() ? entry : relative + "/" + entry);
    }

    PackResult take() {
        result_.tar = tar_.finish();
        return std::move(result_);
    }

private:
    void visit(int dirfd, const std::string& entry, const std::string& name, const std::string& relative) {
        struct stat st{};
        if (::fstatat(dirfd, entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
            refuse(fmt::format("cannot inspect '{}': {}", shown(relative), errno_text(errno)));
        if (options_.excluded && options_.excluded(relative, S_ISDIR(st.st_mode))) {
            result_.ignored += 1;
            return;
        }
        if (S_ISLNK(st.st_mode) && options_.keep_links) return add_link(dirfd, entry, name, st, relative);
        if (S_ISDIR(st.st_mode)) {
            Fd child(::openat(dirfd, entry.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (child.get() < 0)
                refuse(fmt::format("cannot open directory '{}': {}", shown(relative), errno_text(errno)));
            add_directory(name, st.st_mode, st.st_mtime);
            result_.directories += 1;
            walk(std::move(child), name, relative);
        } else if (S_ISREG(st.st_mode)) {
            // O_NONBLOCK: should the file be swapped for a FIFO meanwhile, don't hang on it.
            Fd file(::openat(dirfd, entry.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
            struct stat now{};
            if (file.get() < 0 || ::fstat(file.get(), &now) != 0 || !S_ISREG(now.st_mode))
                return result_.skipped.push_back({relative, "replaced by something else while being copied"});
            add_file(name, file.get(), now, relative);
        } else {
            result_.skipped.push_back({relative, kind_of_special(st.st_mode)});  // never followed or opened
        }
    }

    // The link itself, read with readlinkat: whatever it points to is never opened.
    void add_link(int dirfd, const std::string& entry, const std::string& name, const struct stat& st,
                  const std::string& relative) {
        count_entry();
        std::string target(PATH_MAX, '\0');
        auto n = ::readlinkat(dirfd, entry.c_str(), target.data(), target.size());
        if (n <= 0) return result_.skipped.push_back({relative, "a symbolic link that could not be read"});
        target.resize(static_cast<std::size_t>(n));
        tar_.add({.name = name, .link_target = target, .mode = 0777, .uid = owner_, .gid = owner_, .mtime = st.st_mtime});
        if (options_.on_entry) options_.on_entry({.path = relative, .link = true, .mode = 0777, .mtime = st.st_mtime, .data = target});
        result_.links.push_back({relative, target, leads_outside(relative, target)});
    }

    // Lexically: an absolute target, or one whose ".." climb above the packed directory.
    static bool leads_outside(const std::string& relative, const std::string& target) {
        if (target.starts_with('/')) return true;
        auto depth = static_cast<long>(components(relative).size()) - 1;
        for (auto part : components(target)) {
            depth += part == ".." ? -1 : 1;
            if (depth < 0) return true;
        }
        return false;
    }

    static std::string kind_of_special(mode_t mode) {
        if (S_ISLNK(mode)) return "a symbolic link (not followed)";
        if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
        if (S_ISSOCK(mode)) return "a socket";
        if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
        return "not a regular file";
    }

    std::string shown(const std::string& relative) const {
        return relative.empty() ? host_path_ : host_path_ + "/" + relative;
    }

    void count_entry() {
        if (++entries_ > limits_.max_entries)
            refuse(fmt::format("more than {} files and directories to copy; refusing (copy a smaller directory)",
                               limits_.max_entries));
    }

    [[noreturn]] void too_many_bytes() const {
        refuse(fmt::format("more than {} bytes to copy; refusing (copy fewer or smaller files)", limits_.max_bytes));
    }

    std::string read_bounded(int fd, std::uint64_t budget, const std::string& relative) const {
        std::string data;
        char buffer[65536];
        for (;;) {
            auto n = ::read(fd, buffer, sizeof buffer);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) refuse(fmt::format("cannot read '{}': {}", shown(relative), errno_text(errno)));
            if (n == 0) return data;
            if (static_cast<std::uint64_t>(n) > budget - data.size()) too_many_bytes();  // it grew meanwhile
            data.append(buffer, static_cast<std::size_t>(n));
        }
    }

    const Limits& limits_;
    unsigned owner_;
    std::string host_path_;
    const PackOptions& options_;
    std::uint64_t entries_ = 0;
    PackResult result_;
    docker::TarWriter tar_;
};

} // namespace

PackResult pack_host_path(const HostDirs& dirs, const std::string& host_path, const std::string& archive_root,
                          unsigned owner, const Limits& limits, const PackOptions& options) {
    auto [root, relative] = dirs.locate(host_path);
    auto name = workspace_path(archive_root);
    if (name == ".") refuse("the destination in the sandbox must name a file or directory, not the workspace itself");
    Fd root_fd = open_root(root);
    // Intermediate symlinks may be followed only while they stay inside the root; the last one never.
    constexpr std::uint64_t beneath = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    Fd target(open_beneath(root_fd.get(), relative, O_PATH | O_NOFOLLOW, beneath));
    if (target.get() < 0) refuse(resolve_error(host_path, errno));
    struct stat st{};
    if (::fstat(target.get(), &st) != 0) refuse(resolve_error(host_path, errno));
    if (S_ISLNK(st.st_mode))
        refuse(fmt::format("host path '{}' is a symbolic link; refusing to follow it (give the real path)", host_path));
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        refuse(fmt::format("host path '{}' is not a regular file or directory", host_path));

    Packer packer(limits, owner, host_path, options);
    auto parts = components(name);
    std::string parent;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {  // parents of the destination, so the upload creates them
        parent.append(i ? "/" : "").append(parts[i]);
        packer.add_directory(parent, 0755, st.st_mtime);
    }
    if (S_ISDIR(st.st_mode)) {
        Fd dir(::openat(target.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (dir.get() < 0) refuse(resolve_error(host_path, errno));
        packer.add_directory(name, st.st_mode, st.st_mtime);
        packer.walk(std::move(dir), name, "");
    } else {
        // Reopen for reading, still beneath the root, and make sure it is the file we inspected.
        Fd file(open_beneath(root_fd.get(), relative, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, beneath));
        struct stat now{};
        if (file.get() < 0 || ::fstat(file.get(), &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev)
            refuse(fmt::format("host path '{}' changed while being copied; try again", host_path));
        packer.add_file(name, file.get(), now, "");
    }
    auto result = packer.take();
    result.directories += S_ISDIR(st.st_mode) ? 1 : 0;
    return result;
}

// ---------------------------------------------------------------- unpacking

namespace {

struct Planned {
    EntryType type;
    const TarMember* member;  // null for a directory implied by a deeper member
};

// Validates every member and maps each to its path below host_path ("" is host_path).
std::map<std::string, Planned> plan_unpack(const std::vector<TarMember>& members, const Limits& limits) {
    if (members.empty()) refuse("the archive is empty; nothing to copy");
    if (members.size() > limits.max_entries)
        refuse(fmt::format("the archive has more than {} entries; refusing it", limits.max_entries));
    std::map<std::string, Planned> plan;
    std::string first;
    std::uint64_t bytes = 0;
    for (const auto& member : members) {
        const auto& path = member.path;
        if (member.type != EntryType::file && member.type != EntryType::directory)
            refuse(fmt::format("the archive member '{}' is a link or special file; refusing the whole archive "
                               "(only regular files and directories are copied to the host)", path));
        if (has_nul(path)) refuse("an archive member name contains a NUL byte; refusing the whole archive");
        if (path.starts_with('/'))
            refuse(fmt::format("the archive member '{}' has an absolute path; refusing the whole archive", path));
        auto parts = components(path);
        if (std::find(parts.begin(), parts.end(), "..") != parts.end())
            refuse(fmt::format("the archive member '{}' contains '..'; refusing the whole archive", path));
        if (parts.empty()) refuse("an archive member has an empty name; refusing the whole archive");
        if (first.empty()) first = parts[0];
        if (parts[0] != first)
            refuse(fmt::format("the archive members do not share one top-level name ('{}' and '{}'); refusing it",
                               first, parts[0]));
        bytes += member.data.size();
        if (bytes > limits.max_bytes)
            refuse(fmt::format("the archive holds more than {} bytes; refusing it", limits.max_bytes));
        // Every ancestor must be a directory, and no path may be both a file and a directory.
        std::string sub;  // "" is host_path itself (parts[0])
        for (std::size_t i = 1;; ++i) {
            bool last = i == parts.size();
            auto type = last ? member.type : EntryType::directory;
            auto [it, added] = plan.try_emplace(sub, Planned{type, last ? &member : nullptr});
            if (!added && it->second.type != type)
                refuse(fmt::format("the archive member '{}' is both a file and a directory; refusing it", path));
            if (!added && last) it->second.member = &member;  // as tar does, the later member wins
            if (last) break;
            sub.append(sub.empty() ? "" : "/").append(parts[i]);
        }
    }
    return plan;
}

std::string at(const std::string& base, const std::string& sub) { return sub.empty() ? base : base + "/" + sub; }

// Checks the host side before writing anything: no symlink in the way, no type clash.
void preflight(int parent, const std::string& base, const std::string& host_path,
               const std::map<std::string, Planned>& plan) {
    for (const auto& [sub, planned] : plan) {
        auto shown = at(host_path, sub);
        Fd fd(open_beneath(parent, at(base, sub), O_PATH | O_NOFOLLOW, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS));
        if (fd.get() < 0) {
            if (errno == ENOENT) continue;  // to be created
            refuse(resolve_error(shown, errno));
        }
        struct stat st{};
        if (::fstat(fd.get(), &st) != 0) refuse(resolve_error(shown, errno));
        if (S_ISLNK(st.st_mode))
            refuse(fmt::format("'{}' exists and is a symbolic link; refusing to replace it (remove it first)", shown));
        if (planned.type == EntryType::directory && !S_ISDIR(st.st_mode))
            refuse(fmt::format("'{}' exists and is not a directory; refusing to replace it", shown));
        if (planned.type == EntryType::file && !S_ISREG(st.st_mode))
            refuse(fmt::format("'{}' exists and is not a regular file; refusing to replace it", shown));
    }
}

void make_directory(int dirfd, const std::string& name, unsigned mode, const std::string& shown) {
    if (::mkdirat(dirfd, name.c_str(), (mode & 0777) | 0700) == 0) return;
    int err = errno;
    struct stat st{};
    if (err != EEXIST) refuse(fmt::format("cannot create directory '{}': {}", shown, errno_text(err)));
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
        refuse(fmt::format("cannot create directory '{}': it exists and is not a directory", shown));
}

// Writes under a temporary name and renames into place, so a failure never leaves half a file.
// `mode` narrowed by the umask, or exactly (set on the temporary file before it
// takes the name, never by name afterwards: that could follow a link swapped in).
enum class ModeIs { umasked, exact };

void write_file(int dirfd, const std::string& name, std::string_view data, unsigned mode, const std::string& shown,
                ModeIs mode_is = ModeIs::umasked) {
    static std::atomic<unsigned> counter{0};
    auto temp = fmt::format(".cubicle-{}-{}.part", ::getpid(), counter++);
    Fd fd(::openat(dirfd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0777 & ~07000u));
    if (fd.get() < 0) refuse(fmt::format("cannot create '{}': {}", shown, errno_text(errno)));
    auto fail = [&](const std::string& why) {
        ::unlinkat(dirfd, temp.c_str(), 0);
        refuse(fmt::format("cannot write '{}': {}", shown, why));
    };
    for (std::size_t done = 0; done < data.size();) {
        auto n = ::write(fd.get(), data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(errno_text(errno));
        done += static_cast<std::size_t>(n);
    }
    if (mode_is == ModeIs::exact && ::fchmod(fd.get(), mode & 0777) != 0) fail(errno_text(errno));
    if (::close(fd.release()) != 0) fail(errno_text(errno));
    struct stat st{};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
        fail("it appeared meanwhile as something other than a regular file");
    if (::renameat(dirfd, temp.c_str(), dirfd, name.c_str()) != 0) fail(errno_text(errno));
}

} // namespace

UnpackResult unpack_to_host(const HostDirs& dirs, const std::vector<TarMember>& members,
                            const std::string& host_path, const Limits& limits) {
    auto [root, relative] = dirs.locate(host_path);
    auto plan = plan_unpack(members, limits);
    Fd root_fd = open_root(root);
    auto slash = relative.rfind('/');
    auto parent_relative = slash == std::string::npos ? std::string(".") : relative.substr(0, slash);
    auto base = slash == std::string::npos ? relative : relative.substr(slash + 1);
    constexpr std::uint64_t no_links = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
    Fd parent(open_beneath(root_fd.get(), parent_relative, O_PATH | O_DIRECTORY, no_links));
    if (parent.get() < 0)
        refuse(fmt::format("the parent directory of '{}' must exist and be reached without symbolic links: {}",
                           host_path, errno_text(errno)));
    preflight(parent.get(), base, host_path, plan);

    UnpackResult result;
    for (const auto& [sub, planned] : plan) {  // parents sort before their children
        auto path = at(base, sub);
        auto cut = path.rfind('/');
        auto dir_path = cut == std::string::npos ? std::string(".") : path.substr(0, cut);
        auto name = cut == std::string::npos ? path : path.substr(cut + 1);
        auto shown = at(host_path, sub);
        Fd dir(open_beneath(parent.get(), dir_path, O_PATH | O_DIRECTORY, no_links));
        if (dir.get() < 0) refuse(resolve_error(shown, errno));
        unsigned mode = planned.member ? planned.member->mode : 0755;
        if (planned.type == EntryType::directory) {
            make_directory(dir.get(), name, mode, shown);
            result.directories += 1;
        } else {
            write_file(dir.get(), name, planned.member->data, mode, shown);
            result.files += 1;
            result.bytes += planned.member->data.size();
        }
    }
    return result;
}

// ---------------------------------------------------------------- single files below a project

namespace {

constexpr std::uint64_t no_symlinks = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;

// `relative` below `base`, checked: no "..", nothing absolute, not empty.
struct Located {
    Fd root;
    std::string dir;   // the file's directory, relative to the root
    std::string name;  // its last component
    std::string shown;
};

Located locate_below(const HostDirs& dirs, const std::string& base, const std::string& relative) {
    if (has_nul(relative)) refuse("a file name contains a NUL byte");
    if (relative.starts_with('/')) refuse(fmt::format("'{}' is absolute; files are named below the project", relative));
    auto parts = components(relative);
    if (parts.empty()) refuse("a file name is empty");
    if (std::find(parts.begin(), parts.end(), "..") != parts.end())
        refuse(fmt::format("'{}' contains '..'; refusing it", relative));
    auto [root, base_relative] = dirs.locate(base);
    Located at{open_root(root), base_relative, std::string(parts.back()), base + "/" + relative};
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) at.dir.append("/").append(parts[i]);
    return at;
}

} // namespace

void require_host_directory(const HostDirs& dirs, const std::string& host_path) {
    auto [root, relative] = dirs.locate(host_path);
    Fd root_fd = open_root(root);
    Fd dir(open_beneath(root_fd.get(), relative, O_PATH | O_NOFOLLOW, no_symlinks));
    if (dir.get() < 0) refuse(resolve_error(host_path, errno));
    struct stat st{};
    if (::fstat(dir.get(), &st) != 0) refuse(resolve_error(host_path, errno));
    if (S_ISLNK(st.st_mode)) refuse(fmt::format("'{}' is a symbolic link; give the real path", host_path));
    if (!S_ISDIR(st.st_mode)) refuse(fmt::format("'{}' is not a directory", host_path));
}

HostFile read_host_file(const HostDirs& dirs, const std::string& base, const std::string& relative, const Limits& limits) {
    auto at = locate_below(dirs, base, relative);
    Fd dir(open_beneath(at.root.get(), at.dir, O_PATH | O_DIRECTORY, no_symlinks));
    if (dir.get() < 0) {
        if (errno == ENOENT || errno == ENOTDIR) return {};
        if (errno == ELOOP || errno == EXDEV) return {.kind = HostFile::Kind::symlink};
        refuse(resolve_error(at.shown, errno));
    }
    struct stat st{};
    if (::fstatat(dir.get(), at.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return {};
        refuse(resolve_error(at.shown, errno));
    }
    if (S_ISLNK(st.st_mode)) return {.kind = HostFile::Kind::symlink};
    if (!S_ISREG(st.st_mode)) return {.kind = HostFile::Kind::other};
    Fd file(::openat(dir.get(), at.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    struct stat now{};
    if (file.get() < 0 || ::fstat(file.get(), &now) != 0 || !S_ISREG(now.st_mode)) return {.kind = HostFile::Kind::other};
    HostFile result{.kind = HostFile::Kind::regular, .mode = static_cast<unsigned>(now.st_mode & 07777)};
    char buffer[65536];
    for (;;) {
        auto n = ::read(file.get(), buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) refuse(fmt::format("cannot read '{}': {}", at.shown, errno_text(errno)));
        if (n == 0) return result;
        if (result.data.size() + static_cast<std::size_t>(n) > limits.max_bytes)
            refuse(fmt::format("'{}' is larger than the transfer limit of {} bytes", at.shown, limits.max_bytes));
        result.data.append(buffer, static_cast<std::size_t>(n));
    }
}

void write_host_file(const HostDirs& dirs, const std::string& base, const std::string& relative, std::string_view data,
                     unsigned mode) {
    auto at = locate_below(dirs, base, relative);
    // Each missing directory is made, and each step opened, without following a link.
    Fd dir(open_beneath(at.root.get(), dirs.locate(base).second, O_PATH | O_DIRECTORY, no_symlinks));
    if (dir.get() < 0) refuse(resolve_error(base, errno));
    auto parts = components(relative);
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
        std::string part(parts[i]);
        make_directory(dir.get(), part, 0755, at.shown);
        Fd next(open_beneath(dir.get(), part, O_PATH | O_DIRECTORY, no_symlinks));
        if (next.get() < 0) refuse(resolve_error(at.shown, errno));
        dir = std::move(next);
    }
    struct stat st{};
    if (::fstatat(dir.get(), at.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
        refuse(fmt::format("'{}' is a symbolic link or special file on the host; refusing to replace it", at.shown));
    // write_file renames over the name: a link swapped in meanwhile is replaced, never written through.
    write_file(dir.get(), at.name, data, mode, at.shown, ModeIs::exact);
}

void remove_host_file(const HostDirs& dirs, const std::string& base, const std::string& relative) {
    auto at = locate_below(dirs, base, relative);
    Fd dir(open_beneath(at.root.get(), at.dir, O_PATH | O_DIRECTORY, no_symlinks));
    if (dir.get() < 0) refuse(resolve_error(at.shown, errno));
    struct stat st{};
    if (::fstatat(dir.get(), at.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return;
        refuse(resolve_error(at.shown, errno));
    }
    if (!S_ISREG(st.st_mode)) refuse(fmt::format("'{}' is not a regular file on the host; refusing to delete it", at.shown));
    if (::unlinkat(dir.get(), at.name.c_str(), 0) != 0)
        refuse(fmt::format("cannot delete '{}': {}", at.shown, errno_text(errno)));
}

// ---------------------------------------------------------------- sandbox paths

std::string workspace_path(std::string_view path) {
    if (has_nul(path)) refuse("the path contains a NUL byte");
    if (path.empty()) refuse("the path is empty; use '.' for the workspace (/workspace) itself");
    if (path.size() > 4096) refuse(fmt::format("the path is {} bytes long; the limit is 4096", path.size()));
    if (path.starts_with('/'))
        refuse(fmt::format("path must be relative to the workspace (/workspace), not '{}'", path));
    std::vector<std::string_view> parts;
    for (auto part : components(path)) {
        if (part.size() > 255)
            refuse(fmt::format("a component of path '{}' is {} bytes long; the limit is 255", path, part.size()));
        if (part != "..") parts.push_back(part);
        else if (parts.empty()) refuse(fmt::format("path '{}' escapes the workspace (/workspace) with '..'", path));
        else parts.pop_back();
    }
    return parts.empty() ? "." : join(parts);
}

} // namespace cubicle::files
