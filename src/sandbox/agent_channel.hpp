// A direct line to a container's agent (agent/protocol.h, CUBICLE_AGENT_CHANNEL):
// a unix socket the server listens on, bind-mounted into the container, which the
// agent connects to when it starts. Docker's attach stream copies every frame
// through dockerd and the container's shim, two more processes to wake on each
// call; this socket goes from the agent straight to the server. It only works
// where the engine sees the server's files and the runtime passes host sockets
// through (runc, crun; not gVisor): an agent that cannot connect says so in its
// hello and the attach stream serves as before.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "docker/client.hpp"

namespace cubicle::sandbox {

// One sandbox's socket. It stays (not listening) as long as its container: the
// engine's archive calls mount the container's binds again, and fail without it.
class AgentChannel {
public:
    ~AgentChannel();  // stops listening and removes the socket
    AgentChannel(const AgentChannel&) = delete;
    AgentChannel& operator=(const AgentChannel&) = delete;

    const std::string& path() const { return path_; }
    // The agent's connection (made before its hello said so, so no wait is expected);
    // stops listening, so that nothing in the container can connect after it.
    // Throws ToolError when none comes within `timeout`.
    boost::asio::awaitable<std::unique_ptr<docker::RawStream>> accept(std::chrono::milliseconds timeout);

private:
    friend class AgentChannels;
    struct Listener;
    AgentChannel(std::string path, std::unique_ptr<Listener> listener);
    std::string path_;
    std::unique_ptr<Listener> listener_;
};

// The directory of one server's channels, BASE/RANDOM (mode 0700), with the
// server's liveness record in BASE/RANDOM/owner (owner.hpp). The names of the
// directory and of its sockets are random: a container's mount table shows its
// socket's path, and tells its programs nothing. BASE, private to
// the server's user: $RUNTIME_DIRECTORY (systemd's), /run/cubicle as root, else
// $XDG_RUNTIME_DIR/cubicle, else /tmp/cubicle-UID.
class AgentChannels {
public:
    // Also removes the directories of servers provably dead. nullptr (and a warning)
    // when no directory can be made or BASE is not the user's own: then there are none.
    static std::unique_ptr<AgentChannels> open();
    ~AgentChannels();  // removes the directory and what is left in it
    AgentChannels(const AgentChannels&) = delete;
    AgentChannels& operator=(const AgentChannels&) = delete;

    const std::string& path() const { return dir_; }
    // Listens at DIR/RANDOM.sock; nullptr (and a warning) when it cannot.
    std::unique_ptr<AgentChannel> listen(boost::asio::any_io_executor executor) const;

private:
    explicit AgentChannels(std::string dir) : dir_(std::move(dir)) {}
    std::string dir_;
};

} // namespace cubicle::sandbox
