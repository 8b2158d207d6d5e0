// The server's side of the protocol with its in-sandbox agent; the wire format
// itself is defined once, in agent/protocol.h (shared with the C agent).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol.h"

namespace cubicle::sandbox::agent {

#define CUBICLE_FRAME_CXX_(name, cxx_name, value) cxx_name = value,
enum class FrameType : std::uint8_t { CUBICLE_FRAME_TYPES(CUBICLE_FRAME_CXX_) };
#undef CUBICLE_FRAME_CXX_

constexpr std::size_t header_size = CUBICLE_FRAME_HEADER_SIZE;
constexpr std::uint32_t max_payload = CUBICLE_FRAME_MAX_PAYLOAD;
// argv[0] of the runs the agent serves itself (agent/changed.h, agent/remove.h,
// agent/search.h, agent/textfile.h).
constexpr std::string_view builtin_changed_files = CUBICLE_BUILTIN_CHANGED_FILES;
constexpr std::string_view builtin_remove = CUBICLE_BUILTIN_REMOVE;
constexpr std::string_view builtin_search = CUBICLE_BUILTIN_SEARCH;
constexpr std::string_view builtin_read_file = CUBICLE_BUILTIN_READ_FILE;
constexpr std::string_view builtin_replace_file = CUBICLE_BUILTIN_REPLACE_FILE;

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
    bool fork = false;  // sent as FORK: the sandbox's zygote forks it when it can
};

// A run (or, with type open, a long-lived process) request; without its stdin
// when that goes in STDIN frames after a START.
std::string encode_run(std::uint32_t id, const RunRequest& request, FrameType type = FrameType::run, bool with_stdin = true);

// Asks the agent to keep a copy of execution `id`'s output (up to `cap`
// bytes per stream) in `dir`; sent before the run, or before each cell.
std::string encode_save(std::uint32_t id, std::uint64_t cap, std::string_view dir);

struct ExitStatus {
    int exit_code = 0;  // -1 when killed by a signal
    int signal = 0;
    bool timed_out = false;
    bool truncated = false;
    std::uint64_t duration_us = 0;
    std::uint64_t max_rss_kb = 0;
    bool memory_limit = false;  // a process of the run was killed at the programs' memory limit
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
