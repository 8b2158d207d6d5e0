#include "projects/changes.hpp"

#include <cstdlib>
#include <memory>

#include <git2.h>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "projects/ignore.hpp"
#include "projects/libgit.hpp"

namespace cubicle::projects {
namespace {

// Git's own test: a NUL byte in the first 8000 bytes makes a file binary.
bool looks_binary(std::string_view data) { return data.substr(0, 8000).find('\0') != std::string_view::npos; }

bool new_and_ignored(const Baseline& baseline, const std::string& path) {
    return baseline.ignore && baseline.ignore->ignored(path, false);
}

std::string_view next_field(std::string_view& rest, char separator) {
    auto end = rest.find(separator);
    if (end == std::string_view::npos) throw ToolError("the sandbox's file listing is malformed; try again");
    auto field = rest.substr(0, end);
    rest.remove_prefix(end + 1);
    return field;
}

// ---- the diff text, as git prints it

unsigned git_mode(unsigned permissions, bool link) {
    if (link) return 0120000;
    return (permissions & 0111) ? 0100755 : 0100644;
}

// core.quotePath: a name with control characters, quotes, backslashes or
// non-ASCII bytes is written in double quotes with C escapes.
std::string quoted(std::string_view prefix, std::string_view path) {
    auto plain = [](unsigned char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; };
    bool needs = false;
    for (unsigned char c : path) needs = needs || !plain(c);
    if (!needs) return fmt::format("{}{}", prefix, path);
    std::string out = "\"";
    out += prefix;
    for (unsigned char c : path) {
        switch (c) {
        case '\a': out += "\\a"; break;
        case '\b': out += "\\b"; break;
        case '\t': out += "\\t"; break;
        case '\n': out += "\\n"; break;
        case '\v': out += "\\v"; break;
        case '\f': out += "\\f"; break;
        case '\r': out += "\\r"; break;
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        default:
            if (plain(c)) out += static_cast<char>(c);
            else out += fmt::format("\\{:03o}", c);
        }
    }
    return out + "\"";
}

std::string blob_id(const std::string* data) {
    if (!data) return "0000000";
    git_oid oid;
    git_odb_hash(&oid, data->data(), data->size(), GIT_OBJECT_BLOB);
    char hex[GIT_OID_HEXSZ + 1];
    git_oid_tostr(hex, sizeof hex, &oid);
    return std::string(hex, 7);
}

// The hunks libgit2 makes of two buffers (git's xdiff, 3 lines of context).
std::string hunks(const std::string* old_data, const std::string* new_data) {
    git_diff_options options;
    git_diff_options_init(&options, GIT_DIFF_OPTIONS_VERSION);
    options.flags |= GIT_DIFF_FORCE_TEXT;
    git_patch* raw = nullptr;
    if (git_patch_from_buffers(&raw, old_data ? old_data->data() : nullptr, old_data ? old_data->size() : 0, "a",
                               new_data ? new_data->data() : nullptr, new_data ? new_data->size() : 0, "b", &options) != 0)
        throw ToolError(fmt::format("cannot compute a diff: {}", libgit_error()));
    std::unique_ptr<git_patch, void (*)(git_patch*)> patch(raw, git_patch_free);
    git_buf buffer = GIT_BUF_INIT;
    if (git_patch_to_buf(&buffer, patch.get()) != 0) throw ToolError(fmt::format("cannot print a diff: {}", libgit_error()));
    std::string text(buffer.ptr, buffer.size);
    git_buf_dispose(&buffer);
    // libgit2's header names the buffers, not the files: ours replaces it.
    auto first = text.starts_with("@@") ? 0 : text.find("\n@@");
    if (first == std::string::npos) return {};
    return text.substr(first == 0 ? 0 : first + 1);
}

struct Side {
    unsigned mode;  // git's
    const std::string* data;
};

void file_block(std::string& out, const std::string& path, const Side* old_side, const Side* new_side, bool binary) {
    const std::string* old_data = old_side ? old_side->data : nullptr;
    const std::string* new_data = new_side ? new_side->data : nullptr;
    bool same = old_data && new_data && *old_data == *new_data;
    if (same && old_side->mode == new_side->mode) return;  // a mode change git does not track (644 to 600)
    auto a = quoted("a/", path), b = quoted("b/", path);
    out += fmt::format("diff --git {} {}\n", a, b);
    if (old_side && new_side && old_side->mode != new_side->mode)
        out += fmt::format("old mode {:06o}\nnew mode {:06o}\n", old_side->mode, new_side->mode);
    if (!old_side) out += fmt::format("new file mode {:06o}\n", new_side->mode);
    if (!new_side) out += fmt::format("deleted file mode {:06o}\n", old_side->mode);
    if (same) return;
    out += fmt::format("index {}..{}", blob_id(old_data), blob_id(new_data));
    if (old_side && new_side && old_side->mode == new_side->mode) out += fmt::format(" {:06o}", old_side->mode);
    out += '\n';
    auto from = old_side ? a : std::string("/dev/null");
    auto to = new_side ? b : std::string("/dev/null");
    if (binary) {
        out += fmt::format("Binary files {} and {} differ\n", from, to);
        return;
    }
    auto body = hunks(old_data, new_data);
    if (body.empty()) return;  // an empty file added or deleted: git prints no ---/+++ either
    // As git does (for GNU patch): a tab after a label with a space in it.
    auto tab = [](const std::string& label) { return label.find(' ') == std::string::npos ? "" : "\t"; };
    out += fmt::format("--- {}{}\n+++ {}{}\n", from, tab(from), to, tab(to));
    out += body;
}

} // namespace

std::string_view status_name(ChangeStatus status) {
    switch (status) {
    case ChangeStatus::added: return "added";
    case ChangeStatus::deleted: return "deleted";
    case ChangeStatus::modified: return "modified";
    case ChangeStatus::mode: return "mode";
    }
    return "modified";
}

Listing parse_listing(std::string_view text) {
    Listing listing;
    while (!text.empty()) {
        auto record = next_field(text, '\0');
        auto target = next_field(text, '\0');
        auto type = next_field(record, '\t');
        auto mode = next_field(record, '\t');
        auto size = next_field(record, '\t');
        auto mtime = next_field(record, '\t');
        std::string path(record);
        if (type.size() != 1 || path.empty() || type[0] == 'd' || is_git_internal(path)) continue;
        listing[path] = {type[0], static_cast<unsigned>(std::strtoul(std::string(mode).c_str(), nullptr, 8)),
                         std::strtoull(std::string(size).c_str(), nullptr, 10), std::strtod(std::string(mtime).c_str(), nullptr),
                         std::string(target)};
    }
    return listing;
}

std::vector<std::string> files_to_fetch(const Baseline& baseline, const Listing& listing) {
    std::vector<std::string> paths;
    for (const auto& [path, entry] : listing) {
        if (entry.type != 'f') continue;
        auto base = baseline.files.find(path);
        if (base == baseline.files.end()) {
            if (!new_and_ignored(baseline, path)) paths.push_back(path);
        } else if (base->second.link || entry.size != base->second.data.size() || entry.mtime != base->second.mtime) {
            paths.push_back(path);
        }
    }
    return paths;
}

std::vector<Change> compare(const Baseline& baseline, const Listing& listing, const std::map<std::string, std::string>& fetched) {
    std::map<std::string, Change> changes;
    for (const auto& [path, base] : baseline.files) {
        if (!listing.contains(path))
            changes[path] = {.path = path, .status = ChangeStatus::deleted, .binary = looks_binary(base.data), .old_mode = base.mode};
    }
    for (const auto& [path, entry] : listing) {
        Change change{.path = path, .status = ChangeStatus::modified, .new_mode = entry.mode, .new_mtime = entry.mtime};
        change.type = entry.type == 'f' ? "file" : entry.type == 'l' ? "symlink" : "special";
        if (entry.type == 'l') change.new_data = entry.link_target;
        if (entry.type == 'f') {
            auto content = fetched.find(path);
            if (content != fetched.end()) change.new_data = content->second;
        }
        auto base = baseline.files.find(path);
        if (base == baseline.files.end()) {
            if (new_and_ignored(baseline, path)) continue;
            if (entry.type == 'f' && !fetched.contains(path))
                throw ToolError(fmt::format("'{}' changed while the project was compared; try again", path));
            change.status = ChangeStatus::added;
        } else {
            const auto& old = base->second;
            change.old_mode = old.mode;
            bool same_type = old.link ? entry.type == 'l' : entry.type == 'f';
            if (same_type && entry.type == 'l' && old.data == entry.link_target) continue;
            if (same_type && entry.type == 'f') {
                if (!fetched.contains(path)) change.new_data = old.data;  // size and time unchanged
                if (change.new_data == old.data) {
                    if (entry.mode == old.mode) continue;
                    change.status = ChangeStatus::mode;
                }
            }
            change.binary = looks_binary(old.data);
        }
        change.binary = change.binary || looks_binary(change.new_data);
        change.new_sha256 = sha256_hex(change.new_data);
        changes[path] = std::move(change);
    }
    std::vector<Change> out;
    for (auto& [path, change] : changes) out.push_back(std::move(change));
    return out;
}

std::string unified_diff(const Baseline& baseline, const std::vector<Change>& changes) {
    ensure_libgit();
    std::string out;
    for (const auto& change : changes) {
        auto base = baseline.files.find(change.path);
        const BaselineFile* old = base == baseline.files.end() ? nullptr : &base->second;
        Side old_side{old ? git_mode(old->mode, old->link) : 0, old ? &old->data : nullptr};
        bool new_link = change.type == "symlink";
        Side new_side{git_mode(change.new_mode, new_link), &change.new_data};
        bool gone = change.status == ChangeStatus::deleted || change.type == "special";  // git does not track FIFOs
        bool old_link = old && old->link;
        if (!old && gone) continue;  // a new FIFO or socket: nothing git would show
        if (old && !gone && old_link != new_link) {
            // A file that became a link (or back) is two changes to git: a deletion and an addition.
            file_block(out, change.path, &old_side, nullptr, change.binary);
            file_block(out, change.path, nullptr, &new_side, change.binary);
            continue;
        }
        file_block(out, change.path, old ? &old_side : nullptr, gone ? nullptr : &new_side, change.binary);
    }
    return out;
}

} // namespace cubicle::projects
