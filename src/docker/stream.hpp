// Docker's multiplexed stdout/stderr framing (attach and exec without a TTY):
// each frame is {stream, 0, 0, 0, big-endian uint32 size} then `size` bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cubicle::docker {

enum class StreamKind : std::uint8_t { stdin_ = 0, stdout_ = 1, stderr_ = 2 };

// Incremental decoder: feed it bytes as they arrive, in pieces of any size.
class Demuxer {
public:
    // Calls `sink(StreamKind, std::string_view)` for each complete or partial
    // payload piece available so far; payload bytes are passed on as soon as
    // they arrive rather than held back until the frame completes.
    // Returns false on a malformed header (the stream is unusable).
    template <typename Sink>
    bool feed(std::string_view data, Sink&& sink);

private:
    unsigned char header_[8];
    std::size_t header_len_ = 0;
    std::uint32_t remaining_ = 0;
    StreamKind kind_ = StreamKind::stdout_;
};

template <typename Sink>
bool Demuxer::feed(std::string_view data, Sink&& sink) {
    while (!data.empty()) {
        if (remaining_ == 0) {
            std::size_t take = std::min(data.size(), sizeof header_ - header_len_);
            for (std::size_t i = 0; i < take; ++i) header_[header_len_++] = static_cast<unsigned char>(data[i]);
            data.remove_prefix(take);
            if (header_len_ < sizeof header_) return true;
            header_len_ = 0;
            if (header_[0] > 2 || header_[1] || header_[2] || header_[3]) return false;
            kind_ = static_cast<StreamKind>(header_[0]);
            remaining_ = (std::uint32_t(header_[4]) << 24) | (std::uint32_t(header_[5]) << 16) |
                         (std::uint32_t(header_[6]) << 8) | std::uint32_t(header_[7]);
            continue;
        }
        std::size_t take = std::min<std::size_t>(data.size(), remaining_);
        sink(kind_, data.substr(0, take));
        remaining_ -= static_cast<std::uint32_t>(take);
        data.remove_prefix(take);
    }
    return true;
}

} // namespace cubicle::docker
