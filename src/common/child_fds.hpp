// For child processes started through Boost.Process 1.81, which leaves the
// parent's descriptors open in the child (its close_all on Linux compares each
// whitelisted fd with itself, so nothing below its error pipe is closed).
#pragma once

#include <algorithm>

#include <fcntl.h>
#include <unistd.h>

namespace cubicle {

// Runs in the child before exec (async-signal-safe): closes every descriptor
// above stderr that exec would not.
inline void close_inherited_descriptors() {
    for (int fd = 3, end = static_cast<int>(std::min(::sysconf(_SC_OPEN_MAX), 65536L)); fd < end; ++fd) {
        int flags = ::fcntl(fd, F_GETFD);
        if (flags >= 0 && !(flags & FD_CLOEXEC)) ::close(fd);
    }
}

} // namespace cubicle
