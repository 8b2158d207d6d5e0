// What a model is shown of a program's output. Every result fits a budget of
// bytes as sent (escaped JSON): a stream too long for it keeps its head and its
// tail, and one marker line says what was left out and where the whole is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cubicle::tools {


// The smallest budget a call may ask for: room for a marker and some output.
inline constexpr std::size_t min_result_budget = 1024;

// One stream of output: its first and last `keep` bytes, everything counted.
class OutputCapture {
public:
    explicit OutputCapture(std::size_t keep) : keep_(keep) {}

    void append(std::string_view data);
    // Bytes that went by unseen (no longer in memory); lines become unknown
    // and the head ends here, so that the marker stands where the gap is.
    void skip(std::uint64_t bytes);

    std::uint64_t bytes() const { return bytes_; }
    std::uint64_t lines() const { return lines_; }  // newline characters
    bool lines_known() const { return lines_known_; }
    // Everything is kept: head() followed by tail() is the whole stream.
    bool complete() const { return bytes_ == head_.size() + tail().size(); }
    std::string_view head() const { return head_; }
    std::string_view tail() const;

private:
    std::size_t keep_;
    std::string head_;
    std::string tail_;  // the newest bytes after the head; trimmed to keep_ now and then
    std::uint64_t bytes_ = 0;
    std::uint64_t lines_ = 0;
    bool lines_known_ = true;
    bool head_closed_ = false;
};

// What `text` (valid UTF-8) costs in a result as sent, quotes excluded: it
// travels twice, escaped once in structuredContent and escaped twice in the
// text content (which carries the structured JSON as a string).
std::size_t sent_size(std::string_view text);

// Sent size the whole stream would need (an estimate past what is kept).
std::size_t needed_budget(const OutputCapture& capture);

// How a budget is shared by stdout and stderr: each gets what it needs when
// both fit; otherwise the smaller keeps at least a quarter.
struct BudgetSplit {
    std::size_t out;
    std::size_t err;
};
BudgetSplit split_budget(std::size_t out_need, std::size_t err_need, std::size_t budget);

// The stream as shown within `budget` sent bytes: whole when it fits, else
// about 40 % head and 60 % tail cut at line ends where possible, joined by the
// marker line "[cubicle] N bytes (M lines) of `name` omitted here; `where`".
// Invalid UTF-8 is replaced (U+FFFD) as the JSON writer would.
std::string shown_text(const OutputCapture& capture, std::size_t budget, std::string_view name, std::string_view where);

} // namespace cubicle::tools
