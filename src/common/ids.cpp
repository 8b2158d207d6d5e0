#include "common/ids.hpp"

#include <sys/random.h>

#include <stdexcept>
#include <vector>

namespace cubicle {

std::string random_hex(std::size_t bytes) {
    std::vector<unsigned char> raw(bytes);
    if (getrandom(raw.data(), raw.size(), 0) != static_cast<ssize_t>(raw.size())) {
        throw std::runtime_error("getrandom failed");
    }
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : raw) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

} // namespace cubicle
