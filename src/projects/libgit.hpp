// libgit2, initialised once for the process.
#pragma once

#include <string>

namespace cubicle::projects {

void ensure_libgit();
// The message of the last libgit2 failure on this thread.
std::string libgit_error();

} // namespace cubicle::projects
