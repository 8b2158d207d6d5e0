// The books of a sandbox's checkpoints (sandbox/checkpoints.hpp): ids, the limit
// that drops the oldest, re-parked copies and the end of an interpreter.
#include <gtest/gtest.h>

#include "sandbox/checkpoints.hpp"

using cubicle::sandbox::Checkpoint;
using cubicle::sandbox::Checkpoints;

namespace {

Checkpoint make(Checkpoints& books, std::uint32_t interpreter, int pid) {
    return Checkpoint{books.next_id(), "python", interpreter, pid, {}, 1024};
}

} // namespace

TEST(Checkpoints, IdsAreNeverReused) {
    Checkpoints books;
    EXPECT_EQ(books.next_id(), "ckpt-1");
    EXPECT_EQ(books.next_id(), "ckpt-2");
    books.add(make(books, 1, 10), 8);
    books.forget_unless([](const Checkpoint&) { return false; });
    EXPECT_EQ(books.next_id(), "ckpt-4");
}

TEST(Checkpoints, PastTheLimitTheOldestIsDropped) {
    Checkpoints books;
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(books.add(make(books, 1, 100 + i), 3).empty());
    auto dropped = books.add(make(books, 1, 103), 3);
    ASSERT_EQ(dropped.size(), 1u);
    EXPECT_EQ(dropped[0].id, "ckpt-1");
    EXPECT_EQ(dropped[0].pid, 100);
    ASSERT_EQ(books.list().size(), 3u);
    EXPECT_EQ(books.list().front().id, "ckpt-2");
    EXPECT_EQ(books.list().back().id, "ckpt-4");
    // A lower limit (a server started with another --max-checkpoints) drops all the excess at once.
    EXPECT_EQ(books.add(make(books, 1, 104), 1).size(), 3u);
    EXPECT_EQ(books.list().size(), 1u);
}

TEST(Checkpoints, ARestoreReparksOrSpendsTheCheckpoint) {
    Checkpoints books;
    books.add(make(books, 7, 50), 8);
    books.replace_pid("ckpt-1", 51);
    ASSERT_NE(books.find("ckpt-1"), nullptr);
    EXPECT_EQ(books.find("ckpt-1")->pid, 51);
    books.replace_pid("ckpt-9", 52);  // unknown: nothing changes
    EXPECT_EQ(books.list().size(), 1u);
    books.replace_pid("ckpt-1", 0);  // no fresh copy: spent
    EXPECT_EQ(books.find("ckpt-1"), nullptr);
}

TEST(Checkpoints, TheyEndWithTheirInterpreter) {
    Checkpoints books;
    books.add(make(books, 7, 50), 8);
    books.add(make(books, 9, 60), 8);
    books.forget_unless([](const Checkpoint& c) { return c.interpreter == 9; });
    ASSERT_EQ(books.list().size(), 1u);
    EXPECT_EQ(books.list()[0].id, "ckpt-2");
}
