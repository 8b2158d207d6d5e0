// Snapshot records and the retention rule that weighs snapshots and saved sandboxes together.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <gtest/gtest.h>

#include "store/snapshot.hpp"

using namespace cubicle;
using store::expired_together;
using store::Retention;
using store::SavedSandbox;
using store::Snapshot;

namespace {

// `created` in seconds, as the tests think.
Snapshot snapshot(std::string id, std::int64_t created, std::uint64_t bytes) {
    Snapshot s;
    s.snapshot_id = std::move(id);
    s.owner = "alice";
    s.created_ms = created * 1000;
    s.size_bytes = bytes;
    s.complete = true;
    return s;
}

SavedSandbox saved(std::string id, std::int64_t last_used, std::uint64_t bytes) {
    SavedSandbox s;
    s.sandbox_id = std::move(id);
    s.owner = "alice";
    s.last_used = last_used;
    s.size_bytes = bytes;
    return s;
}

constexpr std::int64_t now = 1'000'000;
constexpr std::uint64_t mb = 1 << 20;

} // namespace

TEST(SnapshotRecord, RoundTripsEveryField) {
    Snapshot s = snapshot("snap-0123456789ab", 1234, 99 * mb);
    s.name = "before refactor";
    s.source_sandbox_id = "sb-abcdef";
    s.spec.image = "cubicle/sandbox:latest";
    s.spec.memory_mb = 768;
    s.spec.cpus = 1.5;
    s.spec.pids_limit = 300;
    s.spec.tmp_size_mb = 64;
    s.spec.disk_mb = 2048;
    s.spec.files_limit = 5000;
    s.spec.network = true;
    s.spec.env = {{"A", "1"}, {"B", "two words"}};
    s.stateful = false;
    s.auto_install = false;
    auto back = store::snapshot_from_json(store::to_json(s));
    EXPECT_EQ(back.snapshot_id, s.snapshot_id);
    EXPECT_EQ(back.name, s.name);
    EXPECT_EQ(back.owner, "alice");
    EXPECT_EQ(back.source_sandbox_id, "sb-abcdef");
    EXPECT_EQ(back.spec.image, s.spec.image);
    EXPECT_EQ(back.spec.memory_mb, 768);
    EXPECT_DOUBLE_EQ(back.spec.cpus, 1.5);
    EXPECT_EQ(back.spec.pids_limit, 300);
    EXPECT_EQ(back.spec.tmp_size_mb, 64);
    EXPECT_EQ(back.spec.disk_mb, 2048);
    EXPECT_EQ(back.spec.files_limit, 5000);
    EXPECT_TRUE(back.spec.network);
    EXPECT_EQ(back.spec.env, s.spec.env);
    EXPECT_FALSE(back.stateful);
    EXPECT_FALSE(back.auto_install);
    EXPECT_EQ(back.created_ms, 1234 * 1000);
    EXPECT_EQ(back.size_bytes, 99 * mb);
    EXPECT_TRUE(back.complete);
}

TEST(SnapshotRecord, RefusesWhatIsNotOne) {
    EXPECT_THROW(store::snapshot_from_json("not json"), std::runtime_error);
    EXPECT_THROW(store::snapshot_from_json(R"({"version": 2})"), std::runtime_error);
    auto text = store::to_json(snapshot("snap-1", 1, 1));
    text.replace(text.find("\"owner\""), 7, "\"ownr\"");
    EXPECT_THROW(store::snapshot_from_json(text), std::runtime_error);
}

TEST(SnapshotRecord, Names) {
    EXPECT_FALSE(store::invalid_snapshot_name(""));
    EXPECT_FALSE(store::invalid_snapshot_name("before the big refactor-2.1_b"));
    EXPECT_TRUE(store::invalid_snapshot_name(std::string(65, 'a')));
    EXPECT_TRUE(store::invalid_snapshot_name("a/b"));
    EXPECT_TRUE(store::invalid_snapshot_name("new\nline"));
}

TEST(SnapshotRetention, OldestPastTheCountGo) {
    Retention rules;
    rules.most_snapshots = 2;
    auto out = expired_together({}, {snapshot("s1", now - 30, 1), snapshot("s3", now - 10, 1), snapshot("s2", now - 20, 1)}, rules, now);
    EXPECT_EQ(out.snapshots, std::vector<std::string>{"s1"});
    EXPECT_TRUE(out.sandboxes.empty());
}

TEST(SnapshotRetention, SnapshotsOfOneSecondKeepTheirOrder) {
    Retention rules;
    rules.most_snapshots = 2;
    auto a = snapshot("a", now, 1), b = snapshot("b", now, 1), c = snapshot("c", now, 1);
    a.created_ms += 1;
    b.created_ms += 2;
    c.created_ms += 3;
    auto out = expired_together({}, {c, a, b}, rules, now);
    EXPECT_EQ(out.snapshots, std::vector<std::string>{"a"});
}

TEST(SnapshotRetention, TtlCountsFromCreation) {
    Retention rules;
    rules.ttl_s = 100;
    auto out = expired_together({}, {snapshot("old", now - 101, 1), snapshot("young", now - 99, 1)}, rules, now);
    EXPECT_EQ(out.snapshots, std::vector<std::string>{"old"});
}

TEST(SnapshotRetention, BytesAreSharedWithSavedSandboxesOldestFirst) {
    Retention rules;
    rules.most_bytes = 100 * mb;
    // Newest first: snapshot n (40), sandbox a (30), snapshot m (20): 90 MB kept; then sandbox b (20) and
    // snapshot o (5) are past 100 MB, and so is everything older.
    auto out = expired_together({saved("a", now - 20, 30 * mb), saved("b", now - 40, 20 * mb)},
                                {snapshot("n", now - 10, 40 * mb), snapshot("m", now - 30, 20 * mb), snapshot("o", now - 50, 5 * mb)},
                                rules, now);
    EXPECT_EQ(out.sandboxes, std::vector<std::string>{"b"});
    EXPECT_EQ(out.snapshots, std::vector<std::string>{"o"});
}

TEST(SnapshotRetention, TheNewestOfEachKindStays) {
    Retention rules;
    rules.most_bytes = 10 * mb;
    rules.most_snapshots = 1;
    rules.most_saved = 1;
    // Each alone is over the bytes; neither the newest snapshot nor the newest saved sandbox goes.
    auto out = expired_together({saved("a", now - 5, 50 * mb), saved("b", now - 6, 1)},
                                {snapshot("n", now - 1, 50 * mb), snapshot("m", now - 2, 1)}, rules, now);
    EXPECT_EQ(out.sandboxes, std::vector<std::string>{"b"});
    EXPECT_EQ(out.snapshots, std::vector<std::string>{"m"});
}

TEST(SnapshotRetention, NoLimitsKeepEverything) {
    Retention rules;
    rules.ttl_s = 0;
    rules.most_bytes = 0;
    auto out = expired_together({saved("a", 1, 1ull << 40)}, {snapshot("s", 2, 1ull << 40)}, rules, now);
    EXPECT_TRUE(out.sandboxes.empty());
    EXPECT_TRUE(out.snapshots.empty());
}

TEST(SnapshotStore, RemovingTheRecordRemovesItsArchive) {
    auto dir = std::filesystem::temp_directory_path() / ("cubicle-snapshots-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    {
        store::Store store(dir);
        auto s = snapshot("snap-aaaaaa", now, 3);
        store.write(store::snapshots, s.snapshot_id, store::to_json(s));
        std::ofstream(store.path_of(store::snapshots, s.snapshot_id, store::snapshot_archive)) << "tar";
        std::vector<std::string> broken;
        store.write(store::snapshots, "snap-broken", "{");
        auto records = store::snapshot_records(store, &broken);
        ASSERT_EQ(records.size(), 1u);
        EXPECT_EQ(records[0].snapshot_id, "snap-aaaaaa");
        EXPECT_EQ(broken, std::vector<std::string>{"snap-broken"});
        store.remove(store::snapshots, "snap-aaaaaa");
        store.remove(store::snapshots, "snap-broken");
        EXPECT_TRUE(std::filesystem::is_empty(dir / "snapshots"));
    }
    std::filesystem::remove_all(dir);
}
