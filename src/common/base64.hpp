#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cubicle::base64 {

std::string encode(std::string_view data);
// nullopt when `text` is not valid base64 (whitespace is ignored).
std::optional<std::string> decode(std::string_view text);

} // namespace cubicle::base64
