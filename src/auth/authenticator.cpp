#include "auth/authenticator.hpp"

#include <stdexcept>

#include "common/json.hpp"
#include "common/log.hpp"

namespace cubicle::auth {
namespace {

// The credentials of "Bearer <token>" (the scheme is case-insensitive), or empty.
std::string_view bearer_token(std::string_view authorization) {
    constexpr std::string_view scheme = "bearer ";
    if (authorization.size() <= scheme.size()) return {};
    for (std::size_t i = 0; i < scheme.size(); ++i) {
        char c = authorization[i];
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
        if (c != scheme[i]) return {};
    }
    auto token = authorization.substr(scheme.size());
    while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
    while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
    return token;
}

// Where RFC 9728 puts the metadata of resource `uri`: the well-known path between its authority and path.
std::string metadata_url(std::string_view uri) {
    auto scheme_end = uri.find("://");
    auto path_start = scheme_end == uri.npos ? uri.npos : uri.find('/', scheme_end + 3);
    if (path_start == uri.npos) return std::string(uri) + "/.well-known/oauth-protected-resource";
    return std::string(uri.substr(0, path_start)) + "/.well-known/oauth-protected-resource" + std::string(uri.substr(path_start));
}

} // namespace

Authenticator::Authenticator(AuthSettings settings) : settings_(std::move(settings)) {
    if (!settings_.tokens_file.empty()) {
        tokens_ = std::make_shared<const TokenTable>(TokenTable::load(settings_.tokens_file));
    }
    if (!settings_.jwt.jwks_file.empty()) jwt_ = std::make_shared<const JwtVerifier>(settings_.jwt);
}

std::optional<std::string> Authenticator::authenticate(std::string_view authorization) const {
    auto token = bearer_token(authorization);
    if (token.empty()) return std::nullopt;
    if (tokens_) {
        if (auto principal = tokens_->principal_for(token)) return principal;
    }
    if (jwt_) {
        std::string why;
        if (auto subject = jwt_->subject(token, why)) return subject;
        log::debug("refused an access token: {}", why);
    }
    return std::nullopt;
}

void Authenticator::reload() {
    try {
        if (!settings_.tokens_file.empty()) {
            tokens_ = std::make_shared<const TokenTable>(TokenTable::load(settings_.tokens_file));
            log::info("re-read {} ({} tokens)", settings_.tokens_file, tokens_->size());
        }
        if (!settings_.jwt.jwks_file.empty()) {
            jwt_ = std::make_shared<const JwtVerifier>(settings_.jwt);
            log::info("re-read {} ({} keys)", settings_.jwt.jwks_file, jwt_->keys());
        }
    } catch (const std::exception& e) {
        log::error("keeping the old credentials: {}", e.what());
    }
}

std::string Authenticator::challenge() const {
    if (!jwt_) return "Bearer realm=\"cubicle\"";
    return fmt::format("Bearer realm=\"cubicle\", resource_metadata=\"{}\"", metadata_url(settings_.jwt.audience));
}

std::string Authenticator::resource_metadata() const {
    if (!jwt_) return {};
    json::Writer w;
    w.begin_object().field("resource", settings_.jwt.audience);
    w.key("authorization_servers").begin_array().value(settings_.jwt.issuer).end_array();
    w.key("bearer_methods_supported").begin_array().value("header").end_array();
    w.key("resource_signing_alg_values_supported").begin_array().value("RS256").value("ES256").end_array();
    w.field("resource_name", "cubicle");
    w.end_object();
    return w.take();
}

} // namespace cubicle::auth
