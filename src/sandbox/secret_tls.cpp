#include "sandbox/secret_tls.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace cubicle::sandbox {
namespace {

template <typename T, void (*Free)(T*)>
using Owned = std::unique_ptr<T, decltype([](T* p) { Free(p); })>;

std::string pem_of(BIO* bio) {
    char* data = nullptr;
    long n = BIO_get_mem_data(bio, &data);
    return std::string(data, static_cast<std::size_t>(n));
}

void add_ext(X509* cert, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    Owned<X509_EXTENSION, X509_EXTENSION_free> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
    if (!ext || !X509_add_ext(cert, ext.get(), -1)) throw std::runtime_error("cannot make the sandbox's certificate authority");
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return {};
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// Each "-----BEGIN CERTIFICATE-----" block of `text`.
std::vector<std::string> certificates_in(const std::string& text) {
    static constexpr std::string_view begin = "-----BEGIN CERTIFICATE-----", end = "-----END CERTIFICATE-----";
    std::vector<std::string> out;
    for (std::size_t at = 0; (at = text.find(begin, at)) != std::string::npos;) {
        auto stop = text.find(end, at);
        if (stop == std::string::npos) break;
        out.push_back(text.substr(at, stop + end.size() - at) + "\n");
        at = stop + end.size();
    }
    return out;
}

} // namespace

SandboxCa make_sandbox_ca(const std::string& sandbox_id) {
    Owned<EVP_PKEY, EVP_PKEY_free> key(EVP_EC_gen("P-256"));
    Owned<X509, X509_free> cert(X509_new());
    unsigned char serial[16];
    if (!key || !cert || RAND_bytes(serial, sizeof serial) != 1) throw std::runtime_error("cannot make the sandbox's certificate authority");
    serial[0] &= 0x7f;
    Owned<BIGNUM, BN_free> bn(BN_bin2bn(serial, sizeof serial, nullptr));
    Owned<ASN1_INTEGER, ASN1_INTEGER_free> sn(bn ? BN_to_ASN1_INTEGER(bn.get(), nullptr) : nullptr);
    auto cn = fmt::format("cubicle sandbox {} secrets CA", sandbox_id).substr(0, 64);
    X509_NAME* name = X509_get_subject_name(cert.get());
    if (!sn || !X509_set_version(cert.get(), 2) || !X509_set_serialNumber(cert.get(), sn.get()) ||
        !X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) || !X509_gmtime_adj(X509_getm_notAfter(cert.get()), 30L * 86400) ||
        !X509_set_pubkey(cert.get(), key.get()) ||
        !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0) ||
        !X509_set_issuer_name(cert.get(), name)) {
        throw std::runtime_error("cannot make the sandbox's certificate authority");
    }
    add_ext(cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_ext(cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
    add_ext(cert.get(), NID_subject_key_identifier, "hash");
    add_ext(cert.get(), NID_authority_key_identifier, "keyid:always");
    if (!X509_sign(cert.get(), key.get(), EVP_sha256())) throw std::runtime_error("cannot sign the sandbox's certificate authority");
    Owned<BIO, BIO_free_all> cert_bio(BIO_new(BIO_s_mem())), key_bio(BIO_new(BIO_s_mem()));
    if (!cert_bio || !key_bio || !PEM_write_bio_X509(cert_bio.get(), cert.get()) ||
        !PEM_write_bio_PrivateKey(key_bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr)) {
        throw std::runtime_error("cannot write the sandbox's certificate authority");
    }
    return {pem_of(cert_bio.get()), pem_of(key_bio.get())};
}

std::vector<std::string> upstream_trust(const std::string& extra_file) {
    const char* from_env = std::getenv(X509_get_default_cert_file_env());
    auto certs = certificates_in(read_file(from_env && *from_env ? from_env : X509_get_default_cert_file()));
    // and the directory (OpenSSL's default, or $SSL_CERT_DIR): some systems keep their anchors only there
    const char* dir_env = std::getenv(X509_get_default_cert_dir_env());
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_env && *dir_env ? dir_env : X509_get_default_cert_dir(), ec)) {
        if (!entry.is_regular_file(ec)) continue;
        for (auto& pem : certificates_in(read_file(entry.path().string()))) {
            if (std::find(certs.begin(), certs.end(), pem) == certs.end()) certs.push_back(std::move(pem));
        }
    }
    if (!extra_file.empty()) {
        auto extra = certificates_in(read_file(extra_file));
        if (extra.empty()) throw std::invalid_argument(fmt::format("--test-upstream-ca {}: no certificate in it (or unreadable)", extra_file));
        certs.insert(certs.end(), extra.begin(), extra.end());
    }
    // Without one the proxy could verify no secret's host: every HTTPS request to one would fail.
    if (certs.empty()) {
        throw std::invalid_argument("--secrets: no trusted certificates on this machine (OpenSSL's default file and directory, "
                                    "$SSL_CERT_FILE, $SSL_CERT_DIR) to verify the secrets' hosts with");
    }
    return certs;
}

std::vector<std::pair<std::string, std::string>> sandbox_ca_env() {
    auto bundle = fmt::format("{}/bundle.pem", sandbox_ca_dir);
    return {{"SSL_CERT_FILE", bundle}, {"REQUESTS_CA_BUNDLE", bundle}, {"CURL_CA_BUNDLE", bundle},
            {"NODE_EXTRA_CA_CERTS", fmt::format("{}/ca.pem", sandbox_ca_dir)}};
}

std::vector<std::string> sandbox_ca_install() {
    // The image's bundle where Debian, Alpine or Fedora keep it, then the CA.
    return {"sh", "-c",
            fmt::format("umask 022 && mkdir -p {0} && cat > {0}/ca.pem && "
                        "for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do "
                        "[ -r \"$f\" ] && {{ cat \"$f\" {0}/ca.pem > {0}/bundle.pem; exit 0; }}; done; cp {0}/ca.pem {0}/bundle.pem",
                        sandbox_ca_dir)};
}

} // namespace cubicle::sandbox
