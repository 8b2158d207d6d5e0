// systemd socket activation (sd_listen_fds(3) semantics, without libsystemd):
// a listening socket passed by the service manager as fd 3, announced by
// LISTEN_PID (our pid) and LISTEN_FDS (how many, from 3 on).
#pragma once

#include <optional>
#include <string>

namespace cubicle::systemd {

struct ListenSocket {
    int fd = -1;
    int family = 0;        // AF_INET or AF_INET6
    std::string address;   // the address it is bound to, as text
    unsigned short port = 0;
};

// The passed socket, or nullopt when none was passed to this process.
// Clears LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES so that children (Docker
// helpers, ssh) never see them, and marks the fd close-on-exec.
// Throws std::runtime_error when a socket was passed but cannot serve HTTP
// (more than one, not a listening TCP socket).
std::optional<ListenSocket> take_listen_socket();

} // namespace cubicle::systemd
