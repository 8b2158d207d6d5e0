// Secrets the operator declares (--secrets FILE) and sandboxes ask for by name
// (initialize_sandbox secrets): the sandbox sees a random placeholder; the egress
// proxy puts the real value into requests to the secret's hosts only
// (src/agent/proxy_secrets.h). Values stay in this process and the proxy's.
//
// The file (JSON):
//   {"secrets": [{"name": "OPENAI",
//                 "value_file": "/run/keys/openai" | "value_env": "OPENAI_API_KEY",
//                 "hosts": ["api.openai.com", "host:8443"],
//                 "header": "Authorization", "template": "Bearer {value}"   (template default "{value}")
//                 | "query": "key",
//                 "principals": ["alice", "*"]}]}                              (HTTP: who may use it)
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubicle::sandbox {

struct Secret {
    std::string name;
    std::string value;                // the real value: never logged, never in a result or error
    std::vector<std::string> hosts;   // HOST or HOST:PORT, lower case
    std::string header;               // header name, or empty for a query parameter
    std::string value_template;       // the header's value, "{value}" standing for the value
    std::string query;                // query parameter name
    std::vector<std::string> principals;
    std::string filled() const;       // the header's (or parameter's) value
};

class Secrets {
public:
    Secrets() = default;
    // Reads `path` (empty: no secrets). Throws std::invalid_argument naming what is wrong
    // (never a value).
    explicit Secrets(std::string path);
    // Reads the file again (SIGHUP); a bad file keeps the old set and says why (logged).
    // Returns whether the set was replaced.
    bool reload();
    bool empty() const { return secrets_.empty(); }
    const Secret* find(const std::string& name) const;
    // Throws ToolError when `principal` may not use every one of `names` (unknown names
    // included). On stdio (`any_principal`) every declared secret may be used.
    void check(const std::vector<std::string>& names, const std::string& principal, bool any_principal) const;
    // Does `name` exist and may `principal` use it?  (check() for one name, without throwing.)
    bool allows(const std::string& name, const std::string& principal, bool any_principal) const;

private:
    static std::map<std::string, Secret> load(const std::string& path);
    std::string path_;
    std::map<std::string, Secret> secrets_;
};

// A fresh placeholder for `name`: random, the same length whatever the name.
std::string secret_placeholder(std::string_view name);

} // namespace cubicle::sandbox
