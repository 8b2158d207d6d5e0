// The tool groups --tools names (run, files, …): which tools a server lists.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cubicle::tools {

struct ToolGroup {
    std::string_view name;
    std::string_view summary;
    bool in_default_set;  // listed without --tools
};

// Every group, in the order of src/tools/catalogue/index.json (generated).
const std::vector<ToolGroup>& tool_groups();

// What --tools accepts: the groups and "all".
bool is_group_name(std::string_view name);
// "run, files, runs, preview, host, packages or all", for messages and --help.
std::string group_names();

} // namespace cubicle::tools
