// Runs: an execution with an id, its whole output saved in the sandbox
// (.cubicle/runs/<id>/stdout and stderr) and a budgeted view for the model.
// A foreground call waits for its run; a background run outlives the call
// (not its sandbox) and is looked at with get_run.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/cancellation.hpp"
#include "common/json.hpp"
#include "sandbox/sandbox.hpp"
#include "tools/output_budget.hpp"

namespace cubicle::tools {

// An unguessable run id.
std::string new_run_id();
// The run's directory relative to the workspace.
std::string run_dir(std::string_view run_id);

// What the model is told about where the whole output is.
struct OutputHome {
    std::string dir;         // relative to the workspace; empty when not saved
    std::string not_saved;   // why, when not saved
    std::uint64_t cap = 0;   // --max-output-bytes: bytes kept per stream
};

// Writes the output fields of a result (stdout, stderr, sizes, files,
// truncated) into `w`, within `budget` bytes as sent. `capped`: the program
// wrote past --max-output-bytes.
void write_output(json::Writer& w, const OutputCapture& out, const OutputCapture& err, std::size_t budget, const OutputHome& home,
                  bool capped);

// A program running in the background.
class Run : public std::enable_shared_from_this<Run> {
public:
    Run(boost::asio::any_io_executor executor, std::string id, std::string sandbox_id, std::string label, OutputHome home,
        std::size_t keep);

    const std::string& id() const { return id_; }
    const std::string& sandbox_id() const { return sandbox_id_; }
    const std::string& label() const { return label_; }
    const OutputHome& home() const { return home_; }
    const std::shared_ptr<sandbox::ExecHandle>& handle() const { return handle_; }
    const std::shared_ptr<Cancellation>& cancellation() const { return cancel_; }
    std::chrono::system_clock::time_point started() const { return started_; }

    sandbox::OutputSink sink();
    void finish(sandbox::ExecResult result);
    void fail(std::string error);
    bool finished() const { return finished_; }
    std::uint64_t bytes(int stream) const { return logs_[stream].end(); }  // 0 stdout, 1 stderr
    const sandbox::ExecResult& result() const { return result_; }
    const std::string& error() const { return error_; }

    // Output since a cursor ("STDOUT:STDERR" byte offsets; empty: since the
    // last look), as captures; moves the last look to the end.
    struct View {
        OutputCapture out;
        OutputCapture err;
        std::string next;  // the cursor after this view
    };
    View view(std::string_view since, std::size_t budget);
    bool news(std::string_view since) const;

    // Waits until something new happens (output or the end) or `deadline`;
    // then a moment more, so that a burst comes back in one look.
    boost::asio::awaitable<void> wait(std::string since, std::chrono::steady_clock::time_point deadline);

private:
    struct Log {
        std::string data;
        std::uint64_t start = 0;  // stream offset of data[0]
        std::uint64_t end() const { return start + data.size(); }
    };
    void append(int stream, std::string_view data);
    void wake();
    std::pair<std::uint64_t, std::uint64_t> cursor(std::string_view since) const;

    boost::asio::any_io_executor executor_;
    std::string id_;
    std::string sandbox_id_;
    std::string label_;
    OutputHome home_;
    std::size_t keep_;
    Log logs_[2];
    std::uint64_t looked_[2] = {0, 0};
    std::shared_ptr<sandbox::ExecHandle> handle_ = std::make_shared<sandbox::ExecHandle>();
    std::shared_ptr<Cancellation> cancel_ = std::make_shared<Cancellation>();
    std::chrono::system_clock::time_point started_ = std::chrono::system_clock::now();
    bool finished_ = false;
    sandbox::ExecResult result_;
    std::string error_;
    std::vector<std::shared_ptr<boost::asio::steady_timer>> waiters_;
};

// The background runs of this server, by id.
class Runs {
public:
    static constexpr std::size_t max_running_per_sandbox = 16;
    static constexpr std::size_t max_kept_per_sandbox = 32;

    // Registers a run; throws ToolError past the limit of running ones.
    void add(std::shared_ptr<Run> run);
    std::shared_ptr<Run> find(const std::string& id) const;
    std::vector<std::shared_ptr<Run>> of_sandbox(const std::string& sandbox_id) const;
    // Forgets the runs of sandboxes that are gone.
    void forget_sandbox(const std::string& sandbox_id);

    // Records a run whose output was saved in the sandbox (`bytes` of it);
    // returns the ids of the oldest saved runs (never a running one) past
    // max_saved_per_sandbox runs or `max_bytes` in all, whose directories
    // should go: saved output must not fill the workspace. Past a limit it
    // trims to three quarters of it, so that the removal (a process in the
    // sandbox) comes once in many calls rather than with every call.
    static constexpr std::size_t max_saved_per_sandbox = 100;
    std::vector<std::string> note_saved(const std::string& sandbox_id, std::string run_id, std::uint64_t bytes,
                                        std::uint64_t max_bytes);
    // The runs of a sandbox whose output is saved, oldest first.
    std::vector<std::string> saved(const std::string& sandbox_id) const {
        std::vector<std::string> ids;
        if (auto it = saved_.find(sandbox_id); it != saved_.end()) {
            for (const auto& entry : it->second) ids.push_back(entry.run_id);
        }
        return ids;
    }

private:
    std::map<std::string, std::shared_ptr<Run>> runs_;
    struct Saved {
        std::string run_id;
        std::uint64_t bytes;
    };
    std::map<std::string, std::vector<Saved>> saved_;  // by sandbox, oldest first
};

} // namespace cubicle::tools
