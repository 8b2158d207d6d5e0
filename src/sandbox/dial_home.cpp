#include "sandbox/dial_home.hpp"

#include <cerrno>
#include <map>
#include <optional>
#include <string_view>
#include <stdexcept>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "agent/protocol.h"
#include "common/errors.hpp"
#include "common/hex.hpp"
#include "common/ids.hpp"
#include "common/log.hpp"
#include "docker/client.hpp"
#include "docker/tls_relay.hpp"
#include "docker/transport.hpp"
#include "docker/watchdog.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// From the TCP connection to its token: an agent sends it at once, before any program runs.
constexpr std::chrono::seconds admission_time(2);
// Connections between accept and token at once: the rest are closed, so that nobody who
// reaches the endpoint can hold the server's descriptors.
constexpr int most_unadmitted = 64;
// Out of descriptors: accepting again at once would spin.
constexpr std::chrono::milliseconds accept_backoff(100);
// Anyone who reaches the endpoint can make it refuse: refusals are logged, but not without bound.
constexpr int refusals_logged_per_minute = 20;

struct SslCtxFree {
    void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
    void operator()(SSL* ssl) const { SSL_free(ssl); }
};
struct KeyFree {
    void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertFree {
    void operator()(X509* cert) const { X509_free(cert); }
};

std::string openssl_error() {
    unsigned long code = ERR_get_error();
    char text[256] = "unknown error";
    if (code) ERR_error_string_n(code, text, sizeof text);
    ERR_clear_error();
    return text;
}

// The hex SHA-256 of `key`'s DER SubjectPublicKeyInfo: what the agent compares.
std::string pin_of(EVP_PKEY* key) {
    unsigned char* der = nullptr;
    int size = i2d_PUBKEY(key, &der);
    if (size <= 0) throw std::runtime_error("cannot encode the agent endpoint's key: " + openssl_error());
    std::string encoded(reinterpret_cast<const char*>(der), static_cast<std::size_t>(size));
    OPENSSL_free(der);
    return sha256_hex(encoded);
}

// A key and a self-signed certificate that live as long as the server: agents trust
// the key's pin, never a CA, so nothing is written to disk.
std::unique_ptr<SSL_CTX, SslCtxFree> make_context(std::string& pin) {
    std::unique_ptr<EVP_PKEY, KeyFree> key(EVP_EC_gen("P-256"));
    std::unique_ptr<X509, CertFree> cert(X509_new());
    if (!key || !cert) throw std::runtime_error("cannot make the agent endpoint's key: " + openssl_error());
    X509_set_version(cert.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 10L * 365 * 24 * 3600);
    X509_set_pubkey(cert.get(), key.get());
    X509_NAME* name = X509_get_subject_name(cert.get());
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("cubicle agent endpoint"), -1, -1, 0);
    X509_set_issuer_name(cert.get(), name);
    if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0)
        throw std::runtime_error("cannot sign the agent endpoint's certificate: " + openssl_error());
    std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_server_method()));
    if (!ctx || SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1 || SSL_CTX_use_certificate(ctx.get(), cert.get()) != 1 ||
        SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1)
        throw std::runtime_error("cannot set up the agent endpoint's TLS: " + openssl_error());
    // Every agent connects once: no session tickets to send, nor sessions to keep.
    SSL_CTX_set_num_tickets(ctx.get(), 0);
    SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
    pin = pin_of(key.get());
    return ctx;
}

// What the waiting claims are keyed by: the token's SHA-256, so that looking a presented token
// up compares digests, and its time tells nothing about how much of a real token it matched.
std::string token_key(std::string_view token) { return sha256_hex(token); }

// A sandbox's wait for its agent.
struct Claim {
    explicit Claim(asio::any_io_executor executor) : wake(executor, asio::steady_timer::time_point::max()) {}
    asio::steady_timer wake;
    std::unique_ptr<docker::RawStream> stream;
};

} // namespace

struct DialHome::State {
    explicit State(asio::any_io_executor executor) : acceptor(executor) {}
    tcp::acceptor acceptor;
    std::unique_ptr<SSL_CTX, SslCtxFree> context;
    std::string pin;
    std::uint16_t port = 0;
    std::map<std::string, std::shared_ptr<Claim>> waiting;  // by token_key(), until its agent comes
    std::chrono::steady_clock::time_point refusal_minute;   // when the count below began
    int refusals_this_minute = 0;
    int unadmitted = 0;  // connections in admit(), before their token
};

namespace {

class DialChannel : public AgentChannel {
public:
    DialChannel(std::shared_ptr<DialHome::State> state, std::string key, std::shared_ptr<Claim> claim, AgentWiring wiring)
        : state_(std::move(state)), key_(std::move(key)), claim_(std::move(claim)), wiring_(std::move(wiring)) {}
    ~DialChannel() override { forgo(); }
    void forgo() override { state_->waiting.erase(key_); }

    const char* kind() const override { return "tcp"; }
    AgentWiring wiring() const override { return wiring_; }

    asio::awaitable<std::unique_ptr<docker::RawStream>> accept(std::chrono::milliseconds timeout) override {
        if (!claim_->stream) {
            claim_->wake.expires_after(timeout);
            co_await claim_->wake.async_wait(use_tuple);
        }
        state_->waiting.erase(key_);
        if (!claim_->stream) throw ToolError(fmt::format("the sandbox agent did not dial home within {} ms", timeout.count()));
        co_return std::move(claim_->stream);
    }

private:
    std::shared_ptr<DialHome::State> state_;
    std::string key_;  // token_key() of its token
    std::shared_ptr<Claim> claim_;
    AgentWiring wiring_;
};

void log_refusal(DialHome::State& state, const std::string& who, const std::string& why) {
    auto now = std::chrono::steady_clock::now();
    if (now - state.refusal_minute >= std::chrono::minutes(1)) {
        state.refusal_minute = now;
        state.refusals_this_minute = 0;
    }
    int count = ++state.refusals_this_minute;
    if (count <= refusals_logged_per_minute)
        log::warning("agent endpoint: refused {}: {}", who, why);
    else if (count == refusals_logged_per_minute + 1)
        log::warning("agent endpoint: more than {} refusals this minute; the rest are logged at debug level", refusals_logged_per_minute);
    else
        log::debug("agent endpoint: refused {}: {}", who, why);
}

// Waits until the socket is ready for what OpenSSL asked; false when it is gone (or timed out).
asio::awaitable<bool> ready_for(tcp::socket& socket, int error) {
    auto what = error == SSL_ERROR_WANT_WRITE ? asio::socket_base::wait_write : asio::socket_base::wait_read;
    auto [ec] = co_await socket.async_wait(what, use_tuple);
    co_return !ec;
}

// Ends a connection's count as unadmitted, which serve() began when it accepted it.
struct Unadmitted {
    explicit Unadmitted(DialHome::State& state) : state(state) {}
    ~Unadmitted() { --state.unadmitted; }
    Unadmitted(const Unadmitted&) = delete;
    Unadmitted& operator=(const Unadmitted&) = delete;
    DialHome::State& state;
};

// One connection: a TLS handshake, then a token this server issued and nobody used.
// `taken` gets the claim its token matched, for admit() to wake should this throw.
asio::awaitable<void> admit_one(std::shared_ptr<DialHome::State> state, tcp::socket socket, std::shared_ptr<std::shared_ptr<Claim>> taken) {
    std::optional<Unadmitted> unadmitted(std::in_place, *state);
    boost::system::error_code ec;
    auto peer = socket.remote_endpoint(ec);
    std::string who = ec ? std::string("an unknown peer") : fmt::format("{}:{}", peer.address().to_string(), peer.port());
    // The watchdog's expiry may already be queued when this frame is gone: it keeps what it
    // needs in shared state and forgets `socket` when destroyed, so a late handler does nothing.
    docker::Watchdog deadline(socket.get_executor(), [&socket] {
        boost::system::error_code ignored;
        socket.cancel(ignored);
    });
    deadline.arm(admission_time);
    // Frames are small and answered at once: Nagle's wait for an ACK would add ~40 ms to each.
    socket.set_option(tcp::no_delay(true), ec);
    socket.native_non_blocking(true, ec);
    std::unique_ptr<SSL, SslFree> ssl(SSL_new(state->context.get()));
    std::string refusal;
    if (ec || !ssl || SSL_set_fd(ssl.get(), socket.native_handle()) != 1) refusal = "cannot set up TLS: " + openssl_error();
    while (refusal.empty()) {
        ERR_clear_error();
        int r = SSL_accept(ssl.get());
        if (r == 1) break;
        int error = SSL_get_error(ssl.get(), r);
        if ((error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) && co_await ready_for(socket, error)) continue;
        refusal = "no TLS handshake: " + openssl_error();
    }
    char token[CUBICLE_DIAL_TOKEN_SIZE + 1];
    std::size_t have = 0;
    while (refusal.empty() && have < sizeof token) {
        ERR_clear_error();
        std::size_t n = 0;
        int r = SSL_read_ex(ssl.get(), token + have, sizeof token - have, &n);
        if (r == 1) {
            have += n;
            continue;
        }
        int error = SSL_get_error(ssl.get(), r);
        if ((error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) && co_await ready_for(socket, error)) continue;
        refusal = "no token";
    }
    std::shared_ptr<Claim> claim;
    if (refusal.empty()) {
        auto it = token[CUBICLE_DIAL_TOKEN_SIZE] == '\n' ? state->waiting.find(token_key({token, CUBICLE_DIAL_TOKEN_SIZE}))
                                                          : state->waiting.end();
        if (it == state->waiting.end()) {
            refusal = "a token this server did not issue, or one already used";
        } else {
            claim = it->second;
            *taken = claim;
            state->waiting.erase(it);  // the token is spent: no second connection gets in with it
        }
    }
    unadmitted.reset();
    if (!claim) {
        log_refusal(*state, who, refusal);
        co_return;  // the socket closes
    }
    // Tells the agent it is in; the relay below starts with an empty write side.
    const char accepted = CUBICLE_DIAL_ACCEPTED;
    for (std::size_t sent = 0; sent == 0;) {
        ERR_clear_error();
        int r = SSL_write_ex(ssl.get(), &accepted, 1, &sent);
        if (r == 1) break;
        int error = SSL_get_error(ssl.get(), r);
        if ((error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) && co_await ready_for(socket, error)) continue;
        log::warning("agent endpoint: {} went away after its token", who);
        claim->wake.cancel();
        co_return;
    }
    claim->stream = docker::raw_stream(docker::relay_tls(std::move(socket), ssl.release()));
    claim->wake.cancel();
}

// admit_one, detached: an exception is logged, and a sandbox whose token it took is woken
// (it then reports that its agent did not come) rather than left to its timeout.
asio::awaitable<void> admit(std::shared_ptr<DialHome::State> state, tcp::socket socket) {
    auto taken = std::make_shared<std::shared_ptr<Claim>>();
    try {
        co_await admit_one(std::move(state), std::move(socket), taken);
    } catch (const std::exception& e) {
        log::error("agent endpoint: admitting a connection failed: {}", e.what());
        if (*taken && !(*taken)->stream) (*taken)->wake.cancel();
    }
}

asio::awaitable<void> serve(std::shared_ptr<DialHome::State> state) {
    for (;;) {
        tcp::socket socket(state->acceptor.get_executor());
        auto [ec] = co_await state->acceptor.async_accept(socket, use_tuple);
        if (ec == asio::error::operation_aborted || !state->acceptor.is_open()) co_return;
        if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
            asio::steady_timer pause(state->acceptor.get_executor(), accept_backoff);
            co_await pause.async_wait(use_tuple);
            continue;
        }
        if (ec) continue;  // a peer gone before we took it
        if (state->unadmitted >= most_unadmitted) continue;  // the socket closes
        ++state->unadmitted;  // counted here, before admit() runs, so a burst cannot pass the cap
        asio::co_spawn(state->acceptor.get_executor(), admit(state, std::move(socket)), asio::detached);
    }
}

} // namespace

std::string host_port(const std::string& host, std::uint16_t port) {
    return host.find(':') == std::string::npos ? fmt::format("{}:{}", host, port) : fmt::format("[{}]:{}", host, port);
}

std::unique_ptr<DialHome> DialHome::listen(asio::any_io_executor executor, const std::string& host, std::uint16_t port) {
    auto state = std::make_shared<State>(executor);
    state->context = make_context(state->pin);
    boost::system::error_code ec;
    auto address = asio::ip::make_address(host, ec);
    tcp::endpoint endpoint(address, port);
    if (!ec) state->acceptor.open(endpoint.protocol(), ec);
    if (!ec) state->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) state->acceptor.bind(endpoint, ec);
    if (!ec) state->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw std::runtime_error(fmt::format("cannot listen for agents at {}:{}: {}", host, port, ec.message()));
    state->port = state->acceptor.local_endpoint().port();
    asio::co_spawn(executor, serve(state), asio::detached);
    log::info("agent endpoint: TLS on {}", host_port(host, state->port));
    return std::unique_ptr<DialHome>(new DialHome(std::move(state)));
}

DialHome::~DialHome() {
    boost::system::error_code ignored;
    state_->acceptor.close(ignored);
    for (auto& [token, claim] : state_->waiting) claim->wake.cancel();
}

const std::string& DialHome::pin() const { return state_->pin; }
std::uint16_t DialHome::port() const { return state_->port; }

std::unique_ptr<AgentChannel> DialHome::expect(std::string network, std::string host, std::uint16_t port) {
    auto token = random_hex(CUBICLE_DIAL_TOKEN_SIZE / 2);
    auto claim = std::make_shared<Claim>(state_->acceptor.get_executor());
    auto key = token_key(token);
    state_->waiting[key] = claim;
    AgentWiring wiring{.network = std::move(network), .dial = fmt::format("{} {} {}", host_port(host, port), state_->pin, token)};
    return std::make_unique<DialChannel>(state_, std::move(key), std::move(claim), std::move(wiring));
}

} // namespace cubicle::sandbox
