#include "sandbox/secrets.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"
#include "common/json.hpp"
#include "common/log.hpp"

namespace cubicle::sandbox {
namespace {

bool plain_name(std::string_view s) {
    return !s.empty() && s.size() <= 63 && !(s[0] >= '0' && s[0] <= '9') &&
           std::all_of(s.begin(), s.end(), [](char c) { return c == '_' || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); });
}

bool token_chars(std::string_view s) {  // an HTTP header or parameter name
    return !s.empty() && s.size() < 128 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f && c != ':' && c != '=' && c != '&' && c != '?'; });
}

bool host_rule(std::string_view s) {
    return !s.empty() && s.size() < 260 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c == '.' || c == '-' || c == ':' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'); });
}

std::string strings_of(simdjson::dom::element e, const char* key, std::vector<std::string>& out, const std::string& name) {
    simdjson::dom::array items;
    auto field = e[key];
    if (field.error() == simdjson::NO_SUCH_FIELD) return {};
    if (field.get(items) != simdjson::SUCCESS) return fmt::format("secret {}: {} must be an array of strings", name, key);
    for (auto item : items) {
        std::string_view s;
        if (item.get(s) != simdjson::SUCCESS) return fmt::format("secret {}: {} must be an array of strings", name, key);
        out.emplace_back(s);
    }
    return {};
}

} // namespace

std::string Secret::filled() const {
    if (header.empty()) return value;
    std::string out = value_template;
    for (std::size_t at; (at = out.find("{value}")) != std::string::npos;) out.replace(at, 7, value);
    return out;
}

Secrets::Secrets(std::string path) : path_(std::move(path)) {
    if (!path_.empty()) secrets_ = load(path_);
}

std::map<std::string, Secret> Secrets::load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument(fmt::format("--secrets {}: cannot read the file", path));
    std::stringstream text;
    text << in.rdbuf();
    json::Document doc;
    if (auto error = doc.parse(text.str())) throw std::invalid_argument(fmt::format("--secrets {}: not JSON: {}", path, *error));
    simdjson::dom::array list;
    if (doc.root()["secrets"].get(list) != simdjson::SUCCESS) {
        throw std::invalid_argument(fmt::format("--secrets {}: want {{\"secrets\": [...]}}", path));
    }
    std::map<std::string, Secret> out;
    auto bad = [&path](const std::string& why) { return std::invalid_argument(fmt::format("--secrets {}: {}", path, why)); };
    for (auto e : list) {
        Secret s;
        std::string_view name, text_value;
        if (e["name"].get(name) != simdjson::SUCCESS || !plain_name(name)) {
            throw bad("every secret needs a name of letters, digits and _ (an environment variable's name)");
        }
        s.name = name;
        if (out.contains(s.name)) throw bad(fmt::format("secret {} is declared twice", s.name));
        std::string_view from_file, from_env;
        bool has_file = e["value_file"].get(from_file) == simdjson::SUCCESS, has_env = e["value_env"].get(from_env) == simdjson::SUCCESS;
        if (has_file == has_env) throw bad(fmt::format("secret {}: give value_file or value_env (one of them)", s.name));
        if (has_file) {
            std::ifstream value_in{std::string(from_file), std::ios::binary};
            if (!value_in) throw bad(fmt::format("secret {}: cannot read its value_file {}", s.name, from_file));
            std::stringstream v;
            v << value_in.rdbuf();
            s.value = v.str();
            while (!s.value.empty() && (s.value.back() == '\n' || s.value.back() == '\r')) s.value.pop_back();  // a file's last newline
        } else {
            const char* v = std::getenv(std::string(from_env).c_str());
            if (!v) throw bad(fmt::format("secret {}: the server's environment has no {}", s.name, from_env));
            s.value = v;
        }
        if (s.value.empty()) throw bad(fmt::format("secret {}: its value is empty", s.name));
        if (s.value.size() > 8192) throw bad(fmt::format("secret {}: its value is over 8192 bytes", s.name));
        if (s.value.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
            throw bad(fmt::format("secret {}: its value holds a line break or NUL byte", s.name));
        }
        if (auto why = strings_of(e, "hosts", s.hosts, s.name); !why.empty()) throw bad(why);
        if (s.hosts.empty()) throw bad(fmt::format("secret {}: hosts (where it may be sent) must name at least one host", s.name));
        for (auto& h : s.hosts) {
            std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            if (!host_rule(h)) throw bad(fmt::format("secret {}: bad host '{}' (want HOST or HOST:PORT)", s.name, h));
        }
        std::string_view header, query, value_template = "{value}";
        bool has_header = e["header"].get(header) == simdjson::SUCCESS, has_query = e["query"].get(query) == simdjson::SUCCESS;
        if (has_header == has_query) throw bad(fmt::format("secret {}: give header (with template) or query (one of them)", s.name));
        if (e["template"].error() != simdjson::NO_SUCH_FIELD && e["template"].get(value_template) != simdjson::SUCCESS) {
            throw bad(fmt::format("secret {}: template must be a string", s.name));
        }
        if (has_header && (!token_chars(header) || value_template.find("{value}") == std::string_view::npos ||
                           value_template.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos)) {
            throw bad(fmt::format("secret {}: want a header name and a one-line template holding {{value}}", s.name));
        }
        if (has_query && !token_chars(query)) throw bad(fmt::format("secret {}: bad query parameter name", s.name));
        s.header = header;
        s.query = query;
        s.value_template = value_template;
        if (s.filled().size() > 8192) throw bad(fmt::format("secret {}: its header value (template filled in) is over 8192 bytes", s.name));
        if (auto why = strings_of(e, "principals", s.principals, s.name); !why.empty()) throw bad(why);
        out.emplace(s.name, std::move(s));
    }
    return out;
}

bool Secrets::reload() {
    if (path_.empty()) return false;
    try {
        secrets_ = load(path_);
        log::info("--secrets {}: re-read, {} secret(s)", path_, secrets_.size());
        return true;
    } catch (const std::exception& e) {
        log::error("{}; the secrets read before stay in use", e.what());
        return false;
    }
}

const Secret* Secrets::find(const std::string& name) const {
    auto it = secrets_.find(name);
    return it == secrets_.end() ? nullptr : &it->second;
}

void Secrets::check(const std::vector<std::string>& names, const std::string& principal, bool any_principal) const {
    for (const auto& name : names) {
        const auto* s = find(name);
        if (!s) {
            throw ToolError(secrets_.empty() ? fmt::format("no secret {}: this server declares no secrets (the operator's --secrets file)", name)
                                             : fmt::format("no secret {}: the server's --secrets file does not declare it", name));
        }
        bool allowed = any_principal || std::find(s->principals.begin(), s->principals.end(), "*") != s->principals.end() ||
                       std::find(s->principals.begin(), s->principals.end(), principal) != s->principals.end();
        if (!allowed) throw ToolError(fmt::format("secret {} is not for this client: the operator's --secrets file does not list its principal", name));
    }
}

bool Secrets::allows(const std::string& name, const std::string& principal, bool any_principal) const {
    try {
        check({name}, principal, any_principal);
        return true;
    } catch (const ToolError&) {
        return false;
    }
}

std::string secret_placeholder(std::string_view name) {
    return fmt::format("cubicle-secret-{}-{}", name, random_hex(16));
}

} // namespace cubicle::sandbox
