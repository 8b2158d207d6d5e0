// Exact-text edits (files/edit): matching, line endings, encodings, the diff.
#include <gtest/gtest.h>

#include <string>

#include "common/errors.hpp"
#include "files/edit.hpp"

#include <fmt/format.h>

namespace cubicle::files {
namespace {

EditOutcome edit(std::string_view content, std::string old_text, std::string new_text, bool all = false) {
    return apply_edit("f.txt", content, Edit{std::move(old_text), std::move(new_text), all}, 64u << 20);
}

std::string error_of(std::string_view content, std::string old_text, std::string new_text, bool all = false) {
    try {
        edit(content, std::move(old_text), std::move(new_text), all);
    } catch (const ToolError& e) {
        return e.what();
    }
    return "";
}

TEST(Edit, ReplacesTheOneOccurrenceAndShowsTheDiff) {
    auto out = edit("a\nb\nc\nd\ne\nf\ng\nh\n", "e\n", "E\n");
    EXPECT_EQ(out.content, "a\nb\nc\nd\nE\nf\ng\nh\n");
    EXPECT_EQ(out.replacements, 1u);
    EXPECT_EQ(out.first_line, 5u);
    EXPECT_EQ(out.diff, "--- a/f.txt\n+++ b/f.txt\n@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n");
}

TEST(Edit, WithinALineAndAcrossLines) {
    EXPECT_EQ(edit("int x = 1;\n", "1", "2").diff, "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-int x = 1;\n+int x = 2;\n");
    auto out = edit("one\ntwo\nthree\n", "two\nthree", "2");
    EXPECT_EQ(out.content, "one\n2\n");
    EXPECT_EQ(out.diff, "--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,2 @@\n one\n-two\n-three\n+2\n");
}

TEST(Edit, InsertionAndDeletionOfWholeLines) {
    EXPECT_EQ(edit("a\nb\n", "a\n", "a\nnew\n").diff, "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,3 @@\n a\n+new\n b\n");
    EXPECT_EQ(edit("a\nb\nc\n", "b\n", "").content, "a\nc\n");
}

TEST(Edit, ZeroMatchesSaysSoAndPointsAtANearMiss) {
    auto message = error_of("def f():\n        return 1\n", "def f():\n    return 1\n", "x");
    EXPECT_NE(message.find("not found in f.txt"), std::string::npos) << message;
    EXPECT_NE(message.find("line 1"), std::string::npos) << message;
    EXPECT_NE(error_of("abc\n", "zzz", "y").find("not found"), std::string::npos);
}

TEST(Edit, SeveralMatchesNameTheirLinesUnlessReplaceAll) {
    std::string content = "x = 1\ny = 2\nx = 1\n\nx = 1\n";
    auto message = error_of(content, "x = 1", "x = 3");
    EXPECT_NE(message.find("occurs 3 times"), std::string::npos) << message;
    EXPECT_NE(message.find("lines 1, 3, 5"), std::string::npos) << message;
    auto out = edit(content, "x = 1", "x = 3", true);
    EXPECT_EQ(out.content, "x = 3\ny = 2\nx = 3\n\nx = 3\n");
    EXPECT_EQ(out.replacements, 3u);
    // Two replacements within one line make one change of that line.
    auto same_line = edit("a a\n", "a", "b", true);
    EXPECT_EQ(same_line.diff, "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-a a\n+b b\n");
}

TEST(Edit, RefusesEmptyAndUnchangedEdits) {
    EXPECT_NE(error_of("abc", "", "x").find("empty"), std::string::npos);
    EXPECT_NE(error_of("abc", "a", "a").find("same"), std::string::npos);
    EXPECT_NE(error_of(std::string("a\0b", 3), "a", "b").find("binary"), std::string::npos);
}

TEST(Edit, CrlfFilesStayCrlf) {
    auto out = edit("one\r\ntwo\r\nthree\r\n", "two\nthree", "2\n3");
    EXPECT_EQ(out.content, "one\r\n2\r\n3\r\n");
    EXPECT_EQ(out.line_ending, "crlf");
    EXPECT_EQ(out.diff, "--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n one\n-two\n-three\n+2\n+3\n");
    // A mixed file is edited as it is.
    EXPECT_EQ(edit("a\r\nb\n", "b\n", "c\n").line_ending, "lf");
}

TEST(Edit, NoFinalNewlineIsKeptAndMarked) {
    auto out = edit("a\nb", "b", "c");
    EXPECT_EQ(out.content, "a\nc");
    EXPECT_EQ(out.diff,
              "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n");
}

TEST(Edit, Utf8AndLatin1) {
    auto utf8 = edit("caf\xC3\xA9 = 1\n", "caf\xC3\xA9", "th\xC3\xA9");
    EXPECT_EQ(utf8.content, "th\xC3\xA9 = 1\n");
    EXPECT_EQ(utf8.encoding, "utf-8");
    // Latin-1 bytes are matched as the characters they are and written back as Latin-1.
    auto latin1 = edit("caf\xE9 = 1\n", "caf\xC3\xA9", "na\xC3\xAFve");
    EXPECT_EQ(latin1.content, "na\xEFve = 1\n");
    EXPECT_EQ(latin1.encoding, "latin-1");
    EXPECT_NE(error_of("caf\xE9\n", "caf\xC3\xA9", "\xE2\x82\xAC").find("Latin-1"), std::string::npos);
}

TEST(Edit, DistantReplacementsAreSeparateHunks) {
    std::string content;
    for (int i = 1; i <= 30; ++i) content += (i == 2 || i == 25 ? "x" : std::to_string(i)) + "\n";
    auto out = edit(content, "x\n", "y\n", true);
    EXPECT_NE(out.diff.find("@@ -1,5 +1,5 @@"), std::string::npos) << out.diff;
    EXPECT_NE(out.diff.find("@@ -22,7 +22,7 @@"), std::string::npos) << out.diff;
}

TEST(Edit, ALargeFile) {
    std::string content;
    while (content.size() < 10u << 20) content += "the quick brown fox jumps over the lazy dog\n";
    content += "needle\n";
    auto out = edit(content, "needle", "pin");
    EXPECT_EQ(out.content.size(), content.size() - 3);
    EXPECT_LT(out.diff.size(), 1000u);
}

TEST(Edit, AGrowingReplaceAllIsRefusedBeforeItIsBuilt) {
    std::string content(10u << 20, 'x');
    std::string big(10 * 1024, 'y');
    try {
        apply_edit("f.txt", content, Edit{"x", big, true}, 64u << 20);
        FAIL() << "no error";
    } catch (const ToolError& e) {
        EXPECT_NE(std::string(e.what()).find("larger than the limit"), std::string::npos) << e.what();
    }
}

TEST(Edit, AFileOfNewlinesCostsNoLineIndex) {
    // 64 MiB of empty lines: the diff's windows are a few lines; the numbers are counted, not kept.
    std::string content(64u << 20, '\n');
    content += "end\n";
    auto out = edit(content, "end", "END");
    EXPECT_EQ(out.first_line, (64u << 20) + 1);
    EXPECT_NE(out.diff.find(fmt::format("@@ -{},4 +{},4 @@", (64u << 20) - 2, (64u << 20) - 2)), std::string::npos) << out.diff;
}

TEST(Edit, LineNumbersFollowTheShiftOfEarlierReplacements) {
    std::string content;
    for (int i = 1; i <= 40; ++i) content += (i % 10 == 0 ? "hit" : std::to_string(i)) + "\n";
    auto out = edit(content, "hit\n", "a\nb\n", true);
    // Lines 10, 20, 30, 40: each window alone; every later hunk one line further down in the new file.
    EXPECT_NE(out.diff.find("@@ -7,7 +7,8 @@"), std::string::npos) << out.diff;
    EXPECT_NE(out.diff.find("@@ -17,7 +18,8 @@"), std::string::npos) << out.diff;
    EXPECT_NE(out.diff.find("@@ -37,4 +40,5 @@"), std::string::npos) << out.diff;
    // Closer together, their context touches: one hunk.
    auto near = edit("1\n2\nhit\n4\n5\n6\n7\nhit\n9\n10\n11\n12\n", "hit\n", "x\n", true);
    EXPECT_NE(near.diff.find("@@ -1,11 +1,11 @@\n 1\n 2\n-hit\n+x\n 4\n 5\n 6\n 7\n-hit\n+x\n 9\n 10\n 11\n"), std::string::npos)
        << near.diff;
}

} // namespace
} // namespace cubicle::files
