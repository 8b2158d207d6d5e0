// libFuzzer target: MCP JSON-RPC message handling (mcp::Session), fed one
// message per input line with a trivial tool set; checks that everything the
// server sends is one line of valid JSON and that nothing stays in flight
// after shutdown.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <simdjson.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "mcp/session.hpp"
#include "mcp/tool.hpp"
#include "fuzz_tools.hpp"

namespace asio = boost::asio;
using namespace cubicle;
using namespace cubicle::mcp;

namespace {

void check_sent(const std::string& message) {
    if (message.find('\n') != std::string::npos || message.find('\r') != std::string::npos) std::abort();
    json::Document doc;
    if (doc.parse(message)) std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    asio::io_context io;
    Session session(io.get_executor(), ServerInfo{"cubicle-fuzz", "0", "fuzzing"}, fuzz::tools(), check_sent);
    std::string_view input(reinterpret_cast<const char*>(data), size);
    while (!input.empty()) {
        auto eol = input.find('\n');
        session.handle_message(std::string(input.substr(0, eol)));
        input.remove_prefix(eol == std::string_view::npos ? input.size() : eol + 1);
        io.restart();
        io.poll();
    }
    // The tools never wait; what is still in flight (a subscription) ends at
    // shutdown, within its grace period.
    if (session.in_flight() > 0) asio::co_spawn(io, session.shutdown(), asio::detached);
    io.restart();
    io.run();
    if (session.in_flight() != 0) std::abort();
    return 0;
}
