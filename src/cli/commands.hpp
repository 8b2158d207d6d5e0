// Subcommands of the one binary besides serving: `cubicle image …` and `cubicle doctor`.
// Each takes the arguments after its name and returns the process's exit status.
#pragma once

namespace cubicle::cli {

int image_command(int argc, char** argv);
int doctor_command(int argc, char** argv);

} // namespace cubicle::cli
