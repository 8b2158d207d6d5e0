// JSON output and input helpers shared by the protocol, Docker and tool code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <simdjson.h>

namespace cubicle::json {

// Appends `text` as a JSON string literal (with quotes). Control characters are
// escaped and invalid UTF-8 becomes U+FFFD, so arbitrary program output always
// yields valid JSON and never a raw newline.
void append_quoted(std::string& out, std::string_view text);

// Replaces invalid UTF-8 sequences by U+FFFD.
std::string sanitize_utf8(std::string_view text);

// Length of the longest prefix of `text` that does not end inside an
// incomplete (but so far valid) UTF-8 sequence; used to split streamed output
// at character boundaries.
std::size_t complete_utf8_prefix(std::string_view text);

// A small streaming writer: commas and quoting are its business, not the caller's.
class Writer {
public:
    Writer& begin_object();
    Writer& end_object();
    Writer& begin_array();
    Writer& end_array();
    Writer& key(std::string_view name);
    Writer& value(std::string_view text);
    Writer& value(const char* text) { return value(std::string_view(text)); }
    Writer& value(const std::string& text) { return value(std::string_view(text)); }
    Writer& value(bool flag);
    Writer& value(std::int64_t number);
    Writer& value(int number) { return value(static_cast<std::int64_t>(number)); }
    Writer& value(std::uint64_t number);
    Writer& value(double number);
    Writer& null();
    // Inserts an already serialized JSON value verbatim.
    Writer& raw(std::string_view json_text);

    template <typename T>
    Writer& field(std::string_view name, const T& v) { return key(name).value(v); }

    const std::string& str() const { return out_; }
    std::string take() { return std::move(out_); }

private:
    void separate();
    std::string out_;
    bool first_ = true;
    bool after_key_ = false;
};

// Serializes a parsed simdjson value back to compact JSON text.
std::string to_string(simdjson::dom::element value);

// A parsed inbound document that owns its buffer: elements stay valid for the
// lifetime of this object.
class Document {
public:
    Document() = default;
    // Elements point into the parser: a Document never moves.
    Document(const Document&) = delete;
    Document& operator=(const Document&) = delete;

    // Parses `text`; returns an error description on failure.
    std::optional<std::string> parse(std::string_view text);
    simdjson::dom::element root() const { return root_; }

private:
    simdjson::dom::parser parser_;
    simdjson::dom::element root_;
};

} // namespace cubicle::json
