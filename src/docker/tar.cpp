#include "docker/tar.hpp"

#include <cstring>
#include <ctime>
#include <stdexcept>

#include <fmt/format.h>

namespace cubicle::docker {
namespace {

constexpr std::size_t block = 512;

void put_octal(char* field, std::size_t width, std::uint64_t value) {
    // width includes the terminating NUL
    auto text = fmt::format("{:0{}o}", value, width - 1);
    if (text.size() > width - 1) throw std::length_error("tar field overflow");
    std::memcpy(field, text.data(), text.size());
}

} // namespace

void TarWriter::add(const TarEntry& entry) {
    if (entry.name.empty() || entry.name.size() >= 100) throw std::length_error("tar entry name length");
    char header[block] = {};
    std::memcpy(header, entry.name.data(), entry.name.size());
    put_octal(header + 100, 8, entry.mode);
    put_octal(header + 108, 8, entry.uid);
    put_octal(header + 116, 8, entry.gid);
    put_octal(header + 124, 12, entry.directory ? 0 : entry.content.size());
    put_octal(header + 136, 12, static_cast<std::uint64_t>(std::time(nullptr)));
    header[156] = entry.directory ? '5' : '0';
    std::memcpy(header + 257, "ustar", 6);
    std::memcpy(header + 263, "00", 2);
    std::memset(header + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : header) sum += c;
    put_octal(header + 148, 7, sum);
    out_.append(header, block);
    if (!entry.directory) {
        out_ += entry.content;
        out_.append((block - entry.content.size() % block) % block, '\0');
    }
}

std::string TarWriter::finish() {
    out_.append(2 * block, '\0');
    return std::move(out_);
}

} // namespace cubicle::docker
