#include "projects/libgit.hpp"

#include <git2.h>

namespace cubicle::projects {

void ensure_libgit() {
    // Never shut down: libgit2 keeps global state for the process's lifetime.
    static const int initialised = git_libgit2_init();
    (void)initialised;
}

std::string libgit_error() {
    const git_error* error = git_error_last();
    return error && error->message ? error->message : "unknown libgit2 error";
}

} // namespace cubicle::projects
