#pragma once

#include <stdexcept>

namespace cubicle {

// A failure the client's model can act on: reported as a tool result with
// isError: true and this message, never as a protocol error.
class ToolError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

} // namespace cubicle
