#include "tools/progress.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "common/json.hpp"

namespace cubicle::tools {

ProgressStream::ProgressStream(std::shared_ptr<mcp::RequestContext> context, boost::asio::any_io_executor executor,
                               std::uint64_t max_bytes)
    : context_(std::move(context)), timer_(std::move(executor)), max_bytes_(max_bytes) {}

void ProgressStream::output(docker::StreamKind kind, std::string_view data) {
    if (!context_->wants_progress() || capped_ || closed_) return;
    auto& carry = carry_[kind == docker::StreamKind::stderr_ ? 1 : 0];
    carry.append(data);
    std::size_t complete = json::complete_utf8_prefix(carry);
    if (complete == 0) return;
    std::string_view ready(carry.data(), complete);
    std::uint64_t room = max_bytes_ - sent_bytes_ - waiting_.size();
    if (ready.size() > room) {
        ready = ready.substr(0, json::complete_utf8_prefix(ready.substr(0, room)));
        capped_ = true;
    }
    waiting_.append(ready);
    carry.erase(0, complete);
    if (!capped_) {
        schedule();
        return;
    }
    send_waiting();
    progress_ += 1;
    context_->progress(progress_, fmt::format("\n[cubicle] progress stops here, after {} bytes of output; the program goes on "
                                              "and its result shows the head and tail of the output\n",
                                              sent_bytes_));
}

void ProgressStream::note(std::string_view message) {
    if (closed_) return;
    send_waiting();
    progress_ += 1;
    context_->progress(progress_, message);
}

void ProgressStream::close() {
    send_waiting();
    closed_ = true;
    timer_.cancel();
}

void ProgressStream::send_waiting() {
    // However much accumulated, one notification stays small once escaped.
    constexpr std::size_t max_piece = 64 << 10;
    std::string_view ready = waiting_;
    while (!ready.empty()) {
        auto piece = ready.size() <= max_piece ? ready.size() : json::complete_utf8_prefix(ready.substr(0, max_piece));
        if (piece == 0) piece = std::min(ready.size(), max_piece);  // not UTF-8 at all: U+FFFD on the way out
        sent_bytes_ += piece;
        progress_ += static_cast<double>(piece);
        context_->progress(progress_, ready.substr(0, piece));
        ready.remove_prefix(piece);
    }
    waiting_.clear();
}

// A token bucket: sparse output goes at once, jitter included; a flood gets
// `rate` notifications a second.
void ProgressStream::schedule() {
    if (timer_armed_) return;
    auto now = std::chrono::steady_clock::now();
    tokens_ = std::min(burst, tokens_ + std::chrono::duration<double>(now - refilled_).count() * rate);
    refilled_ = now;
    if (tokens_ >= 1) {
        tokens_ -= 1;
        send_waiting();
        return;
    }
    timer_armed_ = true;
    timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>((1 - tokens_) / rate)));
    // A plain callback, not a coroutine: it owns its stream until it runs.
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code&) {
        self->timer_armed_ = false;
        if (!self->closed_ && !self->waiting_.empty()) self->schedule();
    });
}

} // namespace cubicle::tools
