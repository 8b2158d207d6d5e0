#include "common/hex.hpp"

#include <stdexcept>

#include <openssl/evp.h>

namespace cubicle {

std::string to_hex(std::string_view bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char c : bytes) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

std::string sha256_hex(std::string_view data) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) != 1) throw std::runtime_error("SHA-256 failed");
    return to_hex(std::string_view(reinterpret_cast<const char*>(digest), length));
}

} // namespace cubicle
