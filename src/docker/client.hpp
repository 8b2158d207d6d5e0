// A Docker Engine API client over any endpoint docker/transport reaches (unix, tcp, TLS, ssh).
// Knows nothing of MCP; every call is a coroutine.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "docker/endpoint.hpp"
#include "docker/engine.hpp"

namespace cubicle::docker {

namespace asio = boost::asio;

// How long each step of an Engine request may take: connecting, sending the
// request, waiting for the answer's headers, and any pause inside its body.
// A stalled daemon thus fails a call instead of hanging it. Hijacked streams
// (attach, exec) have no read deadline once upgraded; close() ends them.
struct Deadlines {
    std::chrono::milliseconds connect = std::chrono::seconds(5);
    std::chrono::milliseconds step = std::chrono::seconds(30);
};

// A failure reported by the daemon (status >= 400) or in reaching it (status 0,
// a deadline included).
class Error : public std::runtime_error {
public:
    Error(unsigned status, std::string message)
        : std::runtime_error(std::move(message)), status_(status) {}
    unsigned status() const { return status_; }

private:
    unsigned status_;
};

// A connection taken over after an HTTP upgrade (attach, exec start): raw bytes
// in both directions.
class RawStream {
public:
    virtual ~RawStream() = default;
    // Reads what is available (at least one byte); returns 0 at end of stream.
    virtual asio::awaitable<std::size_t> read_some(char* data, std::size_t size) = 0;
    // Queues `data` for writing; writes happen in order and never interleave.
    virtual void send(std::string data) = 0;
    // Ends the sending side once everything queued is written (the process sees EOF on stdin).
    virtual void close_write() = 0;
    virtual void close() = 0;
};

struct ContainerSummary {
    std::string id;
    std::string state;  // created, running, exited, dead, ...
    std::int64_t created = 0;  // unix seconds
    std::map<std::string, std::string> labels;
};

// A Swarm task (GET /tasks): where and how one replica of a service runs.
struct SwarmTask {
    std::string id;
    std::string service_id;
    std::string node_id;
    std::string state;          // Status.State: new ... running, complete, failed, rejected, orphaned ...
    std::string desired_state;  // running, shutdown, ...
    std::string error;          // Status.Err
    std::string created_at;     // RFC 3339: orders a service's tasks
    // Its addresses (CIDR) on each network it is attached to, by network id.
    std::map<std::string, std::vector<std::string>> addresses;
};

struct ImageInfo {
    std::string id;
    std::string architecture;
    std::int64_t size = 0;  // bytes
    std::map<std::string, std::string> labels;
};

// A request body read piece by piece (a root filesystem tarball from a pipe).
class ByteSource {
public:
    virtual ~ByteSource() = default;
    // Reads at least one byte; returns 0 at the end. Throws when the producer failed.
    virtual asio::awaitable<std::size_t> read_some(char* data, std::size_t size) = 0;
};

// Lines of progress from a long image operation (a pull), already readable.
using ProgressSink = std::function<void(std::string_view)>;

struct DaemonInfo {
    std::string api_version;
    std::string id;  // the engine's own id (/info ID); empty when it has none
    std::vector<std::string> runtimes;
    bool nvidia_runtime() const;
};

class Client {
public:
    Client(asio::any_io_executor executor, Endpoint endpoint, Deadlines deadlines = {});
    ~Client();
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    // Throws std::invalid_argument when the endpoint's TLS material cannot be loaded.
    // Negotiates the API version from /_ping (floor 1.41) and learns which engine
    // answers (engine.hpp). Throws Error with a clear message when the daemon cannot
    // be reached.
    asio::awaitable<void> connect();
    const std::string& api_version() const;
    // Docker until connect() has learnt otherwise.
    const Engine& engine() const;
    const Endpoint& endpoint() const;

    asio::awaitable<std::string> create_container(std::string config_json, std::string name = {});
    asio::awaitable<void> start_container(std::string id);
    asio::awaitable<void> kill_container(std::string id, std::string signal = "KILL");
    // Freezes every process of the container (the cgroup freezer) and thaws them again.
    asio::awaitable<void> pause_container(std::string id);
    asio::awaitable<void> unpause_container(std::string id);
    // Kills if needed and removes the container with its anonymous volumes.
    asio::awaitable<void> remove_container(std::string id);
    asio::awaitable<std::vector<ContainerSummary>> list_containers(std::string label_filter);
    asio::awaitable<void> put_archive(std::string id, std::string path, std::string tar);
    // Throws Error when the archive is larger than `max_bytes`.
    asio::awaitable<std::string> get_archive(std::string id, std::string path, std::uint64_t max_bytes);
    // Networks: an internal (no route out) bridge network of our own, joining one (known on it
    // by `aliases` too, running or not), leaving one (not on it is no error), removing it.
    asio::awaitable<std::string> create_network(std::string config_json);
    // `address`: the container's IPv4 address there (a network with a subnet of its own); empty, the Engine's choice.
    asio::awaitable<void> connect_network(std::string network, std::string container_id, std::vector<std::string> aliases = {},
                                          std::string address = {});
    asio::awaitable<void> disconnect_network(std::string network, std::string container_id);
    asio::awaitable<void> remove_network(std::string network);
    // The address of the network's gateway (its first IPAM entry); empty when it has none.
    asio::awaitable<std::string> network_gateway(std::string network);
    // Ids of networks carrying `label_filter` with their labels.
    asio::awaitable<std::vector<ContainerSummary>> list_networks(std::string label_filter);
    // Named volumes: creating one (POST /volumes/create, an existing name is no error on
    // Docker), removing one (gone already is no error; Error 409 while a container uses
    // it), and the names (as `id`) of those carrying `label_filter` with their labels.
    asio::awaitable<void> create_volume(std::string config_json);
    asio::awaitable<void> remove_volume(std::string name);
    asio::awaitable<std::vector<ContainerSummary>> list_volumes(std::string label_filter);
    // The volume's labels (name as `id`); nullopt when there is no such volume.
    asio::awaitable<std::optional<ContainerSummary>> inspect_volume(std::string name);

    // Runs a process in a running container (the fallback when the agent cannot run):
    // create, then start over a hijacked connection, then read its exit code.
    asio::awaitable<std::string> exec_create(std::string id, std::string config_json);
    asio::awaitable<std::unique_ptr<RawStream>> exec_start(std::string exec_id);
    asio::awaitable<int> exec_exit_code(std::string exec_id);
    // Attaches to stdin/stdout/stderr of a created or running container.
    asio::awaitable<std::unique_ptr<RawStream>> attach(std::string id);
    // nullopt when the image is not present locally.
    asio::awaitable<std::optional<ImageInfo>> inspect_image(std::string image);
    // The names (REPOSITORY:TAG, sorted) of the local images carrying `label_filter`.
    asio::awaitable<std::vector<std::string>> list_images(std::string label_filter);
    asio::awaitable<DaemonInfo> info();

    // ---- Swarm (the endpoint is a manager) ----
    // POST /services/create; returns the service's id.
    asio::awaitable<std::string> create_service(std::string spec_json);
    // DELETE /services/{id}; a service already gone is not an error.
    asio::awaitable<void> remove_service(std::string id);
    // The services carrying `label_filter` (KEY=VALUE), each as its id and its Spec's labels.
    asio::awaitable<std::vector<ContainerSummary>> list_services(std::string label_filter);
    // The tasks of `services` (GET /tasks?filters=service), newest first per service.
    asio::awaitable<std::vector<SwarmTask>> list_tasks(std::vector<std::string> services);
    // The ids of the nodes Swarm says are down or disconnected (not those still "unknown").
    asio::awaitable<std::vector<std::string>> nodes_lost();
    // POST /build of a context tarball (a Dockerfile at its top) as image `tag`; throws Error
    // with the builder's message when the build fails.
    asio::awaitable<void> build_image(std::string context_tar, std::string tag);

    // ---- images ----
    // Pulls an image, reporting progress as it goes (at most a line every half
    // second); throws Error with the daemon's message on failure.
    asio::awaitable<void> pull_image(std::string image, ProgressSink progress = {});
    // Pushes REGISTRY/REPOSITORY:TAG to its registry (no credentials), as pull_image reports.
    asio::awaitable<void> push_image(std::string image, ProgressSink progress = {});
    // Streams a root filesystem tarball into a new untagged image
    // (POST /images/create?fromSrc=-) with Dockerfile-style `changes`; returns its id.
    asio::awaitable<std::string> import_image(std::shared_ptr<ByteSource> tarball, std::vector<std::string> changes, std::string message);
    asio::awaitable<void> tag_image(std::string image, std::string repository, std::string tag);
    // Removes an image unless a container still uses it (or it is gone already).
    asio::awaitable<void> remove_image(std::string image);

    struct Response {
        unsigned status = 0;
        std::string body;
    };
    // One API call; `target` is the path without the version prefix.
    asio::awaitable<Response> request(std::string method, std::string target, std::string body = {},
                                      std::string content_type = "application/json",
                                      std::uint64_t max_body = std::uint64_t(1) << 31);

private:
    asio::awaitable<void> stream_image_operation(std::string target, std::string what, ProgressSink progress);
    // POSTs to `target` asking for an upgrade and returns the raw connection.
    asio::awaitable<std::unique_ptr<RawStream>> hijack(std::string target, std::string body, std::string what);

    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Reads the parts of GET /info that cubicle uses.
DaemonInfo parse_daemon_info(std::string_view info_json);

// Percent-encodes a query parameter value.
std::string url_encode(std::string_view text);

} // namespace cubicle::docker
