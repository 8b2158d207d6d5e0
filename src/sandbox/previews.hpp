// A sandbox's exposed ports (expose_port): for each, a listener on the host's
// 127.0.0.1 at an ephemeral port (unless the HTTP transport alone serves it)
// whose every connection is relayed, byte for byte, to the same port on the
// sandbox's own loopback through its agent (AgentStream), once its first
// request names the listener in Host (DNS rebinding). The sandbox keeps no
// network. Closed with the sandbox.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

namespace cubicle::sandbox {

class Sandbox;

class Previews {
public:
    explicit Previews(boost::asio::any_io_executor executor) : executor_(std::move(executor)) {}
    ~Previews();
    Previews(const Previews&) = delete;
    Previews& operator=(const Previews&) = delete;

    // Exposes `port` of `box` (at most `limit` per sandbox) and returns the host port
    // relaying it: the one already listening, else a new listener; 0 when `listen`
    // is false (only the HTTP transport's preview path serves it). Throws ToolError.
    unsigned short expose(std::weak_ptr<Sandbox> box, unsigned short port, std::size_t limit, bool listen);
    // Stops listening and closes the port's connections; false when it was not exposed.
    bool unexpose(unsigned short port);
    // sandbox port → host port (0: no listener)
    std::map<unsigned short, unsigned short> exposed() const;
    void close_all();

    struct Listener;

private:
    boost::asio::any_io_executor executor_;
    std::map<unsigned short, std::shared_ptr<Listener>> listeners_;  // by sandbox port
};

} // namespace cubicle::sandbox
