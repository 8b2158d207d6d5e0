#include "tools/search_records.hpp"

#include <charconv>
#include <optional>

namespace cubicle::tools {
namespace {

// The agent writes at most this many context lines per side (agent/search.c).
constexpr std::uint64_t max_context = 10;

class Fields {
public:
    explicit Fields(std::string_view data) : rest_(data) {}

    std::optional<std::string_view> next() {
        auto end = rest_.find('\0');
        if (end == std::string_view::npos) return std::nullopt;
        auto field = rest_.substr(0, end);
        rest_.remove_prefix(end + 1);
        return field;
    }

    std::optional<std::uint64_t> number() {
        auto field = next();
        if (!field || field->empty()) return std::nullopt;
        std::uint64_t value = 0;
        auto [end, error] = std::from_chars(field->data(), field->data() + field->size(), value);
        if (error != std::errc() || end != field->data() + field->size()) return std::nullopt;
        return value;
    }

    bool lines(std::vector<std::string>& out) {
        auto count = number();
        if (!count || *count > max_context) return false;
        for (std::uint64_t i = 0; i < *count; ++i) {
            auto line = next();
            if (!line) return false;
            out.emplace_back(*line);
        }
        return true;
    }

    bool empty() const { return rest_.empty(); }

private:
    std::string_view rest_;
};

std::optional<SearchMatch> read_match(Fields& fields) {
    SearchMatch match;
    auto path = fields.next();
    auto line = fields.number();
    auto column = fields.number();
    auto text = fields.next();
    if (!path || !line || !column || !text) return std::nullopt;
    match.path = *path;
    match.line = *line;
    match.column = *column;
    match.text = *text;
    if (!fields.lines(match.before) || !fields.lines(match.after)) return std::nullopt;
    return match;
}

} // namespace

SearchRecords parse_search_records(std::string_view output) {
    SearchRecords records;
    Fields fields(output);
    while (!fields.empty()) {
        auto kind = fields.next();
        if (kind == "m") {
            auto match = read_match(fields);
            if (!match) break;
            records.matches.push_back(std::move(*match));
        } else if (kind == "s") {
            auto count = fields.number();
            auto files = fields.number();
            auto cut = fields.number();
            if (!count || !files || !cut) break;
            records.count = *count;
            records.files_searched = *files;
            records.cut = *cut != 0;
            records.finished = true;
            break;
        } else {
            break;
        }
    }
    if (!records.finished) records.count = records.matches.size();
    return records;
}

} // namespace cubicle::tools
