#include "config.hpp"

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <arpa/inet.h>
#include <unistd.h>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "tools/groups.hpp"

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

long long physical_memory_mb() {
    long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? static_cast<long long>(pages) * page_size / (1024 * 1024) : 1024;
}

bool parse_bool(std::string_view name, std::string_view text) {
    if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
    if (text == "0" || text == "false" || text == "no" || text == "off" || text.empty()) return false;
    throw std::invalid_argument(fmt::format("{} must be true or false, not '{}'", name, text));
}

// "none" or MODULE[,MODULE...], each a dotted Python name: the zygote imports
// them by name, so anything else is a typo (a module that is not installed is
// skipped by the zygote and imports as usual when a run asks for it).
std::vector<std::string> parse_module_list(std::string_view name, std::string_view text) {
    std::vector<std::string> modules;
    if (text == "none") return modules;
    auto is_identifier = [](std::string_view part) {
        return !part.empty() && !std::isdigit(static_cast<unsigned char>(part[0])) &&
               std::ranges::all_of(part, [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; });
    };
    for (std::size_t start = 0; start <= text.size();) {
        auto end = std::min(text.find(',', start), text.size());
        auto module = text.substr(start, end - start);
        bool valid = !module.empty();
        for (std::size_t at = 0; valid && at <= module.size();) {
            auto dot = std::min(module.find('.', at), module.size());
            valid = is_identifier(module.substr(at, dot - at));
            at = dot + 1;
        }
        if (!valid) {
            throw std::invalid_argument(
                fmt::format("{}: '{}' is not a Python module name; give a comma-separated list such as numpy,pandas, or none", name, module));
        }
        modules.emplace_back(module);
        start = end + 1;
    }
    return modules;
}

// A directory the operator opens to uploads and downloads: absolute, existing, not /.
std::string checked_host_dir(std::string_view dir) {
    std::string path(dir);
    if (!path.starts_with('/')) {
        throw std::invalid_argument(fmt::format("--allow-host-dir needs an absolute path, not '{}'", path));
    }
    std::error_code ec;
    auto canonical = std::filesystem::canonical(path, ec);
    if (ec || !std::filesystem::is_directory(canonical, ec)) {
        throw std::invalid_argument(fmt::format("--allow-host-dir '{}' is not an existing directory", path));
    }
    if (canonical == "/") {
        throw std::invalid_argument(fmt::format("--allow-host-dir '{}' would open the whole host file system; name a directory below /", path));
    }
    return path;
}

// HOST or HOST:PORT, as the egress proxy reads its rules: a DNS name or IPv4 address.
std::string checked_egress_rule(std::string_view rule) {
    auto colon = rule.find(':');
    auto host = rule.substr(0, colon);
    bool host_ok = !host.empty() && host.size() <= 253 && host.front() != '-' && host.front() != '.' && host.back() != '-';
    for (char c : host) host_ok = host_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.');
    int port = 0;
    if (colon != std::string_view::npos) {
        auto text = rule.substr(colon + 1);
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
        if (ec != std::errc() || end != text.data() + text.size() || port < 1 || port > 65535) port = -1;
    }
    if (!host_ok || port < 0) {
        throw std::invalid_argument(fmt::format("--egress-allow '{}' is not HOST or HOST:PORT (a DNS name or IPv4 address, port 1-65535)", rule));
    }
    return std::string(rule);
}

// DOCKER_TLS and DOCKER_TLS_VERIFY as the docker CLI reads them: any value is on,
// except one that plainly says no.
bool docker_switch(std::string_view text) {
    return !text.empty() && text != "0" && text != "false" && text != "no" && text != "off";
}

struct Option {
    std::string_view flag;     // --flag
    std::string_view env;      // CUBICLE_*
    std::string_view value_name;  // empty for a switch
    std::string help;
    std::function<void(Config&, std::string_view)> apply;
};

const std::vector<Option>& options() {
    static const std::vector<Option> table = {
        {"--default-image", "CUBICLE_DEFAULT_IMAGE", "IMAGE", "image for sandboxes that name none",
         [](Config& c, std::string_view v) { c.default_image = v; }},
        {"--docker-host", "DOCKER_HOST", "URL",
         "Docker daemon: unix:///path, tcp://host:port or ssh://user@host:port (default: DOCKER_CONTEXT, the current docker context, "
         "the local socket)",
         [](Config& c, std::string_view v) { c.docker_host = v; }},
        {"--docker-tls", "DOCKER_TLS", "", "use TLS to a tcp:// daemon without checking its certificate",
         [](Config& c, std::string_view v) { c.docker_tls = docker_switch(v); }},
        {"--docker-tls-verify", "DOCKER_TLS_VERIFY", "", "use TLS to a tcp:// daemon and check its certificate against ca.pem",
         [](Config& c, std::string_view v) { c.docker_tls_verify = docker_switch(v); }},
        {"--docker-cert-path", "DOCKER_CERT_PATH", "DIR", "ca.pem, cert.pem and key.pem for TLS (default: ~/.docker)",
         [](Config& c, std::string_view v) { c.docker_cert_path = v; }},
        {"--docker-ssh-config", "CUBICLE_DOCKER_SSH_CONFIG", "FILE", "ssh configuration file for ssh:// daemons (default: ~/.ssh/config)",
         [](Config& c, std::string_view v) { c.docker_ssh_config = v; }},
        {"--docker-timeout-s", "CUBICLE_DOCKER_TIMEOUT_S", "N",
         "longest wait for each step of a Docker request (connect, send, answer, each pause in a body)",
         [](Config& c, std::string_view v) { c.docker_timeout_s = parse_number("--docker-timeout-s", v, 1, 3600); }},
        {"--runtime", "CUBICLE_RUNTIME", "NAME", "OCI runtime for sandboxes, such as runsc (gVisor); the engine must offer it",
         [](Config& c, std::string_view v) { c.runtime = v; }},
        {"--memory-mb", "CUBICLE_MEMORY_MB", "N", "memory a sandbox's programs may hold, files aside (swap disabled)",
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
        {"--tmp-size-mb", "CUBICLE_TMP_SIZE_MB", "N", "size of each sandbox's /tmp (tmpfs: held in memory beside the programs' memory)",
         [](Config& c, std::string_view v) { c.tmp_size_mb = parse_number("--tmp-size-mb", v, 1, 1 << 20); }},
        {"--max-memory-mb", "CUBICLE_MAX_MEMORY_MB", "N", "largest memory_mb a client may ask for (default: half of this machine's memory)",
         [](Config& c, std::string_view v) { c.max_memory_mb = parse_number("--max-memory-mb", v, 16, 1 << 24); }},
        {"--max-cpus", "CUBICLE_MAX_CPUS", "X", "largest cpus a client may ask for (default: this machine's CPU count)",
         [](Config& c, std::string_view v) { c.max_cpus = parse_number("--max-cpus", v, 0.01, 1024.0); }},
        {"--max-pids-limit", "CUBICLE_MAX_PIDS_LIMIT", "N", "largest pids_limit a client may ask for",
         [](Config& c, std::string_view v) { c.max_pids_limit = parse_number("--max-pids-limit", v, 8, 1 << 22); }},
        {"--max-tmp-size-mb", "CUBICLE_MAX_TMP_SIZE_MB", "N", "largest tmp_size_mb a client may ask for",
         [](Config& c, std::string_view v) { c.max_tmp_size_mb = parse_number("--max-tmp-size-mb", v, 1, 1 << 20); }},
        {"--disk-mb", "CUBICLE_DISK_MB", "N",
         "size of each sandbox's /workspace (held in memory beside the programs' memory; 0: no quota, a plain volume)",
         [](Config& c, std::string_view v) { c.disk_mb = parse_number("--disk-mb", v, 0, 1 << 24); }},
        {"--files-limit", "CUBICLE_FILES_LIMIT", "N", "most files and directories in each sandbox's /workspace",
         [](Config& c, std::string_view v) { c.files_limit = parse_number("--files-limit", v, 100, 1 << 30); }},
        {"--max-disk-mb", "CUBICLE_MAX_DISK_MB", "N", "largest disk_mb a client may ask for",
         [](Config& c, std::string_view v) { c.max_disk_mb = parse_number("--max-disk-mb", v, 1, 1 << 24); }},
        {"--max-files-limit", "CUBICLE_MAX_FILES_LIMIT", "N", "largest files_limit a client may ask for",
         [](Config& c, std::string_view v) { c.max_files_limit = parse_number("--max-files-limit", v, 100, 1 << 30); }},
        {"--max-output-bytes", "CUBICLE_MAX_OUTPUT_BYTES", "N", "output kept per stream and execution (saved in the sandbox)",
         [](Config& c, std::string_view v) {
             c.max_output_bytes = parse_number<std::uint64_t>("--max-output-bytes", v, 1024, std::uint64_t(1) << 30);
         }},
        {"--result-budget", "CUBICLE_RESULT_BUDGET", "N",
         "bytes of program output a result may carry as sent (head and tail kept; calls may ask for less)",
         [](Config& c, std::string_view v) {
             c.result_budget = parse_number<std::uint64_t>("--result-budget", v, 1024, std::uint64_t(1) << 24);
         }},
        {"--progress-max-bytes", "CUBICLE_PROGRESS_MAX_BYTES", "N", "program output sent as progress notifications per call",
         [](Config& c, std::string_view v) {
             c.progress_max_bytes = parse_number<std::uint64_t>("--progress-max-bytes", v, 0, std::uint64_t(1) << 30);
         }},
        {"--max-background-s", "CUBICLE_MAX_BACKGROUND_S", "N", "largest timeout_s of a background run",
         [](Config& c, std::string_view v) { c.max_background_s = parse_number("--max-background-s", v, 1, 86400 * 7); }},
        {"--allow-network", "CUBICLE_ALLOW_NETWORK", "", "let clients ask for network: true (off by default)",
         [](Config& c, std::string_view v) { c.allow_network = parse_bool("--allow-network", v); }},
        {"--allow-host-dir", "CUBICLE_ALLOW_HOST_DIRS", "DIR",
         "host directory open to upload_file/download_file (repeatable; variable: DIR:DIR)",
         [](Config& c, std::string_view v) {
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(':', start), v.size());
                 if (end > start) c.allow_host_dirs.push_back(checked_host_dir(v.substr(start, end - start)));
                 start = end + 1;
             }
         }},
        {"--max-transfer-mb", "CUBICLE_MAX_TRANSFER_MB", "N", "largest file transfer in MiB",
         [](Config& c, std::string_view v) { c.max_transfer_mb = parse_number("--max-transfer-mb", v, 1, 1 << 20); }},
        {"--max-transfer-entries", "CUBICLE_MAX_TRANSFER_ENTRIES", "N", "most files and directories in one transfer",
         [](Config& c, std::string_view v) { c.max_transfer_entries = parse_number("--max-transfer-entries", v, 1, 10000000); }},
        {"--max-exposed-ports", "CUBICLE_MAX_EXPOSED_PORTS", "N", "most ports one sandbox may expose at once (expose_port)",
         [](Config& c, std::string_view v) { c.max_exposed_ports = parse_number("--max-exposed-ports", v, 1, 1024); }},
        {"--max-checkpoints", "CUBICLE_MAX_CHECKPOINTS", "N",
         "most checkpoints (checkpoint_session) one sandbox keeps; past it the oldest is dropped",
         [](Config& c, std::string_view v) { c.max_checkpoints = parse_number("--max-checkpoints", v, 1, 64); }},
        {"--preview-listeners", "CUBICLE_PREVIEW_LISTENERS", "",
         "on the HTTP transport, expose_port also listens on the host's 127.0.0.1 (reachable by every local user, "
         "past the principal check; off by default: previews go through the authenticated preview path. Always on over stdio)",
         [](Config& c, std::string_view v) { c.preview_listeners = parse_bool("--preview-listeners", v); }},
        {"--egress-allow", "CUBICLE_EGRESS_ALLOW", "HOST[:PORT]",
         "only destination networked sandboxes may reach (repeatable; variable: comma-separated)",
         [](Config& c, std::string_view v) {
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(',', start), v.size());
                 if (end > start) c.egress_allow.push_back(checked_egress_rule(v.substr(start, end - start)));
                 start = end + 1;
             }
         }},
        {"--secrets", "CUBICLE_SECRETS", "FILE",
         "secrets (JSON) networked sandboxes may ask for by name: they see a placeholder, and the egress proxy puts "
         "the value into requests to the secret's hosts only (re-read on SIGHUP)",
         [](Config& c, std::string_view v) { c.secrets_file = v; }},
        {"--test-upstream-ca", "CUBICLE_TEST_UPSTREAM_CA", "FILE",
         "FOR TESTS ONLY: the egress proxy also trusts these certificates (PEM) when it verifies the hosts "
         "that carry secrets (--secrets); never for production use",
         [](Config& c, std::string_view v) { c.test_upstream_ca = v; }},
        {"--egress-approval", "CUBICLE_EGRESS_APPROVAL", "MODE",
         "ask: when a networked sandbox tries a host --egress-allow does not admit, ask the user through the client "
         "(MCP elicitation: once, for the sandbox, or no); off: refuse. Default: ask on stdio, off on HTTP",
         [](Config& c, std::string_view v) {
             if (v != "ask" && v != "off") throw std::invalid_argument(fmt::format("--egress-approval must be ask or off, not '{}'", v));
             c.egress_approval = v;
         }},
        {"--egress-approval-timeout-s", "CUBICLE_EGRESS_APPROVAL_TIMEOUT_S", "N",
         "how long a connection waits for the user's answer to an egress approval before it is refused",
         [](Config& c, std::string_view v) { c.egress_approval_timeout_s = parse_number("--egress-approval-timeout-s", v, 1, 3600); }},
        {"--max-egress-networks", "CUBICLE_MAX_EGRESS_NETWORKS", "N",
         "most internal networks for networked sandboxes, one per principal that has any; each takes a subnet "
         "of the Docker daemon's address pools",
         [](Config& c, std::string_view v) { c.max_egress_networks = parse_number("--max-egress-networks", v, 1, 1000); }},
        {"--no-persistent", "CUBICLE_NO_PERSISTENT", "",
         "refuse persistent: true (sandboxes kept on disk in --state-dir across server restarts)",
         [](Config& c, std::string_view v) { c.no_persistent = parse_bool("--no-persistent", v); }},
        {"--state-dir", "CUBICLE_STATE_DIR", "DIR",
         "where persistent sandboxes are kept between servers (default: $STATE_DIRECTORY, /var/lib/cubicle for root, "
         "else $XDG_STATE_HOME/cubicle or ~/.local/state/cubicle)",
         [](Config& c, std::string_view v) {
             if (v.empty() || v.front() != '/') throw std::invalid_argument(fmt::format("--state-dir must be an absolute path, not '{}'", v));
             c.state_dir = v;
         }},
        {"--persist-copy-s", "CUBICLE_PERSIST_COPY_S", "N",
         "copy a running persistent sandbox's workspace to disk this often when its files changed (a host that loses "
         "power loses at most this much); 0: only when it stops (default 60)",
         [](Config& c, std::string_view v) { c.persist_copy_s = parse_number("--persist-copy-s", v, 0, 86400); }},
        {"--max-saved-sandboxes", "CUBICLE_MAX_SAVED_SANDBOXES", "N", "most saved persistent sandboxes per principal (the least recently used go)",
         [](Config& c, std::string_view v) { c.max_saved_sandboxes = parse_number("--max-saved-sandboxes", v, 1, 10000); }},
        {"--saved-ttl-days", "CUBICLE_SAVED_TTL_DAYS", "N", "days a saved sandbox is kept after its last use (0: until removed)",
         [](Config& c, std::string_view v) { c.saved_ttl_days = parse_number("--saved-ttl-days", v, 0, 36500); }},
        {"--max-saved-mb", "CUBICLE_MAX_SAVED_MB", "N",
         "most MiB of saved sandboxes and snapshots together per principal (the oldest go; 0: no limit)",
         [](Config& c, std::string_view v) { c.max_saved_mb = parse_number("--max-saved-mb", v, 0, 1 << 30); }},
        {"--max-snapshots", "CUBICLE_MAX_SNAPSHOTS", "N",
         "most snapshots per principal (the oldest go; they also expire with --saved-ttl-days, counted from their creation)",
         [](Config& c, std::string_view v) { c.max_snapshots = parse_number("--max-snapshots", v, 1, 10000); }},
        {"--executor", "CUBICLE_EXECUTOR", "KIND",
         "agent (default; falls back to exec where the agent cannot run) or exec",
         [](Config& c, std::string_view v) {
             if (v != "agent" && v != "exec") throw std::invalid_argument(fmt::format("--executor must be agent or exec, not '{}'", v));
             c.executor = v;
         }},
        {"--agent-channel", "CUBICLE_AGENT_CHANNEL", "KIND",
         "socket (default: the agent speaks over a unix socket mounted into its container, where the engine is local "
         "and can mount it), attach (over Docker's attach stream, relayed by the engine) or tcp (the agent dials the "
         "server over TLS, from a network on which nothing else answers; see --agent-listen)",
         [](Config& c, std::string_view v) {
             if (v != "socket" && v != "attach" && v != "tcp")
                 throw std::invalid_argument(fmt::format("--agent-channel must be socket, attach or tcp, not '{}'", v));
             c.agent_channel = v;
         }},
        {"--agent-listen", "CUBICLE_AGENT_LISTEN", "ADDRESS:PORT",
         "with --agent-channel tcp, where the server takes its agents' TLS connections: 0.0.0.0:PORT or [::]:PORT, "
         "every address (default: the gateway of its agent network, a free port; the relay dials that gateway in "
         "either case, the one address its internal network reaches)",
         [](Config& c, std::string_view v) {
             auto colon = v.rfind(':');
             auto host = colon == std::string_view::npos ? std::string_view() : v.substr(0, colon);
             if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
             unsigned char address[16];
             if (host.empty() || (::inet_pton(AF_INET, std::string(host).c_str(), address) != 1 &&
                                  ::inet_pton(AF_INET6, std::string(host).c_str(), address) != 1))
                 throw std::invalid_argument(fmt::format("--agent-listen must be IP-ADDRESS:PORT, not '{}'", v));
             // A local relay's network is internal: no route but to its gateway, so another address
             // would never see an agent. With --engine swarm the relays run on other nodes and
             // dial this address (checked after parsing, when the engine is known).
             parse_number("--agent-listen's port", v.substr(colon + 1), 0, 65535);
             c.agent_listen = v;
         }},
        {"--engine", "CUBICLE_ENGINE", "KIND",
         "local (default: each sandbox is a container of the engine at --docker-host) or swarm (--docker-host is a "
         "Swarm manager; each sandbox is a service of one task on a node Swarm chooses, its agent dialing home: "
         "needs --agent-channel tcp and --agent-listen ADDRESS:PORT that the nodes reach; docs/engines.md)",
         [](Config& c, std::string_view v) {
             if (v != "local" && v != "swarm") throw std::invalid_argument(fmt::format("--engine must be local or swarm, not '{}'", v));
             c.engine = v;
         }},
        {"--swarm-constraint", "CUBICLE_SWARM_CONSTRAINTS", "EXPR",
         "with --engine swarm, a placement constraint every sandbox's service carries, written as Swarm's "
         "placement constraints are, e.g. node.labels.sandboxes==yes (repeatable; variable: EXPR;EXPR)",
         [](Config& c, std::string_view v) {
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(';', start), v.size());
                 auto expr = v.substr(start, end - start);
                 if (!expr.empty()) {
                     if (expr.find("==") == std::string_view::npos && expr.find("!=") == std::string_view::npos)
                         throw std::invalid_argument(
                             fmt::format("--swarm-constraint must be KEY==VALUE or KEY!=VALUE, not '{}'", expr));
                     c.swarm_constraints.emplace_back(expr);
                 }
                 start = end + 1;
             }
         }},
        {"--pool-size", "CUBICLE_POOL_SIZE", "N", "warm sandboxes kept ready (0: none)",
         [](Config& c, std::string_view v) { c.pool_size = parse_number("--pool-size", v, 0, 1000); }},
        {"--pool-max", "CUBICLE_POOL_MAX", "N", "most warm sandboxes kept under sustained demand (at least --pool-size)",
         [](Config& c, std::string_view v) { c.pool_max = parse_number("--pool-max", v, 0, 1000); }},
        {"--no-recycle", "CUBICLE_NO_RECYCLE", "", "remove every throwaway sandbox after its run instead of resetting it for reuse",
         [](Config& c, std::string_view v) { c.no_recycle = parse_bool("--no-recycle", v); }},
        {"--pool-refill", "CUBICLE_POOL_REFILL", "N", "warm sandboxes started at once when refilling",
         [](Config& c, std::string_view v) { c.pool_refill = parse_number("--pool-refill", v, 1, 64); }},
        {"--pool-idle-s", "CUBICLE_POOL_IDLE_S", "N", "empty the pool after this long unused",
         [](Config& c, std::string_view v) { c.pool_idle_s = parse_number("--pool-idle-s", v, 1, 86400 * 7); }},
        {"--zygote-preload", "CUBICLE_ZYGOTE_PRELOAD", "MODULE[,MODULE...]",
         "Python modules each warm sandbox's zygote imports ahead of fresh runs (they then start with them imported; each "
         "costs memory in every warm sandbox), or none (default: numpy)",
         [](Config& c, std::string_view v) { c.zygote_preload = parse_module_list("--zygote-preload", v); }},
        {"--idle-pause-s", "CUBICLE_IDLE_PAUSE_S", "N",
         "pause a sandbox of initialize_sandbox with nothing running after this long without a call (the Engine's "
         "cgroup freezer; its next call resumes it); 0: never (default 60)",
         [](Config& c, std::string_view v) { c.idle_pause_s = parse_number("--idle-pause-s", v, 0, 86400 * 7); }},
        {"--max-ttl-s", "CUBICLE_MAX_TTL_S", "N", "the longest ttl_s a client may give initialize_sandbox (default 86400)",
         [](Config& c, std::string_view v) { c.max_ttl_s = parse_number("--max-ttl-s", v, 1, 86400 * 365); }},
        {"--default-ttl-s", "CUBICLE_DEFAULT_TTL_S", "N",
         "the ttl_s of a sandbox that asks for none: it is stopped after this long without a call; 0: never (default)",
         [](Config& c, std::string_view v) { c.default_ttl_s = parse_number("--default-ttl-s", v, 0, 86400 * 365); }},
        {"--tools", "CUBICLE_TOOLS", "GROUP[,GROUP...]",
         fmt::format("the tool groups to list: {} (default: run, files and runs; host too with --allow-host-dir, packages with "
                     "--allow-network)",
                     tools::group_names()),
         [](Config& c, std::string_view v) {
             c.tool_groups.clear();
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(',', start), v.size());
                 auto name = v.substr(start, end - start);
                 if (!tools::is_group_name(name)) {
                     throw std::invalid_argument(fmt::format("--tools: '{}' is not a tool group; the groups are {}", name, tools::group_names()));
                 }
                 c.tool_groups.emplace_back(name);
                 start = end + 1;
             }
         }},
        {"--log-level", "CUBICLE_LOG_LEVEL", "LEVEL", "debug, info, warning or error (to stderr)",
         [](Config& c, std::string_view v) {
             if (v != "debug" && v != "info" && v != "warning" && v != "error")
                 throw std::invalid_argument(fmt::format("--log-level must be debug, info, warning or error, not '{}'", v));
             c.log_level = v;
         }},
        {"--transport", "CUBICLE_TRANSPORT", "KIND", "stdio (default) or http (streamable HTTP)",
         [](Config& c, std::string_view v) {
             if (v != "stdio" && v != "http") throw std::invalid_argument(fmt::format("--transport must be stdio or http, not '{}'", v));
             c.transport = v;
         }},
        {"--host", "CUBICLE_HOST", "ADDRESS", "HTTP: address to listen on (a non-loopback one needs authentication)",
         [](Config& c, std::string_view v) { c.host = v; }},
        {"--port", "CUBICLE_PORT", "N", "HTTP: port to listen on (0: any free one)",
         [](Config& c, std::string_view v) { c.port = parse_number("--port", v, 0, 65535); }},
        {"--http-path", "CUBICLE_HTTP_PATH", "PATH", "HTTP: the MCP endpoint's path",
         [](Config& c, std::string_view v) {
             if (v.empty() || v.front() != '/') throw std::invalid_argument(fmt::format("--http-path must start with /, not '{}'", v));
             c.http_path = v;
         }},
        {"--auth-tokens", "CUBICLE_AUTH_TOKENS", "FILE",
         "HTTP: bearer tokens, one 'principal token' line each (re-read on SIGHUP)",
         [](Config& c, std::string_view v) { c.auth_tokens = v; }},
        {"--jwks-file", "CUBICLE_JWKS_FILE", "FILE",
         "HTTP: accept OAuth 2.1 access tokens (JWT, RS256/ES256) signed by a key of this JWK set (re-read on SIGHUP)",
         [](Config& c, std::string_view v) { c.jwks_file = v; }},
        {"--jwt-issuer", "CUBICLE_JWT_ISSUER", "URL", "HTTP: the authorization server that issues the access tokens (iss)",
         [](Config& c, std::string_view v) { c.jwt_issuer = v; }},
        {"--jwt-audience", "CUBICLE_JWT_AUDIENCE", "URI", "HTTP: this server's resource URI, required in a token's aud",
         [](Config& c, std::string_view v) { c.jwt_audience = v; }},
        {"--insecure-no-auth", "CUBICLE_INSECURE_NO_AUTH", "",
         "HTTP: serve a non-loopback address without authentication (behind an authenticating proxy only)",
         [](Config& c, std::string_view v) { c.insecure_no_auth = parse_bool("--insecure-no-auth", v); }},
        {"--allow-origin", "CUBICLE_ALLOW_ORIGINS", "ORIGIN",
         "HTTP: a browser Origin allowed besides the server's own (repeatable; variable: comma-separated)",
         [](Config& c, std::string_view v) {
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(',', start), v.size());
                 if (end > start) c.allow_origins.emplace_back(v.substr(start, end - start));
                 start = end + 1;
             }
         }},
        {"--allow-host", "CUBICLE_ALLOW_HOSTS", "NAME",
         "HTTP: a Host name clients may use besides the bound address (repeatable; variable: comma-separated)",
         [](Config& c, std::string_view v) {
             for (std::size_t start = 0; start <= v.size();) {
                 auto end = std::min(v.find(',', start), v.size());
                 if (end > start) c.allow_hosts.emplace_back(v.substr(start, end - start));
                 start = end + 1;
             }
         }},
        {"--tls-cert", "CUBICLE_TLS_CERT", "FILE", "HTTP: serve HTTPS with this PEM certificate chain",
         [](Config& c, std::string_view v) { c.tls_cert = v; }},
        {"--tls-key", "CUBICLE_TLS_KEY", "FILE", "HTTP: the PEM private key of --tls-cert",
         [](Config& c, std::string_view v) { c.tls_key = v; }},
        {"--http-max-connections", "CUBICLE_HTTP_MAX_CONNECTIONS", "N", "HTTP: open connections at most (then 503)",
         [](Config& c, std::string_view v) { c.http_max_connections = parse_number("--http-max-connections", v, 1, 1000000); }},
        {"--http-max-body-mb", "CUBICLE_HTTP_MAX_BODY_MB", "N", "HTTP: largest request body in MiB (then 413)",
         [](Config& c, std::string_view v) { c.http_max_body_mb = parse_number("--http-max-body-mb", v, 1, 4096); }},
        {"--http-session-idle-s", "CUBICLE_HTTP_SESSION_IDLE_S", "N", "HTTP: an MCP session unused this long ends (then 404)",
         [](Config& c, std::string_view v) { c.http_session_idle_s = parse_number("--http-session-idle-s", v, 1, 86400 * 7); }},
        {"--http-header-timeout-s", "CUBICLE_HTTP_HEADER_TIMEOUT_S", "N", "HTTP: a request's header must arrive within this time",
         [](Config& c, std::string_view v) { c.http_header_timeout_s = parse_number("--http-header-timeout-s", v, 1, 3600); }},
        {"--drain-s", "CUBICLE_DRAIN_S", "N", "HTTP: on SIGTERM, running calls get this long to finish before they are cancelled",
         [](Config& c, std::string_view v) { c.drain_s = parse_number("--drain-s", v, 0, 3600); }},
        {"--client-max-sandboxes", "CUBICLE_CLIENT_MAX_SANDBOXES", "N", "HTTP: live sandboxes per client (principal)",
         [](Config& c, std::string_view v) { c.client_max_sandboxes = parse_number("--client-max-sandboxes", v, 1, 10000); }},
        {"--client-max-executions", "CUBICLE_CLIENT_MAX_EXECUTIONS", "N", "HTTP: concurrent executions per client",
         [](Config& c, std::string_view v) { c.client_max_executions = parse_number("--client-max-executions", v, 1, 10000); }},
        {"--client-calls-per-minute", "CUBICLE_CLIENT_CALLS_PER_MINUTE", "N", "HTTP: tool calls per minute per client",
         [](Config& c, std::string_view v) { c.client_calls_per_minute = parse_number("--client-calls-per-minute", v, 1, 10000000); }},
    };
    return table;
}

} // namespace

ParsedArgs parse_args(int argc, char** argv) {
    ParsedArgs parsed;
    for (const auto& option : options()) {
        if (const char* value = std::getenv(std::string(option.env).c_str()); value && *value) {
            try {
                option.apply(parsed.config, value);
            } catch (const std::invalid_argument& e) {
                // The user set a variable, not a flag: name what they set.
                std::string message = e.what();
                if (auto at = message.find(option.flag); at != std::string::npos) message.replace(at, option.flag.size(), option.env);
                throw std::invalid_argument(fmt::format("{} (from the environment)", message));
            }
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
    auto& c = parsed.config;
    // An operator's default is never over their own ceiling: the ceiling moves up to it.
    c.max_timeout_s = std::max(c.max_timeout_s, c.timeout_s);
    c.max_pids_limit = std::max(c.max_pids_limit, c.pids_limit);
    c.max_tmp_size_mb = std::max(c.max_tmp_size_mb, c.tmp_size_mb);
    c.max_disk_mb = std::max(c.max_disk_mb, c.disk_mb);
    c.max_files_limit = std::max(c.max_files_limit, c.files_limit);
    c.max_ttl_s = std::max(c.max_ttl_s, c.default_ttl_s);
    if (!c.agent_listen.empty()) {
        auto host = std::string_view(c.agent_listen).substr(0, c.agent_listen.rfind(':'));
        bool anywhere = host == "0.0.0.0" || host == "[::]";
        if (c.engine != "swarm" && !anywhere)
            throw std::invalid_argument(fmt::format(
                "--agent-listen takes 0.0.0.0:PORT or [::]:PORT, not '{}': the relay reaches the server only at its "
                "agent network's gateway, which the server listens on by default",
                c.agent_listen));
        if (c.engine == "swarm" && anywhere)
            throw std::invalid_argument(fmt::format(
                "with --engine swarm, --agent-listen names the address the nodes' relays dial, not '{}'", c.agent_listen));
    }
    if (c.engine == "swarm") {
        // Another node's task has no socket of this host and no attach stream through the manager.
        if (c.agent_channel != "tcp") throw std::invalid_argument("--engine swarm needs --agent-channel tcp: its agents dial home");
        if (c.agent_listen.empty())
            throw std::invalid_argument("--engine swarm needs --agent-listen ADDRESS:PORT, an address of this host the nodes reach");
        if (c.executor != "agent") throw std::invalid_argument("--engine swarm needs --executor agent: Docker exec reaches no other node");
    } else if (!c.swarm_constraints.empty()) {
        throw std::invalid_argument("--swarm-constraint needs --engine swarm");
    }
    return parsed;
}

int Config::memory_ceiling_mb() const {
    int ceiling = max_memory_mb > 0 ? max_memory_mb : static_cast<int>(std::min<long long>(physical_memory_mb() / 2, 1 << 24));
    return std::max(ceiling, memory_mb);
}

double Config::cpu_ceiling() const {
    double ceiling = max_cpus > 0 ? max_cpus : static_cast<double>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
    return std::max(ceiling, cpus);
}

bool option_takes_value(std::string_view flag) {
    for (const auto& option : options()) {
        if (option.flag == flag) return !option.value_name.empty();
    }
    return false;
}

std::string usage() {
    std::string out = "cubicle " CUBICLE_VERSION " - an MCP server that runs code in locked-down Docker sandboxes\n\n"
                      "usage: cubicle [options]\n";
    for (const auto& command : cli::subcommands) out += fmt::format("       cubicle {} {}\n", command.name, command.synopsis);
    out += "\nWithout a command it speaks MCP (JSON-RPC 2.0, one message per line) on stdin/stdout, or\n"
           "streamable HTTP with --transport http; logs go to stderr.\n\n"
           "commands:\n";
    for (const auto& command : cli::subcommands) {
        out += fmt::format("  {:<26} {}\n", fmt::format("{} {}", command.name, command.synopsis), command.summary);
    }
    out += "\noptions (each also read from the environment variable shown):\n";
    for (const auto& option : options()) {
        auto left = fmt::format("{} {}", option.flag, option.value_name);
        out += fmt::format("  {:<26} {} [{}]\n", left, option.help, option.env);
    }
    out += fmt::format("  {:<26} {}\n  {:<26} {}\n", "-h, --help", "show this help", "-V, --version", "show the version");
    return out;
}

std::vector<OptionDoc> option_docs() {
    std::vector<OptionDoc> docs;
    for (const auto& option : options()) docs.push_back({option.flag, option.env, option.value_name, option.help});
    return docs;
}

} // namespace cubicle
