#include "common/file_text.hpp"

#include <fstream>
#include <sstream>

namespace cubicle {

std::string file_text(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

} // namespace cubicle
