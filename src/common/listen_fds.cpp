#include "common/listen_fds.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

namespace cubicle::systemd {
namespace {

constexpr int first_fd = 3;  // SD_LISTEN_FDS_START

std::optional<long> number(const char* text) {
    if (!text || !*text) return std::nullopt;
    std::string_view view(text);
    long value = 0;
    auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
    if (ec != std::errc() || end != view.data() + view.size()) return std::nullopt;
    return value;
}

} // namespace

std::optional<ListenSocket> take_listen_socket() {
    auto pid = number(std::getenv("LISTEN_PID"));
    auto count = number(std::getenv("LISTEN_FDS"));
    // Meant for another process (a parent that did not clear them): ignore, as sd_listen_fds does.
    bool ours = pid && count && *pid == static_cast<long>(::getpid());
    ::unsetenv("LISTEN_PID");
    ::unsetenv("LISTEN_FDS");
    ::unsetenv("LISTEN_FDNAMES");
    if (!ours || *count <= 0) return std::nullopt;
    if (*count != 1) throw std::runtime_error(fmt::format("systemd passed {} sockets; cubicle serves exactly one (one ListenStream=)", *count));

    ListenSocket socket{.fd = first_fd};
    int flags = ::fcntl(first_fd, F_GETFD);
    if (flags < 0) throw std::runtime_error("systemd announced a socket on fd 3, but fd 3 is not open");
    ::fcntl(first_fd, F_SETFD, flags | FD_CLOEXEC);
    int type = 0, listening = 0;
    socklen_t length = sizeof type;
    bool stream = ::getsockopt(first_fd, SOL_SOCKET, SO_TYPE, &type, &length) == 0 && type == SOCK_STREAM;
    length = sizeof listening;
    bool accepting = ::getsockopt(first_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 && listening;
    sockaddr_storage bound{};
    length = sizeof bound;
    if (!stream || !accepting || ::getsockname(first_fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0 ||
        (bound.ss_family != AF_INET && bound.ss_family != AF_INET6)) {
        throw std::runtime_error("the socket systemd passed is not a listening TCP socket (ListenStream= needs an address or port)");
    }
    socket.family = bound.ss_family;
    char text[INET6_ADDRSTRLEN] = {};
    if (bound.ss_family == AF_INET) {
        auto* v4 = reinterpret_cast<sockaddr_in*>(&bound);
        ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
        socket.port = ntohs(v4->sin_port);
    } else {
        auto* v6 = reinterpret_cast<sockaddr_in6*>(&bound);
        ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
        socket.port = ntohs(v6->sin6_port);
    }
    socket.address = text;
    return socket;
}

} // namespace cubicle::systemd
