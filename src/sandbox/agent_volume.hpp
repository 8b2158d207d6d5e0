// The volume every container of this server takes the agent from, mounted
// read-only: the agent is written once per server instead of once per container.
// One per server instance, not one shared by every server on the daemon: a server
// never rewrites the file another server's sandboxes are executing, and each
// removes its own at exit (or the orphan sweep does, once the server is gone, by
// its labels). Its name is random, not the instance's: a container's mount table
// shows the volume's host path to its programs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "docker/client.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

class AgentVolume {
public:
    AgentVolume(asio::any_io_executor executor, docker::Client& docker, std::string instance);

    const std::string& name() const { return name_; }
    // The volume's name once it holds the agent; the first call makes it (through a
    // container of `image`), concurrent calls wait for that one. Empty when it cannot
    // be made: the caller copies the agent into its own container instead, and the
    // next call tries again.
    asio::awaitable<std::string> ensure(std::string image);
    // After a container failed to start from it: whether the volume is still the one
    // this server wrote. It may have been removed behind our back (`docker volume prune`
    // while no container used it), and the daemon then makes an empty one of that name
    // for the next container naming it; if so, that one is removed and the next
    // ensure() writes the volume anew.
    asio::awaitable<bool> intact();
    // Removes the volume; false while a container still uses it.
    asio::awaitable<bool> remove();

private:
    asio::awaitable<void> fill(std::string image);

    asio::any_io_executor executor_;
    docker::Client& docker_;
    std::string instance_;
    std::string name_;
    enum class State { idle, filling, ready } state_ = State::idle;
    bool made_ = false;    // creation was asked for: there may be something to remove
    bool warned_ = false;  // the first failure is a warning, later ones are not repeated
    std::vector<std::shared_ptr<asio::steady_timer>> waiting_;
};

} // namespace cubicle::sandbox
