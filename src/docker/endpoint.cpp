#include "docker/endpoint.hpp"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include <pwd.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/file_text.hpp"
#include "common/hex.hpp"
#include "common/json.hpp"
#include "config.hpp"

namespace cubicle::docker {
namespace {

namespace fs = std::filesystem;

bool all_digits(std::string_view text) {
    if (text.empty()) return false;
    for (char c : text) {
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    }
    return true;
}

// host[:port], the host possibly a bracketed IPv6 address.
void split_host_port(std::string_view rest, Endpoint& endpoint, std::string_view url, std::string_view origin) {
    std::string_view host = rest, port;
    if (rest.starts_with('[')) {
        auto close = rest.find(']');
        if (close == rest.npos) throw std::invalid_argument(fmt::format("{} '{}': unclosed '[' in the host", origin, url));
        host = rest.substr(1, close - 1);
        auto after = rest.substr(close + 1);
        if (!after.empty() && !after.starts_with(':')) throw std::invalid_argument(fmt::format("{} '{}': junk after the host", origin, url));
        if (!after.empty()) port = after.substr(1);
    } else if (auto colon = rest.rfind(':'); colon != rest.npos) {
        host = rest.substr(0, colon);
        port = rest.substr(colon + 1);
        if (port.empty()) throw std::invalid_argument(fmt::format("{} '{}' has an empty port", origin, url));
    }
    if (host.empty()) throw std::invalid_argument(fmt::format("{} '{}' needs a host", origin, url));
    if (!port.empty() && (!all_digits(port) || std::stoul(std::string(port)) == 0 || std::stoul(std::string(port)) > 65535)) {
        throw std::invalid_argument(fmt::format("{} '{}': the port must be a number from 1 to 65535", origin, url));
    }
    endpoint.host = host;
    endpoint.port = port;
}

bool is_file(const fs::path& path) {
    std::error_code ec;
    return fs::is_regular_file(path, ec);
}

std::string home_directory() {
    if (const char* home = std::getenv("HOME"); home && *home) return home;
    if (const passwd* entry = ::getpwuid(::getuid()); entry && entry->pw_dir) return entry->pw_dir;
    return "/";
}

// TLS files of the default context: DOCKER_CERT_PATH (or the docker config dir).
void apply_tls_settings(Endpoint& endpoint, const EndpointSettings& settings) {
    if (endpoint.kind != Endpoint::Kind::tcp || !(settings.tls || settings.tls_verify)) return;
    fs::path dir = settings.cert_path.empty() ? fs::path(settings.config_dir) : fs::path(settings.cert_path);
    std::string_view dir_origin = settings.cert_path.empty() ? "the docker config directory (DOCKER_CONFIG)" : "DOCKER_CERT_PATH";
    endpoint.tls.enabled = true;
    endpoint.tls.verify = settings.tls_verify;
    if (is_file(dir / "ca.pem")) endpoint.tls.ca = dir / "ca.pem";
    bool cert = is_file(dir / "cert.pem"), key = is_file(dir / "key.pem");
    if (cert != key) {
        throw std::invalid_argument(fmt::format("{} ({}) has {} but not {}: a client certificate needs both", dir_origin, dir.string(),
                                                cert ? "cert.pem" : "key.pem", cert ? "key.pem" : "cert.pem"));
    }
    if (cert) {
        endpoint.tls.cert = dir / "cert.pem";
        endpoint.tls.key = dir / "key.pem";
    }
}

Endpoint from_context(std::string_view name, std::string_view name_origin, const EndpointSettings& settings) {
    fs::path root = fs::path(settings.config_dir) / "contexts";
    auto id = context_id(name);
    auto meta_path = root / "meta" / id / "meta.json";
    std::string what = fmt::format("docker context '{}' (from {})", name, name_origin);
    if (!is_file(meta_path)) {
        throw std::invalid_argument(fmt::format("{} does not exist: no {} (docker context ls lists the contexts)", what, meta_path.string()));
    }
    json::Document doc;
    std::string_view host;
    bool skip_verify = false;
    if (auto error = doc.parse(file_text(meta_path))) {
        throw std::invalid_argument(fmt::format("{}: {} is not valid JSON: {}", what, meta_path.string(), *error));
    }
    auto docker = doc.root()["Endpoints"]["docker"];
    if (docker["Host"].get(host) != simdjson::SUCCESS || host.empty()) {
        throw std::invalid_argument(fmt::format("{}: {} has no Endpoints.docker.Host", what, meta_path.string()));
    }
    if (docker["SkipTLSVerify"].get(skip_verify) != simdjson::SUCCESS) skip_verify = false;
    auto tls_dir = root / "tls" / id / "docker";
    bool ca = is_file(tls_dir / "ca.pem"), cert = is_file(tls_dir / "cert.pem"), key = is_file(tls_dir / "key.pem");
    // As for the docker CLI: TLS when the context holds TLS material or skips verification.
    bool tls = ca || cert || key || skip_verify;
    auto endpoint = parse_docker_host(host, what, tls ? "2376" : "2375");
    endpoint.context = name;
    endpoint.source = fmt::format("context '{}' (from {})", name, name_origin);
    if (endpoint.kind == Endpoint::Kind::tcp && tls) {
        endpoint.tls.enabled = true;
        endpoint.tls.verify = !skip_verify;
        if (ca) endpoint.tls.ca = tls_dir / "ca.pem";
        if (cert != key) throw std::invalid_argument(fmt::format("{}: {} holds only one of cert.pem and key.pem", what, tls_dir.string()));
        if (cert) {
            endpoint.tls.cert = tls_dir / "cert.pem";
            endpoint.tls.key = tls_dir / "key.pem";
        }
    }
    return endpoint;
}

} // namespace

std::string context_id(std::string_view name) { return sha256_hex(name); }

std::string Endpoint::describe() const {
    auto host_port = [this] {
        auto h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
        return port.empty() ? h : h + ":" + port;
    };
    switch (kind) {
    case Kind::unix_socket: return "unix://" + path;
    case Kind::tcp: return "tcp://" + host_port();
    case Kind::ssh: return "ssh://" + (user.empty() ? "" : user + "@") + host_port();
    }
    return {};
}

std::string Endpoint::kind_name() const {
    switch (kind) {
    case Kind::unix_socket: return "unix";
    case Kind::tcp: return tls.enabled ? (tls.verify ? "tcp+tls" : "tcp+tls (server certificate not verified)") : "tcp";
    case Kind::ssh: return "ssh";
    }
    return {};
}

Endpoint parse_docker_host(std::string_view url, std::string_view origin, std::string_view default_tcp_port) {
    Endpoint endpoint;
    if (url.empty()) {
        endpoint.path = "/var/run/docker.sock";
        return endpoint;
    }
    if (url.starts_with("unix://")) {
        endpoint.path = std::string(url.substr(7));
        if (endpoint.path.empty()) throw std::invalid_argument(fmt::format("{} '{}': unix:// needs a socket path", origin, url));
        return endpoint;
    }
    if (url.starts_with("tcp://")) {
        auto rest = url.substr(6);
        if (auto slash = rest.find('/'); slash != rest.npos) rest = rest.substr(0, slash);
        endpoint.kind = Endpoint::Kind::tcp;
        split_host_port(rest, endpoint, url, origin);
        if (endpoint.port.empty()) endpoint.port = default_tcp_port;
        return endpoint;
    }
    if (url.starts_with("ssh://")) {
        auto rest = url.substr(6);
        if (auto slash = rest.find('/'); slash != rest.npos && slash + 1 < rest.size()) {
            throw std::invalid_argument(fmt::format("{} '{}': an ssh:// URL takes no path", origin, url));
        } else if (slash != rest.npos) {
            rest = rest.substr(0, slash);
        }
        endpoint.kind = Endpoint::Kind::ssh;
        if (auto at = rest.rfind('@'); at != rest.npos) {
            endpoint.user = rest.substr(0, at);
            rest = rest.substr(at + 1);
            if (endpoint.user.empty()) throw std::invalid_argument(fmt::format("{} '{}': empty user before '@'", origin, url));
        }
        split_host_port(rest, endpoint, url, origin);
        // Never let a host or user be read as an ssh option.
        if (endpoint.host.starts_with('-') || endpoint.user.starts_with('-')) {
            throw std::invalid_argument(fmt::format("{} '{}': a host or user may not start with '-'", origin, url));
        }
        return endpoint;
    }
    throw std::invalid_argument(fmt::format("unsupported {} '{}': use unix:///path/to/docker.sock, tcp://host:port or ssh://[user@]host[:port]",
                                            origin, url));
}

Endpoint resolve_endpoint(const EndpointSettings& settings) {
    Endpoint endpoint;
    if (!settings.docker_host.empty()) {
        endpoint = parse_docker_host(settings.docker_host, settings.docker_host_origin, settings.tls || settings.tls_verify ? "2376" : "2375");
        endpoint.source = settings.docker_host_origin;
        apply_tls_settings(endpoint, settings);
    } else {
        std::string name = settings.context, origin = "DOCKER_CONTEXT";
        if (name.empty()) {
            auto config_file = fs::path(settings.config_dir) / "config.json";
            if (is_file(config_file)) {
                json::Document doc;
                if (auto error = doc.parse(file_text(config_file))) {
                    throw std::invalid_argument(fmt::format("{} is not valid JSON: {}", config_file.string(), *error));
                }
                std::string_view current;
                if (doc.root()["currentContext"].get(current) == simdjson::SUCCESS) name = current;
                origin = fmt::format("currentContext in {}", config_file.string());
            }
        }
        if (!name.empty() && name != "default") endpoint = from_context(name, origin, settings);
        else endpoint = parse_docker_host("");
    }
    endpoint.ssh_config = settings.ssh_config;
    return endpoint;
}

EndpointSettings endpoint_settings(const Config& config) {
    EndpointSettings settings;
    settings.docker_host = config.docker_host;
    const char* env_host = std::getenv("DOCKER_HOST");
    settings.docker_host_origin = env_host && config.docker_host == env_host ? "DOCKER_HOST" : "--docker-host";
    settings.tls = config.docker_tls;
    settings.tls_verify = config.docker_tls_verify;
    settings.cert_path = config.docker_cert_path;
    settings.ssh_config = config.docker_ssh_config;
    if (const char* context = std::getenv("DOCKER_CONTEXT")) settings.context = context;
    const char* dir = std::getenv("DOCKER_CONFIG");
    settings.config_dir = dir && *dir ? std::string(dir) : home_directory() + "/.docker";
    return settings;
}

} // namespace cubicle::docker
