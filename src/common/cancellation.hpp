// A one-shot cancellation signal shared between the protocol layer (which
// receives notifications/cancelled) and the sandbox layer (which kills the
// running process).
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace cubicle {

class Cancellation {
public:
    void cancel() {
        if (cancelled_) return;
        cancelled_ = true;
        auto handlers = std::move(handlers_);
        for (auto& handler : handlers) handler();
    }
    bool cancelled() const { return cancelled_; }
    // Runs `handler` on cancellation, or at once if already cancelled.
    void on_cancel(std::function<void()> handler) {
        if (cancelled_) {
            handler();
        } else {
            handlers_.push_back(std::move(handler));
        }
    }

private:
    bool cancelled_ = false;
    std::vector<std::function<void()>> handlers_;
};

} // namespace cubicle
