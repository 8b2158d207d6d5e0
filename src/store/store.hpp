// What outlives a server: the state directory (--state-dir) and its records.
// Nothing else knows its layout. Records are small JSON files written whole
// (temporary file, fsync, rename); a record is held by at most one process at
// a time through a lock file the kernel releases when that process dies.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubicle::store {

// --state-dir's default: $STATE_DIRECTORY (systemd), else /var/lib/cubicle for root,
// else $XDG_STATE_HOME/cubicle, else ~/.local/state/cubicle.
std::filesystem::path default_state_dir();

// An exclusive hold on one record, for as long as this object lives (or the process).
class Hold {
public:
    explicit Hold(int fd) : fd_(fd) {}
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

private:
    int fd_;
};

// The kinds of record: one directory each.
inline constexpr std::string_view sandboxes = "sandboxes";
inline constexpr std::string_view snapshots = "snapshots";

class Store {
public:
    // Opens the store at `dir`, creating it (mode 0700) and its id on first use.
    // Throws std::runtime_error naming the directory when it cannot.
    explicit Store(std::filesystem::path dir);

    const std::filesystem::path& dir() const { return dir_; }
    // 32 hex digits made once per store: labels the containers and volumes it owns.
    const std::string& id() const { return id_; }

    // `key` must be a name of letters, digits, '-' and '_' (ids made by the server).
    void write(std::string_view kind, std::string_view key, std::string_view json) const;
    std::optional<std::string> read(std::string_view kind, std::string_view key) const;
    std::vector<std::string> keys(std::string_view kind) const;
    // Removes the record and anything else stored under its key (`path_of` files).
    void remove(std::string_view kind, std::string_view key) const;
    // Where a record may keep a file of its own (say, a snapshot's archive).
    std::filesystem::path path_of(std::string_view kind, std::string_view key, std::string_view suffix) const;

    // The whole store, for a moment: a get-or-create by name takes it around its scan
    // and its write (never across a wait), so two servers never make two of one name.
    std::unique_ptr<Hold> lock_all() const;
    // The record's hold, or null when another process (or this one) has it.
    std::unique_ptr<Hold> try_hold(std::string_view kind, std::string_view key) const;
    // Whether some process holds the record now.
    bool held(std::string_view kind, std::string_view key) const;

private:
    std::filesystem::path dir_;
    std::string id_;
};

} // namespace cubicle::store
