// Human output of the subcommands: lines on stdout, and on a terminal a status line
// redrawn in place for work under way (plain lines only when not a terminal).
#pragma once

#include <string>
#include <string_view>

namespace cubicle::cli {

class Terminal {
public:
    Terminal();
    bool tty() const { return tty_; }
    // A line that stays (clears a status line first).
    void line(std::string_view text);
    // Replaces the status line; ignored when stdout is not a terminal.
    void status(std::string_view text);

private:
    bool tty_;
    bool status_shown_ = false;
    std::size_t width_ = 80;
};

} // namespace cubicle::cli
