#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/json.hpp"
#include "docker/stream.hpp"
#include "mcp/tool.hpp"
#include "sandbox/sandbox.hpp"

namespace cubicle::tools {

// Forwards output to the client as progress notifications the moment it
// arrives, cutting only at UTF-8 character boundaries.
class ProgressStream {
public:
    explicit ProgressStream(std::shared_ptr<mcp::RequestContext> context) : context_(std::move(context)) {}

    void output(docker::StreamKind kind, std::string_view data) {
        if (!context_->wants_progress()) return;
        auto& carry = carry_[kind == docker::StreamKind::stderr_ ? 1 : 0];
        carry.append(data);
        std::size_t complete = json::complete_utf8_prefix(carry);
        if (complete == 0) return;
        progress_ += static_cast<double>(complete);
        context_->progress(progress_, std::string_view(carry).substr(0, complete));
        carry.erase(0, complete);
    }

    void note(std::string_view message) {
        progress_ += 1;
        context_->progress(progress_, message);
    }

    sandbox::OutputSink sink(std::shared_ptr<ProgressStream> self) {
        return [self](docker::StreamKind kind, std::string_view data) { self->output(kind, data); };
    }

private:
    std::shared_ptr<mcp::RequestContext> context_;
    std::string carry_[2];
    double progress_ = 0;
};

} // namespace cubicle::tools
