#include "mcp/stdio.hpp"

#include <unistd.h>

#include <cerrno>

#include <boost/asio/post.hpp>

#include "common/log.hpp"

namespace cubicle::mcp {

StdioTransport::StdioTransport(boost::asio::any_io_executor executor, int in_fd, int out_fd)
    : executor_(std::move(executor)), in_fd_(in_fd), out_fd_(out_fd) {}

StdioTransport::~StdioTransport() {
    flush_and_stop();
    // The reader may sit in read(2) on a terminal that never closes; the
    // process is ending, so it is left to exit with it.
    if (reader_.joinable()) reader_.detach();
}

void StdioTransport::start(std::function<void(std::string)> on_line, std::function<void()> on_eof) {
    on_line_ = std::move(on_line);
    on_eof_ = std::move(on_eof);
    writer_ = std::thread([this] { write_loop(); });
    reader_ = std::thread([this] { read_loop(); });
}

void StdioTransport::read_loop() {
    std::string pending;
    std::string chunk(64 * 1024, '\0');
    bool discarding = false;  // inside an over-long line
    for (;;) {
        ssize_t n = ::read(in_fd_, chunk.data(), chunk.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        std::size_t start = 0;
        for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
            if (chunk[i] != '\n') continue;
            if (!discarding) {
                pending.append(chunk, start, i - start);
                if (!pending.empty() && pending.back() == '\r') pending.pop_back();
                if (!pending.empty()) {
                    boost::asio::post(executor_, [this, line = std::move(pending)]() mutable { on_line_(std::move(line)); });
                }
            }
            pending.clear();
            discarding = false;
            start = i + 1;
        }
        if (!discarding) pending.append(chunk, start, static_cast<std::size_t>(n) - start);
        if (pending.size() > max_line) {
            log::error("dropping an inbound message longer than {} bytes", max_line);
            boost::asio::post(executor_, [this] { on_line_("{\"oversized\":"); });  // answered as a parse error
            pending.clear();
            discarding = true;
        }
    }
    if (!pending.empty() && !discarding) {
        boost::asio::post(executor_, [this, line = std::move(pending)]() mutable { on_line_(std::move(line)); });
    }
    boost::asio::post(executor_, [this] { on_eof_(); });
}

void StdioTransport::send(std::string message) {
    message += '\n';
    {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(message));
    }
    wake_.notify_one();
}

void StdioTransport::write_loop() {
    for (;;) {
        std::deque<std::string> batch;
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty() && stopping_) return;
            batch.swap(queue_);
        }
        for (const auto& message : batch) {
            std::size_t done = 0;
            while (done < message.size()) {
                ssize_t n = ::write(out_fd_, message.data() + done, message.size() - done);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) return;  // the client is gone; nothing more can be said
                done += static_cast<std::size_t>(n);
            }
        }
    }
}

void StdioTransport::flush_and_stop() {
    {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        stopping_ = true;
    }
    wake_.notify_one();
    if (writer_.joinable()) writer_.join();
}

} // namespace cubicle::mcp
