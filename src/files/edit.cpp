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
constexpr std::size_t max_window_bytes = 64 * 1024;  // the diff stops at a window this large

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

// 1-based line numbers of the first `most` of `offsets` (ascending): one pass
// over the text up to the last of them, nothing kept per line.
std::vector<std::size_t> line_numbers(std::string_view text, const std::vector<std::size_t>& offsets, std::size_t most) {
    std::vector<std::size_t> numbers;
    std::size_t line = 1, counted = 0;
    for (std::size_t i = 0; i < offsets.size() && i < most; ++i) {
        line += static_cast<std::size_t>(std::count(text.begin() + counted, text.begin() + offsets[i], '\n'));
        counted = offsets[i];
        numbers.push_back(line);
    }
    return numbers;
}

std::string line_list(const std::vector<std::size_t>& numbers, std::size_t total) {
    std::string out;
    for (std::size_t i = 0; i < numbers.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", numbers[i]);
    if (total > numbers.size()) out += ", …";
    return out;
}

std::string_view trim(std::string_view s) {
    auto first = s.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return {};
    return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// Where old_text's first non-blank line appears with other indentation or
// spacing: a hint for a model whose old_text was almost right.
std::string near_misses(std::string_view text, std::string_view old_text) {
    std::string_view first;
    for (std::size_t pos = 0; pos < old_text.size() && first.empty();) {
        auto end = old_text.find('\n', pos);
        if (end == std::string_view::npos) end = old_text.size();
        first = trim(old_text.substr(pos, end - pos));
        pos = end + 1;
    }
    if (first.empty()) return {};
    std::vector<std::size_t> found;
    std::size_t line = 1, total = 0;
    for (std::size_t pos = 0; pos < text.size(); ++line) {
        auto end = text.find('\n', pos);
        if (end == std::string_view::npos) end = text.size();
        if (trim(text.substr(pos, end - pos)) == first && total++ < max_listed_lines) found.push_back(line);
        pos = end + 1;
    }
    if (found.empty()) return {};
    return fmt::format("; its first line, apart from spacing, is on line{} {} — compare the indentation and the lines after it",
                       total == 1 ? "" : "s", line_list(found, total));
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

// The hunks of `blocks` (line ranges of the two windows), whose first lines
// are lines old_base + 1 and new_base + 1 of the files. False once the diff
// is over its size: it ends there.
bool append_hunks(std::string& out, const Lines& before, const Lines& after, const std::vector<Block>& blocks, std::size_t old_base,
                  std::size_t new_base) {
    std::size_t i = 0;
    while (i < blocks.size()) {
        // Blocks whose context touches are one hunk.
        std::size_t j = i;
        while (j + 1 < blocks.size() && blocks[j + 1].old_begin <= blocks[j].old_end + 2 * context_lines) ++j;
        std::size_t old_from = blocks[i].old_begin - std::min(context_lines, blocks[i].old_begin);
        std::size_t old_to = std::min(before.text.size(), blocks[j].old_end + context_lines);
        std::size_t new_from = blocks[i].new_begin - (blocks[i].old_begin - old_from);
        std::size_t new_to = blocks[j].new_end + (old_to - blocks[j].old_end);
        out += fmt::format("@@ -{} +{} @@\n", hunk_range(old_base + old_from, old_to - old_from),
                           hunk_range(new_base + new_from, new_to - new_from));
        std::size_t pos = old_from;
        for (std::size_t k = i; k <= j; ++k) {
            for (; pos < blocks[k].old_begin; ++pos) diff_line(out, ' ', before.text[pos]);
            for (auto l = blocks[k].old_begin; l < blocks[k].old_end; ++l) diff_line(out, '-', before.text[l]);
            for (auto l = blocks[k].new_begin; l < blocks[k].new_end; ++l) diff_line(out, '+', after.text[l]);
            pos = blocks[k].old_end;
        }
        for (; pos < old_to; ++pos) diff_line(out, ' ', before.text[pos]);
        if (out.size() > max_diff_bytes) return false;
        i = j + 1;
    }
    return true;
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

// Where a window around a replacement starts: `lines` lines above the line of `at`.
std::size_t lines_above(std::string_view text, std::size_t at, std::size_t lines) {
    auto nl = at == 0 ? std::string_view::npos : text.rfind('\n', at - 1);
    std::size_t start = nl == std::string_view::npos ? 0 : nl + 1;
    for (std::size_t n = 0; n < lines && start > 0; ++n) {
        nl = start >= 2 ? text.rfind('\n', start - 2) : std::string_view::npos;
        start = nl == std::string_view::npos ? 0 : nl + 1;
    }
    return start;
}

// Where it ends: after the line of `at` and `lines` more.
std::size_t lines_below(std::string_view text, std::size_t at, std::size_t lines) {
    std::size_t end = at;
    for (std::size_t n = 0; n <= lines && end < text.size(); ++n) {
        auto nl = text.find('\n', end);
        end = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    return end;
}

// The unified diff of the replacements at `found`, made window by window (the
// lines around a group of replacements near each other) so that a file of any
// size costs the memory of what is shown; it ends at max_diff_bytes.
std::string diff_of(std::string_view path, std::string_view text, const std::vector<std::size_t>& found, std::string_view old_text,
                    std::string_view new_text) {
    std::string out = fmt::format("--- a/{0}\n+++ b/{0}\n", path);
    auto newlines = [](std::string_view s) { return static_cast<std::ptrdiff_t>(std::count(s.begin(), s.end(), '\n')); };
    std::ptrdiff_t line_shift = 0;  // lines the replacements before this window added
    std::size_t old_base = 0, counted = 0;
    for (std::size_t i = 0; i < found.size();) {
        auto begin = lines_above(text, found[i], context_lines);
        auto end = lines_below(text, found[i] + old_text.size(), context_lines);
        std::size_t j = i + 1;
        bool cut = false;  // replacements so close together and so many that the diff would be over its size anyway
        while (j < found.size() && lines_above(text, found[j], context_lines) <= end) {
            if ((cut = end - begin >= max_window_bytes)) break;
            end = std::max(end, lines_below(text, found[j] + old_text.size(), context_lines));
            ++j;
        }
        old_base += static_cast<std::size_t>(std::count(text.begin() + counted, text.begin() + begin, '\n'));
        counted = begin;
        auto window = text.substr(begin, end - begin);
        std::string replaced;
        std::vector<std::size_t> at, new_at;
        std::size_t pos = 0;
        for (auto k = i; k < j; ++k) {
            auto local = found[k] - begin;
            replaced.append(window.substr(pos, local - pos));
            at.push_back(local);
            new_at.push_back(replaced.size());
            replaced += new_text;
            pos = local + old_text.size();
        }
        replaced.append(window.substr(pos));
        Lines before(window), after(replaced);
        std::vector<Block> blocks;
        for (std::size_t k = 0; k < at.size(); ++k) {
            auto block = changed_lines(before, after, at[k], old_text.size(), new_at[k], new_text.size());
            if (!blocks.empty() && block.old_begin < blocks.back().old_end) {  // two replacements on one line
                blocks.back().old_end = std::max(blocks.back().old_end, block.old_end);
                blocks.back().new_end = std::max(blocks.back().new_end, block.new_end);
            } else {
                blocks.push_back(block);
            }
        }
        auto new_base = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(old_base) + line_shift);
        if (!append_hunks(out, before, after, blocks, old_base, new_base) || cut) {
            if (out.size() > max_diff_bytes) {
                out.resize(max_diff_bytes);
                out.resize(out.rfind('\n') + 1);
            }
            out += fmt::format("… (the diff goes on; {} replacements in all)\n", found.size());
            break;
        }
        line_shift += static_cast<std::ptrdiff_t>(j - i) * (newlines(new_text) - newlines(old_text));
        i = j;
    }
    return out;
}

} // namespace

EditOutcome apply_edit(std::string_view path, std::string_view content, const Edit& edit, std::uint64_t max_bytes) {
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

    auto found = occurrences(text, old_text);
    if (found.empty()) throw ToolError(fmt::format("old_text was not found in {}{}", path, near_misses(text, edit.old_text)));
    auto lines = line_numbers(text, found, max_listed_lines);
    if (found.size() > 1 && !edit.replace_all) {
        throw ToolError(fmt::format("old_text occurs {} times in {} (lines {}); include more of the surrounding text to pick one, "
                                    "or set replace_all",
                                    found.size(), path, line_list(lines, found.size())));
    }
    // Refused before anything is built: a short old_text replaced everywhere by a
    // long new_text can ask for far more than the file.
    auto grows = new_text.size() > old_text.size() ? new_text.size() - old_text.size() : 0;
    auto shrinks = old_text.size() - std::min(old_text.size(), new_text.size());
    if (grows && found.size() > (max_bytes - std::min(max_bytes, text.size() - found.size() * shrinks)) / grows)
        throw ToolError(fmt::format("the edited file would be larger than the limit of {} bytes", max_bytes));

    std::string result;
    result.reserve(text.size() + found.size() * grows);
    std::size_t pos = 0;
    for (auto at : found) {
        result.append(text.substr(pos, at - pos));
        result += new_text;
        pos = at + old_text.size();
    }
    result.append(text.substr(pos));

    outcome.diff = diff_of(path, text, found, old_text, new_text);
    outcome.replacements = found.size();
    outcome.first_line = lines.front();
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
