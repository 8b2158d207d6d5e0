// The volume containers take the agent from, mounted read-only: the agent is written
// once instead of once per container. Named by the agent's digest and shared by every
// server of that agent on the daemon, it outlives them: a server's first sandbox then
// waits for one volume lookup, not for a container that copies the agent in (~200 ms).
//
// Why this is safe to share (it was one volume per server before):
// - Nothing is ever rewritten: the agent goes in under a name of its own
//   (`.agent-<random>`) and `agent` is a symbolic link made after it, so a container
//   never runs a half-written file, and a second writer (two servers filling it at
//   once, or a repair) adds a file and re-points the link while running agents keep theirs.
// - It is never removed while in use: each server that uses it holds a container that
//   mounts it (created, never started; labelled as the server's, so it goes with the
//   server, or with the orphan sweep once the server is dead), and the daemon refuses to
//   remove a volume any container mounts. Only volumes of other agents (an older
//   cubicle) are removed, by the orphan sweep, and only when the daemon allows it.
// - Its name tells a sandbox the agent's digest and nothing of the server (a container's
//   mount table shows the volume's host path to its programs).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "docker/client.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

class AgentVolume {
public:
    AgentVolume(asio::any_io_executor executor, docker::Client& docker, std::string instance);

    const std::string& name() const { return name_; }
    // The volume's name once it holds the agent: found on the daemon, or written
    // (through a container of `image`); concurrent calls wait for the first. Empty when
    // it cannot be had: the caller copies the agent into its own container instead, and
    // the next call tries again.
    asio::awaitable<std::string> ensure(std::string image);
    // After a container failed to start from it: whether the volume should be written
    // again and the start retried. Yes when another server wrote it (this one has not
    // seen it work: that server's fill may have been cut short) or when it lost its
    // label (removed behind our back, e.g. `docker volume prune`, and made anew, empty,
    // by the daemon for the next container naming it: that one is removed).
    asio::awaitable<bool> repair();
    // Creates this server's container that holds the volume (see above), once the
    // volume is ready; the orphan sweep calls it, off the first sandbox's path (until
    // then this server's sandboxes mount it, and a volume removed meanwhile is written
    // again by repair()).
    asio::awaitable<void> hold();
    // Returns once no holding container is being made (shutdown: then every container
    // of this server is there for it to remove).
    asio::awaitable<void> settle();
    // Whether a volume with these labels is a shared agent volume of another agent (an
    // older or newer cubicle's), which the orphan sweep removes when nothing mounts it.
    bool stale(const std::map<std::string, std::string>& labels) const;

private:
    asio::awaitable<void> find_or_fill(std::string image);
    asio::awaitable<void> fill(std::string image);

    asio::any_io_executor executor_;
    docker::Client& docker_;
    std::string instance_;
    std::string digest_;
    std::string name_;
    enum class State { idle, filling, ready } state_ = State::idle;
    std::string holder_;         // this server's container that holds the volume (and writes into it)
    std::string image_;          // what the holder is created from: the image of the volume's first user
    bool written_here_ = false;  // this server wrote it (the last fill was its own)
    bool rewrite_ = false;       // the next ensure() writes it even though it exists
    bool held_ = false;          // the holding container exists (or is being made)
    bool holding_ = false;       // hold() is making it
    bool warned_ = false;        // the first failure is a warning, later ones are not repeated
    std::vector<std::shared_ptr<asio::steady_timer>> waiting_;
};

} // namespace cubicle::sandbox
