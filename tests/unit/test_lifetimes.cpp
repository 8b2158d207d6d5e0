#include <gtest/gtest.h>

#include "sandbox/lifetime_rules.hpp"

using namespace cubicle::sandbox;
using namespace std::chrono_literals;

namespace {

const auto now = std::chrono::steady_clock::now();
const auto wall_now = WallClock::from_time_t(1'800'000'000);  // 2027-01-15T08:00:00Z

LifeState idle_for(std::chrono::seconds idle) {
    LifeState state;
    state.last_used = now - idle;
    state.pausable = true;
    return state;
}

} // namespace

TEST(Lifetimes, IdleSandboxIsPausedAfterTheIdleTime) {
    EXPECT_EQ(next_step(idle_for(59s), now, wall_now, 60s), LifeStep::none);
    EXPECT_EQ(next_step(idle_for(60s), now, wall_now, 60s), LifeStep::pause);
    EXPECT_EQ(next_step(idle_for(3600s), now, wall_now, 0s), LifeStep::none) << "0 turns pausing off";
}

TEST(Lifetimes, NothingUnderWayIsPaused) {
    auto state = idle_for(600s);
    state.busy = true;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::none) << "a run, a stream or an exposed port";
    state = idle_for(600s);
    state.in_call = true;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::none);
    state = idle_for(600s);
    state.pausable = false;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::none) << "a shared workspace, an engine that refused";
    state = idle_for(600s);
    state.paused = true;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::none) << "paused once";
}

TEST(Lifetimes, ExpiryEndsEvenPausedOrBusyButNeverInACall) {
    auto state = idle_for(10s);
    state.expires_at = wall_now + 1s;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::none);
    state.expires_at = wall_now;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::expire);
    state.paused = true;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::expire);
    state.busy = true;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::expire) << "a background run does not renew it";
    state.in_call = true;
    EXPECT_EQ(next_step(state, now, wall_now, 60s), LifeStep::none);
}

TEST(Lifetimes, EndedRecordIsBoundedAndPerPrincipal) {
    EndedRecord record(3);
    for (int i = 0; i < 5; ++i) record.add("alice", {"sb-a" + std::to_string(i), EndReason::stopped, wall_now, 0});
    record.add("bob", {"sb-b", EndReason::expired, wall_now, 60});
    ASSERT_EQ(record.of("alice").size(), 3u);
    EXPECT_EQ(record.of("alice").front().sandbox_id, "sb-a2");
    EXPECT_EQ(record.find("alice", "sb-a0"), nullptr) << "the oldest fall out";
    ASSERT_NE(record.find("alice", "sb-a4"), nullptr);
    EXPECT_EQ(record.find("alice", "sb-b"), nullptr) << "never another principal's";
    EXPECT_EQ(record.of("carol").size(), 0u);
    ASSERT_NE(record.find("bob", "sb-b"), nullptr);
}

TEST(Lifetimes, EndedMessageSaysWhatHappenedAndWhatToDo) {
    auto expired = ended_message({"sb-1", EndReason::expired, wall_now, 60});
    EXPECT_EQ(expired, "sandbox sb-1 expired at 2027-01-15T08:00:00Z (ttl_s 60: it was not used for that long); "
                       "start a new one with initialize_sandbox");
    EXPECT_NE(ended_message({"sb-2", EndReason::stopped, wall_now, 0}).find("was stopped at 2027-01-15T08:00:00Z"), std::string::npos);
    EXPECT_NE(ended_message({"sb-3", EndReason::server_exit, wall_now, 0}).find("server exited"), std::string::npos);
    EXPECT_EQ(name_of(EndReason::server_exit), "server exit");
}
