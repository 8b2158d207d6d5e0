// Answers recorded from real engines (tests/golden/daemon/), for tests that
// check how cubicle reads them without a daemon.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

inline std::string recorded(const std::string& name) {
    std::ifstream in(std::string(CUBICLE_SOURCE_ROOT) + "/tests/golden/daemon/" + name);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_FALSE(text.str().empty()) << name;
    return text.str();
}
