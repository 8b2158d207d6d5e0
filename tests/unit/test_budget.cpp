// What a tool result costs on the wire: encoded sizes, cuts and the text block.
#include <gtest/gtest.h>

#include <string>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "tools/budget.hpp"

namespace cubicle::tools {
namespace {

std::string json_quoted(std::string_view text) {
    std::string out;
    json::append_quoted(out, text);
    return out;
}

TEST(Budget, EncodedSizeIsWhatTheWriterEmits) {
    for (std::string text : {std::string("plain"), std::string(100, '\0'), std::string("a\"b\\c\nd\te\x7f\x01"),
                             std::string("caf\xc3\xa9 \xff bad"), std::string()}) {
        EXPECT_EQ(encoded_size(text), json_quoted(text).size() - 2) << text;
    }
}

TEST(Budget, CutsAtTheEncodedBudgetOnACharacterBoundary) {
    std::string nuls(1000, '\0');
    EXPECT_TRUE(cut_to_encoded(nuls, 600));
    EXPECT_EQ(nuls.size(), 100u);  // six bytes each once escaped
    std::string text = "\xc3\xa9\xc3\xa9\xc3\xa9";  // three two-byte characters
    EXPECT_TRUE(cut_to_encoded(text, 5));
    EXPECT_EQ(text, "\xc3\xa9\xc3\xa9");
    std::string small = "fits";
    EXPECT_FALSE(cut_to_encoded(small, 4));
    EXPECT_EQ(small, "fits");
}

TEST(Budget, SmallResultsAreRepeatedVerbatim) {
    mcp::ToolResult result{.structured = R"({"stdout":"hi\n","exit_code":0})"};
    finish_result(result);
    EXPECT_TRUE(result.text.empty());  // the session repeats `structured` itself
}

TEST(Budget, LargeResultsAreNotSentTwice) {
    std::string big(3 << 20, 'x');
    mcp::ToolResult result{.structured = R"({"stdout":")" + big + R"(","exit_code":0})"};
    finish_result(result);
    EXPECT_LT(result.text.size(), 20000u);
    EXPECT_NE(result.text.find("bytes left out"), std::string::npos);
    json::Document doc;
    ASSERT_FALSE(doc.parse(result.text));
    EXPECT_EQ(doc.root()["exit_code"].get_int64().value(), 0);
}

TEST(Budget, OverTheCeilingIsAToolError) {
    mcp::ToolResult result{.structured = R"({"stdout":")" + std::string(max_message_bytes, 'x') + R"("})"};
    EXPECT_THROW(finish_result(result), ToolError);
    mcp::ToolResult images{.structured = R"({"ok":true})"};
    images.images.push_back({std::string(max_message_bytes, 'A'), "image/png"});
    EXPECT_THROW(finish_result(images), ToolError);
}

} // namespace
} // namespace cubicle::tools
