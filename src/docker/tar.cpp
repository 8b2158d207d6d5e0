#include "docker/tar.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include <fmt/format.h>

namespace cubicle::docker {
namespace {

constexpr std::size_t block = 512;
constexpr std::size_t max_name = 99;  // the name field, with room for its NUL
constexpr std::uint64_t max_octal_11 = 077777777777;  // what a 12-byte field holds

void put_octal(char* field, std::size_t width, std::uint64_t value) {
    auto text = fmt::format("{:0{}o}", value, width - 1);  // width includes the NUL
    std::memcpy(field, text.data(), std::min(text.size(), width - 1));
}

// One "length key=value\n" record; the length counts its own digits.
std::string pax_record(std::string_view key, std::string_view value) {
    auto body = fmt::format(" {}={}\n", key, value);
    std::size_t length = body.size() + 1;
    while (std::to_string(length).size() + body.size() != length) ++length;
    return std::to_string(length) + body;
}

void pad(std::string& out) { out.append((block - out.size() % block) % block, '\0'); }

} // namespace

void TarWriter::header(std::string_view name, char type, std::uint64_t size, unsigned mode, unsigned uid, unsigned gid,
                       std::int64_t mtime, std::string_view link) {
    char h[block] = {};
    // An empty view's data() may be null, which memcpy may not be given even for 0 bytes.
    if (!name.empty()) std::memcpy(h, name.data(), std::min(name.size(), max_name));
    if (!link.empty()) std::memcpy(h + 157, link.data(), std::min(link.size(), max_name));
    put_octal(h + 100, 8, mode & 0777);
    put_octal(h + 108, 8, uid);
    put_octal(h + 116, 8, gid);
    put_octal(h + 124, 12, size);
    put_octal(h + 136, 12, static_cast<std::uint64_t>(std::clamp<std::int64_t>(mtime, 0, max_octal_11)));
    h[156] = type;
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    put_octal(h + 148, 7, sum);
    out_.append(h, block);
}

void TarWriter::add(const TarEntry& entry) {
    if (entry.name.empty()) throw std::length_error("a tar entry needs a name");
    std::string name = entry.name;
    if (entry.directory && !name.ends_with('/')) name += '/';
    auto mtime = entry.mtime >= 0 ? entry.mtime : static_cast<std::int64_t>(std::time(nullptr));
    bool link = !entry.link_target.empty();
    std::uint64_t size = entry.directory || link ? 0 : entry.content.size();
    std::string pax;
    if (name.size() > max_name) pax += pax_record("path", name);
    if (entry.link_target.size() > max_name) pax += pax_record("linkpath", entry.link_target);
    if (size > max_octal_11) pax += pax_record("size", std::to_string(size));
    if (!pax.empty()) {
        header("././@PaxHeader", 'x', pax.size(), 0644, 0, 0, mtime);
        out_ += pax;
        pad(out_);
    }
    char type = entry.directory ? '5' : link ? '2' : '0';
    header(name, type, size > max_octal_11 ? 0 : size, entry.mode, entry.uid, entry.gid, mtime, entry.link_target);
    if (type == '0') {
        out_ += entry.content;
        pad(out_);
    }
}

std::string TarWriter::finish() {
    out_.append(2 * block, '\0');
    return std::move(out_);
}

} // namespace cubicle::docker
