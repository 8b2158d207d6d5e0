// Turns an engine endpoint into connected byte streams, one per HTTP connection.
// Every kind yields the same thing, a stream socket the client speaks HTTP over:
//   unix, tcp  the daemon's socket itself;
//   tcp + TLS  one end of a socketpair, relayed in-process through OpenSSL
//              (half-close becomes close_notify and back);
//   ssh        one end of a socketpair that is stdin and stdout of
//              `ssh host docker system dial-stdio` (one ssh per connection).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/generic/stream_protocol.hpp>

#include "docker/endpoint.hpp"

struct ssl_st;

namespace cubicle::docker {

class RawStream;

class Transport {
public:
    using Socket = boost::asio::generic::stream_protocol::socket;

    virtual ~Transport() = default;

    // Throws std::invalid_argument when the endpoint's TLS material cannot be loaded.
    static std::unique_ptr<Transport> make(boost::asio::any_io_executor executor, const Endpoint& endpoint);

    // A new connection, set up within `deadline`. Throws docker::Error saying why not.
    virtual boost::asio::awaitable<Socket> open(std::chrono::milliseconds deadline) = 0;

    // What broke the connection on descriptor `connection` (an open()ed socket's
    // native handle) when the transport knows more than the socket ("ssh exited with
    // status 255: ...", a TLS alert); empty when it does not. Waits briefly for a
    // dying ssh to finish telling.
    virtual boost::asio::awaitable<std::string> explain(int connection);
};

// A connected socket as a RawStream (client.hpp): an upgraded HTTP connection, whose
// first bytes may already have been read (`leftover`), or any other byte stream.
std::unique_ptr<RawStream> raw_stream(Transport::Socket socket, std::string leftover = {});

} // namespace cubicle::docker
