#include "sandbox/agent_channel.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/file_text.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "docker/transport.hpp"
#include "sandbox/owner.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using local = asio::local::stream_protocol;

namespace {

constexpr const char* owner_file = "owner";
// The directory's and the sockets' names: random, because the container's mount table
// shows the socket's host path to its programs, which must learn nothing from it (not
// the server's instance, not the sandbox's id).
constexpr std::size_t name_bytes = 8;
// Room for a socket's name in its directory ("/", 16 hex digits, ".sock", and spare).
constexpr std::size_t longest_socket_name = 32;

std::string base_dir() {
    if (const char* systemd = std::getenv("RUNTIME_DIRECTORY"); systemd && *systemd == '/' && !std::strchr(systemd, ':')) {
        return systemd;  // systemd's RuntimeDirectory= (cubicle.service), made for this service alone
    }
    if (::geteuid() == 0) return "/run/cubicle";
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime == '/') return fmt::format("{}/cubicle", runtime);
    return fmt::format("/tmp/cubicle-{}", ::geteuid());
}

// Somebody else's directory (a shared /tmp) must not hold our sockets.
bool private_dir(const std::string& dir) {
    struct stat st{};
    return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 0077) == 0;
}

// The directories of servers that are provably dead (a server killed before it could remove its own).
void remove_dead(const std::string& base) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(base, ec)) {
        if (!entry.is_directory(ec) || entry.is_symlink(ec)) continue;
        auto record = file_text(entry.path() / owner_file);
        if (!record.empty() && owner_state(record) == OwnerState::dead) fs::remove_all(entry.path(), ec);
    }
}

} // namespace

struct SocketChannel::Listener {
    explicit Listener(asio::any_io_executor executor) : acceptor(executor) {}
    local::acceptor acceptor;
};

SocketChannel::SocketChannel(std::string path, std::unique_ptr<Listener> listener)
    : path_(std::move(path)), listener_(std::move(listener)) {}

SocketChannel::~SocketChannel() {
    boost::system::error_code ignored;
    listener_->acceptor.close(ignored);
    ::unlink(path_.c_str());
}

asio::awaitable<std::unique_ptr<docker::RawStream>> SocketChannel::accept(std::chrono::milliseconds timeout) {
    auto& acceptor = listener_->acceptor;
    asio::steady_timer timer(acceptor.get_executor());
    timer.expires_after(timeout);
    timer.async_wait([&acceptor](boost::system::error_code ec) {
        if (!ec) acceptor.cancel(ec);
    });
    // Not a structured binding: GCC 12 destroys a coroutine's bound socket twice.
    local::socket socket(acceptor.get_executor());
    boost::system::error_code ec;
    co_await acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    timer.cancel();
    boost::system::error_code ignored;
    acceptor.close(ignored);
    if (ec) throw ToolError(fmt::format("the sandbox agent announced its channel but did not connect to it ({})", ec.message()));
    co_return docker::raw_stream(docker::Transport::Socket(std::move(socket)));
}

std::unique_ptr<AgentChannels> AgentChannels::open() {
    auto base = base_dir();
    if (::mkdir(base.c_str(), 0700) != 0 && errno != EEXIST) {
        log::warning("agent channels: cannot create {}: {}; sandboxes use their attach streams", base, std::strerror(errno));
        return nullptr;
    }
    if (!private_dir(base)) {
        log::warning("agent channels: {} is not a directory private to this user; sandboxes use their attach streams", base);
        return nullptr;
    }
    remove_dead(base);
    auto dir = fmt::format("{}/{}", base, random_hex(name_bytes));
    if (dir.size() + longest_socket_name >= sizeof(sockaddr_un::sun_path)) {
        log::warning("agent channels: {} is too long a path for Unix sockets; sandboxes use their attach streams", dir);
        return nullptr;
    }
    if (::mkdir(dir.c_str(), 0700) != 0) {
        log::warning("agent channels: cannot create {}: {}; sandboxes use their attach streams", dir, std::strerror(errno));
        return nullptr;
    }
    std::ofstream(fs::path(dir) / owner_file) << owner_record();
    return std::unique_ptr<AgentChannels>(new AgentChannels(std::move(dir)));
}

AgentChannels::~AgentChannels() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

std::unique_ptr<SocketChannel> AgentChannels::listen(asio::any_io_executor executor) const {
    auto path = fmt::format("{}/{}.sock", dir_, random_hex(name_bytes));
    auto listener = std::make_unique<SocketChannel::Listener>(executor);
    boost::system::error_code ec;
    if (path.size() >= sizeof(sockaddr_un::sun_path)) ec = boost::asio::error::name_too_long;
    if (!ec) listener->acceptor.open(local(), ec);
    if (!ec) listener->acceptor.bind(local::endpoint(path), ec);
    // The agent runs as the sandbox uid; the directory (0700) keeps everyone else on
    // the host out, and in the container the socket takes one connection only.
    if (!ec && ::chmod(path.c_str(), 0666) != 0) ec.assign(errno, boost::system::system_category());
    if (!ec) listener->acceptor.listen(1, ec);
    if (ec) {
        log::warning("agent channel {}: {}; the sandbox uses its attach stream", path, ec.message());
        ::unlink(path.c_str());
        return nullptr;
    }
    return std::unique_ptr<SocketChannel>(new SocketChannel(std::move(path), std::move(listener)));
}

} // namespace cubicle::sandbox
