#include "common/ids.hpp"

#include "common/hex.hpp"

#include <sys/random.h>

#include <stdexcept>
#include <vector>

namespace cubicle {

std::string random_hex(std::size_t bytes) {
    std::vector<unsigned char> raw(bytes);
    if (getrandom(raw.data(), raw.size(), 0) != static_cast<ssize_t>(raw.size())) {
        throw std::runtime_error("getrandom failed");
    }
    return to_hex(std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
}

} // namespace cubicle
