// The agent dials home (--agent-channel tcp): where the server cannot mount a socket
// into a sandbox (a remote engine, a Swarm task on another node, a pod), its agent
// connects to the server's TLS endpoint instead. The server makes a key and a
// self-signed certificate at start, in memory; each sandbox is given, in its agent's
// environment (removed before any program runs), the endpoint's address, the pin of
// that key and a one-time token. The server takes a connection only after the TLS
// handshake and a token it issued and nobody used yet; anything else is closed.
// Each sandbox is alone on a network of its own with the server's relay (agent/relay.h),
// which forwards to this endpoint: nothing else answers it there, not even the host.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>

#include "sandbox/agent_channel.hpp"

namespace cubicle::sandbox {

class DialHome {
public:
    // Listens with TLS at `host`:`port` (port 0: any free one). Throws std::runtime_error
    // when it cannot.
    static std::unique_ptr<DialHome> listen(boost::asio::any_io_executor executor, const std::string& host, std::uint16_t port);
    ~DialHome();  // stops listening; connections not yet claimed are closed
    DialHome(const DialHome&) = delete;
    DialHome& operator=(const DialHome&) = delete;

    // The lowercase hex SHA-256 of the certificate's public key (DER SubjectPublicKeyInfo).
    const std::string& pin() const;
    std::uint16_t port() const;
    // A channel for one sandbox, with a fresh token; the token is forgotten with it. The
    // sandbox joins `network`, where its agent dials `host`:`port` (the relay, or this endpoint).
    std::unique_ptr<AgentChannel> expect(std::string network, std::string host, std::uint16_t port);

    struct State;

private:
    explicit DialHome(std::shared_ptr<State> state) : state_(std::move(state)) {}
    std::shared_ptr<State> state_;
};

// HOST:PORT, an IPv6 host in brackets.
std::string host_port(const std::string& host, std::uint16_t port);

} // namespace cubicle::sandbox
