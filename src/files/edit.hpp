// Exact-text edits of a file's bytes, as coding assistants make them: the text
// to replace must occur exactly once (or every occurrence is replaced on
// request), and the file keeps its line endings and its encoding. Pure: the
// bytes come and go through the sandbox elsewhere (tools/file_tools.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cubicle::files {

struct Edit {
    std::string old_text;  // UTF-8, as the model wrote it
    std::string new_text;
    bool replace_all = false;
};

struct EditOutcome {
    std::string content;        // the file's new bytes
    std::uint64_t replacements = 0;
    std::uint64_t first_line = 0;  // 1-based line of the first replacement
    std::string encoding;       // "utf-8" or "latin-1": what the file was read as
    std::string line_ending;    // "lf" or "crlf"
    std::string diff;           // unified diff of the change, 3 lines of context
};

// Applies `edit` to `content` (a file named `path`, for messages and the diff).
// Throws ToolError when old_text is empty, equals new_text, occurs nowhere or
// (without replace_all) several times — saying how often and on which lines —
// when the file is binary, when new_text cannot be written in a Latin-1 file,
// or when the result would be over max_bytes (refused before it is built).
// Memory: the file, the result and the lines around what the diff shows.
EditOutcome apply_edit(std::string_view path, std::string_view content, const Edit& edit, std::uint64_t max_bytes);

} // namespace cubicle::files
