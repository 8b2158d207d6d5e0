// The real tool list, as clients see it, against tests/golden/tools.json.
// Regenerate with: CUBICLE_UPDATE_GOLDEN=1 build/tests/unit_tests --gtest_filter='Golden*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <simdjson.h>

#include "common/json.hpp"
#include "config.hpp"
#include "docker/client.hpp"
#include "mcp/session.hpp"
#include "sandbox/manager.hpp"
#include "tools/catalogue.hpp"
#include "tools/groups.hpp"
#include "tools/tools.hpp"

#ifndef CUBICLE_SOURCE_ROOT
#error "CUBICLE_SOURCE_ROOT must be defined by the build"
#endif

namespace cubicle {
namespace {

namespace asio = boost::asio;

Config all_tools() {
    Config config;
    config.tool_groups = {"all"};
    return config;
}

const std::string golden_path = std::string(CUBICLE_SOURCE_ROOT) + "/tests/golden/tools.json";

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return {};
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Two-space indented JSON, one member per line: reviewable diffs.
void pretty(std::string& out, simdjson::dom::element e, int depth) {
    auto indent = [&](int d) { out += '\n'; out.append(static_cast<std::size_t>(2 * d), ' '); };
    switch (e.type()) {
    case simdjson::dom::element_type::OBJECT: {
        simdjson::dom::object object = e;
        if (object.size() == 0) {
            out += "{}";
            return;
        }
        out += '{';
        bool first = true;
        for (auto [key, value] : object) {
            if (!first) out += ',';
            first = false;
            indent(depth + 1);
            json::append_quoted(out, key);
            out += ": ";
            pretty(out, value, depth + 1);
        }
        indent(depth);
        out += '}';
        return;
    }
    case simdjson::dom::element_type::ARRAY: {
        simdjson::dom::array array = e;
        if (array.size() == 0) {
            out += "[]";
            return;
        }
        out += '[';
        bool first = true;
        for (auto value : array) {
            if (!first) out += ',';
            first = false;
            indent(depth + 1);
            pretty(out, value, depth + 1);
        }
        indent(depth);
        out += ']';
        return;
    }
    default:
        out += json::to_string(e);
    }
}

// The tool list of a server with `config` (every group by default: the golden file covers them all).
std::string real_tools_json(Config config = all_tools()) {
    asio::io_context io;
    docker::Client client(io.get_executor(), docker::parse_docker_host(""));
    sandbox::Manager manager(io.get_executor(), client, config);
    mcp::Session session(io.get_executor(), mcp::ServerInfo{"cubicle", "test", ""}, tools::sandbox_tools(manager, client, config),
                         [](std::string) {});
    return session.tools_json();
}

TEST(Golden, ToolsJsonMatches) {
    std::string actual = real_tools_json();
    EXPECT_EQ(actual.find('\n'), std::string::npos);
    json::Document actual_doc;
    ASSERT_FALSE(actual_doc.parse(actual)) << actual;

    if (const char* update = std::getenv("CUBICLE_UPDATE_GOLDEN"); update && std::string_view(update) == "1") {
        std::string text;
        pretty(text, actual_doc.root(), 0);
        text += '\n';
        std::filesystem::create_directories(std::filesystem::path(golden_path).parent_path());
        std::ofstream out(golden_path, std::ios::binary | std::ios::trunc);
        ASSERT_TRUE(out) << "cannot write " << golden_path;
        out << text;
        GTEST_SKIP() << "rewrote " << golden_path;
    }

    std::string golden = read_file(golden_path);
    ASSERT_FALSE(golden.empty()) << golden_path << " is missing; run with CUBICLE_UPDATE_GOLDEN=1";
    json::Document golden_doc;
    ASSERT_FALSE(golden_doc.parse(golden)) << golden_path << " is not valid JSON";
    EXPECT_EQ(json::to_string(actual_doc.root()), json::to_string(golden_doc.root()))
        << "the tool list changed; if intended, regenerate with CUBICLE_UPDATE_GOLDEN=1";
}

// Every schema node that says it is an array says what its items are, and
// every object node lists its properties: no loosely typed values reach clients.
void check_strict(simdjson::dom::element e, const std::string& where, std::vector<std::string>& problems) {
    if (e.is_array()) {
        std::size_t i = 0;
        for (auto item : simdjson::dom::array(e)) check_strict(item, where + "[" + std::to_string(i++) + "]", problems);
        return;
    }
    if (!e.is_object()) return;
    simdjson::dom::object object = e;
    std::vector<std::string> types;
    simdjson::dom::element type;
    if (object["type"].get(type) == simdjson::SUCCESS) {
        if (type.is_string()) {
            types.emplace_back(std::string_view(type));
        } else if (type.is_array()) {
            for (auto t : simdjson::dom::array(type)) {
                if (t.is_string()) types.emplace_back(std::string_view(t));
            }
        }
    }
    for (const auto& t : types) {
        if (t == "array" && object["items"].error()) problems.push_back(where + ": array without items");
        if (t == "object" && object["properties"].error()) problems.push_back(where + ": object without properties");
    }
    for (auto [key, value] : object) check_strict(value, where + "." + std::string(key), problems);
}

TEST(Golden, SchemasAreStrict) {
    std::string golden = read_file(golden_path);
    ASSERT_FALSE(golden.empty()) << golden_path;
    json::Document doc;
    ASSERT_FALSE(doc.parse(golden));
    simdjson::dom::array tools;
    ASSERT_EQ(doc.root()["tools"].get(tools), simdjson::SUCCESS);
    ASSERT_GT(tools.size(), 0u);
    std::vector<std::string> problems;
    std::size_t arrays = 0;
    for (auto tool : tools) {
        std::string name{std::string_view(tool["name"])};
        for (const char* schema : {"inputSchema", "outputSchema"}) {
            simdjson::dom::element s;
            ASSERT_EQ(tool[schema].get(s), simdjson::SUCCESS) << name << " " << schema;
            EXPECT_EQ(std::string_view(s["type"]), "object") << name << " " << schema;
            check_strict(s, name + "." + schema, problems);
        }
        arrays += json::to_string(tool).find(R"("type":"array")") != std::string::npos;
    }
    EXPECT_TRUE(problems.empty()) << [&] {
        std::string all;
        for (const auto& p : problems) all += p + "\n";
        return all;
    }();
    EXPECT_GT(arrays, 0u);  // the check did look at some arrays
}

TEST(Golden, CheckerCatchesLooseSchemas) {
    std::vector<std::string> problems;
    json::Document doc;
    ASSERT_FALSE(doc.parse(R"({"type":"object","properties":{"a":{"type":"array"},"b":{"type":["object","null"]},
                                "c":{"anyOf":[{"type":"array","items":{"type":"object"}}]}}})"));
    check_strict(doc.root(), "s", problems);
    EXPECT_EQ(problems.size(), 3u);
}

TEST(Golden, ToolsHaveAnnotationsAndExpectedNames) {
    json::Document doc;
    ASSERT_FALSE(doc.parse(real_tools_json()));
    std::vector<std::string> names;
    for (auto tool : simdjson::dom::array(doc.root()["tools"])) {
        names.emplace_back(std::string_view(tool["name"]));
        EXPECT_TRUE(tool["annotations"].is_object());
    }
    EXPECT_EQ(names, (std::vector<std::string>{"initialize_sandbox", "execute_code", "run_command", "get_sandbox_status",
                                               "stop_sandbox", "checkpoint_session", "restore_checkpoint", "get_run", "send_input", "signal_run", "list_runs", "write_file", "read_file", "edit_file", "list_files",
                                               "search_files", "upload_file", "download_file", "clean_workspace", "open_project", "diff_project",
                                               "apply_project", "expose_port", "unexpose_port", "install_package", "list_languages"}));
}

std::vector<std::string> tool_names(const Config& config) {
    json::Document doc;
    EXPECT_FALSE(doc.parse(real_tools_json(config)));
    std::vector<std::string> names;
    for (auto tool : simdjson::dom::array(doc.root()["tools"])) names.emplace_back(std::string_view(tool["name"]));
    return names;
}

TEST(Golden, DefaultSetIsRunFilesAndRuns) {
    const std::vector<std::string> basic{"initialize_sandbox", "execute_code", "run_command", "get_sandbox_status", "stop_sandbox",
                                         "checkpoint_session", "restore_checkpoint", "get_run", "send_input", "signal_run", "list_runs", "write_file", "read_file", "edit_file",
                                         "list_files", "search_files", "clean_workspace", "expose_port", "unexpose_port", "list_languages"};
    EXPECT_EQ(tool_names(Config{}), basic);
    // The host and packages tools join the default set where the operator allowed what they need.
    Config with_host;
    with_host.allow_host_dirs = {"/tmp"};
    auto names = tool_names(with_host);
    EXPECT_NE(std::ranges::find(names, "upload_file"), names.end());
    EXPECT_NE(std::ranges::find(names, "download_file"), names.end());
    EXPECT_EQ(std::ranges::find(names, "install_package"), names.end());
    Config with_network;
    with_network.allow_network = true;
    names = tool_names(with_network);
    EXPECT_NE(std::ranges::find(names, "install_package"), names.end());
    EXPECT_EQ(std::ranges::find(names, "upload_file"), names.end());
}

TEST(Golden, ChosenGroupsOnly) {
    Config config;
    config.tool_groups = {"files", "packages"};
    config.allow_host_dirs = {"/tmp"};  // --tools wins over the default set's additions
    EXPECT_EQ(tool_names(config), (std::vector<std::string>{"write_file", "read_file", "edit_file", "list_files", "search_files", "clean_workspace", "install_package"}));
}

TEST(Golden, PlaceholdersFilledFromConfig) {
    Config config;
    config.memory_mb = 300;
    config.default_image = "img\"quoted";
    EXPECT_EQ(tools::fill_placeholders("default {memory_mb} MiB, {default_image}", config, false), "default 300 MiB, img\"quoted");
    EXPECT_EQ(tools::fill_placeholders(R"({"d":"{default_image}","n":{},"p":"^[0-7]{3,4}$"})", config, true),
              R"({"d":"img\"quoted","n":{},"p":"^[0-7]{3,4}$"})");
    auto names = tools::fill_placeholders(R"({"enum":["{language_names}"]})", config, true);
    EXPECT_EQ(names.rfind(R"({"enum":["python",)", 0), 0u) << names;
    EXPECT_THROW(tools::fill_placeholders("{no_such_value}", config, false), std::logic_error);
    EXPECT_THROW(tools::fill_placeholders("{language_names}", config, false), std::logic_error);
}

TEST(Golden, EveryGroupHasTools) {
    for (const auto& group : tools::tool_groups()) {
        Config config;
        config.tool_groups = {std::string(group.name)};
        EXPECT_FALSE(tool_names(config).empty()) << group.name;
    }
}

} // namespace
} // namespace cubicle
