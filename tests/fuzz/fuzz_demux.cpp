// libFuzzer target: Docker's stdout/stderr stream demultiplexer
// (docker/stream.hpp), fed in pieces of arbitrary size; checks that the bytes
// it passes on are exactly the frames' payloads, in order.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "docker/stream.hpp"

using cubicle::docker::Demuxer;
using cubicle::docker::StreamKind;

namespace {

// The reference: whole frames decoded in one go. Returns false on a bad header.
bool reference(std::string_view in, std::string& out, std::string& err) {
    while (in.size() >= 8) {
        auto b = [&](int i) { return static_cast<unsigned char>(in[i]); };
        if (b(0) > 2 || b(1) || b(2) || b(3)) return false;
        std::uint32_t len = (std::uint32_t(b(4)) << 24) | (std::uint32_t(b(5)) << 16) | (std::uint32_t(b(6)) << 8) | b(7);
        std::string_view payload = in.substr(8, len);
        (b(0) == 2 ? err : out) += payload;
        in.remove_prefix(8 + payload.size());
    }
    return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    std::size_t piece = data[0] % 13 + 1;
    std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

    Demuxer demuxer;
    std::string out, err;
    bool ok = true;
    auto sink = [&](StreamKind kind, std::string_view bytes) { (kind == StreamKind::stderr_ ? err : out) += bytes; };
    for (std::size_t at = 0; ok && at < input.size(); at += piece) ok = demuxer.feed(input.substr(at, piece), sink);

    std::string ref_out, ref_err;
    bool ref_ok = reference(input, ref_out, ref_err);
    if (ok != ref_ok) std::abort();
    if (ok && (out != ref_out || err != ref_err)) std::abort();
    return 0;
}
