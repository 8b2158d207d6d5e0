// Projects without Docker: the baseline, what counts as a change, the diff text
// (checked against git itself), applying to a host directory, ignore rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "files/host_transfer.hpp"
#include "projects/apply.hpp"
#include "projects/baseline.hpp"
#include "projects/changes.hpp"
#include "projects/ignore.hpp"

namespace cubicle::projects {
namespace {

namespace fs = std::filesystem;

class TempDir {
public:
    TempDir() {
        char templ[] = "/tmp/cubicle-proj-XXXXXX";
        if (!::mkdtemp(templ)) throw std::runtime_error("mkdtemp failed");
        char resolved[PATH_MAX];
        path_ = ::realpath(templ, resolved);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& sub) const { return path_ + "/" + sub; }

private:
    std::string path_;
};

void put(const std::string& path, const std::string& content, unsigned mode = 0644) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    ::chmod(path.c_str(), mode);
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string run(const std::string& command) {
    std::string out;
    FILE* pipe = ::popen(command.c_str(), "r");
    char buffer[4096];
    while (auto n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
    EXPECT_EQ(::pclose(pipe), 0) << command;
    return out;
}

// A listing record as the sandbox's find prints it.
std::string record(char type, unsigned mode, std::size_t size, double mtime, const std::string& path, const std::string& target = "") {
    std::string out = fmt::format("{}\t{:o}\t{}\t{:.10f}\t{}", type, mode, size, mtime, path);
    out.push_back('\0');
    out += target;
    out.push_back('\0');
    return out;
}

Baseline sample_baseline() {
    Baseline b;
    b.host_path = "/nowhere";
    b.path = "proj";
    b.record("same.txt", false, 0644, 100, "same\n");
    b.record("edited.txt", false, 0644, 100, "one\ntwo\nthree\n");
    b.record("gone.txt", false, 0644, 100, "bye\n");
    b.record("script.sh", false, 0644, 100, "echo hi\n");
    b.record("becomes-link.txt", false, 0644, 100, "text\n");
    b.record("link", true, 0777, 100, "same.txt");
    return b;
}

std::string sample_listing() {
    return record('f', 0644, 5, 100, "same.txt") + record('f', 0644, 14, 250.5, "edited.txt") +
           record('f', 0755, 8, 100, "script.sh") + record('l', 0777, 8, 100, "becomes-link.txt", "/etc/passwd") +
           record('l', 0777, 8, 100, "link", "same.txt") + record('f', 0644, 4, 300, "new.txt") +
           record('p', 0644, 0, 300, "pipe") + record('d', 0755, 0, 300, "dir") + record('f', 0644, 10, 300, ".git/HEAD") +
           record('f', 0644, 3, 300, "sub/.git/config");
}

TEST(ProjectChanges, ListingDropsDirectoriesAndGitInternals) {
    auto listing = parse_listing(sample_listing());
    EXPECT_EQ(listing.size(), 7u);
    EXPECT_FALSE(listing.contains("dir"));
    EXPECT_FALSE(listing.contains(".git/HEAD"));
    EXPECT_FALSE(listing.contains("sub/.git/config"));
    EXPECT_EQ(listing.at("becomes-link.txt").link_target, "/etc/passwd");
    EXPECT_EQ(listing.at("script.sh").mode, 0755u);
    EXPECT_THROW(parse_listing("f\t644\t1"), ToolError);
}

TEST(ProjectChanges, FetchesOnlyNewFilesAndThoseWhoseSizeOrTimeMoved) {
    auto baseline = sample_baseline();
    auto fetch = files_to_fetch(baseline, parse_listing(sample_listing()));
    EXPECT_EQ(fetch, (std::vector<std::string>{"edited.txt", "new.txt"}));
}

TEST(ProjectChanges, ClassifiesEveryKindOfChange) {
    auto baseline = sample_baseline();
    std::map<std::string, std::string> fetched{{"edited.txt", "one\n2\nthree\n"}, {"new.txt", "new\n"}};
    auto changes = compare(baseline, parse_listing(sample_listing()), fetched);
    std::map<std::string, std::string> seen;
    for (const auto& c : changes) seen[c.path] = fmt::format("{}/{}", status_name(c.status), c.type);
    EXPECT_EQ(seen, (std::map<std::string, std::string>{{"becomes-link.txt", "modified/symlink"},
                                                        {"edited.txt", "modified/file"},
                                                        {"gone.txt", "deleted/file"},
                                                        {"new.txt", "added/file"},
                                                        {"pipe", "added/special"},
                                                        {"script.sh", "mode/file"}}));
}

TEST(ProjectChanges, TouchedButUnchangedFilesAreNoChange) {
    auto baseline = sample_baseline();
    auto listing = record('f', 0644, 5, 999.25, "same.txt");
    auto changes = compare(baseline, parse_listing(listing), {{"same.txt", "same\n"}});
    for (const auto& c : changes) EXPECT_NE(c.path, "same.txt");
}

TEST(ProjectChanges, NewFilesTheIgnoreRulesMatchAreNoChange) {
    TempDir dir;
    put(dir / ".gitignore", "*.o\nbuild/\n");
    Baseline baseline;
    baseline.host_path = dir.path();
    baseline.ignore = std::make_shared<IgnoreRules>(dir.path());
    auto listing = parse_listing(record('f', 0644, 1, 1, "a.o") + record('f', 0644, 1, 1, "build/x") + record('f', 0644, 1, 1, "a.c"));
    EXPECT_EQ(files_to_fetch(baseline, listing), (std::vector<std::string>{"a.c"}));
}

// The diff text is what git itself prints for the same change.
TEST(ProjectDiff, MatchesGitDiff) {
    if (std::system("git --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no git";
    TempDir repo;
    std::map<std::string, std::pair<std::string, unsigned>> before{
        {"edited.txt", {"one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n", 0644}},
        {"gone.txt", {"bye\n", 0644}},
        {"script.sh", {"echo hi\n", 0644}},
        {"no-newline.txt", {"a\nb", 0644}},
        {"bin.dat", {std::string("\0\1\2", 3), 0644}},
        {"empty-gone", {"", 0644}},
        {"name with\nnewline", {"x\n", 0644}},
        {"caf\xc3\xa9.txt", {"cafe\n", 0644}},
    };
    Baseline baseline;
    for (const auto& [path, file] : before) {
        put(repo / path, file.first, file.second);
        baseline.record(path, false, file.second, 1, file.first);
    }
    run(fmt::format("cd {} && git init -q && git -c user.name=t -c user.email=t@t add -A && "
                    "git -c user.name=t -c user.email=t@t commit -qm base", repo.path()));
    put(repo / "edited.txt", "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\n10\n");
    fs::remove(repo / "gone.txt");
    fs::remove(repo / "empty-gone");
    ::chmod((repo / "script.sh").c_str(), 0755);
    put(repo / "no-newline.txt", "a\nb\nc");
    put(repo / "bin.dat", std::string("\0\1\3", 3));
    put(repo / "added.txt", "new\n");
    put(repo / "added-empty", "");
    put(repo / "name with\nnewline", "y\n");
    put(repo / "caf\xc3\xa9.txt", "caf\xc3\xa9\n");
    std::string listing;
    std::map<std::string, std::string> fetched;
    for (const auto& entry : fs::recursive_directory_iterator(repo.path())) {
        auto relative = fs::relative(entry.path(), repo.path()).string();
        if (relative.starts_with(".git") || !entry.is_regular_file()) continue;
        struct stat st{};
        ::stat(entry.path().c_str(), &st);
        listing += record('f', st.st_mode & 0777, static_cast<std::size_t>(st.st_size), 2, relative);
        fetched[relative] = slurp(entry.path());
    }
    auto changes = compare(baseline, parse_listing(listing), fetched);
    auto ours = unified_diff(baseline, changes);
    auto git = run(fmt::format("cd {} && git add -N --ignore-removal . && git -c core.abbrev=7 diff --no-renames", repo.path()));
    EXPECT_EQ(ours, git);
}

// ---- apply

struct HostProject {
    TempDir root;
    files::HostDirs dirs{{root.path()}};
    files::Limits limits;
    Baseline baseline;
    HostProject() {
        baseline.host_path = root.path();
        baseline.path = "p";
        for (auto [path, data] : {std::pair{"a.txt", "a\n"}, {"b.txt", "b\n"}, {"c.txt", "c\n"}, {"dir/d.txt", "d\n"}}) {
            put(root / path, data);
            baseline.record(path, false, 0644, 1, data);
        }
    }
    Change modified(const std::string& path, const std::string& data, unsigned mode = 0644) {
        return {.path = path, .status = ChangeStatus::modified, .old_mode = 0644, .new_mode = mode, .new_data = data,
                .new_sha256 = sha256_hex(data), .new_mtime = 5};
    }
};

TEST(ProjectApply, WritesChangesAndUpdatesTheBaseline) {
    HostProject p;
    Change added{.path = "new/deep/e.txt", .status = ChangeStatus::added, .new_mode = 0755, .new_data = "e\n",
                 .new_sha256 = sha256_hex("e\n"), .new_mtime = 5};
    std::vector<Change> changes{p.modified("a.txt", "A\n"), added};
    auto result = apply_changes(p.baseline, changes, {}, p.dirs, p.limits);
    EXPECT_EQ(result.written.size(), 2u);
    EXPECT_TRUE(result.conflicts.empty());
    EXPECT_EQ(slurp(p.root / "a.txt"), "A\n");
    EXPECT_EQ(slurp(p.root / "new/deep/e.txt"), "e\n");
    struct stat st{};
    ::stat((p.root / "new/deep/e.txt").c_str(), &st);
    EXPECT_EQ(st.st_mode & 0777, 0755u);
    EXPECT_EQ(p.baseline.files.at("a.txt").data, "A\n");
    EXPECT_EQ(p.baseline.files.at("new/deep/e.txt").mtime, 5);
}

TEST(ProjectApply, HostFileChangedMeanwhileIsAConflictAndUntouched) {
    HostProject p;
    put(p.root / "b.txt", "host edit\n");
    auto result = apply_changes(p.baseline, {p.modified("b.txt", "sandbox edit\n")}, {}, p.dirs, p.limits);
    ASSERT_EQ(result.conflicts.size(), 1u);
    EXPECT_EQ(result.conflicts[0].baseline_sha256, sha256_hex("b\n"));
    EXPECT_EQ(result.conflicts[0].host_sha256, sha256_hex("host edit\n"));
    EXPECT_EQ(slurp(p.root / "b.txt"), "host edit\n");
    EXPECT_EQ(p.baseline.files.at("b.txt").data, "b\n");
}

TEST(ProjectApply, DryRunWritesNothing) {
    HostProject p;
    ApplyRequest request{.dry_run = true, .delete_all = true};
    Change gone{.path = "c.txt", .status = ChangeStatus::deleted, .old_mode = 0644};
    auto result = apply_changes(p.baseline, {p.modified("a.txt", "A\n"), gone}, request, p.dirs, p.limits);
    EXPECT_EQ(result.written.size(), 1u);
    EXPECT_EQ(result.deleted, std::vector<std::string>{"c.txt"});
    EXPECT_EQ(slurp(p.root / "a.txt"), "a\n");
    EXPECT_TRUE(fs::exists(p.root / "c.txt"));
    EXPECT_EQ(p.baseline.files.at("a.txt").data, "a\n");
}

TEST(ProjectApply, DeletionsOnlyWhenAsked) {
    HostProject p;
    Change gone{.path = "c.txt", .status = ChangeStatus::deleted, .old_mode = 0644};
    auto result = apply_changes(p.baseline, {gone}, {}, p.dirs, p.limits);
    EXPECT_TRUE(result.deleted.empty());
    ASSERT_EQ(result.refused.size(), 1u);
    EXPECT_TRUE(fs::exists(p.root / "c.txt"));
    result = apply_changes(p.baseline, {gone}, {.files = {"c.txt"}}, p.dirs, p.limits);
    EXPECT_EQ(result.deleted, std::vector<std::string>{"c.txt"});
    EXPECT_FALSE(fs::exists(p.root / "c.txt"));
    EXPECT_FALSE(p.baseline.files.contains("c.txt"));
}

TEST(ProjectApply, NeverLinksSpecialFilesGitInternalsOrThroughHostLinks) {
    HostProject p;
    TempDir outside;
    put(outside / "victim", "safe\n");
    fs::remove_all(p.root / "dir");
    fs::create_directory_symlink(outside.path(), p.root / "dir");  // the host swapped a directory for a link
    fs::remove(p.root / "a.txt");
    fs::create_symlink(outside / "victim", p.root / "a.txt");
    auto link = p.modified("b.txt", "/etc/passwd");
    link.type = "symlink";
    auto fifo = p.modified("c.txt", "");
    fifo.type = "special";
    Change git{.path = ".git/config", .status = ChangeStatus::added, .new_mode = 0644, .new_data = "x"};
    auto result = apply_changes(p.baseline, {p.modified("dir/d.txt", "owned\n"), p.modified("a.txt", "owned\n"), link, fifo, git},
                                {}, p.dirs, p.limits);
    EXPECT_TRUE(result.written.empty());
    EXPECT_EQ(slurp(outside / "victim"), "safe\n");
    EXPECT_EQ(result.refused.size(), 3u);   // link, FIFO, .git
    EXPECT_EQ(result.conflicts.size(), 2u);  // the host has links where files were
    EXPECT_EQ(slurp(p.root / "b.txt"), "b\n");
}

TEST(ProjectApply, HostModeKeptUnlessTheSandboxChangedIt) {
    HostProject p;
    ::chmod((p.root / "a.txt").c_str(), 0600);  // a chmod on the host alone is no conflict
    auto result = apply_changes(p.baseline, {p.modified("a.txt", "A\n"), p.modified("b.txt", "B\n", 0755)}, {}, p.dirs, p.limits);
    ASSERT_EQ(result.written.size(), 2u);
    struct stat st{};
    ::stat((p.root / "a.txt").c_str(), &st);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ::stat((p.root / "b.txt").c_str(), &st);
    EXPECT_EQ(st.st_mode & 0777, 0755u);
}

TEST(ProjectHostGuard, RefusesEscapes) {
    HostProject p;
    EXPECT_THROW(files::write_host_file(p.dirs, p.root.path(), "../x", "x", 0644), ToolError);
    EXPECT_THROW(files::write_host_file(p.dirs, p.root.path(), "/etc/x", "x", 0644), ToolError);
    EXPECT_THROW(files::write_host_file(p.dirs, "/etc", "x", "x", 0644), ToolError);
    TempDir outside;
    fs::create_directory_symlink(outside.path(), p.root / "out");
    EXPECT_THROW(files::write_host_file(p.dirs, p.root.path(), "out/x", "x", 0644), ToolError);
    EXPECT_FALSE(fs::exists(outside / "x"));
    EXPECT_EQ(files::read_host_file(p.dirs, p.root.path(), "out/x", p.limits).kind, files::HostFile::Kind::symlink);
    ::mkfifo((p.root / "fifo").c_str(), 0644);
    EXPECT_EQ(files::read_host_file(p.dirs, p.root.path(), "fifo", p.limits).kind, files::HostFile::Kind::other);
    EXPECT_THROW(files::write_host_file(p.dirs, p.root.path(), "fifo", "x", 0644), ToolError);
    EXPECT_THROW(files::remove_host_file(p.dirs, p.root.path(), "fifo"), ToolError);
}

// ---- open: ignore rules and packing

TEST(ProjectIgnore, GitRulesButTrackedFilesStay) {
    if (std::system("git --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no git";
    TempDir repo;
    put(repo / ".gitignore", "*.log\nbuild/\n");
    put(repo / "kept.log", "tracked despite the pattern\n");
    put(repo / "src/a.c", "int a;\n");
    run(fmt::format("cd {} && git init -q && git add -f kept.log .gitignore src", repo.path()));
    put(repo / "other.log", "x\n");
    fs::create_directories(repo / "build");
    IgnoreRules rules(repo.path());
    EXPECT_TRUE(rules.in_repository());
    EXPECT_TRUE(rules.ignored("other.log", false));
    EXPECT_FALSE(rules.ignored("kept.log", false));
    EXPECT_TRUE(rules.ignored("build", true));
    EXPECT_FALSE(rules.ignored("src", true));
    EXPECT_FALSE(rules.ignored("src/a.c", false));
}

TEST(ProjectIgnore, PlainDirectoryHonoursItsGitignoreFiles) {
    TempDir dir;
    put(dir / ".gitignore", "*.o\n");
    put(dir / "sub/.gitignore", "secret\n");
    IgnoreRules rules(dir.path());
    EXPECT_FALSE(rules.in_repository());
    EXPECT_TRUE(rules.ignored("x.o", false));
    EXPECT_TRUE(rules.ignored("sub/secret", false));
    EXPECT_FALSE(rules.ignored("secret", false));
    EXPECT_FALSE(fs::exists(dir / ".git"));  // nothing written
}

TEST(ProjectPack, KeepsLinksSkipsSpecialFilesAndRecordsEntries) {
    TempDir dir;
    put(dir / "p/a.txt", "a\n");
    put(dir / "p/skip.o", "o\n");
    fs::create_symlink("a.txt", dir / "p/in");
    fs::create_symlink("/etc/passwd", dir / "p/abs");
    fs::create_symlink("../../x", dir / "p/sub-up");
    ::mkfifo((dir / "p/fifo").c_str(), 0644);
    files::HostDirs dirs({dir.path()});
    files::PackOptions options;
    options.keep_links = true;
    options.excluded = [](const std::string& path, bool) { return path.ends_with(".o"); };
    std::map<std::string, std::string> seen;
    options.on_entry = [&seen](const files::PackedEntry& e) { seen[std::string(e.path)] = std::string(e.data); };
    auto packed = files::pack_host_path(dirs, dir / "p", "p", 1000, {}, options);
    EXPECT_EQ(packed.files, 1u);
    EXPECT_EQ(packed.ignored, 1u);
    ASSERT_EQ(packed.skipped.size(), 1u);
    EXPECT_EQ(packed.skipped[0].path, "fifo");
    EXPECT_EQ(packed.skipped[0].reason, "a FIFO (named pipe)");
    std::map<std::string, bool> outside;
    for (const auto& link : packed.links) outside[link.path] = link.outside;
    EXPECT_EQ(outside, (std::map<std::string, bool>{{"abs", true}, {"in", false}, {"sub-up", true}}));
    EXPECT_EQ(seen.at("in"), "a.txt");
    EXPECT_EQ(seen.at("a.txt"), "a\n");
    auto long_target = std::string(150, 'x') + "/target";
    fs::create_symlink(long_target, dir / "p/long");
    packed = files::pack_host_path(dirs, dir / "p", "p", 1000, {}, options);
    auto members = files::read_tar(packed.tar, {});
    bool long_link = std::ranges::any_of(members, [&long_target](const files::TarMember& m) {
        return m.path == "p/long" && m.type == files::EntryType::symlink && m.link_target == long_target;
    });
    EXPECT_TRUE(long_link);  // a target past the 100-byte field travels in a PAX header
    bool link_member = std::ranges::any_of(members, [](const files::TarMember& m) {
        return m.path == "p/abs" && m.type == files::EntryType::symlink && m.link_target == "/etc/passwd";
    });
    EXPECT_TRUE(link_member);
}

} // namespace
} // namespace cubicle::projects
