// The search builtin's output as the server reads it (tools/search_records).
#include <gtest/gtest.h>

#include <string>

#include "tools/search_records.hpp"

namespace cubicle::tools {
namespace {

using namespace std::string_literals;

const std::string one_match = "m\0src/a.c\0" "12\0" "5\0int foo(void);\0" "1\0// before\0" "2\0after 1\0after 2\0"s;
const std::string summary = "s\0" "7\0" "3\0" "1\0"s;

TEST(SearchRecords, MatchesAndSummary) {
    auto records = parse_search_records(one_match + one_match + summary);
    ASSERT_EQ(records.matches.size(), 2u);
    const auto& m = records.matches[0];
    EXPECT_EQ(m.path, "src/a.c");
    EXPECT_EQ(m.line, 12u);
    EXPECT_EQ(m.column, 5u);
    EXPECT_EQ(m.text, "int foo(void);");
    EXPECT_EQ(m.before, std::vector<std::string>{"// before"});
    EXPECT_EQ(m.after, (std::vector<std::string>{"after 1", "after 2"}));
    EXPECT_EQ(records.count, 7u);
    EXPECT_EQ(records.files_searched, 3u);
    EXPECT_TRUE(records.cut);
    EXPECT_TRUE(records.finished);
}

TEST(SearchRecords, EmptyTextsAndNoMatches) {
    auto records = parse_search_records("m\0p\0" "1\0" "1\0\0" "0\0" "0\0"s + "s\0" "1\0" "1\0" "0\0"s);
    ASSERT_EQ(records.matches.size(), 1u);
    EXPECT_EQ(records.matches[0].text, "");
    EXPECT_FALSE(records.cut);
    auto none = parse_search_records("s\0" "0\0" "0\0" "0\0"s);
    EXPECT_TRUE(none.matches.empty());
    EXPECT_TRUE(none.finished);
}

TEST(SearchRecords, EveryCutShortOutputKeepsTheWholeRecordsOnly) {
    auto whole = one_match + one_match + summary;
    for (std::size_t size = 0; size < whole.size(); ++size) {
        auto records = parse_search_records(std::string_view(whole).substr(0, size));
        EXPECT_FALSE(records.finished) << size;
        EXPECT_LE(records.matches.size(), 2u);
        EXPECT_EQ(records.count, records.matches.size());
        for (const auto& m : records.matches) EXPECT_EQ(m.after.size(), 2u);
    }
}

TEST(SearchRecords, GarbageEndsTheParse) {
    EXPECT_TRUE(parse_search_records("x\0junk\0"s).matches.empty());
    EXPECT_TRUE(parse_search_records("m\0p\0one\0" "1\0t\0" "0\0" "0\0"s).matches.empty());
    EXPECT_TRUE(parse_search_records("m\0p\0" "1\0" "1\0t\0" "99\0"s).matches.empty());  // more context than the agent writes
    EXPECT_FALSE(parse_search_records("s\0" "1\0" "-1\0" "0\0"s).finished);
}

} // namespace
} // namespace cubicle::tools
