// Validated access to a tool's JSON arguments. Every problem becomes a
// ToolError whose message tells the model exactly what to change.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <simdjson.h>

namespace cubicle::tools {

class Args {
public:
    // Refuses arguments not in `known`.
    Args(simdjson::dom::element arguments, std::initializer_list<std::string_view> known);

    std::optional<std::string> string(std::string_view key) const;
    std::string required_string(std::string_view key) const;
    std::optional<bool> boolean(std::string_view key) const;
    std::optional<double> number(std::string_view key, double min, double max) const;
    std::optional<std::int64_t> integer(std::string_view key, std::int64_t min, std::int64_t max) const;
    // A string or an array of strings, as a list.
    std::optional<std::vector<std::string>> strings(std::string_view key) const;
    // Named strings: a list of {"name", "value"} objects (the form strict tool
    // schemas can state), or an object whose values are all strings.
    std::optional<std::vector<std::pair<std::string, std::string>>> named_strings(std::string_view key) const;

private:
    std::optional<simdjson::dom::element> get(std::string_view key) const;
    simdjson::dom::object object_;
};

} // namespace cubicle::tools
