// OAuth 2.1 access tokens as a resource server sees them: JWTs signed with
// RS256 or ES256 by a key of a JWKS, for this server's audience (RFC 8707),
// from the configured issuer, not expired.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace cubicle::auth {

struct JwtSettings {
    std::string jwks_file;  // a JSON Web Key Set
    std::string issuer;     // required "iss"
    std::string audience;   // required in "aud": this server's resource URI
};

class JwtVerifier {
public:
    // Reads the key set; throws std::runtime_error naming what is wrong with it.
    explicit JwtVerifier(JwtSettings settings);
    ~JwtVerifier();
    JwtVerifier(JwtVerifier&&) noexcept;
    JwtVerifier& operator=(JwtVerifier&&) noexcept;

    // The token's subject ("sub") when the token is valid, else nothing
    // (`why` says what failed, for the log: never sent to the client).
    std::optional<std::string> subject(std::string_view token, std::string& why) const;
    std::size_t keys() const;

private:
    struct Keys;
    JwtSettings settings_;
    std::unique_ptr<Keys> keys_;
};

} // namespace cubicle::auth
