#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "sandbox/owner.hpp"

using cubicle::sandbox::owner_record;
using cubicle::sandbox::owner_record_of;
using cubicle::sandbox::owner_state;
using cubicle::sandbox::OwnerState;

namespace {

std::vector<std::string> fields(const std::string& record) {
    std::vector<std::string> out;
    std::size_t start = 0;
    for (auto end = record.find('/'); end != std::string::npos; end = record.find('/', start)) {
        out.push_back(record.substr(start, end - start));
        start = end + 1;
    }
    out.push_back(record.substr(start));
    return out;
}

std::string join(const std::vector<std::string>& parts) {
    std::string out;
    for (const auto& part : parts) {
        if (!out.empty()) out += '/';
        out += part;
    }
    return out;
}

} // namespace

TEST(Owner, OwnRecordIsAlive) {
    ASSERT_EQ(fields(owner_record()).size(), 7u);
    EXPECT_EQ(owner_state(owner_record()), OwnerState::alive);
}

TEST(Owner, EndedProcessIsDead) {
    pid_t child = fork();
    if (child == 0) {
        pause();
        _exit(0);
    }
    auto record = owner_record_of(child);
    ASSERT_FALSE(record.empty());
    EXPECT_EQ(owner_state(record), OwnerState::alive);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    EXPECT_EQ(owner_state(record), OwnerState::dead);
}

TEST(Owner, ReusedPidIsDead) {
    auto parts = fields(owner_record());
    parts[6] = std::to_string(std::stoull(parts[6]) + 1);  // this pid, another start time
    EXPECT_EQ(owner_state(join(parts)), OwnerState::dead);
}

TEST(Owner, EarlierBootOfThisMachineIsDead) {
    auto parts = fields(owner_record());
    if (parts[1].empty()) GTEST_SKIP() << "no machine id here";
    parts[3] = "00000000-0000-0000-0000-000000000000";
    EXPECT_EQ(owner_state(join(parts)), OwnerState::dead);
}

TEST(Owner, WhatCannotBeCheckedIsUnknown) {
    auto other_host = fields(owner_record());
    other_host[1] = "0123456789abcdef0123456789abcdef";
    other_host[3] = "00000000-0000-0000-0000-000000000000";
    other_host[5] = "999999999";
    EXPECT_EQ(owner_state(join(other_host)), OwnerState::unknown);
    auto renamed_host = fields(owner_record());
    renamed_host[2] += "-clone";
    renamed_host[3] = "00000000-0000-0000-0000-000000000000";
    EXPECT_EQ(owner_state(join(renamed_host)), OwnerState::unknown);
    auto other_namespace = fields(owner_record());
    other_namespace[4] = std::to_string(1);
    other_namespace[5] = "999999999";
    EXPECT_EQ(owner_state(join(other_namespace)), OwnerState::unknown);
    EXPECT_EQ(owner_state(""), OwnerState::unknown);
    EXPECT_EQ(owner_state("v2/a/b/c/d/1/2"), OwnerState::unknown);
    EXPECT_EQ(owner_state("v1/a/b"), OwnerState::unknown);
    auto bad_pid = fields(owner_record());
    bad_pid[5] = "12x";
    EXPECT_EQ(owner_state(join(bad_pid)), OwnerState::unknown);
}
