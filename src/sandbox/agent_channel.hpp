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

// How a container reaches its agent's channel (policy.hpp's container_config).
struct AgentWiring {
    std::string socket_path;  // a socket to bind-mount at CUBICLE_AGENT_CHANNEL
    std::string network;      // dialing home: the network to join
    std::string dial;         // and CUBICLE_AGENT_DIAL's value
};

// Where one sandbox's agent connects to the server, once, before any program runs:
// a socket mounted into its container (below) or the server's TLS endpoint (dial_home.hpp).
class AgentChannel {
public:
    virtual ~AgentChannel() = default;
    virtual AgentWiring wiring() const = 0;
    virtual const char* kind() const = 0;  // as get_sandbox_status names it
    // The agent's connection (made before its hello said so, so no wait is expected);
    // nothing else can connect as this sandbox's agent after it.
    // Throws ToolError when none comes within `timeout`.
    virtual boost::asio::awaitable<std::unique_ptr<docker::RawStream>> accept(std::chrono::milliseconds timeout) = 0;
    // The agent said it speaks over its attach stream: nothing may take the channel now.
    virtual void forgo() {}
};

// One sandbox's socket. It stays (not listening) as long as its container: the
// engine's archive calls mount the container's binds again, and fail without it.
class SocketChannel : public AgentChannel {
public:
    ~SocketChannel() override;  // stops listening and removes the socket
    SocketChannel(const SocketChannel&) = delete;
    SocketChannel& operator=(const SocketChannel&) = delete;

    const std::string& path() const { return path_; }
    AgentWiring wiring() const override { return {.socket_path = path_}; }
    const char* kind() const override { return "socket"; }
    // Stops listening once connected, so that nothing in the container can connect after it.
    boost::asio::awaitable<std::unique_ptr<docker::RawStream>> accept(std::chrono::milliseconds timeout) override;

private:
    friend class AgentChannels;
    struct Listener;
    SocketChannel(std::string path, std::unique_ptr<Listener> listener);
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
    std::unique_ptr<SocketChannel> listen(boost::asio::any_io_executor executor) const;

private:
    explicit AgentChannels(std::string dir) : dir_(std::move(dir)) {}
    std::string dir_;
};

} // namespace cubicle::sandbox
