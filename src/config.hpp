// Server settings: the one place that knows option names, variables and defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cubicle {

struct Config {
    std::string default_image = "cubicle/sandbox:latest";
    std::string docker_host;  // empty: DOCKER_HOST or the local socket
    int memory_mb = 512;
    double cpus = 1.0;
    int timeout_s = 30;
    int max_timeout_s = 300;
    int max_sandboxes = 32;
    int pids_limit = 256;
    int tmp_size_mb = 256;
    std::uint64_t max_output_bytes = 1 << 20;  // per stream
    bool allow_network = false;
    std::vector<std::string> allow_host_dirs;  // host directories open to upload/download
    int max_transfer_mb = 256;                 // per upload, download or file read/write
    int max_transfer_entries = 10000;          // files and directories per transfer
    std::vector<std::string> egress_allow;  // HOST[:PORT] networked sandboxes may reach; empty: any public address
    std::string executor = "agent";  // or "exec": Docker exec instead of the in-sandbox agent
    int pool_size = 2;          // warm sandboxes kept ready for the default profile
    int pool_refill = 1;        // how many of them start at once
    int pool_idle_s = 300;      // the pool empties after this long without use
    std::string log_level = "info";
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

} // namespace cubicle
