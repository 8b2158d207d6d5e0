// The output budget: what a model is shown of a long output.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include <simdjson.h>

#include "tools/output_budget.hpp"

namespace cubicle::tools {
namespace {

OutputCapture capture_of(const std::string& text, std::size_t keep = 16 << 10) {
    OutputCapture c(keep);
    // In pieces, as output arrives.
    for (std::size_t at = 0; at < text.size(); at += 7919) c.append(std::string_view(text).substr(at, 7919));
    return c;
}

int count(const std::string& text, std::string_view what) {
    int n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

TEST(OutputBudget, SmallOutputIsShownWhole) {
    auto c = capture_of("hello\nworld\n");
    EXPECT_TRUE(c.complete());
    EXPECT_EQ(c.bytes(), 12u);
    EXPECT_EQ(c.lines(), 2u);
    EXPECT_EQ(shown_text(c, 1024, "stdout", "see file"), "hello\nworld\n");
}

TEST(OutputBudget, FloodKeepsWholeLinesOfHeadAndTailAndOneMarker) {
    std::string text;
    for (int i = 0; i < 200000; ++i) text += fmt::format("line {:06d}\n", i);
    auto c = capture_of(text);
    EXPECT_FALSE(c.complete());
    EXPECT_EQ(c.lines(), 200000u);
    auto shown = shown_text(c, 8192, "stdout", "all of it is in out.txt");
    EXPECT_LE(sent_size(shown), 8192u);
    EXPECT_GT(sent_size(shown), 7000u);  // the budget is used, not wasted
    EXPECT_EQ(shown.rfind("line 000000\nline 000001\n", 0), 0u);
    EXPECT_TRUE(shown.ends_with("line 199999\n"));
    EXPECT_EQ(count(shown, "[cubicle]"), 1);
    auto marker_at = shown.find("[cubicle]");
    auto marker_end = shown.find('\n', marker_at);
    std::string marker = shown.substr(marker_at, marker_end - marker_at);
    EXPECT_NE(marker.find("all of it is in out.txt"), std::string::npos) << marker;
    // Every line around the marker is whole, and the counts add up.
    auto head = shown.substr(0, marker_at), tail = shown.substr(marker_end + 1);
    EXPECT_EQ(head.size() % 12, 0u);
    EXPECT_EQ(tail.size() % 12, 0u);
    EXPECT_EQ(tail.rfind("line ", 0), 0u);
    auto omitted = text.size() - head.size() - tail.size();
    EXPECT_NE(marker.find(fmt::format("{} bytes ({} lines)", omitted, omitted / 12)), std::string::npos) << marker;
    // Tail gets more room than head.
    EXPECT_GT(tail.size(), head.size());
}

TEST(OutputBudget, OneHugeLineIsCutByBytes) {
    std::string text(1 << 20, 'x');
    text += "END";
    auto shown = shown_text(capture_of(text), 4096, "stdout", "see file");
    EXPECT_LE(sent_size(shown), 4096u);
    EXPECT_TRUE(shown.ends_with("END"));
    EXPECT_NE(shown.find("within one line"), std::string::npos);
}

TEST(OutputBudget, CompleteButTooLongIsCutToo) {
    std::string text;
    for (int i = 0; i < 1000; ++i) text += "\"quoted\"\n";  // expensive to escape
    auto c = capture_of(text, 1 << 20);
    EXPECT_TRUE(c.complete());
    auto shown = shown_text(c, 2048, "stderr", "see file");
    EXPECT_LE(sent_size(shown), 2048u);
    EXPECT_TRUE(shown.ends_with("\"quoted\"\n"));
    EXPECT_EQ(count(shown, "of stderr omitted here"), 1);
}

TEST(OutputBudget, InvalidUtf8AndCutCharactersBecomeValidText) {
    std::string text;
    for (int i = 0; i < 20000; ++i) text += "é\xff€\n";
    auto shown = shown_text(capture_of(text, 3000), 2048, "stdout", "see file");
    EXPECT_TRUE(simdjson::validate_utf8(shown.data(), shown.size()));
    EXPECT_LE(sent_size(shown), 2048u);
    EXPECT_NE(shown.find("\xEF\xBF\xBD"), std::string::npos);  // U+FFFD
}

TEST(OutputBudget, SkippedOutputPutsTheMarkerFirst) {
    OutputCapture c(1024);
    c.skip(5000);
    c.append("recent 1\nrecent 2\n");
    EXPECT_FALSE(c.lines_known());
    auto shown = shown_text(c, 1024, "stdout", "see file");
    EXPECT_EQ(shown.rfind("[cubicle] 5000 bytes of stdout omitted here; see file\n", 0), 0u) << shown;
    EXPECT_TRUE(shown.ends_with("recent 1\nrecent 2\n"));
}

TEST(OutputBudget, SplitGivesEachWhatItNeedsOrAQuarter) {
    auto both_fit = split_budget(100, 200, 1000);
    EXPECT_EQ(both_fit.out, 100u);
    EXPECT_EQ(both_fit.err, 200u);
    auto big_out = split_budget(1 << 20, 100, 1000);
    EXPECT_EQ(big_out.err, 100u);
    EXPECT_EQ(big_out.out, 900u);
    auto big_err = split_budget(100, 1 << 20, 1000);
    EXPECT_EQ(big_err.out, 100u);
    EXPECT_EQ(big_err.err, 900u);
    auto both_big = split_budget(1 << 20, 1 << 20, 1000);
    EXPECT_EQ(both_big.err, 250u);
    EXPECT_EQ(both_big.out, 750u);
}

TEST(OutputBudget, SentSizeCountsBothCopies) {
    EXPECT_EQ(sent_size("ab"), 4u);       // plain: once, then once more in the text content
    EXPECT_EQ(sent_size("\n"), 5u);       // \n, then \\n
    EXPECT_EQ(sent_size("\""), 6u);       // \", then \\\"
    EXPECT_EQ(sent_size("\x01"), 13u);    // \u0001, then \\u0001
}

} // namespace
} // namespace cubicle::tools
