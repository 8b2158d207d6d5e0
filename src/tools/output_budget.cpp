#include "tools/output_budget.hpp"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "common/json.hpp"

namespace cubicle::tools {
namespace {

// Escaped once ("\n", 2 bytes) plus escaped twice ("\\n", 3 bytes).
std::size_t sent_char_size(unsigned char c) {
    switch (c) {
    case '"': case '\\': return 2 + 4;
    case '\n': case '\r': case '\t': case '\b': case '\f': return 2 + 3;
    default: return c < 0x20 || c == 0x7F ? 6 + 7 : 1 + 1;
    }
}

bool continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The longest prefix of `text` (valid UTF-8) within `budget` sent bytes, ending at a character boundary.
std::size_t prefix_within(std::string_view text, std::size_t budget) {
    std::size_t used = 0, n = 0;
    while (n < text.size()) {
        std::size_t cost = sent_char_size(static_cast<unsigned char>(text[n]));
        if (used + cost > budget) break;
        used += cost;
        ++n;
    }
    while (n > 0 && n < text.size() && continuation(text[n])) --n;
    return n;
}

// The length of the longest such suffix, starting at a character boundary.
std::size_t suffix_within(std::string_view text, std::size_t budget) {
    std::size_t used = 0, start = text.size();
    while (start > 0) {
        std::size_t cost = sent_char_size(static_cast<unsigned char>(text[start - 1]));
        if (used + cost > budget) break;
        used += cost;
        --start;
    }
    while (start < text.size() && continuation(text[start])) ++start;
    return text.size() - start;
}

std::uint64_t count_lines(std::string_view text) { return static_cast<std::uint64_t>(std::count(text.begin(), text.end(), '\n')); }

std::string marker(std::uint64_t bytes, std::optional<std::uint64_t> lines, std::string_view name, std::string_view where) {
    auto what = !lines       ? std::string()
                : *lines == 0 ? std::string(" (within one line)")
                : *lines == 1 ? std::string(" (1 line)")
                              : fmt::format(" ({} lines)", *lines);
    return fmt::format("[cubicle] {} bytes{} of {} omitted here; {}\n", bytes, what, name, where);
}

} // namespace

void OutputCapture::append(std::string_view data) {
    bytes_ += data.size();
    lines_ += count_lines(data);
    if (!head_closed_ && head_.size() < keep_) {
        std::size_t take = std::min(keep_ - head_.size(), data.size());
        head_.append(data.substr(0, take));
        data.remove_prefix(take);
    }
    if (data.empty()) return;
    tail_.append(data);
    // Trimmed only once twice the size, so appending stays linear.
    if (tail_.size() > 2 * keep_ + 64 * 1024) tail_.erase(0, tail_.size() - keep_);
}

void OutputCapture::skip(std::uint64_t bytes) {
    if (bytes == 0) return;
    bytes_ += bytes;
    lines_known_ = false;
    head_closed_ = true;
    tail_.clear();  // the tail must be the newest bytes
}

std::string_view OutputCapture::tail() const {
    std::string_view t = tail_;
    return t.size() > keep_ ? t.substr(t.size() - keep_) : t;
}

std::size_t sent_size(std::string_view text) {
    std::size_t size = 0;
    for (char c : text) size += sent_char_size(static_cast<unsigned char>(c));
    return size;
}

std::size_t needed_budget(const OutputCapture& capture) {
    if (!capture.complete()) return 2 * static_cast<std::size_t>(capture.bytes());
    std::string whole(capture.head());
    whole += capture.tail();
    return sent_size(json::sanitize_utf8(whole));
}

BudgetSplit split_budget(std::size_t out_need, std::size_t err_need, std::size_t budget) {
    if (out_need + err_need <= budget) return {out_need, err_need};
    std::size_t err = std::min(err_need, std::max(budget / 4, budget > out_need ? budget - out_need : 0));
    std::size_t out = std::min(out_need, budget - err);
    return {out, budget - out};
}

std::string shown_text(const OutputCapture& capture, std::size_t budget, std::string_view name, std::string_view where) {
    std::string head, tail;
    if (capture.complete()) {
        std::string whole(capture.head());
        whole += capture.tail();
        head = json::sanitize_utf8(whole);
        if (sent_size(head) <= budget) return head;
        tail = head;
    } else {
        auto raw_head = capture.head();
        head = json::sanitize_utf8(raw_head.substr(0, json::complete_utf8_prefix(raw_head)));
        auto raw_tail = capture.tail();
        while (!raw_tail.empty() && continuation(raw_tail.front())) raw_tail.remove_prefix(1);
        tail = json::sanitize_utf8(raw_tail);
    }
    // The marker's size with the widest numbers it can hold.
    std::size_t reserve = sent_size(marker(UINT64_MAX, UINT64_MAX, name, where)) + sent_char_size('\n');
    std::size_t room = budget > reserve ? budget - reserve : 0;
    std::size_t head_room = room * 2 / 5;

    std::size_t head_len = prefix_within(head, head_room);
    // Whole lines where the cut loses at most half of what fits.
    if (auto nl = std::string_view(head).substr(0, head_len).rfind('\n'); nl != std::string_view::npos && nl + 1 >= head_len / 2) {
        head_len = nl + 1;
    }
    std::string_view tail_view = tail;
    if (capture.complete()) tail_view.remove_prefix(head_len);  // one string: the tail starts after the head
    std::size_t tail_len = suffix_within(tail_view, room - sent_size(std::string_view(head).substr(0, head_len)));
    std::size_t tail_start = tail_view.size() - tail_len;
    if (tail_start > 0 && tail_view[tail_start - 1] != '\n') {
        auto nl = tail_view.find('\n', tail_start);
        if (nl != std::string_view::npos && nl + 1 - tail_start <= tail_len / 2) tail_start = nl + 1;
    }
    auto head_part = std::string_view(head).substr(0, head_len);
    auto tail_part = tail_view.substr(tail_start);
    std::uint64_t shown_lines = count_lines(head_part) + count_lines(tail_part);
    std::uint64_t shown_bytes = head_part.size() + tail_part.size();
    std::string out(head_part);
    if (!out.empty() && out.back() != '\n') out += '\n';
    std::optional<std::uint64_t> omitted_lines;
    if (capture.lines_known()) omitted_lines = capture.lines() > shown_lines ? capture.lines() - shown_lines : 0;
    out += marker(capture.bytes() > shown_bytes ? capture.bytes() - shown_bytes : 0, omitted_lines, name, where);
    out += tail_part;
    return out;
}

} // namespace cubicle::tools
