#include "cli/terminal.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>

namespace cubicle::cli {

Terminal::Terminal() : tty_(::isatty(STDOUT_FILENO) == 1) {
    winsize size{};
    if (tty_ && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 10) width_ = size.ws_col;
}

void Terminal::line(std::string_view text) {
    if (status_shown_) std::fputs("\r\033[K", stdout);
    status_shown_ = false;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

void Terminal::status(std::string_view text) {
    if (!tty_) return;
    if (text.size() >= width_) text = text.substr(0, width_ - 1);
    std::fputs("\r\033[K", stdout);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    status_shown_ = true;
}

} // namespace cubicle::cli
