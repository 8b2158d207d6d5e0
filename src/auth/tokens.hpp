// Bearer tokens from a file: one "principal token" per line.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubicle::auth {

class TokenTable {
public:
    // Reads `path`; blank lines and lines starting with '#' are skipped.
    // Throws std::runtime_error naming the file and line of a bad entry.
    static TokenTable load(const std::string& path);

    // The principal `token` belongs to. Every entry is compared, in constant
    // time, so the answer's timing says nothing about how close a guess was.
    std::optional<std::string> principal_for(std::string_view token) const;
    std::size_t size() const { return entries_.size(); }

private:
    struct Entry {
        std::string principal;
        std::array<unsigned char, 32> digest;  // SHA-256 of the token
    };
    std::vector<Entry> entries_;
};

// SHA-256 of `data`.
std::array<unsigned char, 32> sha256(std::string_view data);

} // namespace cubicle::auth
