#include "files/edit.hpp"

#include <algorithm>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <simdjson.h>

#include "common/errors.hpp"

namespace cubicle::files {
namespace {

constexpr std::size_t context_lines = 3;
constexpr std::size_t max_listed_lines = 8;  // line numbers named in an error
constexpr std::size_t max_diff_bytes = 8 * 1024;

std::string latin1_to_utf8(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() + bytes.size() / 8);
    for (unsigned char c : bytes) {
        if (c < 0x80) {
            out += static_cast<char>(c);
        } else {
            out += static_cast<char>(0xC0 | (c >> 6));
            out += static_cast<char>(0x80 | (c & 0x3F));
        }
    }
    return out;
}

// Valid UTF-8 back to Latin-1; nullopt when a character is beyond U+00FF.
std::optional<std::string> utf8_to_latin1(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        auto c = static_cast<unsigned char>(text[i]);
        if (c < 0x80) {
            out += static_cast<char>(c);
        } else if ((c == 0xC2 || c == 0xC3) && i + 1 < text.size()) {
            out += static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(text[++i]) & 0x3F));
        } else {
            return std::nullopt;
        }
    }
    return out;
}

bool valid_utf8(std::string_view text) { return simdjson::validate_utf8(text.data(), text.size()); }

// Every bare "\n" of `text` as "\r\n".
std::string to_crlf(std::string_view text) {
    std::string out;
    out.reserve(text.size() + text.size() / 16);
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\n' && (i == 0 || text[i - 1] != '\r')) out += '\r';
        out += text[i];
    }
    return out;
}

// A file is CRLF when it has line ends and every one of them is "\r\n".
bool is_crlf(std::string_view text) {
    bool any = false;
    for (std::size_t i = text.find('\n'); i != std::string_view::npos; i = text.find('\n', i + 1)) {
        if (i == 0 || text[i - 1] != '\r') return false;
        any = true;
    }
    return any;
}

std::vector<std::size_t> occurrences(std::string_view text, std::string_view needle) {
    std::vector<std::size_t> at;
    for (auto i = text.find(needle); i != std::string_view::npos; i = text.find(needle, i + needle.size())) at.push_back(i);
    return at;
}

// The file's lines, each with its terminator; the start offset of each.
struct Lines {
    std::vector<std::string_view> text;
    std::vector<std::size_t> start;

    explicit Lines(std::string_view content) {
        std::size_t pos = 0;
        while (pos < content.size()) {
            auto end = content.find('\n', pos);
            end = end == std::string_view::npos ? content.size() : end + 1;
            start.push_back(pos);
            text.push_back(content.substr(pos, end - pos));
            pos = end;
        }
    }
    // 0-based index of the line holding byte `offset` (the last line past the end).
    std::size_t of(std::size_t offset) const {
        if (start.empty()) return 0;
        auto it = std::upper_bound(start.begin(), start.end(), offset);
        return static_cast<std::size_t>(it - start.begin()) - 1;
    }
};

std::string line_list(const Lines& lines, const std::vector<std::size_t>& offsets) {
    std::string out;
    for (std::size_t i = 0; i < offsets.size() && i < max_listed_lines; ++i) {
        out += fmt::format("{}{}", i ? ", " : "", lines.of(offsets[i]) + 1);
    }
    if (offsets.size() > max_listed_lines) out += ", …";
    return out;
}

std::string_view trim(std::string_view s) {
    auto first = s.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return {};
    return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// Where old_text's first non-blank line appears with other indentation or
// spacing: a hint for a model whose old_text was almost right.
std::string near_misses(const Lines& lines, std::string_view old_text) {
    std::string_view first;
    for (std::size_t pos = 0; pos < old_text.size() && first.empty();) {
        auto end = old_text.find('\n', pos);
        if (end == std::string_view::npos) end = old_text.size();
        first = trim(old_text.substr(pos, end - pos));
        pos = end + 1;
    }
    if (first.empty()) return {};
    std::vector<std::size_t> found;
    for (std::size_t i = 0; i < lines.text.size(); ++i) {
        if (trim(lines.text[i]) == first) found.push_back(lines.start[i]);
    }
    if (found.empty()) return {};
    return fmt::format("; its first line, apart from spacing, is on line{} {} — compare the indentation and the lines after it",
                       found.size() == 1 ? "" : "s", line_list(lines, found));
}

// One replaced region, as line ranges [old_begin, old_end) and [new_begin, new_end).
struct Block {
    std::size_t old_begin, old_end, new_begin, new_end;
};

std::string_view without_terminator(std::string_view line) {
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
}

void diff_line(std::string& out, char mark, std::string_view line) {
    out += mark;
    out += without_terminator(line);
    out += '\n';
    if (line.empty() || line.back() != '\n') out += "\\ No newline at end of file\n";
}

std::string hunk_range(std::size_t begin, std::size_t count) {
    // A unified diff names an empty range by the line before it.
    if (count == 0) return fmt::format("{},0", begin);
    if (count == 1) return fmt::format("{}", begin + 1);
    return fmt::format("{},{}", begin + 1, count);
}

std::string unified_diff(std::string_view path, const Lines& before, const Lines& after, const std::vector<Block>& blocks) {
    std::string out = fmt::format("--- a/{0}\n+++ b/{0}\n", path);
    std::size_t i = 0;
    while (i < blocks.size()) {
        // Blocks whose context touches are one hunk.
        std::size_t j = i;
        while (j + 1 < blocks.size() && blocks[j + 1].old_begin <= blocks[j].old_end + 2 * context_lines) ++j;
        std::size_t old_from = blocks[i].old_begin - std::min(context_lines, blocks[i].old_begin);
        std::size_t old_to = std::min(before.text.size(), blocks[j].old_end + context_lines);
        std::size_t new_from = blocks[i].new_begin - (blocks[i].old_begin - old_from);
        std::size_t new_to = blocks[j].new_end + (old_to - blocks[j].old_end);
        out += fmt::format("@@ -{} +{} @@\n", hunk_range(old_from, old_to - old_from), hunk_range(new_from, new_to - new_from));
        std::size_t pos = old_from;
        for (std::size_t k = i; k <= j; ++k) {
            for (; pos < blocks[k].old_begin; ++pos) diff_line(out, ' ', before.text[pos]);
            for (auto l = blocks[k].old_begin; l < blocks[k].old_end; ++l) diff_line(out, '-', before.text[l]);
            for (auto l = blocks[k].new_begin; l < blocks[k].new_end; ++l) diff_line(out, '+', after.text[l]);
            pos = blocks[k].old_end;
        }
        for (; pos < old_to; ++pos) diff_line(out, ' ', before.text[pos]);
        if (out.size() > max_diff_bytes) {
            out.resize(max_diff_bytes);
            out.resize(out.rfind('\n') + 1);
            out += fmt::format("… (the diff goes on; {} replacements in all)\n", blocks.size());
            break;
        }
        i = j + 1;
    }
    return out;
}

// The lines a replacement touched: from the line of its start to the line of
// its end in each text, then the lines equal at either edge given back as context.
Block changed_lines(const Lines& before, const Lines& after, std::size_t old_at, std::size_t old_size, std::size_t new_at,
                    std::size_t new_size) {
    auto last_of = [](const Lines& lines, std::size_t at, std::size_t size) {
        return lines.text.empty() ? 0 : std::min(lines.text.size(), lines.of(at + size) + 1);
    };
    Block b{before.of(old_at), last_of(before, old_at, old_size), after.of(new_at), last_of(after, new_at, new_size)};
    b.old_begin = std::min(b.old_begin, b.old_end);
    b.new_begin = std::min(b.new_begin, b.new_end);
    while (b.old_begin < b.old_end && b.new_begin < b.new_end && before.text[b.old_end - 1] == after.text[b.new_end - 1]) {
        --b.old_end;
        --b.new_end;
    }
    while (b.old_begin < b.old_end && b.new_begin < b.new_end && before.text[b.old_begin] == after.text[b.new_begin]) {
        ++b.old_begin;
        ++b.new_begin;
    }
    return b;
}

} // namespace

EditOutcome apply_edit(std::string_view path, std::string_view content, const Edit& edit) {
    if (edit.old_text.empty()) throw ToolError("old_text is empty; give the exact text to replace (write_file writes a whole file)");
    if (edit.old_text == edit.new_text) throw ToolError("old_text and new_text are the same; there is nothing to change");
    if (content.find('\0') != std::string_view::npos) throw ToolError(fmt::format("{} is a binary file; edit_file edits text", path));

    EditOutcome outcome;
    bool utf8 = valid_utf8(content);
    outcome.encoding = utf8 ? "utf-8" : "latin-1";
    std::string decoded;
    if (!utf8) decoded = latin1_to_utf8(content);
    std::string_view text = utf8 ? content : std::string_view(decoded);

    // A CRLF file is edited with CRLF text, whichever line ends the model wrote.
    bool crlf = is_crlf(text);
    outcome.line_ending = crlf ? "crlf" : "lf";
    std::string old_text = crlf ? to_crlf(edit.old_text) : edit.old_text;
    std::string new_text = crlf ? to_crlf(edit.new_text) : edit.new_text;

    Lines before(text);
    auto found = occurrences(text, old_text);
    if (found.empty()) throw ToolError(fmt::format("old_text was not found in {}{}", path, near_misses(before, edit.old_text)));
    if (found.size() > 1 && !edit.replace_all) {
        throw ToolError(fmt::format("old_text occurs {} times in {} (lines {}); include more of the surrounding text to pick one, "
                                    "or set replace_all",
                                    found.size(), path, line_list(before, found)));
    }

    std::string result;
    result.reserve(text.size() + found.size() * new_text.size());
    std::vector<std::size_t> new_at;
    std::size_t pos = 0;
    for (auto at : found) {
        result.append(text.substr(pos, at - pos));
        new_at.push_back(result.size());
        result += new_text;
        pos = at + old_text.size();
    }
    result.append(text.substr(pos));

    Lines after(result);
    std::vector<Block> blocks;
    for (std::size_t i = 0; i < found.size(); ++i) {
        auto block = changed_lines(before, after, found[i], old_text.size(), new_at[i], new_text.size());
        if (!blocks.empty() && block.old_begin < blocks.back().old_end) {  // two replacements on one line
            blocks.back().old_end = std::max(blocks.back().old_end, block.old_end);
            blocks.back().new_end = std::max(blocks.back().new_end, block.new_end);
        } else {
            blocks.push_back(block);
        }
    }
    outcome.diff = unified_diff(path, before, after, blocks);
    outcome.replacements = found.size();
    outcome.first_line = before.of(found.front()) + 1;
    if (utf8) {
        outcome.content = std::move(result);
    } else {
        auto latin1 = utf8_to_latin1(result);
        if (!latin1) throw ToolError(fmt::format("{} is Latin-1 text and new_text has characters Latin-1 cannot hold", path));
        outcome.content = std::move(*latin1);
    }
    return outcome;
}

} // namespace cubicle::files
