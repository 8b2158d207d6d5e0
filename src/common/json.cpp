#include "common/json.hpp"

#include <array>
#include <cmath>

#include <fmt/format.h>

namespace cubicle::json {
namespace {

constexpr std::string_view replacement = "\xEF\xBF\xBD";

// Length of the valid UTF-8 sequence starting at `s[i]`, or 0 if invalid;
// `incomplete` is set when the sequence is a valid prefix cut off by the end.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i, bool& incomplete) {
    incomplete = false;
    auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char c = byte(i);
    std::size_t need;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) { need = 3; lo = 0xA0; }
    else if (c == 0xED) { need = 3; hi = 0x9F; }
    else if (c >= 0xE1 && c <= 0xEF) need = 3;
    else if (c == 0xF0) { need = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else if (c == 0xF4) { need = 4; hi = 0x8F; }
    else return 0;
    for (std::size_t k = 1; k < need; ++k) {
        if (i + k >= s.size()) { incomplete = true; return 0; }
        unsigned char b = byte(i + k);
        unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
        if (b < min || b > max) return 0;
    }
    return need;
}

void append_escaped_char(std::string& out, unsigned char c) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
        if (c < 0x20 || c == 0x7F) {
            out += fmt::format("\\u{:04x}", c);
        } else {
            out += static_cast<char>(c);
        }
    }
}

} // namespace

std::string sanitize_utf8(std::string_view text) {
    if (simdjson::validate_utf8(text.data(), text.size())) return std::string(text);
    std::string out;
    out.reserve(text.size() + 16);
    for (std::size_t i = 0; i < text.size();) {
        bool incomplete;
        std::size_t n = utf8_sequence_length(text, i, incomplete);
        if (n == 0) {
            out += replacement;
            ++i;
        } else {
            out.append(text.substr(i, n));
            i += n;
        }
    }
    return out;
}

std::size_t complete_utf8_prefix(std::string_view text) {
    // Only the last three bytes can start an unfinished sequence.
    std::size_t start = text.size() > 3 ? text.size() - 3 : 0;
    for (std::size_t i = start; i < text.size(); ++i) {
        auto c = static_cast<unsigned char>(text[i]);
        if ((c & 0xC0) == 0x80) continue;
        bool incomplete;
        utf8_sequence_length(text, i, incomplete);
        if (incomplete) return i;
    }
    return text.size();
}

void append_quoted(std::string& out, std::string_view text) {
    std::string sanitized;
    if (!simdjson::validate_utf8(text.data(), text.size())) {
        sanitized = sanitize_utf8(text);
        text = sanitized;
    }
    out.reserve(out.size() + text.size() + 2);
    out += '"';
    std::size_t run = 0;  // start of a run of bytes that need no escaping
    for (std::size_t i = 0; i < text.size(); ++i) {
        auto c = static_cast<unsigned char>(text[i]);
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7F) continue;
        out.append(text.substr(run, i - run));
        append_escaped_char(out, c);
        run = i + 1;
    }
    out.append(text.substr(run));
    out += '"';
}

void Writer::separate() {
    if (after_key_) {
        after_key_ = false;
        return;
    }
    if (!first_) out_ += ',';
    first_ = false;
}

Writer& Writer::begin_object() {
    separate();
    out_ += '{';
    first_ = true;
    return *this;
}

Writer& Writer::end_object() {
    out_ += '}';
    first_ = false;
    return *this;
}

Writer& Writer::begin_array() {
    separate();
    out_ += '[';
    first_ = true;
    return *this;
}

Writer& Writer::end_array() {
    out_ += ']';
    first_ = false;
    return *this;
}

Writer& Writer::key(std::string_view name) {
    separate();
    append_quoted(out_, name);
    out_ += ':';
    after_key_ = true;
    return *this;
}

Writer& Writer::value(std::string_view text) {
    separate();
    append_quoted(out_, text);
    return *this;
}

Writer& Writer::value(bool flag) {
    separate();
    out_ += flag ? "true" : "false";
    return *this;
}

Writer& Writer::value(std::int64_t number) {
    separate();
    fmt::format_to(std::back_inserter(out_), "{}", number);
    return *this;
}

Writer& Writer::value(std::uint64_t number) {
    separate();
    fmt::format_to(std::back_inserter(out_), "{}", number);
    return *this;
}

Writer& Writer::value(double number) {
    separate();
    if (std::isfinite(number)) {
        fmt::format_to(std::back_inserter(out_), "{}", number);
    } else {
        out_ += "null";
    }
    return *this;
}

Writer& Writer::null() {
    separate();
    out_ += "null";
    return *this;
}

Writer& Writer::raw(std::string_view json_text) {
    separate();
    out_ += json_text;
    return *this;
}

std::string to_string(simdjson::dom::element value) { return simdjson::minify(value); }

std::optional<std::string> Document::parse(std::string_view text) {
    simdjson::padded_string padded(text);
    auto result = parser_.parse(padded);
    if (result.error()) return std::string(simdjson::error_message(result.error()));
    root_ = result.value_unsafe();
    return std::nullopt;
}

} // namespace cubicle::json
