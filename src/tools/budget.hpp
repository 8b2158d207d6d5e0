// What one tool result may cost on the wire. Program output is arbitrary bytes,
// and escaping makes a byte cost up to six (a NUL is \u0000), so budgets count
// encoded bytes, never raw ones: one stdio line over 10 MiB makes the official
// TypeScript client drop the connection with every sandbox on it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "mcp/tool.hpp"

namespace cubicle::tools {

// The hard ceiling on one result message, images included.
inline constexpr std::size_t max_message_bytes = 4 << 20;
// What the output of one call (stdout and stderr, all commands of a run_command
// list, a read_file's content) may take of it, escaped.
inline constexpr std::size_t max_output_encoded = 3 << 20;
// Structured results up to this size are repeated verbatim in the text block.
inline constexpr std::size_t verbatim_text_bytes = 64 << 10;

// Bytes `text` takes inside a JSON string literal (after invalid UTF-8 became U+FFFD).
std::size_t encoded_size(std::string_view text);

// Cuts `text` (made valid UTF-8 first) at a character boundary so that it takes
// at most `budget` bytes encoded. Returns whether it cut anything.
bool cut_to_encoded(std::string& text, std::size_t budget);

// Gives a result its text block and holds it to max_message_bytes. A small
// structured result is repeated verbatim, as the MCP specification advises for
// clients that predate structuredContent; a larger one is not sent twice: the
// text block gets the same JSON with every long string cut to its head and tail.
// Throws ToolError when even that would not fit.
void finish_result(mcp::ToolResult& result);

} // namespace cubicle::tools
