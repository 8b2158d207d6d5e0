// Newline-delimited JSON-RPC over stdin/stdout. Blocking reads and writes run
// on two small threads so that any kind of file works (pipes, files, ttys);
// every message is handled on the io_context's thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <boost/asio/any_io_executor.hpp>

namespace cubicle::mcp {

class StdioTransport {
public:
    // Lines longer than this are refused with an error under their id (write_file
    // content travels inline, hence the size).
    static constexpr std::size_t max_line = 64u << 20;

    StdioTransport(boost::asio::any_io_executor executor, int in_fd, int out_fd);
    ~StdioTransport();

    // `on_line` gets each message; `on_eof` once when the input ends; both on the executor.
    void start(std::function<void(std::string)> on_line, std::function<void()> on_eof);
    // Thread-safe; appends the newline. Messages go out whole and in order.
    void send(std::string message);
    // Writes everything queued, then stops the writer.
    void flush_and_stop();

private:
    void read_loop();
    void write_loop();
    // Answers a line that was too long to read; `id_json` is its id or null.
    void refuse_oversized(const std::string& id_json);

    boost::asio::any_io_executor executor_;
    int in_fd_;
    int out_fd_;
    std::function<void(std::string)> on_line_;
    std::function<void()> on_eof_;
    std::thread reader_;
    std::thread writer_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::string> queue_;
    bool stopping_ = false;
};

} // namespace cubicle::mcp
