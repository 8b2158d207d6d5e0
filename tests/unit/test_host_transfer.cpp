// Host <-> sandbox file transfer: tar parsing, allowed host directories, packing
// host files for upload and unpacking downloads onto the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "docker/tar.hpp"
#include "files/host_transfer.hpp"

namespace cubicle::files {
namespace {

namespace fs = std::filesystem;

// A fresh directory under /tmp (canonical path), removed with its contents afterwards.
class TempDir {
public:
    TempDir() {
        char templ[] = "/tmp/cubicle-ht-XXXXXX";
        if (!::mkdtemp(templ)) throw std::runtime_error("mkdtemp failed");
        char resolved[PATH_MAX];
        path_ = ::realpath(templ, resolved);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);  // does not follow symlinks
    }
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& sub) const { return path_ + "/" + sub; }

private:
    std::string path_;
};

void write_file(const std::string& path, const std::string& content, unsigned mode = 0644) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << content;
    ::chmod(path.c_str(), mode);
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void run(const std::string& command) { ASSERT_EQ(std::system(command.c_str()), 0) << command; }

const TarMember* find(const std::vector<TarMember>& members, const std::string& path) {
    for (const auto& m : members)
        if (m.path == path) return &m;
    return nullptr;
}

template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const ToolError& e) {
        return e.what();
    }
    return "<no ToolError>";
}

bool exists_nofollow(const std::string& path) {
    struct stat st{};
    return ::lstat(path.c_str(), &st) == 0;
}

// A ustar header with arbitrary size field bytes and a correct checksum.
std::string raw_header(const std::string& name, char type, const std::string& size_field) {
    std::string h(512, '\0');
    h.replace(0, name.size(), name);
    h.replace(100, 7, "0000644");
    h.replace(124, size_field.size(), size_field);
    h.replace(136, 11, "00000000000");
    h[156] = type;
    h.replace(257, 6, std::string("ustar\0", 6));
    h.replace(263, 2, "00");
    h.replace(148, 8, "        ");
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    char buf[8];
    std::snprintf(buf, sizeof buf, "%06o", sum);
    h.replace(148, 7, std::string(buf, 6) + '\0');
    return h;
}

std::string small_archive() {
    docker::TarWriter w;
    w.add({.name = "out", .directory = true, .mode = 0755});
    w.add({.name = "out/a.txt", .content = "hello", .mode = 0640});
    w.add({.name = "out/sub/b.txt", .content = std::string(700, 'b')});
    return w.finish();
}

// ---------------------------------------------------------------- read_tar

TEST(TarRead, ParsesTarWriterArchive) {
    auto archive = small_archive();
    auto members = read_tar(archive, {});
    ASSERT_EQ(members.size(), 3u);
    EXPECT_EQ(members[0].path, "out");
    EXPECT_EQ(members[0].type, EntryType::directory);
    EXPECT_EQ(members[1].path, "out/a.txt");
    EXPECT_EQ(members[1].type, EntryType::file);
    EXPECT_EQ(members[1].data, "hello");
    EXPECT_EQ(members[1].size, 5u);
    EXPECT_EQ(members[1].mode, 0640u);
    EXPECT_GT(members[1].mtime, 1600000000);
    EXPECT_EQ(members[2].data, std::string(700, 'b'));
}

class TarSystem : public ::testing::TestWithParam<const char*> {};

TEST_P(TarSystem, ParsesSystemTarWithLongNames) {
    TempDir dir;
    const std::string long_dir = std::string(120, 'x');
    const std::string long_file = std::string(100, 'y') + ".txt";
    write_file(dir / "proj/a.txt", "alpha");
    write_file(dir / ("proj/" + long_dir + "/" + long_file), "long one");
    fs::create_directories(dir / "proj/empty");
    fs::create_symlink("a.txt", dir / "proj/link");
    const std::string deep_target = std::string(150, 'z');
    fs::create_symlink(deep_target, dir / "proj/longlink");
    run("tar --format=" + std::string(GetParam()) + " -C " + dir.path() + " -cf " + (dir / "x.tar") + " proj");
    auto archive = read_file(dir / "x.tar");
    auto members = read_tar(archive, {});

    ASSERT_NE(find(members, "proj"), nullptr);
    EXPECT_EQ(find(members, "proj")->type, EntryType::directory);
    EXPECT_EQ(find(members, "proj/empty")->type, EntryType::directory);
    ASSERT_NE(find(members, "proj/a.txt"), nullptr);
    EXPECT_EQ(find(members, "proj/a.txt")->data, "alpha");
    auto* long_member = find(members, "proj/" + long_dir + "/" + long_file);
    ASSERT_NE(long_member, nullptr);
    EXPECT_EQ(long_member->data, "long one");
    ASSERT_NE(find(members, "proj/link"), nullptr);
    EXPECT_EQ(find(members, "proj/link")->type, EntryType::symlink);
    EXPECT_EQ(find(members, "proj/link")->link_target, "a.txt");
    EXPECT_EQ(find(members, "proj/longlink")->link_target, deep_target);
    EXPECT_EQ(members.size(), 7u);  // proj, a.txt, empty, the long directory and file, two links
}

INSTANTIATE_TEST_SUITE_P(TarFormats, TarSystem, ::testing::Values("gnu", "pax"));

TEST(TarRead, NormalisesNames) {
    std::string archive = raw_header("./a/b/", '5', "00000000000") + raw_header("/abs", '0', "00000000000") +
                          std::string(1024, '\0');
    auto members = read_tar(archive, {});
    ASSERT_EQ(members.size(), 2u);
    EXPECT_EQ(members[0].path, "a/b");
    EXPECT_EQ(members[1].path, "abs");
}

// A packed archive exercises PAX headers, directories and files; every cut
// that loses the end-of-archive marker must be reported, never parsed silently.
TEST(TarRead, EveryTruncationThrows) {
    TempDir root;
    write_file(root / ("p/" + std::string(150, 'n')), std::string(1500, 'd'));
    write_file(root / "p/s/t.txt", "t");
    auto archive = pack_host_path(HostDirs({root.path()}), root / "p", "p", 1000, {}).tar;
    ASSERT_NO_THROW(read_tar(archive, {}));
    const std::size_t end_marker = archive.size() - 1024;
    for (std::size_t cut = 0; cut <= end_marker; cut += 512) {
        EXPECT_THROW(read_tar(std::string_view(archive).substr(0, cut), {}), ToolError) << cut;
        if (cut + 100 < archive.size()) {
            EXPECT_THROW(read_tar(std::string_view(archive).substr(0, cut + 100), {}), ToolError) << cut + 100;
        }
    }
}

// Archives with PAX and GNU long-name headers, so that their records get corrupted too.
std::vector<std::string> fuzz_seeds() {
    TempDir dir;
    write_file(dir / ("p/" + std::string(120, 'l')), "long");
    write_file(dir / "p/s", "short");
    std::vector<std::string> seeds = {small_archive()};
    for (const char* format : {"gnu", "pax"}) {
        run("tar --format=" + std::string(format) + " -C " + dir.path() + " -cf " + (dir / "x.tar") + " p");
        seeds.push_back(read_file(dir / "x.tar"));
    }
    return seeds;
}

// True when read_tar refused the archive; otherwise checks every member's data lies inside it.
bool refused(const std::string& archive) {
    try {
        for (const auto& m : read_tar(archive, {})) {
            if (m.type != EntryType::file) continue;
            EXPECT_EQ(m.data.size(), m.size);
            EXPECT_GE(m.data.data(), archive.data());
            EXPECT_LE(m.data.data() + m.data.size(), archive.data() + archive.size());
        }
        return false;
    } catch (const ToolError&) {
        return true;
    }
}

TEST(TarRead, ByteFlipsNeverEscapeTheBuffer) {
    std::mt19937 rng(42);
    for (const auto& archive : fuzz_seeds()) {
        int refusals = 0;
        for (int round = 0; round < 3000; ++round) {
            auto copy = archive;
            for (int flips = 0; flips < 3; ++flips)
                copy[rng() % 3072] = static_cast<char>(rng());  // headers and data, not the trailer
            refusals += refused(copy);
        }
        EXPECT_GT(refusals, 1000);  // most header corruptions are caught by the checksum
    }
}

TEST(TarRead, GarbageThrows) {
    std::mt19937 rng(7);
    for (int round = 0; round < 200; ++round) {
        std::string garbage(512 * (1 + rng() % 8), '\0');
        for (auto& c : garbage) c = static_cast<char>(rng());
        EXPECT_THROW(read_tar(garbage, {}), ToolError);
    }
    EXPECT_THROW(read_tar("", {}), ToolError);
    EXPECT_THROW(read_tar("short", {}), ToolError);
}

TEST(TarRead, HugeDeclaredSizesAreRefusedWithoutReading) {
    Limits unlimited{UINT64_MAX, UINT64_MAX};
    auto octal = raw_header("big", '0', "77777777777") + std::string(1024, '\0');
    EXPECT_NE(error_of([&] { read_tar(octal, unlimited); }).find("truncated member data"), std::string::npos);
    EXPECT_NE(error_of([&] { read_tar(octal, {}); }).find("more than 268435456 bytes"), std::string::npos);
    auto base256 = raw_header("big", '0', std::string("\x80\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 12)) +
                   std::string(1024, '\0');
    EXPECT_THROW(read_tar(base256, unlimited), ToolError);
    auto pax = raw_header("pax", 'x', "00000000036") + std::string("30 size=999999999999999999999\n") +
               std::string(482, '\0') + raw_header("f", '0', "00000000000") + std::string(1024, '\0');
    EXPECT_THROW(read_tar(pax, unlimited), ToolError);
}

TEST(TarRead, CorruptHeadersThrow) {
    auto archive = small_archive();
    auto bad_sum = archive;
    bad_sum[0] = 'X';
    EXPECT_NE(error_of([&] { read_tar(bad_sum, {}); }).find("checksum"), std::string::npos);
    auto bad_octal = raw_header("f", '0', "0000000009") + std::string(1024, '\0');
    EXPECT_NE(error_of([&] { read_tar(bad_octal, {}); }).find("octal"), std::string::npos);
    auto dangling_pax = raw_header("pax", 'x', "00000000021") + std::string("17 path=whatever\n") +
                        std::string(512 - 17, '\0') + std::string(1024, '\0');
    EXPECT_THROW(read_tar(dangling_pax, {}), ToolError);
    auto bad_record = raw_header("pax", 'x', "00000000010") + std::string("99 path\n") + std::string(504, '\0') +
                      raw_header("f", '0', "00000000000") + std::string(1024, '\0');
    EXPECT_THROW(read_tar(bad_record, {}), ToolError);
}

TEST(TarRead, EntryLimit) {
    docker::TarWriter w;
    for (int i = 0; i < 20000; ++i) w.add({.name = fmt::format("d/f{}", i)});
    auto archive = w.finish();
    EXPECT_EQ(read_tar(archive, {.max_entries = 20000}).size(), 20000u);
    EXPECT_EQ(error_of([&] { read_tar(archive, {.max_entries = 19999}); }),
              "the archive has more than 19999 entries; refusing it");
    EXPECT_THROW(read_tar(archive, {}), ToolError);  // default 10000
}

TEST(TarRead, ByteLimit) {
    docker::TarWriter w;
    std::string hundred(100, 'x');
    for (int i = 0; i < 3; ++i) w.add({.name = fmt::format("f{}", i), .content = hundred});
    auto archive = w.finish();
    EXPECT_EQ(read_tar(archive, {.max_bytes = 300}).size(), 3u);
    EXPECT_NE(error_of([&] { read_tar(archive, {.max_bytes = 299}); }).find("more than 299 bytes"), std::string::npos);
}

// ---------------------------------------------------------------- HostDirs

TEST(HostTransferDirs, LocatesInsideRoots) {
    TempDir a, b;
    fs::create_directories(b / "nested");
    HostDirs dirs({a.path() + "/./", b.path(), b / "nested"});
    EXPECT_EQ(dirs.roots()[0], a.path());  // canonicalised
    EXPECT_EQ(dirs.locate(a / "x/y.txt"), std::make_pair(a.path(), std::string("x/y.txt")));
    EXPECT_EQ(dirs.locate(a.path()), std::make_pair(a.path(), std::string(".")));
    EXPECT_EQ(dirs.locate(a / "x/./y/../z/"), std::make_pair(a.path(), std::string("x/z")));
    EXPECT_EQ(dirs.locate(b / "nested/f"), std::make_pair(b / "nested", std::string("f")));  // most specific
    EXPECT_EQ(dirs.locate(a / "x/../../" + fs::path(b.path()).filename().string() + "/q"),
              std::make_pair(b.path(), std::string("q")));
}

TEST(HostTransferDirs, RefusesOutsideRelativeAndNul) {
    TempDir a;
    HostDirs dirs({a.path()});
    auto outside = error_of([&] { dirs.locate(a / "../etc/passwd"); });
    EXPECT_NE(outside.find("outside the allowed host directories"), std::string::npos) << outside;
    EXPECT_NE(outside.find(a.path()), std::string::npos) << outside;  // lists the roots
    EXPECT_THROW(dirs.locate(a.path() + "x/file"), ToolError);  // same prefix, sibling directory
    EXPECT_THROW(dirs.locate("/etc/passwd"), ToolError);
    EXPECT_THROW(dirs.locate(a / "../../../../.."), ToolError);
    EXPECT_NE(error_of([&] { dirs.locate("relative/path"); }).find("must be absolute"), std::string::npos);
    EXPECT_THROW(dirs.locate(a / std::string("x\0y", 3)), ToolError);
}

TEST(HostTransferDirs, NoRootsSaysHowToEnable) {
    HostDirs none({});
    EXPECT_TRUE(none.empty());
    EXPECT_NE(error_of([&] { none.locate("/tmp/x"); }).find("start cubicle with --allow-host-dir DIR"),
              std::string::npos);
    EXPECT_THROW(HostDirs({"/nonexistent/cubicle-test-dir"}), ToolError);
}

// ---------------------------------------------------------------- pack_host_path

class HostTransferTest : public ::testing::Test {
protected:
    TempDir root, outside;
    HostDirs dirs{{root.path()}};
};

TEST_F(HostTransferTest, PacksTreeSafely) {
    const std::string long_name = "sub/" + std::string(60, 'm') + "/" + std::string(80, 'n') + ".txt";
    write_file(root / "proj/a.txt", "alpha");
    write_file(root / "proj/sub/deep/b.txt", "beta", 0600);
    write_file(root / ("proj/" + long_name), "long");
    write_file(root / "proj/suid", "#!/bin/sh\n", 04755);
    fs::create_symlink("/etc/shadow", root / "proj/shadow");
    fs::create_symlink(outside.path(), root / "proj/outdir");
    ASSERT_EQ(::mkfifo((root / "proj/sub/fifo").c_str(), 0644), 0);

    auto result = pack_host_path(dirs, root / "proj", "data/proj", 1000, {});
    EXPECT_EQ(result.files, 4u);
    EXPECT_EQ(result.directories, 4u);  // proj, sub, sub/deep, sub/mmm (not the "data" parent)
    EXPECT_EQ(result.bytes, 5u + 4 + 4 + 10);
    std::vector<std::string> skipped;
    for (const auto& entry : result.skipped) skipped.push_back(entry.path);
    std::sort(skipped.begin(), skipped.end());
    EXPECT_EQ(skipped, (std::vector<std::string>{"outdir", "shadow", "sub/fifo"}));

    auto members = read_tar(result.tar, {});
    ASSERT_FALSE(members.empty());
    EXPECT_EQ(members[0].path, "data");
    EXPECT_EQ(members[0].type, EntryType::directory);
    EXPECT_EQ(members[1].path, "data/proj");
    EXPECT_EQ(find(members, "data/proj/a.txt")->data, "alpha");
    EXPECT_EQ(find(members, "data/proj/sub/deep/b.txt")->mode, 0600u);
    EXPECT_EQ(find(members, "data/proj/suid")->mode, 0755u);  // setuid dropped
    ASSERT_NE(find(members, "data/proj/" + long_name), nullptr);
    EXPECT_EQ(find(members, "data/proj/" + long_name)->data, "long");
    EXPECT_EQ(find(members, "data/proj/shadow"), nullptr);
    EXPECT_EQ(find(members, "data/proj/sub/fifo"), nullptr);
    for (const auto& m : members) {
        if (m.type == EntryType::directory) {
            EXPECT_EQ(m.mode & 0755, 0755u) << m.path;
        }
    }

    // GNU tar agrees on names, owners and content.
    write_file(outside / "up.tar", result.tar);
    run("tar --numeric-owner -tvf " + (outside / "up.tar") + " | grep -q '1000/1000'");
    run("tar -C " + outside.path() + " -xf " + (outside / "up.tar"));
    EXPECT_EQ(read_file(outside / ("data/proj/" + long_name)), "long");
}

TEST_F(HostTransferTest, PacksSingleFileWithParents) {
    write_file(root / "in.csv", "1,2\n");
    auto result = pack_host_path(dirs, root / "in.csv", "data/sets/input.csv", 1000, {});
    auto members = read_tar(result.tar, {});
    ASSERT_EQ(members.size(), 3u);
    EXPECT_EQ(members[0].path, "data");
    EXPECT_EQ(members[1].path, "data/sets");
    EXPECT_EQ(members[2].path, "data/sets/input.csv");
    EXPECT_EQ(members[2].data, "1,2\n");
    EXPECT_EQ(result.files, 1u);
}

TEST_F(HostTransferTest, PackRefusesSymlinksOutOfTheRoot) {
    write_file(outside / "secret/key", "SECRET");
    fs::create_symlink(outside / "secret", root / "escape");
    fs::create_directories(root / "real");
    fs::create_symlink(root / "real", root / "alias");

    auto through = error_of([&] { pack_host_path(dirs, root / "escape/key", "k", 1000, {}); });
    EXPECT_NE(through.find("outside its allowed directory"), std::string::npos) << through;
    auto itself = error_of([&] { pack_host_path(dirs, root / "escape", "k", 1000, {}); });
    EXPECT_NE(itself.find("symbolic link"), std::string::npos) << itself;
    EXPECT_NE(error_of([&] { pack_host_path(dirs, root / "alias", "k", 1000, {}); }).find("symbolic link"),
              std::string::npos);
    EXPECT_THROW(pack_host_path(dirs, outside / "secret/key", "k", 1000, {}), ToolError);
    EXPECT_NE(error_of([&] { pack_host_path(dirs, root / "missing", "k", 1000, {}); }).find("does not exist"),
              std::string::npos);
    EXPECT_THROW(pack_host_path(dirs, root / "real", "/abs", 1000, {}), ToolError);
}

TEST_F(HostTransferTest, PackEnforcesLimits) {
    for (int i = 0; i < 5; ++i) write_file(root / fmt::format("p/f{}", i), std::string(10, 'x'));
    EXPECT_NO_THROW(pack_host_path(dirs, root / "p", "p", 1000, {.max_bytes = 50, .max_entries = 6}));
    EXPECT_NE(error_of([&] { pack_host_path(dirs, root / "p", "p", 1000, {.max_entries = 5}); })
                  .find("more than 5 files and directories"),
              std::string::npos);
    EXPECT_NE(error_of([&] { pack_host_path(dirs, root / "p", "p", 1000, {.max_bytes = 49}); })
                  .find("more than 49 bytes"),
              std::string::npos);
}

// ---------------------------------------------------------------- unpack_to_host

TarMember file_member(std::string path, std::string_view data, unsigned mode = 0644) {
    return {.path = std::move(path), .type = EntryType::file, .size = data.size(), .mode = mode, .data = data};
}

TarMember dir_member(std::string path, unsigned mode = 0755) {
    return {.path = std::move(path), .type = EntryType::directory, .mode = mode};
}

TEST_F(HostTransferTest, UnpacksSingleFile) {
    auto result = unpack_to_host(dirs, {file_member("plot.png", "PNG")}, root / "plot-copy.png", {});
    EXPECT_EQ(read_file(root / "plot-copy.png"), "PNG");
    EXPECT_EQ(result.files, 1u);
    EXPECT_EQ(result.bytes, 3u);
    // Overwriting an existing regular file is fine.
    unpack_to_host(dirs, {file_member("plot.png", "PNG2")}, root / "plot-copy.png", {});
    EXPECT_EQ(read_file(root / "plot-copy.png"), "PNG2");
}

TEST_F(HostTransferTest, UnpacksDirectoryFromArchive) {
    auto archive = small_archive();
    auto members = read_tar(archive, {});
    auto result = unpack_to_host(dirs, members, root / "dl", {});
    EXPECT_EQ(read_file(root / "dl/a.txt"), "hello");
    EXPECT_EQ(read_file(root / "dl/sub/b.txt"), std::string(700, 'b'));  // parent made without an entry
    EXPECT_EQ(result.files, 2u);
    EXPECT_EQ(result.directories, 2u);
    EXPECT_EQ(result.bytes, 705u);
    for (const auto& entry : fs::recursive_directory_iterator(root.path()))
        EXPECT_EQ(entry.path().filename().string().find(".cubicle-"), std::string::npos);
}

TEST_F(HostTransferTest, RoundTripThroughPackAndUnpack) {
    write_file(root / "src/x/y.txt", "why");
    write_file(root / ("src/" + std::string(200, 'q')), "q");
    auto packed = pack_host_path(dirs, root / "src", "src", 1000, {});
    unpack_to_host(dirs, read_tar(packed.tar, {}), root / "copy", {});
    EXPECT_EQ(read_file(root / "copy/x/y.txt"), "why");
    EXPECT_EQ(read_file(root / ("copy/" + std::string(200, 'q'))), "q");
}

TEST_F(HostTransferTest, UnpackRefusesUnsafeArchivesWholesale) {
    auto good = file_member("out/ok.txt", "ok");
    auto link = file_member("out/link", "");
    link.type = EntryType::symlink;
    link.link_target = "/etc/shadow";
    auto hard = link;
    hard.type = EntryType::hardlink;
    auto fifo = file_member("out/fifo", "");
    fifo.type = EntryType::other;
    struct Case {
        std::vector<TarMember> members;
        std::string expected;
    };
    std::vector<Case> cases = {
        {{good, link}, "link or special file"},
        {{good, hard}, "link or special file"},
        {{good, fifo}, "link or special file"},
        {{good, file_member("out/../escape", "x")}, "'..'"},
        {{file_member("../escape", "x")}, "'..'"},
        {{good, file_member("/etc/x", "x")}, "absolute"},
        {{good, file_member("other/x", "x")}, "one top-level name"},
        {{good, file_member("", "x")}, "empty name"},
        {{good, file_member(std::string("out/a\0b", 7), "x")}, "NUL"},
        {{file_member("out/f", "x"), file_member("out/f/g", "y")}, "both a file and a directory"},
        {{}, "empty"},
    };
    for (const auto& c : cases) {
        auto message = error_of([&] { unpack_to_host(dirs, c.members, root / "out", {}); });
        EXPECT_NE(message.find(c.expected), std::string::npos) << message;
        EXPECT_FALSE(exists_nofollow(root / "out")) << c.expected;  // nothing written
    }
}

TEST_F(HostTransferTest, UnpackNeverFollowsHostSymlinks) {
    write_file(outside / "victim.txt", "original");
    fs::create_directories(root / "dl");
    fs::create_symlink(outside / "victim.txt", root / "dl/c.txt");
    std::vector<TarMember> members = {dir_member("out"), file_member("out/new.txt", "n"),
                                      file_member("out/c.txt", "pwned")};
    auto message = error_of([&] { unpack_to_host(dirs, members, root / "dl", {}); });
    EXPECT_NE(message.find("symbolic link"), std::string::npos) << message;
    EXPECT_EQ(read_file(outside / "victim.txt"), "original");
    EXPECT_TRUE(fs::is_symlink(root / "dl/c.txt"));
    EXPECT_FALSE(exists_nofollow(root / "dl/new.txt"));  // refused before writing anything

    // A symlinked directory on the way, and host_path itself a symlink.
    fs::create_symlink(outside.path(), root / "dl/sub");
    EXPECT_THROW(unpack_to_host(dirs, {file_member("out/sub/x", "x")}, root / "dl", {}), ToolError);
    fs::create_symlink(outside.path(), root / "linkdir");
    EXPECT_THROW(unpack_to_host(dirs, {file_member("out/x", "x")}, root / "linkdir", {}), ToolError);
    EXPECT_THROW(unpack_to_host(dirs, {file_member("f", "x")}, root / "linkdir/f", {}), ToolError);
    EXPECT_FALSE(exists_nofollow(outside / "x"));
    EXPECT_FALSE(exists_nofollow(outside / "f"));
}

TEST_F(HostTransferTest, UnpackRefusesTypeClashesAndMissingParent) {
    fs::create_directories(root / "isdir");
    write_file(root / "isfile", "f");
    EXPECT_NE(error_of([&] { unpack_to_host(dirs, {file_member("f", "x")}, root / "isdir", {}); })
                  .find("not a regular file"),
              std::string::npos);
    EXPECT_NE(error_of([&] { unpack_to_host(dirs, {dir_member("d")}, root / "isfile", {}); })
                  .find("not a directory"),
              std::string::npos);
    EXPECT_NE(error_of([&] { unpack_to_host(dirs, {file_member("f", "x")}, root / "missing/f", {}); })
                  .find("parent directory"),
              std::string::npos);
    EXPECT_FALSE(exists_nofollow(root / "missing"));
    EXPECT_EQ(read_file(root / "isfile"), "f");
}

TEST_F(HostTransferTest, UnpackStripsSpecialModeBits) {
    unpack_to_host(dirs, {dir_member("d", 07777), file_member("d/tool", "#!", 06755)}, root / "d", {});
    struct stat st{};
    ASSERT_EQ(::stat((root / "d/tool").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07000, 0u);
    EXPECT_EQ(st.st_mode & 0100, 0100u);
    ASSERT_EQ(::stat((root / "d").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07000, 0u);
}

TEST_F(HostTransferTest, FailedWriteLeavesNoHalfFile) {
    write_file(root / "keep.txt", "old");
    std::string big(1 << 20, 'z');
    rlimit saved{};
    ::getrlimit(RLIMIT_FSIZE, &saved);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit small{4096, saved.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &small);
    auto message = error_of([&] { unpack_to_host(dirs, {file_member("keep.txt", big)}, root / "keep.txt", {}); });
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    EXPECT_NE(message.find("cannot write"), std::string::npos) << message;
    EXPECT_EQ(read_file(root / "keep.txt"), "old");
    for (const auto& entry : fs::directory_iterator(root.path()))
        EXPECT_EQ(entry.path().filename(), "keep.txt");  // no temporary left behind
}

TEST_F(HostTransferTest, UnpackOutsideRootsCreatesNothing) {
    EXPECT_THROW(unpack_to_host(dirs, {file_member("f", "x")}, outside / "f", {}), ToolError);
    EXPECT_THROW(unpack_to_host(dirs, {file_member("f", "x")}, root / "../f", {}), ToolError);
    EXPECT_FALSE(exists_nofollow(outside / "f"));
    EXPECT_THROW(unpack_to_host(HostDirs({}), {file_member("f", "x")}, root / "f", {}), ToolError);
    EXPECT_FALSE(exists_nofollow(root / "f"));
}

TEST_F(HostTransferTest, UnpackEnforcesLimits) {
    std::vector<TarMember> members = {dir_member("o"), file_member("o/a", "aaaa"), file_member("o/b", "bbbb")};
    EXPECT_THROW(unpack_to_host(dirs, members, root / "o", {.max_entries = 2}), ToolError);
    EXPECT_THROW(unpack_to_host(dirs, members, root / "o", {.max_bytes = 7}), ToolError);
    EXPECT_FALSE(exists_nofollow(root / "o"));
    EXPECT_NO_THROW(unpack_to_host(dirs, members, root / "o", {.max_bytes = 8, .max_entries = 3}));
}

// ---------------------------------------------------------------- workspace_path

TEST(HostTransferWorkspacePath, Normalises) {
    EXPECT_EQ(workspace_path("."), ".");
    EXPECT_EQ(workspace_path("a/./b/../c"), "a/c");
    EXPECT_EQ(workspace_path("a/"), "a");
    EXPECT_EQ(workspace_path("a//b"), "a/b");
    EXPECT_EQ(workspace_path("a/.."), ".");
    EXPECT_EQ(workspace_path(std::string(255, 'x')), std::string(255, 'x'));
}

TEST(HostTransferWorkspacePath, Refuses) {
    EXPECT_EQ(error_of([] { workspace_path("/etc/passwd"); }),
              "path must be relative to the workspace (/workspace), not '/etc/passwd'");
    EXPECT_NE(error_of([] { workspace_path("../x"); }).find("escapes the workspace"), std::string::npos);
    EXPECT_THROW(workspace_path("a/../../x"), ToolError);
    EXPECT_THROW(workspace_path(std::string("a\0b", 3)), ToolError);
    EXPECT_THROW(workspace_path(""), ToolError);
    EXPECT_THROW(workspace_path(std::string(256, 'x')), ToolError);
    EXPECT_THROW(workspace_path(std::string(4097, 'a')), ToolError);
    std::string long_ok;
    while (long_ok.size() < 4000) long_ok += "abcdefgh/";
    EXPECT_NO_THROW(workspace_path(long_ok));
}

} // namespace
} // namespace cubicle::files
