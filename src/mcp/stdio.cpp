#include "mcp/stdio.hpp"

#include <unistd.h>

#include <cerrno>
#include <optional>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include "common/json.hpp"
#include "common/log.hpp"
#include "mcp/session.hpp"

namespace cubicle::mcp {
namespace {

// Finds the top-level "id" of a message read in pieces, without keeping the
// message: a line too long to handle still gets its error under its own id
// (wherever the id sits: SDKs put it before or after the params).
class IdScanner {
public:
    void feed(std::string_view bytes) {
        for (char c : bytes) step(c);
    }

    // The id as JSON text, or "null" when none could be read.
    std::string id() const {
        if (!found_) return "null";
        json::Document document;
        if (document.parse(id_)) return "null";
        auto type = document.root().type();
        bool usable = type == simdjson::dom::element_type::STRING || type == simdjson::dom::element_type::INT64 ||
                      type == simdjson::dom::element_type::UINT64;
        return usable ? id_ : "null";
    }

private:
    static constexpr std::size_t max_id = 256;

    void step(char c) {
        if (in_string_) {
            if (escaped_) {
                escaped_ = false;
            } else if (c == '\\') {
                escaped_ = true;
            } else if (c == '"') {
                in_string_ = false;
                if (reading_key_) {
                    reading_key_ = false;
                    key_is_id_ = key_ == "id";
                    return;
                }
            }
            if (reading_key_) {
                if (key_.size() < 3) key_ += c;
                else key_ = "long";
            }
            if (reading_id_) keep(c);
            return;
        }
        if (reading_id_ && depth_ == 1 && (c == ',' || c == '}')) {
            reading_id_ = false;
            found_ = !overflow_;
        }
        switch (c) {
        case '"':
            in_string_ = true;
            if (depth_ == 1 && expect_key_) {
                reading_key_ = true;
                expect_key_ = false;
                key_.clear();
            }
            break;
        case '{':
        case '[':
            ++depth_;
            if (depth_ == 1) expect_key_ = c == '{';
            break;
        case '}':
        case ']':
            --depth_;
            break;
        case ',':
            if (depth_ == 1) expect_key_ = true;
            break;
        case ':':
            if (depth_ == 1 && key_is_id_ && !found_) {
                reading_id_ = true;
                id_.clear();
                overflow_ = false;
                key_is_id_ = false;
                return;
            }
            key_is_id_ = false;
            break;
        default:
            break;
        }
        if (reading_id_ && c != ' ' && c != '\t' && c != '\r' && c != '\n') keep(c);
    }

    void keep(char c) {
        if (id_.size() < max_id) id_ += c;
        else overflow_ = true;
    }

    int depth_ = 0;
    bool in_string_ = false;
    bool escaped_ = false;
    bool expect_key_ = false;  // at depth 1, the next string is a key
    bool reading_key_ = false;
    bool key_is_id_ = false;   // the key just read is "id": its value follows the colon
    std::string key_;
    bool reading_id_ = false;
    bool overflow_ = false;
    bool found_ = false;
    std::string id_;
};

} // namespace

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
    std::optional<IdScanner> oversized;  // inside an over-long line: only its id is looked for
    for (;;) {
        ssize_t n = ::read(in_fd_, chunk.data(), chunk.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        std::size_t start = 0;
        for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
            if (chunk[i] != '\n') continue;
            std::string_view piece(chunk.data() + start, i - start);
            if (!oversized && pending.size() + piece.size() > max_line) {
                oversized.emplace();
                oversized->feed(pending);
            }
            if (oversized) {
                oversized->feed(piece);
                refuse_oversized(oversized->id());
                oversized.reset();
            } else {
                pending.append(piece);
                if (!pending.empty() && pending.back() == '\r') pending.pop_back();
                if (!pending.empty()) {
                    boost::asio::post(executor_, [this, line = std::move(pending)]() mutable { on_line_(std::move(line)); });
                }
            }
            pending.clear();
            start = i + 1;
        }
        std::string_view rest(chunk.data() + start, static_cast<std::size_t>(n) - start);
        if (oversized) {
            oversized->feed(rest);
        } else {
            pending.append(rest);
        }
        if (!oversized && pending.size() > max_line) {
            oversized.emplace();
            oversized->feed(pending);
            pending = std::string();
        }
    }
    if (oversized) {
        refuse_oversized(oversized->id());
    } else if (!pending.empty()) {
        boost::asio::post(executor_, [this, line = std::move(pending)]() mutable { on_line_(std::move(line)); });
    }
    boost::asio::post(executor_, [this] { on_eof_(); });
}

void StdioTransport::refuse_oversized(const std::string& id_json) {
    log::error("refusing an inbound message longer than {} bytes (id {})", max_line, id_json);
    json::Writer w;
    w.begin_object().field("jsonrpc", "2.0").key("id").raw(id_json);
    w.key("error").begin_object().field("code", error_code::invalid_request);
    w.field("message", fmt::format("the message is longer than {} MiB and was not read; send large files with upload_file "
                                   "from a host directory, or in smaller parts",
                                   max_line >> 20));
    w.end_object().end_object();
    send(w.take());
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
