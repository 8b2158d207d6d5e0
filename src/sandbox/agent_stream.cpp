#include "sandbox/agent_stream.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace cubicle::sandbox {
namespace {

namespace asio = boost::asio;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// Credit goes back in batches, like the agent's: the agent still holds most of a
// window, so it never waits, and a small answer costs no extra frame.
constexpr std::uint64_t window_batch = CUBICLE_STREAM_WINDOW / 4;

} // namespace

AgentStream::AgentStream(asio::any_io_executor executor, std::uint32_t id, FrameSender send)
    : executor_(executor), id_(id), send_(std::move(send)), changed_(executor, asio::steady_timer::time_point::max()),
      credit_(CUBICLE_STREAM_WINDOW) {}

AgentStream::~AgentStream() {
    if (!finished()) abort("the relay closed");
}

void AgentStream::wake() { changed_.cancel(); }

void AgentStream::fail(std::string why) {
    if (broken_) return;
    broken_ = true;
    error_ = std::move(why);
    wake();  // what arrived before stays readable: a program may answer, then break

}

asio::awaitable<bool> AgentStream::connected(std::chrono::steady_clock::duration timeout) {
    // Nobody else waits yet: the wake-up timer doubles as the deadline.
    changed_.expires_after(timeout);
    while (!connected_ && !broken_) {
        auto [ec] = co_await changed_.async_wait(use_tuple);
        if (!ec) abort(fmt::format("the sandbox's agent did not connect within {} s", std::chrono::ceil<std::chrono::seconds>(timeout).count()));
    }
    changed_.expires_at(asio::steady_timer::time_point::max());
    co_return connected_ && !broken_;
}

asio::awaitable<std::size_t> AgentStream::read_some(char* data, std::size_t size) {
    while (incoming_.empty() && !read_eof_ && !broken_) co_await changed_.async_wait(use_tuple);
    if (incoming_.empty()) co_return 0;
    std::size_t n = 0;
    while (n < size && !incoming_.empty()) {
        auto& front = incoming_.front();
        std::size_t take = std::min(size - n, front.size() - incoming_offset_);
        std::copy_n(front.data() + incoming_offset_, take, data + n);
        n += take;
        incoming_offset_ += take;
        if (incoming_offset_ == front.size()) {
            incoming_.pop_front();
            incoming_offset_ = 0;
        }
    }
    unacked_ += n;
    if (unacked_ >= window_batch && !broken_) {
        buffered_ -= unacked_;
        send_(agent::encode(agent::FrameType::window, id_, std::to_string(unacked_)));
        unacked_ = 0;
    }
    co_return n;
}

asio::awaitable<bool> AgentStream::write(std::string_view data) {
    while (!data.empty()) {
        while (credit_ == 0 && !broken_) co_await changed_.async_wait(use_tuple);
        if (broken_ || write_shut_) co_return false;
        std::size_t n = std::min({data.size(), std::size_t{CUBICLE_STREAM_CHUNK}, static_cast<std::size_t>(credit_)});
        send_(agent::encode(agent::FrameType::data, id_, data.substr(0, n)));
        credit_ -= n;
        data.remove_prefix(n);
    }
    co_return !broken_;
}

void AgentStream::shutdown_write() {
    if (broken_ || write_shut_) return;
    write_shut_ = true;
    send_(agent::encode(agent::FrameType::shut, id_));
}

void AgentStream::abort(std::string_view why) {
    if (finished()) return;
    send_(agent::encode(agent::FrameType::shut, id_, why.empty() ? "aborted" : why));
    fail(std::string(why));
}

void AgentStream::on_closed(std::string why) { fail(std::move(why)); }

void AgentStream::on_frame(agent::FrameType type, std::string payload) {
    using agent::FrameType;
    switch (type) {
    case FrameType::connected:
        connected_ = true;
        wake();
        break;
    case FrameType::error:
        fail(std::move(payload));
        break;
    case FrameType::data:
        // Empty DATA carries nothing (queued, it would read as the end of the stream).
        if (read_eof_ || broken_ || payload.empty()) break;
        buffered_ += payload.size();
        if (buffered_ > CUBICLE_STREAM_WINDOW) {  // an agent past its window: never buffer without bound
            abort("DATA beyond the window");
            break;
        }
        incoming_.push_back(std::move(payload));
        wake();
        break;
    case FrameType::shut:
        if (payload.empty()) {
            read_eof_ = true;
            wake();
        } else {
            fail("the program's connection broke: " + payload);
        }
        break;
    case FrameType::window: {
        std::uint64_t more = 0;
        auto [end, ec] = std::from_chars(payload.data(), payload.data() + payload.size(), more);
        if (ec != std::errc() || end != payload.data() + payload.size() || more > CUBICLE_STREAM_WINDOW - credit_) {
            abort("malformed WINDOW");
            break;
        }
        credit_ += more;
        wake();
        break;
    }
    default:
        break;
    }
}

} // namespace cubicle::sandbox
