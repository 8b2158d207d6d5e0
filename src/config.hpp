// Server settings: the one place that knows option names, variables and defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubicle {

struct Config {
    std::string default_image = CUBICLE_DEFAULT_IMAGE_NAME;
    std::string docker_host;  // empty: DOCKER_HOST, then the docker context, then the local socket
    bool docker_tls = false;         // TLS to a tcp:// endpoint
    bool docker_tls_verify = false;  // TLS, checking the daemon's certificate
    std::string docker_cert_path;    // ca.pem, cert.pem, key.pem (empty: the docker config directory)
    std::string docker_ssh_config;   // ssh -F for ssh:// endpoints (empty: the user's ~/.ssh/config)
    int docker_timeout_s = 30;  // per step of an Engine request; a stalled daemon fails calls instead of hanging them
    std::string runtime;        // OCI runtime for sandboxes (runsc: gVisor); empty: the engine's default
    int memory_mb = 512;
    double cpus = 1.0;
    int timeout_s = 30;
    int max_timeout_s = 300;
    int max_sandboxes = 32;
    int pids_limit = 256;
    int tmp_size_mb = 256;
    // Ceilings on what a client may ask for; /tmp is a tmpfs, so it is memory too.
    int max_memory_mb = 0;   // 0: half of this machine's memory (memory_ceiling_mb)
    double max_cpus = 0;     // 0: this machine's CPU count (cpu_ceiling)
    int max_pids_limit = 4096;
    int max_tmp_size_mb = 4096;
    // The workspace is a size- and inode-capped tmpfs volume, so it is memory as well:
    // a sandbox's hard memory ceiling holds it beside memory_mb (sandbox::memory_limits).
    int disk_mb = 1024;
    int files_limit = 100000;
    int max_disk_mb = 8192;
    int max_files_limit = 1000000;
    std::uint64_t max_output_bytes = 64 << 20;  // per stream and execution, saved in the sandbox
    std::uint64_t result_budget = 16 << 10;     // bytes of output a result may carry, as sent (escaped JSON)
    std::uint64_t progress_max_bytes = 256 << 10;  // output sent as progress per call
    int max_background_s = 3600;                // longest timeout_s of a background run
    bool allow_network = false;
    std::vector<std::string> allow_host_dirs;  // host directories open to upload/download
    int max_transfer_mb = 256;                 // per upload, download or file read/write
    int max_transfer_entries = 10000;          // files and directories per transfer
    int max_exposed_ports = 8;                 // expose_port listeners per sandbox
    int max_checkpoints = 8;                   // checkpoint_session's parked copies per sandbox
    // expose_port also listens on the host's 127.0.0.1 over HTTP (any local user reaches those);
    // over stdio that listener is the only way, so it is always there.
    bool preview_listeners = false;
    std::string secrets_file;  // --secrets: the operator's secrets (sandbox/secrets.hpp); empty: none
    std::string test_upstream_ca;  // tests only: a CA the proxy also trusts for the secrets' hosts
    std::vector<std::string> egress_allow;  // HOST[:PORT] networked sandboxes may reach; empty: any public address
    // What happens when a networked sandbox tries a host the allowlist refuses: "ask" the
    // user through MCP elicitation, or "off" (refused). Empty: ask on stdio, off on HTTP.
    std::string egress_approval;
    int egress_approval_timeout_s = 60;  // how long a connection waits for the user's answer
    bool egress_asks() const { return egress_approval.empty() ? transport == "stdio" : egress_approval == "ask"; }
    int max_egress_networks = 16;  // internal networks, one per principal with networked sandboxes (each a subnet of the Engine's pools)
    // Persistent sandboxes (store/): where they are kept and for how long.
    bool no_persistent = false;  // persistent sandboxes refused (docs/persistence.md)
    std::string state_dir;  // empty: store::default_state_dir()
    int persist_copy_s = 60;       // a running persistent workspace copied to disk this often when changed (0: at stops only)
    int max_saved_sandboxes = 10;  // per principal
    int saved_ttl_days = 7;        // counted from last use (0: kept until removed)
    int max_saved_mb = 0;          // per principal, saved workspaces and snapshots (0: no limit)
    int max_snapshots = 20;        // per principal (snapshot_sandbox; the oldest go)
    std::string executor = "agent";  // or "exec": Docker exec instead of the in-sandbox agent
    std::string agent_channel = "socket";  // or "attach": the agent's frames over Docker's attach stream;
                                           // or "tcp": the agent dials home over TLS (sandbox/dial_home.hpp)
    // --agent-listen 0.0.0.0:PORT or [::]:PORT, where the server takes agents' TLS connections
    // with --agent-channel tcp; empty: the gateway of the server's agent network, any port.
    std::string agent_listen;
    // Where sandboxes run (sandbox/placement.hpp): "local", containers of the engine at
    // docker_host; or "swarm", services of the Swarm that docker_host manages.
    std::string engine = "local";
    std::vector<std::string> swarm_constraints;  // --swarm-constraint, on every sandbox's service
    int pool_size = 2;          // warm sandboxes kept ready for the default profile (the floor)
    int pool_max = 16;          // the most the pool grows to under demand
    bool no_recycle = false;    // remove throwaway sandboxes instead of resetting them for reuse
    int pool_refill = 1;        // how many of them start at once
    int pool_idle_s = 300;      // the pool empties after this long without use
    // The modules the Python zygote imports ahead of fresh runs (--zygote-preload);
    // nullopt: the language table's default, empty: none.
    std::optional<std::vector<std::string>> zygote_preload;
    int idle_pause_s = 60;      // a client's sandbox idle this long is paused (0: never)
    int max_ttl_s = 86400;      // the longest ttl_s initialize_sandbox may ask for
    int default_ttl_s = 0;      // the ttl_s of a sandbox that asks for none (0: it never expires)
    std::string log_level = "info";
    std::vector<std::string> tool_groups;  // --tools: the tool groups listed (or "all"); empty: the default set

    // Streamable HTTP (--transport http).
    std::string transport = "stdio";  // or "http"
    std::string host = "127.0.0.1";
    int port = 8080;
    std::string http_path = "/mcp";
    std::string auth_tokens;  // file of "principal token" lines
    std::string jwks_file;    // OAuth 2.1 access tokens (JWT) signed by these keys
    std::string jwt_issuer;
    std::string jwt_audience;
    bool insecure_no_auth = false;
    std::vector<std::string> allow_origins;
    std::vector<std::string> allow_hosts;
    std::string tls_cert;
    std::string tls_key;
    int http_max_connections = 4096;
    int http_max_body_mb = 64;
    int http_session_idle_s = 3600;
    int http_header_timeout_s = 10;
    int drain_s = 10;
    // Per principal (client), over HTTP.
    int client_max_sandboxes = 16;
    int client_max_executions = 16;
    int client_calls_per_minute = 1200;

    // The ceilings in force: never under the operator's own defaults.
    int memory_ceiling_mb() const;
    double cpu_ceiling() const;
};

struct ParsedArgs {
    Config config;
    bool show_help = false;
    bool show_version = false;
};

// Reads CUBICLE_* variables, then flags (flags win). Throws std::invalid_argument
// with a message naming the bad option.
ParsedArgs parse_args(int argc, char** argv);

std::string usage();

// Whether `flag` is an option of the table that takes a value (the next argument).
bool option_takes_value(std::string_view flag);

// One row of the option table as documentation sees it: --help, the man page,
// the shell completions and server.json are all generated from these rows.
struct OptionDoc {
    std::string_view flag;        // --flag
    std::string_view env;         // the variable read when the flag is absent
    std::string_view value_name;  // empty for a switch
    std::string_view help;
};
std::vector<OptionDoc> option_docs();

} // namespace cubicle
