#include "config.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

namespace cubicle {
namespace {

template <typename T>
T parse_number(std::string_view name, std::string_view text, T min, T max) {
    T value{};
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
        throw std::invalid_argument(fmt::format("{} must be a number from {} to {}, not '{}'", name, min, max, text));
    }
    return value;
}

bool parse_bool(std::string_view name, std::string_view text) {
    if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
    if (text == "0" || text == "false" || text == "no" || text == "off" || text.empty()) return false;
    throw std::invalid_argument(fmt::format("{} must be true or false, not '{}'", name, text));
}

struct Option {
    std::string_view flag;     // --flag
    std::string_view env;      // CUBICLE_*
    std::string_view value_name;  // empty for a switch
    std::string_view help;
    std::function<void(Config&, std::string_view)> apply;
};

const std::vector<Option>& options() {
    static const std::vector<Option> table = {
        {"--default-image", "CUBICLE_DEFAULT_IMAGE", "IMAGE", "image for sandboxes that name none",
         [](Config& c, std::string_view v) { c.default_image = v; }},
        {"--docker-host", "DOCKER_HOST", "URL", "Docker daemon: unix:///path or tcp://host:port",
         [](Config& c, std::string_view v) { c.docker_host = v; }},
        {"--memory-mb", "CUBICLE_MEMORY_MB", "N", "default memory limit per sandbox (swap disabled)",
         [](Config& c, std::string_view v) { c.memory_mb = parse_number("--memory-mb", v, 16, 1 << 20); }},
        {"--cpus", "CUBICLE_CPUS", "X", "default CPU limit per sandbox",
         [](Config& c, std::string_view v) { c.cpus = parse_number("--cpus", v, 0.01, 1024.0); }},
        {"--timeout-s", "CUBICLE_TIMEOUT_S", "N", "default execution timeout",
         [](Config& c, std::string_view v) { c.timeout_s = parse_number("--timeout-s", v, 1, 86400); }},
        {"--max-timeout-s", "CUBICLE_MAX_TIMEOUT_S", "N", "largest timeout_s a client may ask for",
         [](Config& c, std::string_view v) { c.max_timeout_s = parse_number("--max-timeout-s", v, 1, 86400); }},
        {"--max-sandboxes", "CUBICLE_MAX_SANDBOXES", "N", "most live sandboxes at once",
         [](Config& c, std::string_view v) { c.max_sandboxes = parse_number("--max-sandboxes", v, 1, 10000); }},
        {"--pids-limit", "CUBICLE_PIDS_LIMIT", "N", "most processes per sandbox",
         [](Config& c, std::string_view v) { c.pids_limit = parse_number("--pids-limit", v, 8, 1 << 22); }},
        {"--tmp-size-mb", "CUBICLE_TMP_SIZE_MB", "N", "size of each sandbox's /tmp (tmpfs)",
         [](Config& c, std::string_view v) { c.tmp_size_mb = parse_number("--tmp-size-mb", v, 1, 1 << 20); }},
        {"--max-output-bytes", "CUBICLE_MAX_OUTPUT_BYTES", "N", "output kept per stream and execution",
         [](Config& c, std::string_view v) {
             c.max_output_bytes = parse_number<std::uint64_t>("--max-output-bytes", v, 1024, std::uint64_t(1) << 30);
         }},
        {"--allow-network", "CUBICLE_ALLOW_NETWORK", "", "let clients ask for network: true (off by default)",
         [](Config& c, std::string_view v) { c.allow_network = parse_bool("--allow-network", v); }},
        {"--allow-host-dir", "CUBICLE_ALLOW_HOST_DIRS", "DIR",
         "host directory open to upload_file/download_file (repeatable; variable: DIR:DIR)",
         [](Config& c, std::string_view v) {
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(':', start), v.size());
                 if (end > start) c.allow_host_dirs.emplace_back(v.substr(start, end - start));
                 start = end + 1;
             }
         }},
        {"--max-transfer-mb", "CUBICLE_MAX_TRANSFER_MB", "N", "largest file transfer in MiB",
         [](Config& c, std::string_view v) { c.max_transfer_mb = parse_number("--max-transfer-mb", v, 1, 1 << 20); }},
        {"--max-transfer-entries", "CUBICLE_MAX_TRANSFER_ENTRIES", "N", "most files and directories in one transfer",
         [](Config& c, std::string_view v) { c.max_transfer_entries = parse_number("--max-transfer-entries", v, 1, 10000000); }},
        {"--egress-allow", "CUBICLE_EGRESS_ALLOW", "HOST[:PORT]",
         "only destination networked sandboxes may reach (repeatable; variable: comma-separated)",
         [](Config& c, std::string_view v) {
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(',', start), v.size());
                 if (end > start) c.egress_allow.emplace_back(v.substr(start, end - start));
                 start = end + 1;
             }
         }},
        {"--executor", "CUBICLE_EXECUTOR", "KIND",
         "agent (default; falls back to exec where the agent cannot run) or exec",
         [](Config& c, std::string_view v) {
             if (v != "agent" && v != "exec") throw std::invalid_argument(fmt::format("--executor must be agent or exec, not '{}'", v));
             c.executor = v;
         }},
        {"--pool-size", "CUBICLE_POOL_SIZE", "N", "warm sandboxes kept ready (0: none)",
         [](Config& c, std::string_view v) { c.pool_size = parse_number("--pool-size", v, 0, 1000); }},
        {"--pool-refill", "CUBICLE_POOL_REFILL", "N", "warm sandboxes started at once when refilling",
         [](Config& c, std::string_view v) { c.pool_refill = parse_number("--pool-refill", v, 1, 64); }},
        {"--pool-idle-s", "CUBICLE_POOL_IDLE_S", "N", "empty the pool after this long unused",
         [](Config& c, std::string_view v) { c.pool_idle_s = parse_number("--pool-idle-s", v, 1, 86400 * 7); }},
        {"--log-level", "CUBICLE_LOG_LEVEL", "LEVEL", "debug, info, warning or error (to stderr)",
         [](Config& c, std::string_view v) {
             if (v != "debug" && v != "info" && v != "warning" && v != "error")
                 throw std::invalid_argument(fmt::format("--log-level must be debug, info, warning or error, not '{}'", v));
             c.log_level = v;
         }},
    };
    return table;
}

} // namespace

ParsedArgs parse_args(int argc, char** argv) {
    ParsedArgs parsed;
    for (const auto& option : options()) {
        if (const char* value = std::getenv(std::string(option.env).c_str()); value && *value) {
            option.apply(parsed.config, value);
        }
    }
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            parsed.show_help = true;
            continue;
        }
        if (arg == "-V" || arg == "--version") {
            parsed.show_version = true;
            continue;
        }
        std::string_view inline_value;
        bool has_inline = false;
        if (auto eq = arg.find('='); eq != arg.npos) {
            inline_value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
            has_inline = true;
        }
        const Option* match = nullptr;
        for (const auto& option : options()) {
            if (option.flag == arg) match = &option;
        }
        if (!match) throw std::invalid_argument(fmt::format("unknown option '{}' (see --help)", argv[i]));
        if (match->value_name.empty()) {
            match->apply(parsed.config, has_inline ? inline_value : "1");
        } else if (has_inline) {
            match->apply(parsed.config, inline_value);
        } else {
            if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", arg));
            match->apply(parsed.config, argv[++i]);
        }
    }
    if (parsed.config.timeout_s > parsed.config.max_timeout_s) parsed.config.max_timeout_s = parsed.config.timeout_s;
    return parsed;
}

std::string usage() {
    std::string out =
        "cubicle " CUBICLE_VERSION " - an MCP server that runs code in locked-down Docker sandboxes\n\n"
        "usage: cubicle [options]\n\n"
        "Speaks MCP (JSON-RPC 2.0, one message per line) on stdin/stdout; logs go to stderr.\n\n"
        "options (each also read from the environment variable shown):\n";
    for (const auto& option : options()) {
        auto left = fmt::format("{} {}", option.flag, option.value_name);
        out += fmt::format("  {:<26} {} [{}]\n", left, option.help, option.env);
    }
    out += fmt::format("  {:<26} {}\n  {:<26} {}\n", "-h, --help", "show this help", "-V, --version", "show the version");
    return out;
}

} // namespace cubicle
