// Tar archives for PUT /containers/{id}/archive: ustar headers, with a PAX
// header in front of entries whose name or size does not fit one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cubicle::docker {

struct TarEntry {
    std::string name;          // relative, '/'-separated
    std::string_view content;  // empty for directories
    bool directory = false;
    std::string link_target;   // non-empty: a symbolic link to it (content ignored)
    unsigned mode = 0644;      // permission bits; setuid/setgid/sticky are dropped
    unsigned uid = 0;
    unsigned gid = 0;
    std::int64_t mtime = -1;   // unix seconds; -1: now
};

class TarWriter {
public:
    void add(const TarEntry& entry);
    // Appends the end-of-archive marker and returns the archive.
    std::string finish();
    std::size_t size() const { return out_.size(); }

private:
    void header(std::string_view name, char type, std::uint64_t size, unsigned mode, unsigned uid, unsigned gid,
                std::int64_t mtime, std::string_view link = {});
    std::string out_;
};

} // namespace cubicle::docker
