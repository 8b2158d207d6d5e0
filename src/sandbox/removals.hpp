// Background removals take turns, a few at a time: a burst of them (a pool
// emptied for idleness, many throwaway runs ending at once) would otherwise
// crowd out, on the same daemon, the container starts that clients wait for.
// Measured here: a start took 0.5 s alone and 2-8 s while 20 containers were
// being removed at once (0.8-1.9 s with 2 at a time).
#pragma once

#include <cstddef>
#include <deque>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

namespace cubicle::sandbox {

class RemovalTurns {
    struct State;

public:
    // Held while removing; the next waiter's turn comes when it ends.
    class Turn {
    public:
        explicit Turn(std::shared_ptr<State> state) : state_(std::move(state)) {}
        Turn(Turn&&) = default;
        Turn& operator=(Turn&&) = delete;
        ~Turn();

    private:
        std::shared_ptr<State> state_;
    };

    RemovalTurns(boost::asio::any_io_executor executor, std::size_t at_once);
    boost::asio::awaitable<Turn> wait();
    // From now on nobody waits (shutdown removes everything at once).
    void open();

private:
    boost::asio::any_io_executor executor_;
    std::shared_ptr<State> state_;  // shared with the turns: a turn may end after the server object
};

} // namespace cubicle::sandbox
