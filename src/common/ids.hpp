#pragma once

#include <string>

namespace cubicle {

// `bytes` random bytes from the kernel as lowercase hex.
std::string random_hex(std::size_t bytes);

} // namespace cubicle
