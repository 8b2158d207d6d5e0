// Subcommands of the one binary besides serving: `cubicle image …` and `cubicle doctor`.
// Each takes the arguments after its name and returns the process's exit status.
#pragma once

#include <string_view>

namespace cubicle::cli {

int image_command(int argc, char** argv);
int doctor_command(int argc, char** argv);

// How each subcommand is called, for --help and the shell completions (the man
// page describes each at length; a test holds the two together).
struct Subcommand {
    std::string_view name;       // the word after `cubicle`
    std::string_view synopsis;   // the words after it
    std::string_view summary;
};
inline constexpr Subcommand subcommands[] = {
    {"image", "build [PROFILE...]", "build the sandbox images from Debian packages (cubicle image --help)"},
    {"image", "list", "list the image profiles, whether each is present and current"},
    {"image", "dockerfile PROFILE", "print a profile as a Dockerfile"},
    {"doctor", "[options]", "check that this host can run sandboxes, one line per check"},
};

} // namespace cubicle::cli
