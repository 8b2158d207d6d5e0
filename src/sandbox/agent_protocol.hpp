// The framed protocol between cubicle and its in-sandbox agent (src/agent/agent.c).
// Each frame: u32 big-endian payload length, u8 type, u32 big-endian exec id, payload.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubicle::sandbox::agent {

enum class FrameType : std::uint8_t {
    run = 0x01,
    kill = 0x02,
    ping = 0x03,
    stdin = 0x04,  // more input for an open process; empty closes its stdin
    open = 0x05,   // like run, but stdin stays open and fd 3 is a control channel
    hello = 0x10,
    stdout_ = 0x11,
    stderr_ = 0x12,
    exit = 0x13,
    error = 0x14,
    pong = 0x15,
    control = 0x16,  // bytes an open process wrote to fd 3
};

constexpr std::size_t header_size = 9;
constexpr std::uint32_t max_payload = 64u << 20;

struct Frame {
    FrameType type;
    std::uint32_t id;
    std::string payload;
};

std::string encode(FrameType type, std::uint32_t id, std::string_view payload = {});

struct RunRequest {
    std::vector<std::string> argv;
    std::vector<std::string> env;  // KEY=VALUE, added to the agent's environment
    std::string cwd;
    std::string stdin_data;
    std::uint64_t timeout_ms = 0;
    std::uint64_t max_output_bytes = 0;  // per stream
};

// A run (or, with type open, a long-lived process) request.
std::string encode_run(std::uint32_t id, const RunRequest& request, FrameType type = FrameType::run);

struct ExitStatus {
    int exit_code = 0;  // -1 when killed by a signal
    int signal = 0;
    bool timed_out = false;
    bool truncated = false;
    std::uint64_t duration_us = 0;
    std::uint64_t max_rss_kb = 0;
};

std::optional<ExitStatus> parse_exit(std::string_view payload);

// Incremental frame decoder.
class Decoder {
public:
    // Appends bytes; complete frames are then available through next().
    void feed(std::string_view data) { buffer_.append(data); }
    // The next complete frame, nullopt if none yet. Throws on a corrupt stream.
    std::optional<Frame> next();

private:
    std::string buffer_;
    std::size_t offset_ = 0;
};

} // namespace cubicle::sandbox::agent
