// The lifetimes of the sandboxes made by initialize_sandbox: an idle one is paused
// (the Engine's cgroup freezer) and thawed by its next call; one unused for its
// ttl_s is ended; and why each recently ended one is gone is kept for its owner.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "docker/client.hpp"
#include "sandbox/lifetime_rules.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

class Sandbox;

class Lifetimes {
    struct Life;

public:
    // Ends a sandbox (Manager::end): what the watcher calls for an expired one.
    using Ender = std::function<asio::awaitable<void>(std::string id, EndReason reason)>;
    // `idle_pause` 0: never paused.
    Lifetimes(asio::any_io_executor executor, docker::Client& docker, std::chrono::seconds idle_pause, Ender end);

    // Starts keeping a client's sandbox; `ttl` 0: it never expires. A shared-container
    // workspace expires but is never paused (the container is others' too).
    void adopt(const std::shared_ptr<Sandbox>& box, std::chrono::seconds ttl);
    // Stops keeping it without a record (a removal that is not the end of a client's sandbox).
    void forget(const std::string& id);

    // A call on a sandbox, from its start to its end: it is never paused or expired
    // meanwhile, and its end counts as use (idle time and ttl_s start again).
    class Use {
    public:
        Use() = default;
        explicit Use(std::shared_ptr<Life> life);
        Use(Use&& other) noexcept = default;
        Use& operator=(Use&& other) noexcept;
        ~Use();

    private:
        void end();
        std::shared_ptr<Life> life_;
    };
    // A call on `owner`'s sandbox `id` begins: a paused one is thawed first. Nothing
    // happens for an id that is not kept (the call's own lookup says what it is).
    asio::awaitable<Use> use(std::string id, std::string owner);
    // Before a removal or a call to the Engine about its container (an archive upload):
    // waits for a resume under way, and resumes it when paused.
    asio::awaitable<void> thaw(std::string id);
    // Every paused sandbox at once (the server's exit: what it still asks of their agents).
    asio::awaitable<void> thaw_all();

    // Stops keeping it and records why it ended, for its owner's status and next calls.
    void ended(const std::string& id, EndReason reason);
    const EndedSandbox* ended_sandbox(const std::string& owner, const std::string& id) const { return ended_.find(owner, id); }
    const std::deque<EndedSandbox>& ended_of(const std::string& owner) const { return ended_.of(owner); }

    // What get_sandbox_status shows; never touches the container.
    struct View {
        bool paused = false;
        std::int64_t ttl_s = 0;  // 0: none
        std::optional<WallClock::time_point> expires_at;
    };
    std::optional<View> view(const std::string& id) const;

    // Pauses idle sandboxes and ends expired ones until close().
    asio::awaitable<void> watch();
    void close() { closed_ = true; }

private:
    // Pauses a sandbox; an engine that refuses is said once and asked no more.
    asio::awaitable<void> pause(std::shared_ptr<Life> life);
    asio::awaitable<void> resume(std::shared_ptr<Life> life);
    // resume in two steps: the state at once, the Engine's unpause (never throws) after.
    void begin_resume(Life& life);
    asio::awaitable<void> finish_resume(std::shared_ptr<Life> life);
    // Waits while a pause or resume of `life` is under way.
    asio::awaitable<void> settled(std::shared_ptr<Life> life);

    asio::any_io_executor executor_;
    docker::Client& docker_;
    std::chrono::seconds idle_pause_;
    Ender end_;
    bool pauses_ = true;  // the engine has not refused a pause
    bool closed_ = false;
    std::map<std::string, std::shared_ptr<Life>> lives_;  // by sandbox id
    EndedRecord ended_;
};

} // namespace cubicle::sandbox
