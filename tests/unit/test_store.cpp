// The store room: records written whole, holds across processes, retention.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <csignal>

#include <sys/wait.h>
#include <unistd.h>

#include "common/ids.hpp"
#include "store/saved.hpp"
#include "store/store.hpp"

namespace fs = std::filesystem;
using namespace cubicle;

namespace {

struct TempDir {
    fs::path path = fs::temp_directory_path() / ("cubicle-store-test-" + random_hex(6));
    ~TempDir() { fs::remove_all(path); }
};

store::SavedSandbox record(std::string id, std::int64_t last_used, std::uint64_t bytes = 0) {
    store::SavedSandbox saved;
    saved.sandbox_id = std::move(id);
    saved.name = "n-" + saved.sandbox_id;
    saved.owner = "local";
    saved.last_used = last_used;
    saved.size_bytes = bytes;
    return saved;
}

} // namespace

TEST(Store, MakesItsDirectoryAndAnIdThatStays) {
    TempDir dir;
    std::string id;
    {
        store::Store s(dir.path / "nested" / "state");
        id = s.id();
        EXPECT_EQ(id.size(), 32u);
        EXPECT_EQ(fs::status(s.dir()).permissions() & fs::perms::all, fs::perms::owner_all);
    }
    store::Store again(dir.path / "nested" / "state");
    EXPECT_EQ(again.id(), id);
}

TEST(Store, RecordsAreWrittenReadListedAndRemoved) {
    TempDir dir;
    store::Store s(dir.path);
    s.write(store::sandboxes, "sb-1", "{\"a\":1}\n");
    s.write(store::sandboxes, "sb-1", "{\"a\":2}\n");  // replaced whole
    s.write(store::sandboxes, "sb-2", "{}\n");
    std::ofstream(s.path_of(store::sandboxes, "sb-2", ".tar")) << "archive";
    EXPECT_EQ(s.read(store::sandboxes, "sb-1"), "{\"a\":2}\n");
    EXPECT_EQ(s.read(store::sandboxes, "sb-3"), std::nullopt);
    auto keys = s.keys(store::sandboxes);
    std::sort(keys.begin(), keys.end());
    EXPECT_EQ(keys, (std::vector<std::string>{"sb-1", "sb-2"}));
    EXPECT_TRUE(s.keys(store::snapshots).empty());
    s.remove(store::sandboxes, "sb-2");
    EXPECT_FALSE(fs::exists(s.path_of(store::sandboxes, "sb-2", ".tar")));
    EXPECT_EQ(s.keys(store::sandboxes), std::vector<std::string>{"sb-1"});
    // No temporary file is left behind.
    for (const auto& entry : fs::directory_iterator(dir.path / "sandboxes"))
        EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

TEST(Store, KeysThatCouldLeaveTheDirectoryAreRefused) {
    TempDir dir;
    store::Store s(dir.path);
    for (const char* key : {"../x", "a/b", "", ".hidden", "a b"}) {
        EXPECT_THROW(s.write(store::sandboxes, key, "{}"), std::invalid_argument) << key;
    }
}

TEST(Store, AHoldIsExclusiveAndDiesWithItsProcess) {
    TempDir dir;
    store::Store s(dir.path);
    EXPECT_FALSE(s.held(store::sandboxes, "sb-1"));
    auto hold = s.try_hold(store::sandboxes, "sb-1");
    ASSERT_TRUE(hold);
    EXPECT_TRUE(s.held(store::sandboxes, "sb-1"));
    EXPECT_FALSE(s.try_hold(store::sandboxes, "sb-1"));  // this process too
    hold.reset();
    EXPECT_FALSE(s.held(store::sandboxes, "sb-1"));
    // Another process holds it until it is killed.
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    pid_t child = fork();
    if (child == 0) {
        auto held = s.try_hold(store::sandboxes, "sb-1");
        char c = held ? 'y' : 'n';
        (void)!write(ready[1], &c, 1);
        pause();
        _exit(0);
    }
    char c = 0;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    EXPECT_EQ(c, 'y');
    EXPECT_TRUE(s.held(store::sandboxes, "sb-1"));
    EXPECT_FALSE(s.try_hold(store::sandboxes, "sb-1"));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    EXPECT_FALSE(s.held(store::sandboxes, "sb-1"));
    EXPECT_TRUE(s.try_hold(store::sandboxes, "sb-1"));
    close(ready[0]);
    close(ready[1]);
}

TEST(Saved, ARecordRoundTrips) {
    auto saved = record("sb-abc", 1700000000, 12345);
    saved.volume = store::volume_of("sb-abc");
    saved.spec.image = "cubicle/sandbox";
    saved.spec.memory_mb = 300;
    saved.spec.cpus = 1.5;
    saved.spec.env = {{"A", "1"}, {"B", "two \"quoted\"\n"}};
    saved.stateful = false;
    saved.ended = "server exit";
    saved.engine = "ENGINE:ID";
    auto back = store::saved_sandbox_from_json(store::to_json(saved));
    EXPECT_EQ(back.engine, "ENGINE:ID");
    EXPECT_EQ(back.sandbox_id, saved.sandbox_id);
    EXPECT_EQ(back.volume, saved.volume);
    EXPECT_EQ(back.spec.memory_mb, 300);
    EXPECT_EQ(back.spec.cpus, 1.5);
    EXPECT_EQ(back.spec.env, saved.spec.env);
    EXPECT_FALSE(back.stateful);
    EXPECT_EQ(back.size_bytes, 12345u);
    EXPECT_EQ(back.ended, "server exit");
    EXPECT_THROW(store::saved_sandbox_from_json("{\"version\": 2}"), std::runtime_error);
    // A record may only name its own sandbox's volume.
    saved.volume = "someone-elses-volume";
    EXPECT_THROW(store::saved_sandbox_from_json(store::to_json(saved)), std::runtime_error);
    EXPECT_THROW(store::saved_sandbox_from_json("not json"), std::runtime_error);
}

TEST(Saved, NamesAreChecked) {
    EXPECT_FALSE(store::invalid_name("analysis-1.v2_x"));
    EXPECT_TRUE(store::invalid_name(""));
    EXPECT_TRUE(store::invalid_name("-x"));
    EXPECT_TRUE(store::invalid_name("a/b"));
    EXPECT_TRUE(store::invalid_name(std::string(65, 'a')));
}

TEST(Retention, TheLeastRecentlyUsedGoPastTheCountTheBytesAndTheTtl) {
    store::Retention rules{2, 100, 0};
    auto gone = store::expired({record("a", 10), record("b", 30), record("c", 20)}, rules, 40);
    EXPECT_EQ(gone, std::vector<std::string>{"a"});
    gone = store::expired({record("a", 10), record("b", 30)}, rules, 125);  // a is 115 s unused
    EXPECT_EQ(gone, std::vector<std::string>{"a"});
    rules = {10, 0, 100};
    gone = store::expired({record("a", 10, 50), record("b", 30, 40), record("c", 20, 30)}, rules, 40);
    EXPECT_EQ(gone, std::vector<std::string>{"a"});  // b + c = 70, a would make 120
    gone = store::expired({record("a", 10, 50), record("b", 30, 40)}, rules, 40, 50);  // snapshots take 50
    EXPECT_EQ(gone, std::vector<std::string>{"a"});
    // The most recently used stays even alone over the bytes.
    gone = store::expired({record("big", 30, 500), record("old", 10, 1)}, rules, 40);
    EXPECT_EQ(gone, std::vector<std::string>{"old"});
    // The one just saved stays whatever the clock says (saves within one second tie).
    rules = {1, 100, 0};
    gone = store::expired({record("a", 10), record("b", 10), record("c", 10)}, rules, 10, 0, "a");
    EXPECT_EQ(gone, (std::vector<std::string>{"c", "b"}));
    gone = store::expired({record("a", 10)}, rules, 500, 0, "a");  // not even past the TTL
    EXPECT_TRUE(gone.empty());
}

TEST(Store, StrayFilesAreNotRecordsAndAnOpenDirectoryIsRefused) {
    TempDir dir;
    store::Store s(dir.path);
    s.write(store::sandboxes, "sb-1", "{}\n");
    std::ofstream(dir.path / "sandboxes" / "sb-1.old.json") << "{}";
    EXPECT_EQ(s.keys(store::sandboxes), std::vector<std::string>{"sb-1"});
    fs::permissions(dir.path, fs::perms::group_write, fs::perm_options::add);
    EXPECT_THROW(store::Store{dir.path}, std::runtime_error);
}
