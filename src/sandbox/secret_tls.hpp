// TLS for secrets (secrets.hpp): each sandbox that holds secrets gets a certificate
// authority of its own, which its programs trust and with which the egress proxy signs
// the certificates of the secrets' hosts (src/agent/proxy_tls.h); the proxy verifies
// those hosts against the certificates this machine trusts.
#pragma once

#include <string>
#include <vector>

namespace cubicle::sandbox {

struct SandboxCa {
    std::string cert_pem;  // goes into the sandbox
    std::string key_pem;   // goes to the proxy only
};

// A new CA (EC P-256, valid 30 days) named after `sandbox_id`; throws std::runtime_error.
SandboxCa make_sandbox_ca(const std::string& sandbox_id);

// The certificates (PEM, one each) the proxy verifies the secrets' hosts against: this
// machine's trust store (OpenSSL's default file and directory, or $SSL_CERT_FILE and
// $SSL_CERT_DIR) and, when given, those of `extra_file` (--test-upstream-ca: tests only).
// Throws std::invalid_argument for an extra file that cannot be read or holds no
// certificate, and when there is no certificate at all.
std::vector<std::string> upstream_trust(const std::string& extra_file);

// Where the sandbox finds the CA and the bundle (system bundle + CA), and the variables
// that point programs at them (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
// NODE_EXTRA_CA_CERTS).
inline constexpr const char* sandbox_ca_dir = "/tmp/.cubicle-ca";
std::vector<std::pair<std::string, std::string>> sandbox_ca_env();
// The script (sh, the CA on its stdin) that writes them.
std::vector<std::string> sandbox_ca_install();

} // namespace cubicle::sandbox
