// libFuzzer target: the server's side of the agent wire protocol
// (sandbox/agent_protocol): the incremental frame decoder fed the agent's
// output in pieces of arbitrary size, and the EXIT payload parser.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sandbox/agent_protocol.hpp"

using namespace cubicle::sandbox;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    // The first byte picks the piece size, so one input covers many splits.
    std::size_t piece = data[0] % 17 + 1;
    std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

    agent::Decoder decoder;
    std::size_t decoded = 0;
    try {
        for (std::size_t at = 0; at < input.size(); at += piece) {
            decoder.feed(input.substr(at, piece));
            while (auto frame = decoder.next()) {
                decoded += agent::header_size + frame->payload.size();
                // What was decoded re-encodes to the very bytes it came from.
                if (agent::encode(frame->type, frame->id, frame->payload) !=
                    input.substr(decoded - agent::header_size - frame->payload.size(),
                                 agent::header_size + frame->payload.size()))
                    std::abort();
                if (frame->type == agent::FrameType::exit) (void)agent::parse_exit(frame->payload);
            }
        }
    } catch (const std::runtime_error&) {
        // a corrupt stream (oversized frame): the server drops the agent
    }
    (void)agent::parse_exit(input);
    return 0;
}
