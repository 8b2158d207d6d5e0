// Bytes as lowercase hexadecimal, and the SHA-256 digests the server names things by.
#pragma once

#include <string>
#include <string_view>

namespace cubicle {

std::string to_hex(std::string_view bytes);
// The SHA-256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

} // namespace cubicle
