// Runs several coroutines at once and waits for every one to end (shutdown's
// removals: they must all be under way before the client's patience runs out).
#pragma once

#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

namespace cubicle {

// Each task reports its own failures: an exception that escapes one is dropped.
boost::asio::awaitable<void> all_at_once(boost::asio::any_io_executor executor,
                                         std::vector<boost::asio::awaitable<void>> tasks);

} // namespace cubicle
