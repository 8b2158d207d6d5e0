// A TLS connection as a plain socket, for those who hold a TCP one (sandbox/dial_home.cpp);
// apart from transport.hpp so that its other users do without Asio's TCP header.
#pragma once

#include <boost/asio/ip/tcp.hpp>

#include "docker/transport.hpp"

namespace cubicle::docker {

// A TLS connection set up on `tcp` (non-blocking; `ssl` on its descriptor, owned from
// here on) as a plain socket, relayed in-process as the tcp + TLS transport's are.
Transport::Socket relay_tls(boost::asio::ip::tcp::socket tcp, ssl_st* ssl);

} // namespace cubicle::docker
