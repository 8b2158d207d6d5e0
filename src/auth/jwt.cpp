#include "auth/jwt.hpp"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>

#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "common/base64.hpp"
#include "common/json.hpp"

namespace cubicle::auth {
namespace {

constexpr std::int64_t clock_leeway_s = 30;

struct KeyFree {
    void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

std::optional<std::string> base64url_decode(std::string_view text) {
    std::string standard(text);
    for (auto& c : standard) {
        if (c == '-') c = '+';
        else if (c == '_') c = '/';
        else if (c == '+' || c == '/' || c == '=') return std::nullopt;  // not base64url
    }
    while (standard.size() % 4) standard += '=';
    return base64::decode(standard);
}

std::string member(simdjson::dom::element object, std::string_view name) {
    std::string_view value;
    return object[name].get(value) == simdjson::SUCCESS ? std::string(value) : std::string();
}

// OpenSSL 3 builds a public key from its parameters.
Key key_from_params(const char* type, OSSL_PARAM_BLD* builder) {
    OSSL_PARAM* params = OSSL_PARAM_BLD_to_param(builder);
    EVP_PKEY_CTX* context = EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr);
    EVP_PKEY* key = nullptr;
    bool ok = params && context && EVP_PKEY_fromdata_init(context) > 0 &&
              EVP_PKEY_fromdata(context, &key, EVP_PKEY_PUBLIC_KEY, params) > 0;
    EVP_PKEY_CTX_free(context);
    OSSL_PARAM_free(params);
    if (!ok) {
        EVP_PKEY_free(key);
        return nullptr;
    }
    return Key(key);
}

Key rsa_key(const std::string& n, const std::string& e) {
    BIGNUM* modulus = BN_bin2bn(reinterpret_cast<const unsigned char*>(n.data()), static_cast<int>(n.size()), nullptr);
    BIGNUM* exponent = BN_bin2bn(reinterpret_cast<const unsigned char*>(e.data()), static_cast<int>(e.size()), nullptr);
    OSSL_PARAM_BLD* builder = OSSL_PARAM_BLD_new();
    Key key;
    if (modulus && exponent && builder && OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_N, modulus) &&
        OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_E, exponent)) {
        key = key_from_params("RSA", builder);
    }
    OSSL_PARAM_BLD_free(builder);
    BN_free(modulus);
    BN_free(exponent);
    return key;
}

Key p256_key(const std::string& x, const std::string& y) {
    if (x.size() != 32 || y.size() != 32) return nullptr;
    std::string point = "\x04" + x + y;  // uncompressed
    OSSL_PARAM_BLD* builder = OSSL_PARAM_BLD_new();
    Key key;
    if (builder && OSSL_PARAM_BLD_push_utf8_string(builder, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) &&
        OSSL_PARAM_BLD_push_octet_string(builder, OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size())) {
        key = key_from_params("EC", builder);
    }
    OSSL_PARAM_BLD_free(builder);
    return key;
}

// JWS carries an ES256 signature as r || s (32 bytes each); OpenSSL verifies DER.
std::optional<std::string> ecdsa_der(const std::string& raw) {
    if (raw.size() != 64) return std::nullopt;
    ECDSA_SIG* signature = ECDSA_SIG_new();
    BIGNUM* r = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()), 32, nullptr);
    BIGNUM* s = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()) + 32, 32, nullptr);
    if (!signature || !r || !s || !ECDSA_SIG_set0(signature, r, s)) {
        BN_free(r);
        BN_free(s);
        ECDSA_SIG_free(signature);
        return std::nullopt;
    }
    unsigned char* der = nullptr;
    int size = i2d_ECDSA_SIG(signature, &der);
    ECDSA_SIG_free(signature);
    if (size <= 0) return std::nullopt;
    std::string out(reinterpret_cast<char*>(der), static_cast<std::size_t>(size));
    OPENSSL_free(der);
    return out;
}

bool verify_sha256(EVP_PKEY* key, std::string_view signed_part, const std::string& signature) {
    EVP_MD_CTX* context = EVP_MD_CTX_new();
    bool ok = context && EVP_DigestVerifyInit(context, nullptr, EVP_sha256(), nullptr, key) == 1 &&
              EVP_DigestVerify(context, reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                               reinterpret_cast<const unsigned char*>(signed_part.data()), signed_part.size()) == 1;
    EVP_MD_CTX_free(context);
    return ok;
}

} // namespace

struct JwtVerifier::Keys {
    struct Entry {
        std::string kid;
        std::string alg;  // RS256 or ES256
        Key key;
    };
    std::vector<Entry> entries;
};

JwtVerifier::JwtVerifier(JwtSettings settings) : settings_(std::move(settings)), keys_(std::make_unique<Keys>()) {
    if (settings_.issuer.empty() || settings_.audience.empty()) {
        throw std::runtime_error("JWT access tokens need both --jwt-issuer and --jwt-audience");
    }
    std::ifstream in(settings_.jwks_file);
    if (!in) throw std::runtime_error(fmt::format("cannot read the JWKS file {}", settings_.jwks_file));
    std::stringstream text;
    text << in.rdbuf();
    json::Document document;
    if (auto error = document.parse(text.str())) throw std::runtime_error(fmt::format("{}: {}", settings_.jwks_file, *error));
    simdjson::dom::array keys;
    if (document.root()["keys"].get(keys) != simdjson::SUCCESS) {
        throw std::runtime_error(fmt::format("{}: not a JWK set (no \"keys\" array)", settings_.jwks_file));
    }
    for (auto jwk : keys) {
        auto kty = member(jwk, "kty");
        auto use = member(jwk, "use");
        if (!use.empty() && use != "sig") continue;
        Keys::Entry entry{member(jwk, "kid"), "", nullptr};
        if (kty == "RSA") {
            auto n = base64url_decode(member(jwk, "n"));
            auto e = base64url_decode(member(jwk, "e"));
            if (n && e && n->size() >= 256) entry.key = rsa_key(*n, *e);  // 2048 bits at least
            entry.alg = "RS256";
        } else if (kty == "EC" && member(jwk, "crv") == "P-256") {
            auto x = base64url_decode(member(jwk, "x"));
            auto y = base64url_decode(member(jwk, "y"));
            if (x && y) entry.key = p256_key(*x, *y);
            entry.alg = "ES256";
        }
        auto alg = member(jwk, "alg");
        if (!entry.key || (!alg.empty() && alg != entry.alg)) continue;  // a kind of key this server does not use
        keys_->entries.push_back(std::move(entry));
    }
    if (keys_->entries.empty()) {
        throw std::runtime_error(fmt::format("{}: no usable key (RSA of 2048+ bits for RS256, or EC P-256 for ES256)",
                                             settings_.jwks_file));
    }
}

JwtVerifier::~JwtVerifier() = default;
JwtVerifier::JwtVerifier(JwtVerifier&&) noexcept = default;
JwtVerifier& JwtVerifier::operator=(JwtVerifier&&) noexcept = default;

std::size_t JwtVerifier::keys() const { return keys_->entries.size(); }

std::optional<std::string> JwtVerifier::subject(std::string_view token, std::string& why) const {
    auto first = token.find('.');
    auto second = first == token.npos ? token.npos : token.find('.', first + 1);
    if (second == token.npos || token.find('.', second + 1) != token.npos) {
        why = "not a JWS compact token";
        return std::nullopt;
    }
    auto header_text = base64url_decode(token.substr(0, first));
    auto claims_text = base64url_decode(token.substr(first + 1, second - first - 1));
    auto signature = base64url_decode(token.substr(second + 1));
    json::Document header;
    json::Document claims;
    if (!header_text || !claims_text || !signature || header.parse(*header_text) || claims.parse(*claims_text) ||
        !header.root().is_object() || !claims.root().is_object()) {
        why = "malformed token";
        return std::nullopt;
    }
    // The algorithm comes from the key, never from the token alone ("none", HS256 with a public key).
    auto alg = member(header.root(), "alg");
    auto kid = member(header.root(), "kid");
    const Keys::Entry* key = nullptr;
    for (const auto& entry : keys_->entries) {
        if (entry.alg == alg && (kid.empty() || entry.kid == kid)) {
            key = &entry;
            break;
        }
    }
    if (!key) {
        why = fmt::format("no key for alg {} kid {}", alg, kid);
        return std::nullopt;
    }
    std::string signed_signature = *signature;
    if (alg == "ES256") {
        auto der = ecdsa_der(*signature);
        if (!der) {
            why = "bad ES256 signature encoding";
            return std::nullopt;
        }
        signed_signature = *der;
    }
    if (!verify_sha256(key->key.get(), token.substr(0, second), signed_signature)) {
        why = "bad signature";
        return std::nullopt;
    }
    auto now = static_cast<std::int64_t>(std::time(nullptr));
    auto root = claims.root();
    std::int64_t exp = 0;
    double exp_double = 0;
    if (root["exp"].get(exp) != simdjson::SUCCESS) {
        if (root["exp"].get(exp_double) != simdjson::SUCCESS) {
            why = "no exp";
            return std::nullopt;
        }
        exp = static_cast<std::int64_t>(exp_double);
    }
    if (exp + clock_leeway_s < now) {
        why = "expired";
        return std::nullopt;
    }
    std::int64_t nbf = 0;
    if (root["nbf"].get(nbf) == simdjson::SUCCESS && nbf - clock_leeway_s > now) {
        why = "not yet valid";
        return std::nullopt;
    }
    if (member(root, "iss") != settings_.issuer) {
        why = "wrong issuer";
        return std::nullopt;
    }
    bool audience_ok = member(root, "aud") == settings_.audience;
    simdjson::dom::array audiences;
    if (!audience_ok && root["aud"].get(audiences) == simdjson::SUCCESS) {
        for (auto audience : audiences) {
            std::string_view value;
            if (audience.get(value) == simdjson::SUCCESS && value == settings_.audience) audience_ok = true;
        }
    }
    if (!audience_ok) {
        why = "wrong audience";
        return std::nullopt;
    }
    auto subject = member(root, "sub");
    if (subject.empty()) {
        why = "no sub";
        return std::nullopt;
    }
    return subject;
}

} // namespace cubicle::auth
