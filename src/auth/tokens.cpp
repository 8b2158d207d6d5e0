#include "auth/tokens.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

namespace cubicle::auth {

std::array<unsigned char, 32> sha256(std::string_view data) {
    std::array<unsigned char, 32> digest{};
    unsigned int size = 0;
    if (!EVP_Digest(data.data(), data.size(), digest.data(), &size, EVP_sha256(), nullptr) || size != digest.size()) {
        throw std::runtime_error("SHA-256 failed");
    }
    return digest;
}

TokenTable TokenTable::load(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error(fmt::format("cannot read the token file {}", path));
    TokenTable table;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        auto first = line.find_first_not_of(" \t\r");
        if (first == std::string::npos || line[first] == '#') continue;
        auto gap = line.find_first_of(" \t", first);
        auto token_start = gap == std::string::npos ? gap : line.find_first_not_of(" \t", gap);
        auto token_end = token_start == std::string::npos ? token_start : line.find_first_of(" \t\r", token_start);
        if (token_start == std::string::npos ||
            (token_end != std::string::npos && line.find_first_not_of(" \t\r", token_end) != std::string::npos)) {
            throw std::runtime_error(fmt::format("{}:{}: expected 'principal token'", path, number));
        }
        auto token = line.substr(token_start, token_end == std::string::npos ? std::string::npos : token_end - token_start);
        if (token.size() < 16) throw std::runtime_error(fmt::format("{}:{}: a token needs at least 16 characters", path, number));
        table.entries_.push_back({line.substr(first, gap - first), sha256(token)});
    }
    if (table.entries_.empty()) throw std::runtime_error(fmt::format("the token file {} has no tokens", path));
    return table;
}

std::optional<std::string> TokenTable::principal_for(std::string_view token) const {
    // Digests have one length whatever the token's, and every entry is looked at.
    auto digest = sha256(token);
    const Entry* match = nullptr;
    for (const auto& entry : entries_) {
        bool equal = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
        if (equal && !match) match = &entry;
    }
    if (!match) return std::nullopt;
    return match->principal;
}

} // namespace cubicle::auth
