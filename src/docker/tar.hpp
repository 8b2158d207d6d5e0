// Minimal ustar archives for PUT /containers/{id}/archive.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cubicle::docker {

struct TarEntry {
    std::string name;  // relative, '/'-separated, < 100 bytes
    std::string_view content;  // empty for directories
    bool directory = false;
    unsigned mode = 0644;
    unsigned uid = 0;
    unsigned gid = 0;
};

class TarWriter {
public:
    void add(const TarEntry& entry);
    // Appends the end-of-archive marker and returns the archive.
    std::string finish();

private:
    std::string out_;
};

} // namespace cubicle::docker
