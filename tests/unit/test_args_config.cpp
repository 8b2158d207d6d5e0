// Tool argument validation (Args) and server configuration (parse_args, usage).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <simdjson.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "config.hpp"
#include "tools/groups.hpp"
#include "tools/args.hpp"

namespace cubicle {
namespace {

using tools::Args;

// Expects `statement` to throw ToolError whose message contains every `parts`.
#define EXPECT_TOOL_ERROR(statement, ...)                                                      \
    do {                                                                                       \
        try {                                                                                  \
            statement;                                                                         \
            ADD_FAILURE() << "no ToolError from " #statement;                                  \
        } catch (const ToolError& e) {                                                         \
            for (std::string part : std::vector<std::string>{__VA_ARGS__}) {                   \
                EXPECT_NE(std::string(e.what()).find(part), std::string::npos)                 \
                    << "message '" << e.what() << "' lacks '" << part << "'";                  \
            }                                                                                  \
        }                                                                                      \
    } while (0)

class ArgsTest : public ::testing::Test {
protected:
    simdjson::dom::element parse(const std::string& text) {
        auto& doc = documents_.emplace_back(std::make_unique<json::Document>());
        auto error = doc->parse(text);
        EXPECT_FALSE(error) << text;
        return doc->root();
    }
    std::vector<std::unique_ptr<json::Document>> documents_;
};

TEST_F(ArgsTest, NonObjectRefused) {
    for (std::string text : {"[]", "null", "\"s\"", "1"}) {
        auto root = parse(text);
        EXPECT_TOOL_ERROR(Args(root, {"a"}), "object");
    }
}

TEST_F(ArgsTest, UnknownArgumentNamesTheAllowedOnes) {
    auto root = parse(R"({"code":"x","lnaguage":"py"})");
    EXPECT_TOOL_ERROR(Args(root, {"code", "language", "sandbox_id"}), "'lnaguage'", "code, language, sandbox_id");
}

TEST_F(ArgsTest, KnownArgumentsAccepted) {
    auto root = parse(R"({"code":"x","language":"py"})");
    EXPECT_NO_THROW(Args(root, {"code", "language", "sandbox_id"}));
    auto empty = parse("{}");
    EXPECT_NO_THROW(Args(empty, {}));
}

TEST_F(ArgsTest, Strings) {
    Args args(parse(R"({"s":"text","n":1,"z":null,"e":""})"), {"s", "n", "z", "e", "absent"});
    EXPECT_EQ(args.string("s"), "text");
    EXPECT_EQ(args.string("e"), "");
    EXPECT_EQ(args.string("absent"), std::nullopt);
    EXPECT_EQ(args.string("z"), std::nullopt);  // null is "not given"
    EXPECT_TOOL_ERROR(args.string("n"), "'n'", "string");
    EXPECT_EQ(args.required_string("s"), "text");
    EXPECT_TOOL_ERROR(args.required_string("absent"), "'absent'", "required");
    EXPECT_TOOL_ERROR(args.required_string("z"), "'z'", "required");
    EXPECT_TOOL_ERROR(args.required_string("n"), "'n'", "string");
}

TEST_F(ArgsTest, Booleans) {
    Args args(parse(R"({"t":true,"f":false,"s":"true","n":1})"), {"t", "f", "s", "n", "absent"});
    EXPECT_EQ(args.boolean("t"), true);
    EXPECT_EQ(args.boolean("f"), false);
    EXPECT_EQ(args.boolean("absent"), std::nullopt);
    EXPECT_TOOL_ERROR(args.boolean("s"), "'s'", "true or false");
    EXPECT_TOOL_ERROR(args.boolean("n"), "'n'", "true or false");
}

TEST_F(ArgsTest, NumberBounds) {
    Args args(parse(R"({"lo":0.5,"min":1,"mid":2.5,"max":10,"hi":10.001,"neg":-3,"s":"5"})"),
              {"lo", "min", "mid", "max", "hi", "neg", "s", "absent"});
    EXPECT_EQ(args.number("min", 1, 10), 1.0);
    EXPECT_EQ(args.number("mid", 1, 10), 2.5);
    EXPECT_EQ(args.number("max", 1, 10), 10.0);
    EXPECT_EQ(args.number("absent", 1, 10), std::nullopt);
    EXPECT_TOOL_ERROR(args.number("lo", 1, 10), "'lo'", "from 1 to 10");
    EXPECT_TOOL_ERROR(args.number("hi", 1, 10), "'hi'", "from 1 to 10");
    EXPECT_TOOL_ERROR(args.number("neg", 0, 10), "'neg'");
    EXPECT_TOOL_ERROR(args.number("s", 0, 10), "'s'", "number");
    EXPECT_EQ(args.number("neg", -5, 0), -3.0);
}

TEST_F(ArgsTest, IntegerVersusFraction) {
    Args args(parse(R"({"i":3,"f":2.5,"whole_float":4.0,"neg":-2,"huge":9007199254740992,"s":"3"})"),
              {"i", "f", "whole_float", "neg", "huge", "s"});
    EXPECT_EQ(args.integer("i", 0, 10), 3);
    EXPECT_EQ(args.integer("whole_float", 0, 10), 4);
    EXPECT_EQ(args.integer("neg", -5, 5), -2);
    EXPECT_TOOL_ERROR(args.integer("f", 0, 10), "'f'", "whole number");
    EXPECT_TOOL_ERROR(args.integer("i", 4, 10), "'i'", "from 4 to 10");
    EXPECT_TOOL_ERROR(args.integer("huge", 0, 1000), "'huge'");
    EXPECT_TOOL_ERROR(args.integer("s", 0, 10), "'s'");
}

TEST_F(ArgsTest, StringsAcceptsStringOrArray) {
    Args args(parse(R"({"one":"ls","many":["a","b","c"],"empty":[],"mixed":["a",1],"obj":{},"num":5,"nul":null})"),
              {"one", "many", "empty", "mixed", "obj", "num", "nul", "absent"});
    EXPECT_EQ(args.strings("one"), (std::vector<std::string>{"ls"}));
    EXPECT_EQ(args.strings("many"), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(args.strings("absent"), std::nullopt);
    EXPECT_EQ(args.strings("nul"), std::nullopt);
    EXPECT_TOOL_ERROR(args.strings("empty"), "'empty'", "non-empty array of strings");
    EXPECT_TOOL_ERROR(args.strings("mixed"), "'mixed'", "array of strings");
    EXPECT_TOOL_ERROR(args.strings("obj"), "'obj'");
    EXPECT_TOOL_ERROR(args.strings("num"), "'num'");
}

TEST_F(ArgsTest, NamedStrings) {
    Args args(parse(R"({"env":{"A":"1","B":"two"},"empty":{},"bad":{"A":"1","N":2},"list":[{"name":"A","value":"1"},{"value":"two","name":"B"}],
                        "none":[],"loose":[{"name":"A"}],"extra":[{"name":"A","value":"1","x":"y"}],"arr":["A=1"],"s":"A=1"})"),
              {"env", "empty", "bad", "list", "none", "loose", "extra", "arr", "s", "absent"});
    using Pairs = std::vector<std::pair<std::string, std::string>>;
    EXPECT_EQ(args.named_strings("env"), (Pairs{{"A", "1"}, {"B", "two"}}));
    EXPECT_EQ(args.named_strings("list"), (Pairs{{"A", "1"}, {"B", "two"}}));
    EXPECT_EQ(args.named_strings("empty"), Pairs{});
    EXPECT_EQ(args.named_strings("none"), Pairs{});
    EXPECT_EQ(args.named_strings("absent"), std::nullopt);
    EXPECT_TOOL_ERROR(args.named_strings("bad"), "'bad'", "'N'", "string");
    EXPECT_TOOL_ERROR(args.named_strings("loose"), "'loose'", "\"name\"", "\"value\"");
    EXPECT_TOOL_ERROR(args.named_strings("extra"), "'extra'", "\"name\"");
    EXPECT_TOOL_ERROR(args.named_strings("arr"), "'arr'", "\"name\"");
    EXPECT_TOOL_ERROR(args.named_strings("s"), "'s'", "list");
}

// ================================================================ parse_args

const char* const env_vars[] = {
    "CUBICLE_DEFAULT_IMAGE", "DOCKER_HOST",          "CUBICLE_MEMORY_MB",        "CUBICLE_CPUS",
    "CUBICLE_TIMEOUT_S",     "CUBICLE_MAX_TIMEOUT_S", "CUBICLE_MAX_SANDBOXES",    "CUBICLE_PIDS_LIMIT",
    "CUBICLE_TMP_SIZE_MB",   "CUBICLE_ALLOW_NETWORK", "CUBICLE_MAX_OUTPUT_BYTES", "CUBICLE_LOG_LEVEL",
    "CUBICLE_POOL_SIZE",     "CUBICLE_POOL_REFILL",  "CUBICLE_POOL_IDLE_S",
    "CUBICLE_MAX_MEMORY_MB", "CUBICLE_MAX_CPUS",     "CUBICLE_MAX_PIDS_LIMIT",   "CUBICLE_MAX_TMP_SIZE_MB",
    "CUBICLE_DISK_MB",       "CUBICLE_FILES_LIMIT",  "CUBICLE_MAX_DISK_MB",      "CUBICLE_MAX_FILES_LIMIT",
    "CUBICLE_DOCKER_TIMEOUT_S", "CUBICLE_TOOLS",
    "CUBICLE_IDLE_PAUSE_S",  "CUBICLE_MAX_TTL_S",    "CUBICLE_DEFAULT_TTL_S", "CUBICLE_ZYGOTE_PRELOAD",
};

class ParseArgsTest : public ::testing::Test {
protected:
    void SetUp() override {
        for (const char* name : env_vars) {
            if (const char* value = std::getenv(name)) saved_[name] = value;
            ::unsetenv(name);
        }
    }
    void TearDown() override {
        for (const char* name : env_vars) {
            auto it = saved_.find(name);
            if (it != saved_.end()) {
                ::setenv(name, it->second.c_str(), 1);
            } else {
                ::unsetenv(name);
            }
        }
    }
    static ParsedArgs parse(std::vector<std::string> args) {
        args.insert(args.begin(), "cubicle");
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        return parse_args(static_cast<int>(args.size()), argv.data());
    }
    static std::string error_of(std::vector<std::string> args) {
        try {
            parse(std::move(args));
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "<no error>";
    }
    std::map<std::string, std::string> saved_;
};

TEST_F(ParseArgsTest, SwarmEngine) {
    auto c = parse({"--engine", "swarm", "--agent-channel", "tcp", "--agent-listen", "10.0.0.5:0", "--swarm-constraint",
                    "node.labels.sandboxes==yes", "--swarm-constraint", "node.role!=manager"})
                 .config;
    EXPECT_EQ(c.engine, "swarm");
    EXPECT_EQ(c.swarm_constraints, (std::vector<std::string>{"node.labels.sandboxes==yes", "node.role!=manager"}));
    EXPECT_EQ(parse({}).config.engine, "local");
    // Its agents dial home, to an address the nodes reach (not every one of the server's).
    EXPECT_NE(error_of({"--engine", "swarm", "--agent-listen", "10.0.0.5:0"}).find("--agent-channel tcp"), std::string::npos);
    EXPECT_NE(error_of({"--engine", "swarm", "--agent-channel", "tcp"}).find("--agent-listen"), std::string::npos);
    EXPECT_NE(error_of({"--engine", "swarm", "--agent-channel", "tcp", "--agent-listen", "0.0.0.0:7000"}).find("nodes"), std::string::npos);
    EXPECT_NE(error_of({"--engine", "swarm", "--agent-channel", "tcp", "--agent-listen", "10.0.0.5:0", "--executor", "exec"}),
              "<no error>");
    // On one engine the relay reaches only the gateway: a named address is still refused there.
    EXPECT_NE(error_of({"--agent-channel", "tcp", "--agent-listen", "10.0.0.5:0"}).find("0.0.0.0:PORT"), std::string::npos);
    EXPECT_EQ(parse({"--agent-channel", "tcp", "--agent-listen", "0.0.0.0:7000"}).config.agent_listen, "0.0.0.0:7000");
    EXPECT_NE(error_of({"--swarm-constraint", "a==b"}).find("--engine swarm"), std::string::npos);
    EXPECT_NE(error_of({"--engine", "kubernetes"}), "<no error>");
    EXPECT_NE(error_of({"--engine", "swarm", "--agent-channel", "tcp", "--agent-listen", "10.0.0.5:0", "--swarm-constraint", "nonsense"}),
              "<no error>");
}

TEST_F(ParseArgsTest, Ceilings) {
    auto c = parse({"--max-memory-mb", "2048", "--max-cpus", "2", "--max-pids-limit", "512", "--max-tmp-size-mb", "300",
                    "--disk-mb", "100", "--files-limit", "1000", "--max-disk-mb", "200", "--max-files-limit", "2000"}).config;
    EXPECT_EQ(c.memory_ceiling_mb(), 2048);
    EXPECT_EQ(c.cpu_ceiling(), 2.0);
    EXPECT_EQ(c.max_pids_limit, 512);
    EXPECT_EQ(c.max_tmp_size_mb, 300);
    EXPECT_EQ(c.disk_mb, 100);
    EXPECT_EQ(c.files_limit, 1000);
    EXPECT_EQ(c.max_disk_mb, 200);
    EXPECT_EQ(c.max_files_limit, 2000);
    // A default over its ceiling raises the ceiling; unset ceilings are a share of this machine.
    auto raised = parse({"--memory-mb", "4096", "--max-memory-mb", "1024", "--disk-mb", "300", "--max-disk-mb", "200"}).config;
    EXPECT_EQ(raised.memory_ceiling_mb(), 4096);
    EXPECT_EQ(raised.max_disk_mb, 300);
    auto host = parse({}).config;
    EXPECT_GE(host.memory_ceiling_mb(), 512);
    EXPECT_GE(host.cpu_ceiling(), 1.0);
    EXPECT_NE(error_of({"--max-cpus", "0"}), "<no error>");
    EXPECT_EQ(parse({"--disk-mb", "0"}).config.disk_mb, 0);  // no quota
}

TEST_F(ParseArgsTest, ToolGroups) {
    EXPECT_TRUE(parse({}).config.tool_groups.empty());  // the default set
    EXPECT_EQ(parse({"--tools", "run,files"}).config.tool_groups, (std::vector<std::string>{"run", "files"}));
    EXPECT_EQ(parse({"--tools=all"}).config.tool_groups, (std::vector<std::string>{"all"}));
    ::setenv("CUBICLE_TOOLS", "packages", 1);
    EXPECT_EQ(parse({}).config.tool_groups, (std::vector<std::string>{"packages"}));
    EXPECT_EQ(parse({"--tools", "host"}).config.tool_groups, (std::vector<std::string>{"host"}));  // the flag wins
    ::setenv("CUBICLE_TOOLS", "run,nope", 1);
    auto from_env = error_of({});
    EXPECT_NE(from_env.find("CUBICLE_TOOLS"), std::string::npos) << from_env;
    ::unsetenv("CUBICLE_TOOLS");
    auto message = error_of({"--tools", "run,sandboxes"});
    for (auto part : {"'sandboxes'", "run, files, runs, snapshots, preview, host, project, packages or all"}) {
        EXPECT_NE(message.find(part), std::string::npos) << message;
    }
    EXPECT_NE(error_of({"--tools", "run,,files"}), "<no error>");
    // --help names every group.
    for (const auto& group : tools::tool_groups()) EXPECT_NE(usage().find(group.name), std::string::npos) << group.name;
}

TEST_F(ParseArgsTest, Defaults) {
    auto parsed = parse({});
    const Config defaults;
    EXPECT_FALSE(parsed.show_help);
    EXPECT_FALSE(parsed.show_version);
    EXPECT_EQ(parsed.config.default_image, defaults.default_image);
    EXPECT_EQ(parsed.config.docker_host, "");
    EXPECT_EQ(parsed.config.memory_mb, 512);
    EXPECT_EQ(parsed.config.cpus, 1.0);
    EXPECT_EQ(parsed.config.timeout_s, 30);
    EXPECT_EQ(parsed.config.max_timeout_s, 300);
    EXPECT_EQ(parsed.config.max_sandboxes, 32);
    EXPECT_EQ(parsed.config.pids_limit, 256);
    EXPECT_EQ(parsed.config.tmp_size_mb, 256);
    EXPECT_EQ(parsed.config.max_output_bytes, 64u << 20);
    EXPECT_EQ(parsed.config.result_budget, 16u << 10);
    EXPECT_FALSE(parsed.config.allow_network);
    EXPECT_EQ(parsed.config.max_egress_networks, 16);
    EXPECT_EQ(parsed.config.egress_approval_timeout_s, 60);
    EXPECT_TRUE(parsed.config.egress_asks());  // stdio
    EXPECT_EQ(parsed.config.pool_size, defaults.pool_size);
    EXPECT_EQ(parsed.config.pool_refill, defaults.pool_refill);
    EXPECT_EQ(parsed.config.pool_idle_s, defaults.pool_idle_s);
    EXPECT_EQ(parsed.config.log_level, "info");
}

TEST_F(ParseArgsTest, EgressApprovalAsksOnStdioOnlyUnlessSet) {
    EXPECT_FALSE(parse({"--transport", "http"}).config.egress_asks());
    EXPECT_TRUE(parse({"--transport", "http", "--egress-approval", "ask"}).config.egress_asks());
    EXPECT_FALSE(parse({"--egress-approval", "off"}).config.egress_asks());
    EXPECT_EQ(parse({"--egress-approval-timeout-s", "2"}).config.egress_approval_timeout_s, 2);
}

TEST_F(ParseArgsTest, FlagsWithSeparateValues) {
    auto c = parse({"--default-image", "python:3.12-slim", "--docker-host", "tcp://h:1", "--memory-mb", "1024", "--cpus",
                    "2.5", "--timeout-s", "60", "--max-timeout-s", "600", "--max-sandboxes", "4", "--pids-limit", "64",
                    "--tmp-size-mb", "32", "--max-output-bytes", "4096", "--log-level", "debug"})
                 .config;
    EXPECT_EQ(c.default_image, "python:3.12-slim");
    EXPECT_EQ(c.docker_host, "tcp://h:1");
    EXPECT_EQ(c.memory_mb, 1024);
    EXPECT_EQ(c.cpus, 2.5);
    EXPECT_EQ(c.timeout_s, 60);
    EXPECT_EQ(c.max_timeout_s, 600);
    EXPECT_EQ(c.max_sandboxes, 4);
    EXPECT_EQ(c.pids_limit, 64);
    EXPECT_EQ(c.tmp_size_mb, 32);
    EXPECT_EQ(c.max_output_bytes, 4096u);
    EXPECT_EQ(c.log_level, "debug");
}

TEST_F(ParseArgsTest, FlagsWithEquals) {
    auto c = parse({"--memory-mb=2048", "--cpus=0.5", "--default-image=img:tag=x", "--log-level=error"}).config;
    EXPECT_EQ(c.memory_mb, 2048);
    EXPECT_EQ(c.cpus, 0.5);
    EXPECT_EQ(c.default_image, "img:tag=x");  // only the first '=' separates
    EXPECT_EQ(c.log_level, "error");
}

TEST_F(ParseArgsTest, EnvironmentVariables) {
    ::setenv("CUBICLE_MEMORY_MB", "768", 1);
    ::setenv("CUBICLE_CPUS", "1.5", 1);
    ::setenv("CUBICLE_DEFAULT_IMAGE", "env/image:1", 1);
    ::setenv("DOCKER_HOST", "unix:///tmp/d.sock", 1);
    ::setenv("CUBICLE_ALLOW_NETWORK", "true", 1);
    ::setenv("CUBICLE_LOG_LEVEL", "warning", 1);
    ::setenv("CUBICLE_MAX_OUTPUT_BYTES", "2048", 1);
    auto c = parse({}).config;
    EXPECT_EQ(c.memory_mb, 768);
    EXPECT_EQ(c.cpus, 1.5);
    EXPECT_EQ(c.default_image, "env/image:1");
    EXPECT_EQ(c.docker_host, "unix:///tmp/d.sock");
    EXPECT_TRUE(c.allow_network);
    EXPECT_EQ(c.log_level, "warning");
    EXPECT_EQ(c.max_output_bytes, 2048u);
}

TEST_F(ParseArgsTest, EmptyEnvironmentVariableIsIgnored) {
    ::setenv("CUBICLE_MEMORY_MB", "", 1);
    EXPECT_EQ(parse({}).config.memory_mb, 512);
}

TEST_F(ParseArgsTest, FlagsBeatEnvironment) {
    ::setenv("CUBICLE_MEMORY_MB", "768", 1);
    ::setenv("CUBICLE_ALLOW_NETWORK", "1", 1);
    ::setenv("CUBICLE_TIMEOUT_S", "10", 1);
    auto c = parse({"--memory-mb", "256", "--allow-network=false", "--timeout-s=20"}).config;
    EXPECT_EQ(c.memory_mb, 256);
    EXPECT_FALSE(c.allow_network);
    EXPECT_EQ(c.timeout_s, 20);
}

TEST_F(ParseArgsTest, BadEnvironmentValueIsAnError) {
    ::setenv("CUBICLE_MEMORY_MB", "lots", 1);
    // Reported under the name the user set, not the flag's.
    EXPECT_NE(error_of({}).find("CUBICLE_MEMORY_MB must be a number"), std::string::npos);
}

TEST_F(ParseArgsTest, AllowNetworkSwitch) {
    EXPECT_TRUE(parse({"--allow-network"}).config.allow_network);
    EXPECT_TRUE(parse({"--allow-network=true"}).config.allow_network);
    EXPECT_TRUE(parse({"--allow-network=yes"}).config.allow_network);
    EXPECT_FALSE(parse({"--allow-network=0"}).config.allow_network);
    EXPECT_FALSE(parse({"--allow-network=off"}).config.allow_network);
    // A switch does not swallow the next argument.
    auto c = parse({"--allow-network", "--memory-mb", "100"}).config;
    EXPECT_TRUE(c.allow_network);
    EXPECT_EQ(c.memory_mb, 100);
    EXPECT_NE(error_of({"--allow-network=maybe"}).find("--allow-network"), std::string::npos);
}

TEST_F(ParseArgsTest, BadNumbers) {
    for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
             {"--memory-mb", "abc"},
             {"--memory-mb", "12abc"},
             {"--memory-mb", "8"},          // below the minimum
             {"--memory-mb", "2000000"},    // above the maximum
             {"--memory-mb", "1.5"},        // not an integer
             {"--memory-mb", ""},
             {"--memory-mb", "-512"},
             {"--cpus", "0"},
             {"--cpus", "lots"},
             {"--timeout-s", "0"},
             {"--max-output-bytes", "10"},
             {"--pids-limit", "1"},
         }) {
        std::string error = error_of(args);
        EXPECT_NE(error.find(args[0]), std::string::npos) << args[0] << " " << args[1] << ": " << error;
        EXPECT_NE(error.find("must be a number from"), std::string::npos) << error;
    }
}

TEST_F(ParseArgsTest, PoolOptions) {
    auto c = parse({"--pool-size", "0", "--pool-refill=4", "--pool-idle-s", "60"}).config;
    EXPECT_EQ(c.pool_size, 0);  // zero turns the pool off
    EXPECT_EQ(c.pool_refill, 4);
    EXPECT_EQ(c.pool_idle_s, 60);
    ::setenv("CUBICLE_POOL_SIZE", "5", 1);
    EXPECT_EQ(parse({}).config.pool_size, 5);
    EXPECT_EQ(parse({"--pool-size=1"}).config.pool_size, 1);
    EXPECT_NE(error_of({"--pool-size", "-1"}).find("--pool-size"), std::string::npos);
    EXPECT_NE(error_of({"--pool-refill", "0"}).find("--pool-refill"), std::string::npos);
    EXPECT_NE(error_of({"--pool-idle-s", "0"}).find("--pool-idle-s"), std::string::npos);
    EXPECT_EQ(parse({}).config.pool_max, 16);
    EXPECT_EQ(parse({"--pool-max", "40"}).config.pool_max, 40);
    EXPECT_NE(error_of({"--pool-max", "-1"}).find("--pool-max"), std::string::npos);
    EXPECT_FALSE(parse({}).config.no_recycle);
    EXPECT_TRUE(parse({"--no-recycle"}).config.no_recycle);
}

TEST_F(ParseArgsTest, BadLogLevel) {
    EXPECT_NE(error_of({"--log-level", "verbose"}).find("--log-level"), std::string::npos);
}

TEST_F(ParseArgsTest, MissingValue) {
    std::string error = error_of({"--memory-mb"});
    EXPECT_NE(error.find("--memory-mb"), std::string::npos) << error;
    EXPECT_NE(error.find("needs a value"), std::string::npos) << error;
}

TEST_F(ParseArgsTest, UnknownFlag) {
    std::string error = error_of({"--memroy-mb", "5"});
    EXPECT_NE(error.find("--memroy-mb"), std::string::npos) << error;
    EXPECT_NE(error.find("unknown option"), std::string::npos) << error;
    EXPECT_NE(error_of({"positional"}).find("positional"), std::string::npos);
    EXPECT_NE(error_of({"--bogus=1"}).find("--bogus=1"), std::string::npos);
}

TEST_F(ParseArgsTest, HelpAndVersion) {
    EXPECT_TRUE(parse({"--help"}).show_help);
    EXPECT_TRUE(parse({"-h"}).show_help);
    EXPECT_TRUE(parse({"--version"}).show_version);
    EXPECT_TRUE(parse({"-V"}).show_version);
    auto both = parse({"-V", "--memory-mb", "64", "--help"});
    EXPECT_TRUE(both.show_help);
    EXPECT_TRUE(both.show_version);
    EXPECT_EQ(both.config.memory_mb, 64);
}

TEST_F(ParseArgsTest, TimeoutRaisesMaxTimeout) {
    auto c = parse({"--timeout-s", "500"}).config;
    EXPECT_EQ(c.timeout_s, 500);
    EXPECT_GE(c.max_timeout_s, 500);
}

TEST_F(ParseArgsTest, DockerTimeout) {
    EXPECT_EQ(parse({}).config.docker_timeout_s, 30);
    EXPECT_EQ(parse({"--docker-timeout-s", "2"}).config.docker_timeout_s, 2);
    ::setenv("CUBICLE_DOCKER_TIMEOUT_S", "7", 1);
    EXPECT_EQ(parse({}).config.docker_timeout_s, 7);
    EXPECT_THROW(parse({"--docker-timeout-s", "0"}), std::invalid_argument);
    EXPECT_THROW(parse({"--docker-timeout-s", "soon"}), std::invalid_argument);
}

TEST_F(ParseArgsTest, LifetimeOptions) {
    auto defaults = parse({}).config;
    EXPECT_EQ(defaults.idle_pause_s, 60);
    EXPECT_EQ(defaults.max_ttl_s, 86400);
    EXPECT_EQ(defaults.default_ttl_s, 0);  // no ttl_s unless asked for
    EXPECT_EQ(parse({"--idle-pause-s", "0"}).config.idle_pause_s, 0);  // never paused
    ::setenv("CUBICLE_IDLE_PAUSE_S", "5", 1);
    EXPECT_EQ(parse({}).config.idle_pause_s, 5);
    EXPECT_NE(error_of({"--idle-pause-s", "-1"}).find("--idle-pause-s"), std::string::npos);
    EXPECT_NE(error_of({"--max-ttl-s", "0"}).find("--max-ttl-s"), std::string::npos);
    auto c = parse({"--max-ttl-s", "600", "--default-ttl-s", "60"}).config;
    EXPECT_EQ(c.max_ttl_s, 600);
    EXPECT_EQ(c.default_ttl_s, 60);
    // The operator's default is never over their own ceiling: the ceiling moves up to it.
    EXPECT_EQ(parse({"--max-ttl-s", "60", "--default-ttl-s", "600"}).config.max_ttl_s, 600);
}

TEST_F(ParseArgsTest, ZygotePreload) {
    EXPECT_FALSE(parse({}).config.zygote_preload.has_value());  // the language table's default
    EXPECT_EQ(parse({"--zygote-preload", "none"}).config.zygote_preload, std::vector<std::string>{});
    auto modules = std::vector<std::string>{"numpy", "matplotlib.pyplot", "_private"};
    EXPECT_EQ(parse({"--zygote-preload=numpy,matplotlib.pyplot,_private"}).config.zygote_preload, modules);
    ::setenv("CUBICLE_ZYGOTE_PRELOAD", "pandas", 1);
    EXPECT_EQ(parse({}).config.zygote_preload, std::vector<std::string>{"pandas"});
    for (const char* bad : {"", "numpy,", ",numpy", "numpy,,pandas", "os;rm", "1numpy", "numpy.", "a..b", "num py"}) {
        auto error = error_of({"--zygote-preload", bad});
        EXPECT_NE(error.find("is not a Python module name"), std::string::npos) << bad << ": " << error;
    }
}

TEST(Usage, MentionsEveryFlagAndVariable) {
    std::string text = usage();
    for (const char* flag : {"--default-image", "--docker-host", "--docker-timeout-s", "--memory-mb", "--cpus", "--timeout-s", "--max-timeout-s",
                             "--max-sandboxes", "--pids-limit", "--tmp-size-mb", "--max-output-bytes", "--allow-network",
                             "--pool-size", "--pool-refill", "--pool-idle-s", "--zygote-preload", "--idle-pause-s", "--max-ttl-s", "--default-ttl-s",
                             "--log-level", "--help", "--version", "-h", "-V"}) {
        EXPECT_NE(text.find(flag), std::string::npos) << flag;
    }
    for (const char* var : env_vars) EXPECT_NE(text.find(var), std::string::npos) << var;
    EXPECT_NE(text.find(CUBICLE_VERSION), std::string::npos);
}

} // namespace
} // namespace cubicle
