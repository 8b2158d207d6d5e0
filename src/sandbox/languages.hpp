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

// Whether `language` can keep state between calls in a persistent interpreter.
bool has_interpreter(std::string_view language);

// The long-lived interpreter process for `language` (python or javascript).
// It reads cells framed as a big-endian u32 length, a flags byte (1: echo the
// value of a final bare expression, like a REPL) and UTF-8 code on stdin, runs
// each in one persistent namespace, and after each writes "<status>\n" to fd 3
// once its output is flushed.
agent::RunRequest interpreter_for(std::string_view language);

// A cell in the framing the interpreters read.
std::string encode_cell(std::string_view code, bool echo);

// A shell command line, run with /bin/sh -c.
agent::RunRequest shell_command(std::string command);

} // namespace cubicle::sandbox
