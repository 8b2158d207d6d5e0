// A byte stream to a port on a sandbox's own loopback, relayed by its agent
// over the connection that carries its runs (the stream frames of
// agent/protocol.h): what a port preview carries. Credit-based, so a big
// download holds at most a window (CUBICLE_STREAM_WINDOW) here and in the
// agent, and its frames take turns with everything else on that connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "sandbox/agent_protocol.hpp"

namespace cubicle::sandbox {

class AgentStream {
public:
    using FrameSender = std::function<void(std::string frame)>;
    AgentStream(boost::asio::any_io_executor executor, std::uint32_t id, FrameSender send);
    ~AgentStream();  // aborts a stream still open
    AgentStream(const AgentStream&) = delete;
    AgentStream& operator=(const AgentStream&) = delete;

    std::uint32_t id() const { return id_; }
    // Until the agent connected (true) or said why it could not, or `timeout`
    // passed (false, error(); the stream is aborted then).
    boost::asio::awaitable<bool> connected(std::chrono::steady_clock::duration timeout);
    // What the program wrote: at least one byte, or 0 at its end, or once the
    // stream broke and what arrived before is read (error() then says why).
    boost::asio::awaitable<std::size_t> read_some(char* data, std::size_t size);
    // Sends `data` to the program as the window allows; false once the stream broke.
    boost::asio::awaitable<bool> write(std::string_view data);
    // No more writes: the program reads its end of input (a half-close).
    void shutdown_write();
    // Gives up the stream both ways (the agent closes its socket).
    void abort(std::string_view why);
    const std::string& error() const { return error_; }
    // The agent and the sandbox forget it: both directions ended, or it broke.
    bool finished() const { return broken_ || (read_eof_ && write_shut_); }

    // From the sandbox: a frame for this stream (CONNECTED, DATA, SHUT, WINDOW, ERROR),
    // or the end of the sandbox.
    void on_frame(agent::FrameType type, std::string payload);
    void on_closed(std::string why);

private:
    void fail(std::string why);
    void wake();
    boost::asio::any_io_executor executor_;
    std::uint32_t id_;
    FrameSender send_;
    boost::asio::steady_timer changed_;  // cancelled whenever something a waiter waits for happens
    bool connected_ = false;
    bool broken_ = false;
    bool read_eof_ = false;
    bool write_shut_ = false;
    std::string error_;
    std::deque<std::string> incoming_;
    std::size_t incoming_offset_ = 0;   // consumed of incoming_.front()
    std::uint64_t unacked_ = 0;        // read by our reader, credit not yet handed back
    std::uint64_t buffered_ = 0;       // received and not yet handed back: at most a window
    std::uint64_t credit_;             // DATA bytes the agent still takes
};

} // namespace cubicle::sandbox
