// Who is calling: the principal behind an Authorization header.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "auth/jwt.hpp"
#include "auth/tokens.hpp"

namespace cubicle::auth {

struct AuthSettings {
    std::string tokens_file;  // --auth-tokens; empty: no static tokens
    JwtSettings jwt;          // jwt.jwks_file empty: no JWT access tokens
};

class Authenticator {
public:
    // Loads the configured sources; throws std::runtime_error when one is unusable.
    explicit Authenticator(AuthSettings settings);

    bool enabled() const { return tokens_ != nullptr || jwt_ != nullptr; }
    // The principal of an `Authorization: Bearer ...` value, or nothing.
    std::optional<std::string> authenticate(std::string_view authorization) const;
    // Re-reads the token file (SIGHUP). A broken file keeps the old tokens.
    void reload();
    // The WWW-Authenticate value of a 401; with JWTs it points to the RFC 9728 metadata.
    std::string challenge() const;
    // RFC 9728 protected-resource metadata (JSON), or empty without JWTs.
    std::string resource_metadata() const;

private:
    AuthSettings settings_;
    std::shared_ptr<const TokenTable> tokens_;
    std::shared_ptr<const JwtVerifier> jwt_;
};

} // namespace cubicle::auth
