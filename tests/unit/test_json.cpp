// JSON output (Writer, append_quoted, UTF-8 repair) and input (Document).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <simdjson.h>

#include "common/json.hpp"

namespace cubicle::json {
namespace {

using namespace std::string_literals;

const std::string fffd = "\xEF\xBF\xBD";

std::string qj(std::string_view text) {
    std::string out;
    append_quoted(out, text);
    return out;
}

// Parses `json` as a single JSON string and returns its decoded value.
::testing::AssertionResult decodes_to_string(const std::string& json, std::string* decoded) {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(json);
    simdjson::dom::element root;
    if (auto error = parser.parse(padded).get(root)) {
        return ::testing::AssertionFailure() << "not valid JSON (" << simdjson::error_message(error) << "): " << json;
    }
    std::string_view text;
    if (root.get(text) != simdjson::SUCCESS) return ::testing::AssertionFailure() << "not a JSON string: " << json;
    *decoded = std::string(text);
    return ::testing::AssertionSuccess();
}

bool valid_utf8(std::string_view s) { return simdjson::validate_utf8(s.data(), s.size()); }

bool has_raw_control(std::string_view s) {
    for (unsigned char c : s) {
        if (c < 0x20 || c == 0x7F) return true;
    }
    return false;
}

std::size_t count(std::string_view haystack, std::string_view needle) {
    std::size_t n = 0;
    for (auto pos = haystack.find(needle); pos != haystack.npos; pos = haystack.find(needle, pos + needle.size())) ++n;
    return n;
}

// ---------------------------------------------------------------- Writer

TEST(JsonWriter, EmptyContainers) {
    EXPECT_EQ(Writer().begin_object().end_object().str(), "{}");
    EXPECT_EQ(Writer().begin_array().end_array().str(), "[]");
    Writer w;
    w.begin_array().begin_array().end_array().begin_object().end_object().begin_array().end_array().end_array();
    EXPECT_EQ(w.str(), "[[],{},[]]");
}

TEST(JsonWriter, CommasBetweenFieldsAndElements) {
    Writer w;
    w.begin_object().field("a", 1).field("b", "two").field("c", true).field("d", false).key("e").null().end_object();
    EXPECT_EQ(w.str(), R"({"a":1,"b":"two","c":true,"d":false,"e":null})");

    Writer a;
    a.begin_array().value(1).value("x").value(false).null().end_array();
    EXPECT_EQ(a.str(), R"([1,"x",false,null])");
}

TEST(JsonWriter, Nesting) {
    Writer w;
    w.begin_object();
    w.key("list").begin_array();
    w.begin_object().field("x", 1).end_object();
    w.begin_object().field("y", 2).key("z").begin_array().value(3).value(4).end_array().end_object();
    w.end_array();
    w.key("obj").begin_object().key("inner").begin_object().end_object().field("after", "v").end_object();
    w.field("last", 5);
    w.end_object();
    EXPECT_EQ(w.str(), R"({"list":[{"x":1},{"y":2,"z":[3,4]}],"obj":{"inner":{},"after":"v"},"last":5})");

    simdjson::dom::parser parser;
    simdjson::padded_string padded(w.str());
    EXPECT_EQ(parser.parse(padded).error(), simdjson::SUCCESS);
}

TEST(JsonWriter, KeysAreEscaped) {
    Writer w;
    w.begin_object().field("a\"b\\c\n", 1).end_object();
    EXPECT_EQ(w.str(), R"({"a\"b\\c\n":1})");
}

TEST(JsonWriter, StringOverloads) {
    std::string s = "std::string";
    std::string_view sv = "view";
    Writer w;
    w.begin_array().value("literal").value(s).value(sv).end_array();
    EXPECT_EQ(w.str(), R"(["literal","std::string","view"])");
}

TEST(JsonWriter, Integers) {
    Writer w;
    w.begin_array();
    w.value(0).value(-1).value(42);
    w.value(std::numeric_limits<std::int64_t>::min());
    w.value(std::numeric_limits<std::int64_t>::max());
    w.value(std::numeric_limits<std::uint64_t>::max());
    w.value(std::uint64_t{0});
    w.end_array();
    EXPECT_EQ(w.str(), "[0,-1,42,-9223372036854775808,9223372036854775807,18446744073709551615,0]");
}

TEST(JsonWriter, Doubles) {
    Writer w;
    w.begin_array().value(1.5).value(-0.25).value(1e300).value(0.1).end_array();
    simdjson::dom::parser parser;
    simdjson::padded_string padded(w.str());
    simdjson::dom::array array;
    ASSERT_EQ(parser.parse(padded).get(array), simdjson::SUCCESS) << w.str();
    std::vector<double> got;
    for (auto item : array) got.push_back(double(item));
    ASSERT_EQ(got.size(), 4u);
    EXPECT_EQ(got[0], 1.5);
    EXPECT_EQ(got[1], -0.25);
    EXPECT_EQ(got[2], 1e300);
    EXPECT_EQ(got[3], 0.1);  // shortest round-trip representation
}

TEST(JsonWriter, NonFiniteDoublesBecomeNull) {
    Writer w;
    w.begin_array();
    w.value(std::numeric_limits<double>::quiet_NaN());
    w.value(std::numeric_limits<double>::infinity());
    w.value(-std::numeric_limits<double>::infinity());
    w.end_array();
    EXPECT_EQ(w.str(), "[null,null,null]");
}

TEST(JsonWriter, RawIsVerbatimAndSeparated) {
    Writer w;
    w.begin_object().key("a").raw(R"({"x":[1,2]})").field("b", 1).end_object();
    EXPECT_EQ(w.str(), R"({"a":{"x":[1,2]},"b":1})");

    Writer a;
    a.begin_array().raw("1").raw("\"two\"").raw("{}").end_array();
    EXPECT_EQ(a.str(), R"([1,"two",{}])");
}

TEST(JsonWriter, TakeMovesTheText) {
    Writer w;
    w.begin_object().field("k", "v").end_object();
    std::string text = w.take();
    EXPECT_EQ(text, R"({"k":"v"})");
}

// ---------------------------------------------------------------- escaping

TEST(JsonQuote, PlainText) {
    EXPECT_EQ(qj(""), "\"\"");
    EXPECT_EQ(qj("hello world"), "\"hello world\"");
    EXPECT_EQ(qj("/slash/"), "\"/slash/\"");
}

TEST(JsonQuote, QuotesAndBackslash) {
    EXPECT_EQ(qj("say \"hi\""), R"("say \"hi\"")");
    EXPECT_EQ(qj("C:\\path\\"), R"("C:\\path\\")");
    EXPECT_EQ(qj("\\\""), R"("\\\"")");
}

TEST(JsonQuote, ShortEscapes) {
    EXPECT_EQ(qj("\n"), R"("\n")");
    EXPECT_EQ(qj("\r"), R"("\r")");
    EXPECT_EQ(qj("\t"), R"("\t")");
    EXPECT_EQ(qj("\b"), R"("\b")");
    EXPECT_EQ(qj("\f"), R"("\f")");
    EXPECT_EQ(qj("a\nb"), R"("a\nb")");
}

TEST(JsonQuote, EveryControlCharacterAndDel) {
    for (int c = 0; c < 0x20; ++c) {
        std::string input = "a"s + static_cast<char>(c) + "b";
        std::string out = qj(input);
        SCOPED_TRACE(c);
        EXPECT_FALSE(has_raw_control(out)) << out;
        std::string decoded;
        ASSERT_TRUE(decodes_to_string(out, &decoded));
        EXPECT_EQ(decoded, input);
        if (c != '\n' && c != '\r' && c != '\t' && c != '\b' && c != '\f') {
            char expected[16];
            std::snprintf(expected, sizeof expected, "\"a\\u%04xb\"", c);
            EXPECT_EQ(out, std::string(expected));
        }
    }
    std::string del = qj("x\x7Fy");
    EXPECT_EQ(del, R"("x\u007fy")");
    std::string decoded;
    ASSERT_TRUE(decodes_to_string(del, &decoded));
    EXPECT_EQ(decoded, "x\x7Fy");
}

TEST(JsonQuote, EmbeddedNul) {
    std::string input("a\0b", 3);
    EXPECT_EQ(qj(input), R"("a\u0000b")");
}

TEST(JsonQuote, AppendsToExistingText) {
    std::string out = "prefix:";
    append_quoted(out, "v");
    EXPECT_EQ(out, "prefix:\"v\"");
}

TEST(JsonQuote, ValidMultibyteUnchanged) {
    for (std::string text : {"é"s, "漢字"s, "😀"s, "mixed é 漢 😀 \xF4\x8F\xBF\xBF end"s, "\xC2\x80"s, "\xEF\xBF\xBF"s}) {
        SCOPED_TRACE(text);
        EXPECT_EQ(qj(text), "\"" + text + "\"");
        EXPECT_EQ(sanitize_utf8(text), text);
    }
}

struct InvalidCase {
    const char* name;
    std::string bytes;
};

TEST(JsonQuote, InvalidUtf8BecomesReplacementCharacter) {
    const InvalidCase cases[] = {
        {"lone 0xff", "a\xFF" "b"},
        {"lone 0xfe", "a\xFE" "b"},
        {"lone continuation", "a\x80" "b"},
        {"truncated 2-byte at end", "a\xC3"},
        {"truncated 2-byte mid", "a\xC3" "b"},
        {"truncated 3-byte at end", "a\xE6\xBC"},
        {"truncated 3-byte mid", "a\xE6\xBC" "b"},
        {"truncated 4-byte at end", "a\xF0\x9F\x98"},
        {"truncated 4-byte mid", "a\xF0\x9F\x98" "b"},
        {"overlong C0 80", "a\xC0\x80" "b"},
        {"overlong C1 BF", "a\xC1\xBF" "b"},
        {"overlong E0 80 80", "a\xE0\x80\x80" "b"},
        {"overlong F0 80 80 80", "a\xF0\x80\x80\x80" "b"},
        {"surrogate ED A0 80", "a\xED\xA0\x80" "b"},
        {"surrogate ED BF BF", "a\xED\xBF\xBF" "b"},
        {"above U+10FFFF F4 90 80 80", "a\xF4\x90\x80\x80" "b"},
        {"F5 lead", "a\xF5\x80\x80\x80" "b"},
        {"invalid before valid multibyte", "\xFF\xC3\xA9"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        std::string out = qj(c.bytes);
        EXPECT_TRUE(valid_utf8(out));
        EXPECT_FALSE(has_raw_control(out));
        std::string decoded;
        ASSERT_TRUE(decodes_to_string(out, &decoded));
        EXPECT_NE(decoded.find(fffd), std::string::npos) << out;
        EXPECT_TRUE(valid_utf8(decoded));
        // The valid ASCII around the bad bytes survives.
        EXPECT_EQ(decoded.front(), c.bytes.front() == 'a' ? 'a' : decoded.front());
        if (c.bytes.back() == 'b') {
            EXPECT_EQ(decoded.back(), 'b');
        }

        std::string sanitized = sanitize_utf8(c.bytes);
        EXPECT_TRUE(valid_utf8(sanitized));
        EXPECT_EQ(sanitized, decoded);
    }
}

TEST(JsonQuote, ReplacementIsPerBadByteAndKeepsValidNeighbours) {
    EXPECT_EQ(sanitize_utf8("\xFF"), fffd);
    EXPECT_EQ(sanitize_utf8("x\xFFy"), "x" + fffd + "y");
    // A valid character right after a bad byte is kept intact.
    EXPECT_EQ(sanitize_utf8("\xFF\xC3\xA9"), fffd + "\xC3\xA9");
    EXPECT_EQ(sanitize_utf8("\xC3\xA9\xFF\xE6\xBC\xA2"), "\xC3\xA9" + fffd + "\xE6\xBC\xA2");
    // Each byte of an overlong / surrogate / out-of-range sequence is replaced:
    // none of the original bytes reach the output.
    for (std::string bad : {"\xC0\x80"s, "\xED\xA0\x80"s, "\xF4\x90\x80\x80"s}) {
        std::string out = sanitize_utf8(bad);
        EXPECT_EQ(count(out, fffd), bad.size()) << bad.size();
        EXPECT_EQ(out.size(), 3 * bad.size());
    }
}

TEST(JsonQuote, BadBytesMixedWithEscapes) {
    std::string input = "\"\xFF\n\\";
    std::string out = qj(input);
    EXPECT_EQ(out, "\"\\\"" + fffd + "\\n\\\\\"");
}

// ---------------------------------------------------------------- complete_utf8_prefix

TEST(JsonUtf8Prefix, CompleteTextIsWhole) {
    EXPECT_EQ(complete_utf8_prefix(""), 0u);
    EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
    EXPECT_EQ(complete_utf8_prefix("é"), 2u);
    EXPECT_EQ(complete_utf8_prefix("漢"), 3u);
    EXPECT_EQ(complete_utf8_prefix("😀"), 4u);
    EXPECT_EQ(complete_utf8_prefix("ab😀"), 6u);
}

TEST(JsonUtf8Prefix, CutInsideEveryMultibyteCharacter) {
    for (std::string ch : {"é"s, "漢"s, "😀"s}) {
        for (std::string prefix : {""s, "x"s, "hello "s, "漢"s, "ab😀"s}) {
            std::string full = prefix + ch;
            for (std::size_t cut = 1; cut < ch.size(); ++cut) {
                std::string text = prefix + ch.substr(0, cut);
                SCOPED_TRACE(testing::Message() << "prefix size " << prefix.size() << " char size " << ch.size() << " cut " << cut);
                EXPECT_EQ(complete_utf8_prefix(text), prefix.size());
            }
            EXPECT_EQ(complete_utf8_prefix(full), full.size());
        }
    }
}

TEST(JsonUtf8Prefix, InvalidBytesAreNotHeldBack) {
    // Not a valid prefix of anything: nothing to wait for.
    EXPECT_EQ(complete_utf8_prefix("ab\xFF"), 3u);
    EXPECT_EQ(complete_utf8_prefix("ab\x80"), 3u);
    EXPECT_EQ(complete_utf8_prefix("ab\xC0"), 3u);
    EXPECT_EQ(complete_utf8_prefix("ab\xED\xA0"), 4u);  // surrogate prefix
    EXPECT_EQ(complete_utf8_prefix("ab\xF4\x90"), 4u);  // beyond U+10FFFF
}

TEST(JsonUtf8Prefix, SplittingAtThePrefixNeverBreaksCharacters) {
    std::string text = "aé漢😀b😀😀漢é";
    for (std::size_t end = 0; end <= text.size(); ++end) {
        std::string_view head(text.data(), end);
        std::size_t n = complete_utf8_prefix(head);
        ASSERT_LE(n, end);
        EXPECT_TRUE(valid_utf8(head.substr(0, n))) << end;
        EXPECT_LT(end - n, 4u);
    }
}

// ---------------------------------------------------------------- Document, to_string

TEST(JsonDocument, ParseErrors) {
    for (std::string bad : {""s, "{"s, "{\"a\":}"s, "[1,2"s, "nul"s, "{\"a\" 1}"s, "\"unterminated"s, "{'a':1}"s, "[1,]"s,
                            "\"\xFF\""s}) {
        Document doc;
        auto error = doc.parse(bad);
        EXPECT_TRUE(error.has_value()) << bad;
        if (error) {
            EXPECT_FALSE(error->empty());
        }
    }
}

TEST(JsonDocument, ParsesAndOwnsItsBuffer) {
    Document doc;
    {
        std::string text = R"({"name":"value","n":[1,2,3]})";
        ASSERT_FALSE(doc.parse(text));
        text.assign(text.size(), 'X');  // the caller's buffer no longer matters
    }
    std::string_view name;
    ASSERT_EQ(doc.root()["name"].get(name), simdjson::SUCCESS);
    EXPECT_EQ(name, "value");
    EXPECT_EQ(doc.root()["n"].get_array().size(), 3u);
}

TEST(JsonDocument, ReparseReplacesTheRoot) {
    Document doc;
    ASSERT_FALSE(doc.parse("[1]"));
    ASSERT_FALSE(doc.parse(R"({"a":true})"));
    EXPECT_TRUE(doc.root().is_object());
}

TEST(JsonToString, RoundTripIsCompact) {
    const std::string inputs[] = {
        R"({"a":1,"b":[true,false,null],"c":{"d":"e"}})",
        "{\n  \"pretty\" : [ 1 ,\n 2 ],\n  \"s\": \"x\\ny\"\n}",
        R"([])",
        R"("just a string")",
        R"(-12.5)",
        R"({"u":"\u00e9\u6f22","q":"\"\\"})",
    };
    for (const auto& input : inputs) {
        Document doc;
        ASSERT_FALSE(doc.parse(input)) << input;
        std::string once = to_string(doc.root());
        EXPECT_EQ(once.find('\n'), std::string::npos) << once;
        Document again;
        ASSERT_FALSE(again.parse(once)) << once;
        EXPECT_EQ(to_string(again.root()), once);
    }
    Document doc;
    ASSERT_FALSE(doc.parse("{ \"a\" : [ 1 , 2 ] }"));
    EXPECT_EQ(to_string(doc.root()), R"({"a":[1,2]})");
    EXPECT_EQ(to_string(doc.root()["a"].value()), "[1,2]");
}

TEST(JsonToString, WriterOutputRoundTrips) {
    Writer w;
    w.begin_object().field("text", "line1\nline2\t\"q\" é\x01").field("n", std::int64_t{-5}).key("raw").raw("[1,{}]").end_object();
    Document doc;
    ASSERT_FALSE(doc.parse(w.str())) << w.str();
    std::string compact = to_string(doc.root());
    EXPECT_FALSE(has_raw_control(compact)) << compact;
    EXPECT_TRUE(compact.ends_with(",\"n\":-5,\"raw\":[1,{}]}")) << compact;
    std::string_view text;
    ASSERT_EQ(doc.root()["text"].get(text), simdjson::SUCCESS);
    EXPECT_EQ(text, "line1\nline2\t\"q\" é\x01");
}

} // namespace
} // namespace cubicle::json
