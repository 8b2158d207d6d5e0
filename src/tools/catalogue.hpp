// The tool catalogue: each tool's name, group, texts, schemas and annotations,
// kept as data in src/tools/catalogue/*.json and embedded at build time. The
// C++ modules hold only the handlers and find their entries by name.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config.hpp"
#include "mcp/tool.hpp"
#include "tools/groups.hpp"

namespace cubicle::tools {

// One tool as its data file says it. Texts may hold {placeholders}.
struct CatalogueEntry {
    std::string_view name;
    std::string_view group;
    std::string_view title;
    std::string_view description;
    std::string_view input_schema;   // compact JSON Schema
    std::string_view output_schema;  // compact JSON Schema
    bool read_only;
    bool destructive;
    bool idempotent;
    bool open_world;
    bool task_support;
};

// Every tool, in tools/list order (generated).
const std::vector<CatalogueEntry>& catalogue();

// The groups a server lists: those --tools names, else the default set (the
// groups marked so, with host when --allow-host-dir opens a directory and
// packages when --allow-network is on).
std::vector<std::string_view> enabled_groups(const Config& config);

// `text` with its {placeholders} filled in from `config`; in JSON (`json`)
// the values are escaped, and "{language_names}" becomes the list of names.
// Throws std::logic_error for a placeholder it does not know.
std::string fill_placeholders(std::string_view text, const Config& config, bool json);

using Handlers = std::vector<std::pair<std::string_view, mcp::ToolHandler>>;

// The tools of the enabled groups, in catalogue order, each with its handler.
// Throws std::logic_error when an entry has no handler or a handler no entry.
std::vector<mcp::Tool> catalogue_tools(const Config& config, Handlers handlers);

} // namespace cubicle::tools
