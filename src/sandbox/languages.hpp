// How each supported language runs: which interpreter, and how the code reaches it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "sandbox/agent_protocol.hpp"

namespace cubicle::sandbox {

// "python", "javascript" or "bash" for a name or alias; nullopt if unknown.
std::optional<std::string_view> canonical_language(std::string_view name);

// The language names and aliases clients may use, for schemas and errors.
std::string_view language_list();

// The program that runs `code` in `language` (a canonical name).
agent::RunRequest program_for(std::string_view language, std::string code);

// A shell command line, run with /bin/sh -c.
agent::RunRequest shell_command(std::string command);

} // namespace cubicle::sandbox
