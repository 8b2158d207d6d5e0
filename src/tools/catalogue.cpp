#include "tools/catalogue.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "common/json.hpp"
#include "sandbox/languages.hpp"

namespace cubicle::tools {
namespace {

// "python, javascript, r and ruby": the languages with a persistent interpreter.
std::string stateful_languages() {
    std::vector<std::string_view> names;
    for (const auto& language : sandbox::languages()) {
        if (language.repl) names.push_back(language.name);
    }
    std::string out;
    for (std::size_t i = 0; i < names.size(); ++i) out += fmt::format("{}{}", i == 0 ? "" : i + 1 == names.size() ? " and " : ", ", names[i]);
    return out;
}

// The one place the catalogue's placeholders get their values.
std::map<std::string, std::string, std::less<>> placeholder_values(const Config& config) {
    return {
        {"default_image", config.default_image},
        {"memory_mb", fmt::format("{}", config.memory_mb)},
        {"cpus", fmt::format("{}", config.cpus)},
        {"pids_limit", fmt::format("{}", config.pids_limit)},
        {"tmp_size_mb", fmt::format("{}", config.tmp_size_mb)},
        {"disk_mb", fmt::format("{}", config.disk_mb)},
        {"files_limit", fmt::format("{}", config.files_limit)},
        {"timeout_s", fmt::format("{}", config.timeout_s)},
        {"max_timeout_s", fmt::format("{}", config.max_timeout_s)},
        {"result_budget", fmt::format("{}", config.result_budget)},
        {"max_output_bytes", fmt::format("{}", config.max_output_bytes)},
        {"language_list", sandbox::language_list()},
        {"stateful_languages", stateful_languages()},
        {"default_ttl", config.default_ttl_s > 0 ? fmt::format("{} s", config.default_ttl_s) : std::string("none (kept until stop_sandbox)")},
        {"max_ttl_s", fmt::format("{}", config.max_ttl_s)},
    };
}

constexpr std::string_view list_placeholder = "language_names";

std::string quoted_language_names() {
    std::string out;
    for (auto name : sandbox::language_names()) {
        if (!out.empty()) out += ',';
        json::append_quoted(out, name);
    }
    return out;
}

} // namespace

bool is_group_name(std::string_view name) {
    return name == "all" || std::ranges::any_of(tool_groups(), [name](const ToolGroup& g) { return g.name == name; });
}

std::string group_names() {
    std::string out;
    for (const auto& group : tool_groups()) out += fmt::format("{}, ", group.name);
    return out.substr(0, out.size() - 2) + " or all";
}

std::vector<std::string_view> enabled_groups(const Config& config) {
    std::vector<std::string_view> enabled;
    for (const auto& group : tool_groups()) {
        bool on = false;
        if (config.tool_groups.empty()) {
            // What a server offers unasked is what it can do: the host, project
            // and packages tools only work where the operator allowed them.
            bool host_dirs = !config.allow_host_dirs.empty();
            on = group.in_default_set || ((group.name == "host" || group.name == "project") && host_dirs) ||
                 (group.name == "packages" && config.allow_network);
        } else {
            on = std::ranges::any_of(config.tool_groups, [&group](const std::string& asked) { return asked == group.name || asked == "all"; });
        }
        if (on) enabled.push_back(group.name);
    }
    return enabled;
}

std::string fill_placeholders(std::string_view text, const Config& config, bool json) {
    auto values = placeholder_values(config);
    std::string out;
    std::size_t at = 0;
    while (at < text.size()) {
        auto open = text.find('{', at);
        if (open == std::string_view::npos) break;
        auto close = open + 1;
        while (close < text.size() && (std::islower(static_cast<unsigned char>(text[close])) || text[close] == '_')) ++close;
        if (close == open + 1 || close >= text.size() || text[close] != '}') {
            out.append(text.substr(at, close - at));
            at = close;
            continue;
        }
        auto name = text.substr(open + 1, close - open - 1);
        if (name == list_placeholder) {
            // Only as a whole string of an array: ["{language_names}"].
            bool whole = json && open > 0 && text[open - 1] == '"' && close + 1 < text.size() && text[close + 1] == '"';
            if (!whole) throw std::logic_error(fmt::format("catalogue: {{{}}} stands only alone in a JSON array", name));
            out.append(text.substr(at, open - 1 - at));
            out += quoted_language_names();
            at = close + 2;
            continue;
        }
        auto value = values.find(name);
        if (value == values.end()) throw std::logic_error(fmt::format("catalogue: unknown placeholder {{{}}}", name));
        out.append(text.substr(at, open - at));
        if (json) {
            std::string quoted;
            json::append_quoted(quoted, value->second);
            out.append(quoted, 1, quoted.size() - 2);
        } else {
            out += value->second;
        }
        at = close + 1;
    }
    out.append(text.substr(std::min(at, text.size())));
    return out;
}

std::vector<mcp::Tool> catalogue_tools(const Config& config, Handlers handlers) {
    for (const auto& handler : handlers) {
        std::string_view name = handler.first;  // Clang 14 cannot capture a structured binding
        if (std::ranges::none_of(catalogue(), [name](const CatalogueEntry& e) { return e.name == name; })) {
            throw std::logic_error(fmt::format("catalogue: a handler for {}, which has no data file", name));
        }
    }
    auto groups = enabled_groups(config);
    std::vector<mcp::Tool> tools;
    for (const auto& entry : catalogue()) {
        auto handler = std::ranges::find_if(handlers, [&entry](const auto& h) { return h.first == entry.name; });
        if (handler == handlers.end()) throw std::logic_error(fmt::format("catalogue: {} has no handler", entry.name));
        if (std::ranges::find(groups, entry.group) == groups.end()) continue;
        tools.push_back({
            .name = std::string(entry.name),
            .title = std::string(entry.title),
            .description = fill_placeholders(entry.description, config, false),
            .input_schema = fill_placeholders(entry.input_schema, config, true),
            .output_schema = fill_placeholders(entry.output_schema, config, true),
            .read_only = entry.read_only,
            .destructive = entry.destructive,
            .idempotent = entry.idempotent,
            .open_world = entry.open_world,
            .handler = std::move(handler->second),
            .task_support = entry.task_support,
        });
    }
    return tools;
}

} // namespace cubicle::tools
