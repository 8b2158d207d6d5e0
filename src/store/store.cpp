#include "store/store.hpp"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/file_text.hpp"
#include "common/ids.hpp"

namespace cubicle::store {
namespace fs = std::filesystem;
namespace {

std::string env(const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "";
}

bool valid_key(std::string_view key);
void sync_dir(const fs::path& dir);

void check_key(std::string_view key) {
    if (!valid_key(key)) throw std::invalid_argument(fmt::format("'{}' is not a valid record key", key));
}

[[noreturn]] void fail(std::string_view what, const fs::path& path) {
    throw std::runtime_error(fmt::format("{} {}: {}", what, path.string(), std::strerror(errno)));
}

// Writes `data` to `path` so that a reader sees the old file or the whole new one,
// also after a crash of the machine.
void write_whole(const fs::path& path, std::string_view data) {
    auto temporary = path;
    temporary += ".tmp-" + random_hex(4);
    int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot write", temporary);
    for (std::size_t done = 0; done < data.size();) {
        auto n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ::close(fd);
            ::unlink(temporary.c_str());
            fail("cannot write", temporary);
        }
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        ::unlink(temporary.c_str());
        fail("cannot write", temporary);
    }
    if (::rename(temporary.c_str(), path.c_str()) != 0) {
        ::unlink(temporary.c_str());
        fail("cannot write", path);
    }
    sync_dir(path.parent_path());
}

// Open-file-description locks: per open file (so a second open in this process is
// refused too), dropped by the kernel with the last descriptor, SIGKILL included,
// and testable without taking them (F_OFD_GETLK), unlike flock.
struct flock whole_file(short type) {
    struct flock lock {};
    lock.l_type = type;
    lock.l_whence = SEEK_SET;
    return lock;
}

void make_dir(const fs::path& path) {
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) fail("cannot create the state directory", path);
}

// A rename or a new entry lasts a crash of the machine once its directory is synced.
void sync_dir(const fs::path& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);
    ::close(fd);
}

bool valid_key(std::string_view key) {
    bool ok = !key.empty() && key.size() <= 128;
    for (char c : key) ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_');
    return ok;
}

// Records are trusted only in a directory nobody else can write: ours, not a link,
// not writable by group or others.
void check_private(const fs::path& dir) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) fail("cannot use", dir);
    if (!S_ISDIR(st.st_mode)) throw std::runtime_error(fmt::format("{} is not a directory", dir.string()));
    if (st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        throw std::runtime_error(fmt::format("{} must belong to this user (uid {}) and be writable by nobody else", dir.string(), ::geteuid()));
    }
}

// Temporary files a crash left (a writer's own is renamed within moments).
void sweep_temporaries(const fs::path& dir) {
    std::error_code error;
    auto old = fs::file_time_type::clock::now() - std::chrono::minutes(10);
    for (const auto& entry : fs::directory_iterator(dir, error)) {
        if (entry.path().filename().string().find(".tmp-") == std::string::npos) continue;
        if (entry.last_write_time(error) < old) fs::remove(entry.path(), error);
    }
}

} // namespace

Hold::~Hold() {
    if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the lock
}

fs::path default_state_dir() {
    if (auto systemd = env("STATE_DIRECTORY"); !systemd.empty()) {
        // systemd may list several, separated by ':'; the first is ours.
        return fs::path(systemd.substr(0, systemd.find(':')));
    }
    if (::geteuid() == 0) return "/var/lib/cubicle";
    if (auto xdg = env("XDG_STATE_HOME"); !xdg.empty() && xdg.front() == '/') return fs::path(xdg) / "cubicle";
    auto home = env("HOME");
    if (home.empty()) throw std::runtime_error("no state directory: HOME is not set (set --state-dir)");
    return fs::path(home) / ".local" / "state" / "cubicle";
}

Store::Store(fs::path dir) : dir_(std::move(dir)) {
    std::error_code error;
    fs::create_directories(dir_.parent_path(), error);  // ~/.local/state may not exist yet
    make_dir(dir_);
    check_private(dir_);
    for (auto kind : {sandboxes, snapshots}) {
        make_dir(dir_ / std::string(kind));
        check_private(dir_ / std::string(kind));
        sweep_temporaries(dir_ / std::string(kind));
    }
    auto id_file = dir_ / "store.id";
    if (!fs::exists(id_file)) {
        // Two servers starting on a new store at once: link() makes the first one's id the
        // store's and fails for the other, which then reads it.
        auto temporary = dir_ / ("store.id.tmp-" + random_hex(4));
        write_whole(temporary, random_hex(16) + "\n");
        bool linked = ::link(temporary.c_str(), id_file.c_str()) == 0 || errno == EEXIST;
        ::unlink(temporary.c_str());
        if (!linked) fail("cannot write", id_file);
        sync_dir(dir_);
    }
    id_ = file_text(id_file).substr(0, 32);
    if (id_.size() != 32) throw std::runtime_error(fmt::format("{} is not a store id", id_file.string()));
}

void Store::write(std::string_view kind, std::string_view key, std::string_view json) const {
    write_whole(path_of(kind, key, ".json"), json);
}

std::optional<std::string> Store::read(std::string_view kind, std::string_view key) const {
    auto path = path_of(kind, key, ".json");
    if (!fs::exists(path)) return std::nullopt;
    return file_text(path);
}

std::vector<std::string> Store::keys(std::string_view kind) const {
    std::vector<std::string> out;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(dir_ / std::string(kind), error)) {
        const auto& path = entry.path();
        // Anything else there (an editor's backup, a stray copy) is not a record.
        if (path.extension() == ".json" && valid_key(path.stem().string())) out.push_back(path.stem().string());
    }
    return out;
}

void Store::remove(std::string_view kind, std::string_view key) const {
    check_key(key);
    std::error_code error;
    auto prefix = std::string(key) + ".";
    for (const auto& entry : fs::directory_iterator(dir_ / std::string(kind), error)) {
        auto name = entry.path().filename().string();
        if (name.starts_with(prefix) && !name.ends_with(".lock")) fs::remove(entry.path(), error);
    }
    // The lock file last: a process that opened it before may still lock it, and then
    // finds no record.
    fs::remove(path_of(kind, key, ".lock"), error);
}

fs::path Store::path_of(std::string_view kind, std::string_view key, std::string_view suffix) const {
    check_key(key);
    return dir_ / std::string(kind) / (std::string(key) + std::string(suffix));
}

std::unique_ptr<Hold> Store::try_hold(std::string_view kind, std::string_view key) const {
    auto path = path_of(kind, key, ".lock");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot open", path);
    auto lock = whole_file(F_WRLCK);
    if (::fcntl(fd, F_OFD_SETLK, &lock) != 0) {
        ::close(fd);
        return nullptr;
    }
    return std::make_unique<Hold>(fd);
}

std::unique_ptr<Hold> Store::lock_all() const {
    auto path = dir_ / "store.lock";
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot open", path);
    auto lock = whole_file(F_WRLCK);
    while (::fcntl(fd, F_OFD_SETLKW, &lock) != 0) {
        if (errno == EINTR) continue;
        ::close(fd);
        fail("cannot lock", path);
    }
    return std::make_unique<Hold>(fd);
}

bool Store::held(std::string_view kind, std::string_view key) const {
    auto path = path_of(kind, key, ".lock");
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    auto probe = whole_file(F_WRLCK);
    bool taken = ::fcntl(fd, F_OFD_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
    ::close(fd);
    return taken;
}

} // namespace cubicle::store
