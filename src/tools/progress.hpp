#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "docker/stream.hpp"
#include "mcp/tool.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::tools {

// Forwards output to the client as progress notifications a client can bear:
// at once while output is sparse, at most `rate` a second (after a burst of
// `burst`) carrying what accumulated when it floods, and nothing past
// `max_bytes` of output per call but one final note. Cuts only at UTF-8
// character boundaries.
class ProgressStream : public std::enable_shared_from_this<ProgressStream> {
public:
    static constexpr double rate = 20;
    static constexpr double burst = 5;

    ProgressStream(std::shared_ptr<mcp::RequestContext> context, boost::asio::any_io_executor executor, std::uint64_t max_bytes);

    void output(docker::StreamKind kind, std::string_view data);
    // A status line (an image pull); sent at once, after any waiting output.
    void note(std::string_view message);
    // Sends what is waiting and stops: nothing may follow the call's result.
    void close();

    sandbox::OutputSink sink() {
        return [self = shared_from_this()](docker::StreamKind kind, std::string_view data) { self->output(kind, data); };
    }

private:
    void send_waiting();
    void schedule();

    std::shared_ptr<mcp::RequestContext> context_;
    boost::asio::steady_timer timer_;
    std::uint64_t max_bytes_;
    std::string carry_[2];  // an unfinished UTF-8 character per stream
    std::string waiting_;
    std::uint64_t sent_bytes_ = 0;
    double progress_ = 0;
    double tokens_ = burst;  // notifications that may go at once
    std::chrono::steady_clock::time_point refilled_ = std::chrono::steady_clock::now();
    bool timer_armed_ = false;
    bool capped_ = false;
    bool closed_ = false;
};

} // namespace cubicle::tools
