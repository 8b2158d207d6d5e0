#include "tools/args.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/errors.hpp"

namespace cubicle::tools {

Args::Args(simdjson::dom::element arguments, std::initializer_list<std::string_view> known) {
    if (arguments.get(object_) != simdjson::SUCCESS) throw ToolError("arguments must be a JSON object");
    for (auto [key, value] : object_) {
        if (std::find(known.begin(), known.end(), key) != known.end()) continue;
        std::string names;
        for (auto name : known) names += fmt::format("{}{}", names.empty() ? "" : ", ", name);
        throw ToolError(fmt::format("unknown argument '{}'; this tool takes: {}", key, names));
    }
}

std::optional<simdjson::dom::element> Args::get(std::string_view key) const {
    simdjson::dom::element value;
    if (object_[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
    return value;
}

std::optional<std::string> Args::string(std::string_view key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    std::string_view text;
    if (value->get(text) != simdjson::SUCCESS) throw ToolError(fmt::format("argument '{}' must be a string", key));
    return std::string(text);
}

std::string Args::required_string(std::string_view key) const {
    auto value = string(key);
    if (!value) throw ToolError(fmt::format("argument '{}' is required", key));
    return *value;
}

std::optional<bool> Args::boolean(std::string_view key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    bool flag;
    if (value->get(flag) != simdjson::SUCCESS) throw ToolError(fmt::format("argument '{}' must be true or false", key));
    return flag;
}

std::optional<double> Args::number(std::string_view key, double min, double max) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    double number;
    if (value->get(number) != simdjson::SUCCESS || !std::isfinite(number) || number < min || number > max) {
        throw ToolError(fmt::format("argument '{}' must be a number from {} to {}", key, min, max));
    }
    return number;
}

std::optional<std::int64_t> Args::integer(std::string_view key, std::int64_t min, std::int64_t max) const {
    auto number_value = number(key, static_cast<double>(min), static_cast<double>(max));
    if (!number_value) return std::nullopt;
    if (std::floor(*number_value) != *number_value) throw ToolError(fmt::format("argument '{}' must be a whole number", key));
    return static_cast<std::int64_t>(*number_value);
}

std::optional<std::vector<std::string>> Args::strings(std::string_view key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    std::string_view text;
    if (value->get(text) == simdjson::SUCCESS) return std::vector<std::string>{std::string(text)};
    simdjson::dom::array items;
    std::vector<std::string> out;
    bool ok = value->get(items) == simdjson::SUCCESS;
    if (ok) {
        for (auto item : items) {
            if (item.get(text) != simdjson::SUCCESS) {
                ok = false;
                break;
            }
            out.emplace_back(text);
        }
    }
    if (!ok || out.empty()) throw ToolError(fmt::format("argument '{}' must be a string or a non-empty array of strings", key));
    return out;
}

std::optional<std::vector<std::pair<std::string, std::string>>> Args::named_strings(std::string_view key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    std::vector<std::pair<std::string, std::string>> out;
    simdjson::dom::array list;
    simdjson::dom::object object;
    if (value->get(list) == simdjson::SUCCESS) {
        for (auto item : list) {
            std::string_view name, text;
            if (item.get(object) != simdjson::SUCCESS || object.size() != 2 || object["name"].get(name) != simdjson::SUCCESS ||
                object["value"].get(text) != simdjson::SUCCESS) {
                throw ToolError(fmt::format("argument '{}': each entry must be {{\"name\": string, \"value\": string}}", key));
            }
            out.emplace_back(std::string(name), std::string(text));
        }
        return out;
    }
    if (value->get(object) != simdjson::SUCCESS) {
        throw ToolError(fmt::format("argument '{}' must be a list of {{\"name\", \"value\"}} objects (or an object of strings)", key));
    }
    for (auto [name, item] : object) {
        std::string_view text;
        if (item.get(text) != simdjson::SUCCESS) {
            throw ToolError(fmt::format("argument '{}': the value of '{}' must be a string", key, name));
        }
        out.emplace_back(std::string(name), std::string(text));
    }
    return out;
}

} // namespace cubicle::tools
