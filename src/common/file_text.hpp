// A whole file as a string, for the small files the server reads (configuration,
// liveness records, its own binary for a digest).
#pragma once

#include <filesystem>
#include <string>

namespace cubicle {

// The file's bytes; "" when it is missing or cannot be read.
std::string file_text(const std::filesystem::path& path);

} // namespace cubicle
