// Reading a record's fields: each one must be there with its type, or the record
// is refused (std::runtime_error naming the field).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <simdjson.h>

#include "common/json.hpp"

namespace cubicle::store {

// Both kinds of record are of this version; a record of another is refused.
inline constexpr std::int64_t record_version = 1;

// The root of a record's text, parsed into `document`: a JSON object of this version.
inline simdjson::dom::element record_root(json::Document& document, std::string_view text) {
    if (auto error = document.parse(text)) throw std::runtime_error("the record is not JSON: " + *error);
    auto root = document.root();
    std::int64_t version = 0;
    if (root["version"].get(version) != simdjson::SUCCESS || version != record_version)
        throw std::runtime_error("the record is of another version");
    return root;
}

inline std::string string_of(simdjson::dom::element object, const char* key) {
    std::string_view text;
    if (object[key].get(text) != simdjson::SUCCESS) throw std::runtime_error(fmt::format("the record has no {}", key));
    return std::string(text);
}

template <typename T>
T number_of(simdjson::dom::element object, const char* key) {
    T number{};
    if (object[key].get(number) != simdjson::SUCCESS) throw std::runtime_error(fmt::format("the record has no {}", key));
    return number;
}

inline bool flag_of(simdjson::dom::element object, const char* key) {
    bool flag = false;
    if (object[key].get(flag) != simdjson::SUCCESS) throw std::runtime_error(fmt::format("the record has no {}", key));
    return flag;
}

} // namespace cubicle::store
