// The one table of languages: how each is named, built, run and detected.
// Nothing else in cubicle knows a language by name.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/agent_protocol.hpp"

namespace cubicle::sandbox {

struct Language {
    std::string_view name;                     // canonical, as results report it
    std::span<const std::string_view> aliases; // other names clients may use
    std::string_view source_file;              // what the code is saved as ("" for python/javascript/bash,
                                               // which read it from stdin or argv); {class} for Java
    std::string_view compile;                  // shell command run in the build directory; "" if interpreted
    std::string_view run;                      // shell command ({dir}: the build directory; {class}: Java's class)
    std::string_view program;                  // executable whose presence on PATH means the language is there
    std::string_view version;                  // shell command whose output names the version
    std::string_view packages;                 // the Debian packages that provide it
    bool repl;                                 // a persistent interpreter keeps state between calls
    std::string_view extension;                // its source files' usual extension (".py")
    std::string_view preload = {};             // modules a zygote imports ahead of fresh runs by default
                                               // (space-separated; missing ones are skipped); "" = no zygote
};

// Every language, in the order lists show them.
std::span<const Language> languages();

// The language for a name or alias (case-insensitive); nullptr if unknown.
const Language* find_language(std::string_view name);

// "python (python3, py), javascript (node, js), …" for descriptions and errors.
std::string language_list();

// Every name and alias, for the schema's enum.
std::vector<std::string_view> language_names();

// The program that runs `code` in python, javascript or bash (languages without a source_file).
agent::RunRequest program_for(const Language& language, std::string code);

// How a language with a source file is built and run within the sandbox. Builds
// are kept by content hash under <workspace>/.cubicle/build, so running unchanged
// code again skips the compiler. Both requests carry the caches' environment.
struct Build {
    std::string dir;
    // Saves the source and compiles it unless a build of the same content exists.
    agent::RunRequest prepare;
    agent::RunRequest run;
};
Build build_for(const Language& language, std::string code, std::string_view workspace);

// Like program_for, but the code travels as an argument so that stdin is the
// program's own (a background run takes input); nullopt if it is too long for that.
std::optional<agent::RunRequest> program_with_stdin(std::string_view language, std::string code);

// The zygote that forks `language`'s fresh runs (program_for sets their `fork`),
// with `preload` imported (nullopt: `language.preload`); nullopt if the language has none.
std::optional<agent::RunRequest> zygote_for(std::string_view language,
                                            const std::optional<std::vector<std::string>>& preload = std::nullopt);

// Whether `language` can keep state between calls in a persistent interpreter.
bool has_interpreter(std::string_view language);

// The long-lived interpreter process for `language` (one with repl set).
// It reads cells framed as a big-endian u32 length, a flags byte (1: echo the
// value of a final bare expression, like a REPL; 2: a u16 length and a
// directory follow, where Python saves the cell's matplotlib figures) and
// UTF-8 code on stdin, runs each in one persistent namespace, and after each
// writes "<status> <figures>\n" to fd 3 once its output is flushed.
// Python's also takes flags 4 (no code): a checkpoint (agent/checkpoint.h),
// answered "<status> 0 <parked pid> <rss KiB>\n".
agent::RunRequest interpreter_for(std::string_view language);

// The request for a checkpoint of the Python interpreter, in the cells' framing.
std::string encode_checkpoint();

// A cell in the framing the interpreters read; `figure_dir` (absolute, Python
// only) receives figure-N.png for each figure shown or left open.
std::string encode_cell(std::string_view code, bool echo, std::string_view figure_dir = {});

// A shell command line, run with /bin/sh -c.
agent::RunRequest shell_command(std::string command);

// A shell script that prints, for every language whose program is on PATH, a
// line "<name>\t<version output's first line>".
std::string language_probe_script();

// The version number in a version command's output ("go version go1.19.8 linux/amd64" → "1.19.8").
std::string version_number(std::string_view output);

} // namespace cubicle::sandbox
