// Where the Docker Engine listens and how to reach it, resolved as the docker CLI
// does: --docker-host > DOCKER_HOST > DOCKER_CONTEXT > currentContext in
// config.json > unix:///var/run/docker.sock. No I/O beyond reading the docker
// CLI's own files; connecting is docker/transport's job.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace cubicle {
struct Config;
}

namespace cubicle::docker {

struct Endpoint {
    enum class Kind { unix_socket, tcp, ssh } kind = Kind::unix_socket;
    std::string path;  // unix socket path
    std::string host;  // tcp or ssh host
    std::string port;  // tcp or ssh port (ssh: empty for the ssh config's)
    std::string user;  // ssh user (empty for the ssh config's)

    // TLS on tcp://: the client certificate is sent when cert and key are set.
    struct Tls {
        bool enabled = false;
        bool verify = false;  // check the server's certificate against `ca` and its name
        std::string ca, cert, key;  // PEM files
    } tls;

    // Where the endpoint came from, for doctor and errors: "--docker-host",
    // "DOCKER_HOST", "context 'x' (from DOCKER_CONTEXT)", "the default".
    std::string source = "the default";
    std::string context;  // the docker context's name, if one chose it
    std::string ssh_config;  // ssh -F FILE (empty: the user's own ~/.ssh/config)

    // The URL as the docker CLI writes it, e.g. tcp://host:2376.
    std::string describe() const;
    // "unix", "tcp", "tcp+tls" or "ssh".
    std::string kind_name() const;
};

// Parses a DOCKER_HOST-style URL: unix:///path, tcp://host[:port], ssh://[user@]host[:port].
// `origin` names where it came from in errors. Throws std::invalid_argument.
// tcp:// without a port gets `default_tcp_port` (2376 is Docker's port for TLS).
Endpoint parse_docker_host(std::string_view docker_host, std::string_view origin = "DOCKER_HOST", std::string_view default_tcp_port = "2375");

// What decides the endpoint, gathered from options and the environment.
struct EndpointSettings {
    std::string docker_host;         // --docker-host or DOCKER_HOST (config)
    std::string docker_host_origin;  // "--docker-host" or "DOCKER_HOST"
    bool tls = false;                // --docker-tls / DOCKER_TLS
    bool tls_verify = false;         // --docker-tls-verify / DOCKER_TLS_VERIFY
    std::string cert_path;           // --docker-cert-path / DOCKER_CERT_PATH (empty: the config dir)
    std::string context;             // DOCKER_CONTEXT
    std::string config_dir;          // DOCKER_CONFIG, else ~/.docker
    std::string ssh_config;          // --docker-ssh-config
};

// Reads the settings from the server's options and the environment.
EndpointSettings endpoint_settings(const Config& config);

// Resolves the endpoint with the docker CLI's precedence. Throws std::invalid_argument
// naming the variable, option, context or file at fault.
Endpoint resolve_endpoint(const EndpointSettings& settings);

// The docker CLI's directory for a context's files: sha256 of the name, in hex.
std::string context_id(std::string_view name);

} // namespace cubicle::docker
