#include "docker/transport.hpp"
#include "docker/tls_relay.hpp"

#include <algorithm>
#include <list>
#include <map>
#include <stdexcept>

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect_pipe.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/writable_pipe.hpp>
#include <boost/asio/write.hpp>
#include <boost/process/v2/environment.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/child_fds.hpp"
#include "common/log.hpp"
#include "docker/client.hpp"
#include "docker/watchdog.hpp"

namespace cubicle::docker {
namespace {

namespace asio = boost::asio;
namespace bp = boost::process::v2;
using Socket = Transport::Socket;
using asio::use_awaitable;
constexpr auto use_tuple = asio::as_tuple(use_awaitable);

std::string describe(std::chrono::milliseconds duration) {
    if (duration.count() % 1000 == 0) return fmt::format("{} s", duration.count() / 1000);
    return fmt::format("{} ms", duration.count());
}

std::string timed_out(const Endpoint& endpoint, std::chrono::milliseconds limit) {
    return fmt::format("cannot reach the Docker daemon at {}: no connection within {} (timed out; the daemon may be overloaded or stalled)",
                       endpoint.describe(), describe(limit));
}

// The newest OpenSSL error, readable.
std::string openssl_error() {
    unsigned long code = ERR_get_error();
    ERR_clear_error();
    if (!code) return "unknown TLS error";
    char text[256];
    ERR_error_string_n(code, text, sizeof text);
    // "error:0A000086:SSL routines::certificate verify failed" -> the reason.
    std::string_view view = text;
    if (auto colon = view.rfind(':'); colon != view.npos) view = view.substr(colon + 1);
    return std::string(view);
}

Socket as_generic(asio::local::stream_protocol::socket& local) {
    auto executor = local.get_executor();
    return Socket(executor, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), local.release());
}

// What one connection's helper (a TLS relay or an ssh process) found when it ended.
struct LinkState {
    std::string failure;  // empty: it ended cleanly (or has not ended)
    bool done = false;
};

// Remembers each connection's link by the client end's descriptor, for explain(),
// also after the link has ended (that is when it is asked); a descriptor number
// used again replaces the entry, so there are never more than open descriptors.
class Links {
public:
    void add(int fd, std::shared_ptr<LinkState> link) { links_[fd] = std::move(link); }
    std::shared_ptr<LinkState> find(int fd) const {
        auto it = links_.find(fd);
        return it == links_.end() ? nullptr : it->second;
    }

private:
    std::map<int, std::shared_ptr<LinkState>> links_;
};

// Waits up to `limit` for the link to end; returns what it found.
asio::awaitable<std::string> wait_for(std::shared_ptr<LinkState> link, std::chrono::milliseconds limit) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (auto waited = std::chrono::milliseconds(0); link && !link->done && link->failure.empty() && waited < limit;
         waited += std::chrono::milliseconds(20)) {
        timer.expires_after(std::chrono::milliseconds(20));
        co_await timer.async_wait(use_tuple);
    }
    co_return link ? link->failure : std::string();
}

// ---- unix and tcp -------------------------------------------------------------

asio::awaitable<Socket> connect_unix(const Endpoint& endpoint, std::chrono::milliseconds deadline) {
    auto executor = co_await asio::this_coro::executor;
    Socket socket(executor);
    Watchdog watchdog(executor, [&socket] {
        boost::system::error_code ignored;
        socket.cancel(ignored);
    });
    watchdog.arm(deadline);
    asio::generic::stream_protocol::endpoint target{asio::local::stream_protocol::endpoint(endpoint.path)};
    auto [ec] = co_await socket.async_connect(target, use_tuple);
    if (watchdog.expired()) throw Error(0, timed_out(endpoint, deadline));
    if (ec == asio::error::access_denied) {
        throw Error(0, fmt::format("permission denied on the Docker socket {}: add this user to the docker group "
                                   "(sudo usermod -aG docker $USER, then log in again) or set DOCKER_HOST to a daemon it may use",
                                   endpoint.describe()));
    }
    if (ec) {
        throw Error(0, fmt::format("cannot reach the Docker daemon at {} ({}): {} (is Docker running? DOCKER_HOST or DOCKER_CONTEXT "
                                   "selects another daemon)",
                                   endpoint.describe(), endpoint.source, ec.message()));
    }
    co_return socket;
}

asio::awaitable<asio::ip::tcp::socket> connect_tcp(const Endpoint& endpoint, std::chrono::milliseconds deadline) {
    auto executor = co_await asio::this_coro::executor;
    asio::ip::tcp::socket socket(executor);
    asio::ip::tcp::resolver resolver(executor);
    Watchdog watchdog(executor, [&socket, &resolver] {
        boost::system::error_code ignored;
        resolver.cancel();
        socket.cancel(ignored);
    });
    watchdog.arm(deadline);
    auto [ec, results] = co_await resolver.async_resolve(endpoint.host, endpoint.port, use_tuple);
    for (const auto& entry : results) {
        boost::system::error_code ignored;
        socket.close(ignored);
        std::tie(ec) = co_await socket.async_connect(entry.endpoint(), use_tuple);
        if (!ec || watchdog.expired()) break;
    }
    if (watchdog.expired()) throw Error(0, timed_out(endpoint, deadline));
    if (ec) {
        throw Error(0, fmt::format("cannot reach the Docker daemon at {} ({}): {}", endpoint.describe(), endpoint.source, ec.message()));
    }
    co_return std::move(socket);
}

class UnixTransport final : public Transport {
public:
    explicit UnixTransport(Endpoint endpoint) : endpoint_(std::move(endpoint)) {}
    asio::awaitable<Socket> open(std::chrono::milliseconds deadline) override { co_return co_await connect_unix(endpoint_, deadline); }

private:
    Endpoint endpoint_;
};

class TcpTransport final : public Transport {
public:
    explicit TcpTransport(Endpoint endpoint) : endpoint_(std::move(endpoint)) {}
    asio::awaitable<Socket> open(std::chrono::milliseconds deadline) override {
        auto tcp = co_await connect_tcp(endpoint_, deadline);
        auto executor = tcp.get_executor();
        int family = tcp.local_endpoint().protocol().family();
        co_return Socket(executor, asio::generic::stream_protocol(family, SOCK_STREAM), tcp.release());
    }

private:
    Endpoint endpoint_;
};

// ---- TLS ------------------------------------------------------------------------
// OpenSSL works on the TCP socket's descriptor itself (non-blocking, waiting with
// async_wait), so that a half-close can send close_notify while a read waits:
// Asio's ssl::stream has no way to send close_notify alone.

struct SslCtxFree {
    void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
    void operator()(SSL* ssl) const { SSL_free(ssl); }
};

// One TLS connection and its relay to the client's end of a socketpair.
struct TlsLink {
    asio::ip::tcp::socket tcp;
    asio::local::stream_protocol::socket pair;
    std::unique_ptr<SSL, SslFree> ssl;
    std::shared_ptr<LinkState> state = std::make_shared<LinkState>();
    int running = 2;  // relay directions still going

    // Waits until the socket is ready for what OpenSSL asked; false when the socket is gone.
    asio::awaitable<bool> wait(int error) {
        auto what = error == SSL_ERROR_WANT_WRITE ? asio::socket_base::wait_write : asio::socket_base::wait_read;
        auto [ec] = co_await tcp.async_wait(what, use_tuple);
        co_return !ec;
    }

    void note(std::string failure) {
        if (state->failure.empty()) state->failure = std::move(failure);
    }

    void finish_one() {
        if (--running > 0) return;
        boost::system::error_code ignored;
        tcp.close(ignored);
        pair.close(ignored);
        state->done = true;
    }
};

// Client -> daemon: the client's half-close becomes close_notify.
asio::awaitable<void> relay_up(std::shared_ptr<TlsLink> link) {
    std::vector<char> buffer(16 * 1024);  // a TLS record at most
    SSL* ssl = link->ssl.get();
    for (;;) {
        auto [ec, n] = co_await link->pair.async_read_some(asio::buffer(buffer), use_tuple);
        if (ec) {
            // The client's end has closed or half-closed: tell the daemon it gets no more.
            for (;;) {
                ERR_clear_error();
                int r = SSL_shutdown(ssl);
                int error = r < 0 ? SSL_get_error(ssl, r) : SSL_ERROR_NONE;
                if (error == SSL_ERROR_WANT_WRITE && co_await link->wait(error)) continue;
                break;
            }
            break;
        }
        std::size_t sent = 0;
        bool failed = false;
        while (sent < n && !failed) {
            ERR_clear_error();
            std::size_t written = 0;
            int r = SSL_write_ex(ssl, buffer.data() + sent, n - sent, &written);
            if (r == 1) {
                sent += written;
                continue;
            }
            int error = SSL_get_error(ssl, r);
            if ((error == SSL_ERROR_WANT_WRITE || error == SSL_ERROR_WANT_READ) && co_await link->wait(error)) continue;
            if (error == SSL_ERROR_SSL) link->note("TLS write failed: " + openssl_error());
            failed = true;
        }
        // The other direction reads why (an alert) and ends the client's stream.
        if (failed) break;
    }
    link->finish_one();
}

// Daemon -> client: close_notify (or the end of the TCP stream) becomes a half-close.
asio::awaitable<void> relay_down(std::shared_ptr<TlsLink> link) {
    std::vector<char> buffer(16 * 1024);  // a TLS record at most
    SSL* ssl = link->ssl.get();
    bool answered = false;
    for (;;) {
        ERR_clear_error();
        std::size_t n = 0;
        int r = SSL_read_ex(ssl, buffer.data(), buffer.size(), &n);
        if (r == 1) {
            answered = true;
            auto [ec, written] = co_await asio::async_write(link->pair, asio::buffer(buffer.data(), n), use_tuple);
            if (ec) break;
            continue;
        }
        int error = SSL_get_error(ssl, r);
        if ((error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) && co_await link->wait(error)) continue;
        if (error == SSL_ERROR_SSL) {
            auto reason = openssl_error();
            // TLS 1.3 reports a refused client certificate only after the handshake.
            bool refused = reason.find("alert") != std::string::npos;
            link->note(refused ? fmt::format("TLS: the daemon refused this client ({}): it may want a client certificate "
                                             "(cert.pem and key.pem beside ca.pem)", reason)
                               : "TLS: " + reason);
        } else if ((error == SSL_ERROR_SYSCALL || error == SSL_ERROR_ZERO_RETURN) && !answered) {
            // A reset can drop the alert that said why (TLS 1.3 refuses client certificates late).
            link->note("TLS: the daemon dropped the connection before answering: it may refuse this client "
                       "(no client certificate, or one its CA did not sign)");
        }
        break;
    }
    boost::system::error_code ignored;
    link->pair.shutdown(asio::socket_base::shutdown_send, ignored);
    link->finish_one();
}

bool is_ip_address(const std::string& host) {
    unsigned char buffer[16];
    return ::inet_pton(AF_INET, host.c_str(), buffer) == 1 || ::inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

class TlsTransport final : public Transport {
public:
    explicit TlsTransport(Endpoint endpoint) : endpoint_(std::move(endpoint)), ctx_(SSL_CTX_new(TLS_client_method())) {
        const auto& tls = endpoint_.tls;
        auto fail = [this](std::string_view what, const std::string& file) {
            throw std::invalid_argument(fmt::format("TLS for {} ({}): cannot load {} {}: {}", endpoint_.describe(), endpoint_.source, what, file,
                                                    openssl_error()));
        };
        if (!ctx_) fail("the TLS library", "");
        SSL_CTX_set_min_proto_version(ctx_.get(), TLS1_2_VERSION);
        SSL_CTX_set_options(ctx_.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
        SSL_CTX_set_mode(ctx_.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        if (tls.verify) {
            if (!tls.ca.empty()) {
                if (SSL_CTX_load_verify_locations(ctx_.get(), tls.ca.c_str(), nullptr) != 1) fail("the CA certificate", tls.ca);
            } else if (SSL_CTX_set_default_verify_paths(ctx_.get()) != 1) {
                fail("the system's CA certificates", "");
            }
            SSL_CTX_set_verify(ctx_.get(), SSL_VERIFY_PEER, nullptr);
        } else {
            SSL_CTX_set_verify(ctx_.get(), SSL_VERIFY_NONE, nullptr);
            log::warning("TLS to the Docker daemon at {} without checking its certificate (DOCKER_TLS without DOCKER_TLS_VERIFY, or the "
                         "context skips verification): anyone on the way can pose as the daemon",
                         endpoint_.describe());
        }
        if (!tls.cert.empty()) {
            if (SSL_CTX_use_certificate_chain_file(ctx_.get(), tls.cert.c_str()) != 1) fail("the client certificate", tls.cert);
            if (SSL_CTX_use_PrivateKey_file(ctx_.get(), tls.key.c_str(), SSL_FILETYPE_PEM) != 1) fail("the client key", tls.key);
            if (SSL_CTX_check_private_key(ctx_.get()) != 1) fail("a key that matches the certificate", tls.key);
        }
    }

    asio::awaitable<Socket> open(std::chrono::milliseconds deadline) override {
        auto executor = co_await asio::this_coro::executor;
        auto tcp = co_await connect_tcp(endpoint_, deadline);
        std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx_.get()));
        if (!ssl || SSL_set_fd(ssl.get(), tcp.native_handle()) != 1) throw Error(0, "TLS: " + openssl_error());
        tcp.native_non_blocking(true);
        if (endpoint_.tls.verify) {
            if (is_ip_address(endpoint_.host)) X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), endpoint_.host.c_str());
            else SSL_set1_host(ssl.get(), endpoint_.host.c_str());
        }
        if (!is_ip_address(endpoint_.host)) SSL_set_tlsext_host_name(ssl.get(), endpoint_.host.c_str());

        Watchdog watchdog(executor, [&tcp] {
            boost::system::error_code ignored;
            tcp.cancel(ignored);
        });
        watchdog.arm(deadline);
        for (;;) {
            ERR_clear_error();
            int r = SSL_connect(ssl.get());
            if (r == 1) break;
            int error = SSL_get_error(ssl.get(), r);
            if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
                auto what = error == SSL_ERROR_WANT_WRITE ? asio::socket_base::wait_write : asio::socket_base::wait_read;
                auto [ec] = co_await tcp.async_wait(what, use_tuple);
                if (!ec) continue;
            }
            if (watchdog.expired()) {
                throw Error(0, fmt::format("TLS handshake with the Docker daemon at {} did not finish within {} (is it a TLS port?)",
                                           endpoint_.describe(), describe(deadline)));
            }
            throw Error(0, handshake_failure(ssl.get(), error));
        }

        asio::local::stream_protocol::socket ours(executor), theirs(executor);
        asio::local::connect_pair(ours, theirs);
        auto link = std::make_shared<TlsLink>(TlsLink{std::move(tcp), std::move(theirs), std::move(ssl)});
        links_.add(ours.native_handle(), link->state);
        asio::co_spawn(executor, relay_up(link), asio::detached);
        asio::co_spawn(executor, relay_down(link), asio::detached);
        co_return as_generic(ours);
    }

    asio::awaitable<std::string> explain(int connection) override {
        co_return co_await wait_for(links_.find(connection), std::chrono::milliseconds(500));
    }

private:
    std::string handshake_failure(SSL* ssl, int error) {
        std::string why;
        long verify = SSL_get_verify_result(ssl);
        if (verify != X509_V_OK) {
            why = fmt::format("the daemon's certificate was refused: {} (checked against {})", X509_verify_cert_error_string(verify),
                              endpoint_.tls.ca.empty() ? "the system's CA certificates" : endpoint_.tls.ca);
        } else if (error == SSL_ERROR_SSL) {
            why = openssl_error();
        } else {
            why = "the daemon closed the connection (is it a TLS port? does it want a client certificate?)";
        }
        return fmt::format("TLS handshake with the Docker daemon at {} ({}) failed: {}", endpoint_.describe(), endpoint_.source, why);
    }

    Endpoint endpoint_;
    std::unique_ptr<SSL_CTX, SslCtxFree> ctx_;
    Links links_;
};

// ---- ssh --------------------------------------------------------------------------

// In the child before exec: its own process group (a terminal's Ctrl-C is for the
// server, which still needs the connection to remove its sandboxes), gone with the
// server, and none of the server's descriptors (Boost.Process 1.81 leaves them open;
// a copy of another connection's socket would keep that connection from ending).
struct SshChildSetup {
    template <typename Launcher>
    bp::error_code on_exec_setup(Launcher&, const bp::filesystem::path&, const char* const*) {
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        close_inherited_descriptors();
        return {};
    }
};

struct SshChild {
    explicit SshChild(asio::any_io_executor executor) : errors(executor), process(executor) {}
    asio::readable_pipe errors;
    bp::process process;
    std::shared_ptr<LinkState> state = std::make_shared<LinkState>();
};

// Outlives the transport while its watchers still run.
struct SshChildren {
    Endpoint endpoint;
    std::list<std::shared_ptr<SshChild>> live;
};

// Collects a child's stderr, then its exit status; forgets the child once it has ended.
asio::awaitable<void> watch(std::shared_ptr<SshChildren> children, std::shared_ptr<SshChild> child) {
    std::string errors;
    char buffer[1024];
    for (;;) {
        auto [ec, n] = co_await child->errors.async_read_some(asio::buffer(buffer), use_tuple);
        if (ec) break;
        errors.append(buffer, n);
        if (errors.size() > 4096) errors.erase(0, errors.size() - 4096);
    }
    auto [ec, code] = co_await child->process.async_wait(use_tuple);
    while (!errors.empty() && (errors.back() == '\n' || errors.back() == '\r')) errors.pop_back();
    auto where = children->endpoint.describe();
    if (!ec && code != 0) {
        child->state->failure = fmt::format("ssh to {} exited with status {}{}{}", where, code, errors.empty() ? "" : ": ", errors);
        if (code == 255) child->state->failure += " (ssh itself failed: check the host, port, user and key, e.g. with ssh -o BatchMode=yes)";
        else if (code == 127) child->state->failure += " (is docker installed and in PATH on the remote host?)";
        log::debug("{}", child->state->failure);
    } else {
        log::debug("ssh {} for {} ended", child->process.id(), where);
    }
    child->state->done = true;
    children->live.remove(child);
}

class SshTransport final : public Transport {
public:
    explicit SshTransport(Endpoint endpoint) : endpoint_(std::move(endpoint)), children_(std::make_shared<SshChildren>(SshChildren{endpoint_, {}})) {}

    ~SshTransport() override {
        // The server is ending: no ssh outlives it.
        auto& live = children_->live;
        for (auto& child : live) {
            boost::system::error_code ec;
            if (child->process.running(ec)) ::kill(child->process.id(), SIGTERM);
        }
        for (int i = 0; i < 50 && std::any_of(live.begin(), live.end(), [](auto& child) {
                            boost::system::error_code ec;
                            return child->process.running(ec);
                        });
             ++i) {
            ::usleep(10000);
        }
        // What is still running is killed and reaped by ~process.
    }

    asio::awaitable<Socket> open(std::chrono::milliseconds) override {
        auto executor = co_await asio::this_coro::executor;
        auto program = bp::environment::find_executable("ssh");
        if (program.empty()) {
            throw Error(0, fmt::format("{} ({}) needs the ssh client, and there is no ssh in PATH (install openssh-client)",
                                       endpoint_.describe(), endpoint_.source));
        }
        std::vector<std::string> args{"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30"};
        if (!endpoint_.ssh_config.empty()) args.insert(args.end(), {"-F", endpoint_.ssh_config});
        if (!endpoint_.user.empty()) args.insert(args.end(), {"-l", endpoint_.user});
        if (!endpoint_.port.empty()) args.insert(args.end(), {"-p", endpoint_.port});
        args.insert(args.end(), {"--", endpoint_.host, "docker", "system", "dial-stdio"});

        asio::local::stream_protocol::socket ours(executor), theirs(executor);
        asio::local::connect_pair(ours, theirs);
        auto child = std::make_shared<SshChild>(executor);
        asio::writable_pipe error_end(executor);
        asio::connect_pipe(child->errors, error_end);
        try {
            child->process = bp::process(executor, program, args, bp::process_stdio{theirs.native_handle(), theirs.native_handle(), error_end},
                                         SshChildSetup{});
        } catch (const std::exception& e) {
            throw Error(0, fmt::format("cannot start ssh for {} ({}): {}", endpoint_.describe(), endpoint_.source, e.what()));
        }
        log::debug("ssh {} started for a connection to {}", child->process.id(), endpoint_.describe());
        theirs.close();
        error_end.close();
        children_->live.push_back(child);
        links_.add(ours.native_handle(), child->state);
        asio::co_spawn(executor, watch(children_, child), asio::detached);
        co_return as_generic(ours);
    }

    asio::awaitable<std::string> explain(int connection) override {
        co_return co_await wait_for(links_.find(connection), std::chrono::seconds(2));
    }

private:
    Endpoint endpoint_;
    std::shared_ptr<SshChildren> children_;
    Links links_;
};

} // namespace

asio::awaitable<std::string> Transport::explain(int) { co_return std::string(); }

std::unique_ptr<Transport> Transport::make(asio::any_io_executor, const Endpoint& endpoint) {
    switch (endpoint.kind) {
    case Endpoint::Kind::unix_socket: return std::make_unique<UnixTransport>(endpoint);
    case Endpoint::Kind::ssh: return std::make_unique<SshTransport>(endpoint);
    case Endpoint::Kind::tcp:
        if (endpoint.tls.enabled) return std::make_unique<TlsTransport>(endpoint);
        if (endpoint.port == "2376") {
            log::warning("the Docker daemon at {} is reached without TLS, but 2376 is Docker's TLS port: set DOCKER_TLS_VERIFY=1 (and "
                         "DOCKER_CERT_PATH) or --docker-tls-verify if it expects TLS",
                         endpoint.describe());
        }
        return std::make_unique<TcpTransport>(endpoint);
    }
    throw std::invalid_argument("unknown endpoint kind");
}

Transport::Socket relay_tls(asio::ip::tcp::socket tcp, ssl_st* ssl) {
    auto executor = tcp.get_executor();
    asio::local::stream_protocol::socket ours(executor), theirs(executor);
    asio::local::connect_pair(ours, theirs);
    auto link = std::make_shared<TlsLink>(TlsLink{std::move(tcp), std::move(theirs), std::unique_ptr<SSL, SslFree>(ssl)});
    asio::co_spawn(executor, relay_up(link), asio::detached);
    asio::co_spawn(executor, relay_down(link), asio::detached);
    return as_generic(ours);
}

} // namespace cubicle::docker
