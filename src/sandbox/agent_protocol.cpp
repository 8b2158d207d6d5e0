#include "sandbox/agent_protocol.hpp"

#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

namespace cubicle::sandbox::agent {
namespace {

void put_u32(std::string& out, std::uint32_t v) {
    out += static_cast<char>(v >> 24);
    out += static_cast<char>(v >> 16);
    out += static_cast<char>(v >> 8);
    out += static_cast<char>(v);
}

std::uint32_t get_u32(const char* p) {
    auto b = [p](int i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])); };
    return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

void put_field(std::string& out, std::string_view field) {
    out += field;
    out += '\0';
}

} // namespace

std::string encode(FrameType type, std::uint32_t id, std::string_view payload) {
    std::string out;
    out.reserve(header_size + payload.size());
    put_u32(out, static_cast<std::uint32_t>(payload.size()));
    out += static_cast<char>(type);
    put_u32(out, id);
    out += payload;
    return out;
}

std::string encode_run(std::uint32_t id, const RunRequest& request, FrameType type, bool with_stdin) {
    std::string payload;
    put_field(payload, std::to_string(request.timeout_ms));
    put_field(payload, std::to_string(request.max_output_bytes));
    put_field(payload, request.cwd);
    put_field(payload, std::to_string(request.argv.size()));
    for (const auto& arg : request.argv) put_field(payload, arg);
    put_field(payload, std::to_string(request.env.size()));
    for (const auto& var : request.env) put_field(payload, var);
    if (with_stdin) payload += request.stdin_data;
    return encode(type, id, payload);
}

std::string encode_save(std::uint32_t id, std::uint64_t cap, std::string_view dir) {
    std::string payload;
    put_field(payload, std::to_string(cap));
    payload += dir;
    return encode(FrameType::save, id, payload);
}

std::optional<ExitStatus> parse_exit(std::string_view payload) {
    ExitStatus status;
    std::int64_t fields[7] = {};
    const char* p = payload.data();
    const char* end = p + payload.size();
    for (std::size_t i = 0; i < std::size(fields); ++i) {
        while (p < end && *p == ' ') ++p;
        auto [next, ec] = std::from_chars(p, end, fields[i]);
        if (ec != std::errc()) return std::nullopt;
        p = next;
    }
    if (p != end) return std::nullopt;  // exactly these fields
    status.exit_code = static_cast<int>(fields[0]);
    status.signal = static_cast<int>(fields[1]);
    status.timed_out = fields[2] != 0;
    status.truncated = fields[3] != 0;
    status.duration_us = static_cast<std::uint64_t>(fields[4]);
    status.max_rss_kb = static_cast<std::uint64_t>(fields[5]);
    status.memory_limit = fields[6] != 0;
    return status;
}

std::optional<Frame> Decoder::next() {
    std::size_t available = buffer_.size() - offset_;
    if (available < header_size) {
        if (offset_ > 0) {  // compact once everything decoded has been consumed
            buffer_.erase(0, offset_);
            offset_ = 0;
        }
        return std::nullopt;
    }
    const char* header = buffer_.data() + offset_;
    std::uint32_t length = get_u32(header);
    if (length > max_payload) throw std::runtime_error(fmt::format("agent frame of {} bytes is too large", length));
    if (available < header_size + length) return std::nullopt;
    Frame frame{static_cast<FrameType>(static_cast<unsigned char>(header[4])), get_u32(header + 5),
                buffer_.substr(offset_ + header_size, length)};
    offset_ += header_size + length;
    return frame;
}

} // namespace cubicle::sandbox::agent
