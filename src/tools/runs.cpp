#include "tools/runs.hpp"

#include <algorithm>
#include <charconv>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/ids.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;

// A look that found news waits this much longer, so a burst comes back whole.
constexpr auto settle_time = std::chrono::milliseconds(200);

std::string where(const OutputHome& home, std::string_view stream) {
    if (home.dir.empty()) return fmt::format("the whole output was not saved ({})", home.not_saved);
    return fmt::format("all of it is in {}/{} (read_file with offset or tail, or grep it with run_command)", home.dir, stream);
}

} // namespace

std::string new_run_id() { return "run-" + random_hex(12); }

std::string run_dir(std::string_view run_id) { return fmt::format(".cubicle/runs/{}", run_id); }

void write_output(json::Writer& w, const OutputCapture& out, const OutputCapture& err, std::size_t budget, const OutputHome& home,
                  bool capped) {
    std::string note;
    if (capped) note = fmt::format("[cubicle] the program wrote more than {} bytes to a stream; the rest was discarded\n", home.cap);
    budget -= std::min(budget, sent_size(note));
    auto out_need = needed_budget(out), err_need = needed_budget(err);
    auto split = split_budget(out_need, err_need, budget);
    bool cut = !out.complete() || !err.complete() || out_need > split.out || err_need > split.err;
    auto shown_out = shown_text(out, split.out, "stdout", where(home, "stdout"));
    auto shown_err = shown_text(err, split.err, "stderr", where(home, "stderr"));
    (err.bytes() >= home.cap || out.bytes() < home.cap ? shown_err : shown_out) += note;
    w.field("stdout", shown_out).field("stderr", shown_err);
    w.field("stdout_bytes", out.bytes()).field("stderr_bytes", err.bytes()).field("truncated", cut || capped);
    if (!home.dir.empty()) {
        w.field("stdout_file", home.dir + "/stdout").field("stderr_file", home.dir + "/stderr");
    }
}

// ---- Run ----------------------------------------------------------------------

Run::Run(asio::any_io_executor executor, std::string id, std::string sandbox_id, std::string label, OutputHome home, std::size_t keep)
    : executor_(std::move(executor)), id_(std::move(id)), sandbox_id_(std::move(sandbox_id)), label_(std::move(label)),
      home_(std::move(home)), keep_(keep) {}

sandbox::OutputSink Run::sink() {
    // Weak: the sink lives in the sandbox's pending run, the run in the registry.
    return [weak = weak_from_this()](docker::StreamKind kind, std::string_view data) {
        if (auto self = weak.lock()) self->append(kind == docker::StreamKind::stderr_ ? 1 : 0, data);
    };
}

void Run::append(int stream, std::string_view data) {
    auto& log = logs_[stream];
    log.data.append(data);
    if (log.data.size() > 2 * keep_) {
        auto drop = log.data.size() - keep_;
        log.data.erase(0, drop);
        log.start += drop;
    }
    wake();
}

void Run::finish(sandbox::ExecResult result) {
    result_ = std::move(result);
    finished_ = true;
    wake();
}

void Run::fail(std::string error) {
    error_ = std::move(error);
    finished_ = true;
    wake();
}

void Run::wake() {
    auto waiters = std::move(waiters_);
    waiters_.clear();
    for (auto& timer : waiters) timer->cancel();
}

std::pair<std::uint64_t, std::uint64_t> Run::cursor(std::string_view since) const {
    if (since.empty()) return {looked_[0], looked_[1]};
    auto colon = since.find(':');
    std::uint64_t a = 0, b = 0;
    bool ok = colon != std::string_view::npos;
    if (ok) {
        auto [pa, ea] = std::from_chars(since.data(), since.data() + colon, a);
        auto [pb, eb] = std::from_chars(since.data() + colon + 1, since.data() + since.size(), b);
        ok = ea == std::errc() && eb == std::errc() && pa == since.data() + colon && pb == since.data() + since.size();
    }
    if (!ok) throw ToolError(fmt::format("since '{}' is not a cursor; pass the next_since of an earlier get_run, or 0:0 for all output", since));
    return {a, b};
}

bool Run::news(std::string_view since) const {
    auto [a, b] = cursor(since);
    return a < logs_[0].end() || b < logs_[1].end();
}

Run::View Run::view(std::string_view since, std::size_t budget) {
    auto [a, b] = cursor(since);
    View view{OutputCapture(budget), OutputCapture(budget), {}};
    std::uint64_t from[2] = {a, b};
    OutputCapture* captures[2] = {&view.out, &view.err};
    for (int s = 0; s < 2; ++s) {
        const auto& log = logs_[s];
        auto position = std::min(from[s], log.end());
        if (position < log.start) {
            captures[s]->skip(log.start - position);
            position = log.start;
        }
        captures[s]->append(std::string_view(log.data).substr(position - log.start));
        looked_[s] = log.end();
    }
    view.next = fmt::format("{}:{}", logs_[0].end(), logs_[1].end());
    return view;
}

asio::awaitable<void> Run::wait(std::string since, std::chrono::steady_clock::time_point deadline) {
    constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
    if (!finished_ && !news(since)) {
        auto timer = std::make_shared<asio::steady_timer>(executor_, deadline);
        waiters_.push_back(timer);
        co_await timer->async_wait(use_tuple);
    }
    if (!finished_ && news(since)) {
        asio::steady_timer settle(executor_, std::min(std::chrono::steady_clock::now() + settle_time, deadline));
        co_await settle.async_wait(use_tuple);
    }
}

// ---- Runs -----------------------------------------------------------------------

void Runs::add(std::shared_ptr<Run> run) {
    auto mine = of_sandbox(run->sandbox_id());
    auto running = std::count_if(mine.begin(), mine.end(), [](const auto& r) { return !r->finished(); });
    if (static_cast<std::size_t>(running) >= max_running_per_sandbox) {
        throw ToolError(fmt::format("sandbox {} already has {} background runs going; wait for one (get_run) or stop one "
                                    "(signal_run) first",
                                    run->sandbox_id(), running));
    }
    // The oldest finished runs are forgotten (their files stay in the workspace).
    std::vector<std::shared_ptr<Run>> finished;
    for (auto& r : mine) {
        if (r->finished()) finished.push_back(r);
    }
    std::sort(finished.begin(), finished.end(), [](const auto& x, const auto& y) { return x->started() < y->started(); });
    for (std::size_t i = 0; i + max_kept_per_sandbox <= mine.size() && i < finished.size(); ++i) runs_.erase(finished[i]->id());
    runs_[run->id()] = std::move(run);
}

std::shared_ptr<Run> Runs::find(const std::string& id) const {
    auto it = runs_.find(id);
    return it == runs_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Run>> Runs::of_sandbox(const std::string& sandbox_id) const {
    std::vector<std::shared_ptr<Run>> out;
    for (const auto& [id, run] : runs_) {
        if (run->sandbox_id() == sandbox_id) out.push_back(run);
    }
    std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x->started() < y->started(); });
    return out;
}

void Runs::forget_sandbox(const std::string& sandbox_id) {
    std::erase_if(runs_, [&](const auto& entry) { return entry.second->sandbox_id() == sandbox_id; });
    saved_.erase(sandbox_id);
}

std::vector<std::string> Runs::note_saved(const std::string& sandbox_id, std::string run_id, std::uint64_t bytes,
                                          std::uint64_t max_bytes) {
    auto& saved = saved_[sandbox_id];
    saved.push_back({std::move(run_id), bytes});
    std::uint64_t total = 0;
    for (const auto& entry : saved) total += entry.bytes;
    std::vector<std::string> expired;
    if (saved.size() <= max_saved_per_sandbox && total <= max_bytes) return expired;
    std::size_t keep_count = max_saved_per_sandbox * 3 / 4;
    std::uint64_t keep_bytes = max_bytes / 4 * 3;
    // The newest (just recorded) always stays.
    for (auto it = saved.begin(); (saved.size() > keep_count || total > keep_bytes) && it + 1 != saved.end();) {
        auto run = find(it->run_id);
        if (run && !run->finished()) {
            ++it;
            continue;
        }
        if (run) runs_.erase(it->run_id);
        total -= it->bytes;
        expired.push_back(std::move(it->run_id));
        it = saved.erase(it);
    }
    return expired;
}

} // namespace cubicle::tools
