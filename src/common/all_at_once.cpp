#include "common/all_at_once.hpp"

#include <memory>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace cubicle {

namespace asio = boost::asio;

asio::awaitable<void> all_at_once(asio::any_io_executor executor, std::vector<asio::awaitable<void>> tasks) {
    struct Countdown {
        std::size_t left;
        asio::steady_timer done;  // cancelled when the last task ends
    };
    auto countdown = std::make_shared<Countdown>(
        Countdown{tasks.size(), asio::steady_timer(executor, asio::steady_timer::time_point::max())});
    for (auto& task : tasks) {
        asio::co_spawn(executor, std::move(task), [countdown](std::exception_ptr) {
            if (--countdown->left == 0) countdown->done.cancel();
        });
    }
    if (countdown->left > 0) co_await countdown->done.async_wait(asio::as_tuple(asio::use_awaitable));
}

} // namespace cubicle
