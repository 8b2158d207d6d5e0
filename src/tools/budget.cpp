#include "tools/budget.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/json.hpp"

namespace cubicle::tools {
namespace {

constexpr std::size_t excerpt_bytes = 256 << 10;  // the text block of a large result, at most (escaped)
constexpr std::size_t excerpt_string = 8 << 10;   // what one long string keeps there, at most (escaped)

std::size_t byte_cost(unsigned char c) {
    switch (c) {
    case '"': case '\\': case '\n': case '\r': case '\t': case '\b': case '\f': return 2;
    default: return c < 0x20 || c == 0x7F ? 6 : 1;
    }
}

// The start of the UTF-8 character at or before `i` in valid UTF-8.
std::size_t char_start(std::string_view text, std::size_t i) {
    while (i > 0 && i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
    return i;
}

std::size_t long_strings(simdjson::dom::element value, std::size_t longer_than) {
    std::size_t n = 0;
    switch (value.type()) {
    case simdjson::dom::element_type::OBJECT:
        for (auto [key, member] : simdjson::dom::object(value)) n += long_strings(member, longer_than);
        break;
    case simdjson::dom::element_type::ARRAY:
        for (auto item : simdjson::dom::array(value)) n += long_strings(item, longer_than);
        break;
    case simdjson::dom::element_type::STRING:
        n += std::string_view(value).size() > longer_than;
        break;
    default:
        break;
    }
    return n;
}

// Writes `value` with every string longer than `keep` bytes escaped cut to its
// head and tail, each taking at most keep / 2 escaped.
void write_excerpt(json::Writer& w, simdjson::dom::element value, std::size_t keep) {
    switch (value.type()) {
    case simdjson::dom::element_type::OBJECT:
        w.begin_object();
        for (auto [key, member] : simdjson::dom::object(value)) {
            w.key(key);
            write_excerpt(w, member, keep);
        }
        w.end_object();
        break;
    case simdjson::dom::element_type::ARRAY:
        w.begin_array();
        for (auto item : simdjson::dom::array(value)) write_excerpt(w, item, keep);
        w.end_array();
        break;
    case simdjson::dom::element_type::STRING: {
        std::string_view text(value);  // valid UTF-8: it came out of our own writer
        if (encoded_size(text) <= keep) {
            w.value(text);
            break;
        }
        std::size_t head = 0, tail = text.size(), cost = 0;
        while (head < text.size() && cost + byte_cost(static_cast<unsigned char>(text[head])) <= keep / 2)
            cost += byte_cost(static_cast<unsigned char>(text[head++]));
        head = char_start(text, head);
        for (cost = 0; tail > head && cost + byte_cost(static_cast<unsigned char>(text[tail - 1])) <= keep / 2;)
            cost += byte_cost(static_cast<unsigned char>(text[--tail]));
        while (tail < text.size() && (static_cast<unsigned char>(text[tail]) & 0xC0) == 0x80) ++tail;
        w.value(fmt::format("{}\n[cubicle] {} bytes left out of this copy; structuredContent has all of them\n{}",
                            text.substr(0, head), tail - head, text.substr(tail)));
        break;
    }
    default:
        w.raw(json::to_string(value));
    }
}

} // namespace

std::size_t encoded_size(std::string_view text) {
    auto valid = json::sanitize_utf8(text);
    std::size_t size = 0;
    for (unsigned char c : valid) size += byte_cost(c);
    return size;
}

bool cut_to_encoded(std::string& text, std::size_t budget) {
    text = json::sanitize_utf8(text);
    std::size_t size = 0, i = 0;
    for (; i < text.size(); ++i) {
        size += byte_cost(static_cast<unsigned char>(text[i]));
        if (size > budget) break;
    }
    if (i == text.size()) return false;
    text.resize(char_start(text, i));
    return true;
}

void finish_result(mcp::ToolResult& result) {
    if (result.text.empty() && result.structured.size() > verbatim_text_bytes) {
        simdjson::dom::parser parser;
        simdjson::dom::element root;
        if (parser.parse(result.structured).get(root) == simdjson::SUCCESS) {
            // Every long string gets an equal share of the excerpt.
            auto shares = std::max<std::size_t>(1, long_strings(root, excerpt_string / 6));
            json::Writer w;
            write_excerpt(w, root, std::clamp(excerpt_bytes / shares, std::size_t{256}, excerpt_string));
            result.text = w.take();
            // Many short strings (a long listing) shrink little: then say where the result is.
            if (result.text.size() > 2 * excerpt_bytes) {
                result.text = fmt::format("[cubicle] this result is {} bytes of JSON, too many to repeat here; "
                                          "structuredContent has all of it", result.structured.size());
            }
        }
    }
    std::size_t size = result.structured.size() + encoded_size(result.text.empty() ? result.structured : result.text);
    for (const auto& image : result.images) size += image.data.size() + image.mime_type.size() + 64;
    if (size > max_message_bytes) {
        throw ToolError(fmt::format("the result would take {:.1f} MiB on the wire, over the {} MiB one message may carry; "
                                    "ask for less at once (write big output to a file and read it in parts with read_file)",
                                    static_cast<double>(size) / (1 << 20), max_message_bytes >> 20));
    }
}

} // namespace cubicle::tools
