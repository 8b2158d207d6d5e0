// search_files' pure logic, as the agent runs it: .gitignore rules
// (src/agent/ignore.c) and pattern translation (src/agent/pattern.c).
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex.h>
#include <string>

extern "C" {
#include "agent/ignore.h"
#include "agent/pattern.h"
}

namespace {

// What a .gitignore with `text` says of `path`: 1 ignored, 0 re-included, -1 silent.
int verdict(const std::string& text, const char* path, bool is_dir = false) {
    ignore_list list;
    EXPECT_EQ(ignore_parse(&list, text.data(), text.size()), 0);
    int result = ignore_match(&list, path, is_dir ? 1 : 0);
    ignore_free(&list);
    return result;
}

TEST(IgnoreGlob, StarsAndQuestionMarksStayInOneComponent) {
    EXPECT_TRUE(ignore_glob("*.o", "main.o"));
    EXPECT_FALSE(ignore_glob("*.o", "src/main.o"));
    EXPECT_TRUE(ignore_glob("src/*.o", "src/main.o"));
    EXPECT_FALSE(ignore_glob("src/*.o", "src/a/main.o"));
    EXPECT_TRUE(ignore_glob("a?c", "abc"));
    EXPECT_FALSE(ignore_glob("a?c", "a/c"));
    EXPECT_TRUE(ignore_glob("*", ""));
}

TEST(IgnoreGlob, DoubleStarsSpanComponents) {
    EXPECT_TRUE(ignore_glob("**/foo", "foo"));
    EXPECT_TRUE(ignore_glob("**/foo", "a/b/foo"));
    EXPECT_TRUE(ignore_glob("a/**/b", "a/b"));
    EXPECT_TRUE(ignore_glob("a/**/b", "a/x/y/b"));
    EXPECT_FALSE(ignore_glob("a/**/b", "a/x/y/c"));
    EXPECT_TRUE(ignore_glob("abc/**", "abc/x/y"));
    EXPECT_FALSE(ignore_glob("abc/**", "abc"));
    EXPECT_TRUE(ignore_glob("src/**/*.c", "src/deep/er/x.c"));
}

TEST(IgnoreGlob, Brackets) {
    EXPECT_TRUE(ignore_glob("[abc].txt", "b.txt"));
    EXPECT_FALSE(ignore_glob("[abc].txt", "d.txt"));
    EXPECT_TRUE(ignore_glob("[!abc].txt", "d.txt"));
    EXPECT_TRUE(ignore_glob("[a-c]x", "bx"));
    EXPECT_TRUE(ignore_glob("[[:digit:]]*", "7up"));
    EXPECT_FALSE(ignore_glob("[[:digit:]]*", "up"));
    EXPECT_TRUE(ignore_glob("[]]", "]"));
    EXPECT_FALSE(ignore_glob("a[/]b", "a/b"));
    EXPECT_TRUE(ignore_glob("a[b", "a[b"));  // never closed: literal
    EXPECT_TRUE(ignore_glob("\\*x", "*x"));
    EXPECT_FALSE(ignore_glob("\\*x", "ax"));
}

TEST(IgnoreGlob, PathologicalStarsGiveUpInsteadOfHanging) {
    std::string name(60, 'a');
    EXPECT_FALSE(ignore_glob("*a*a*a*a*a*a*a*a*a*a*b", name.c_str()));
    EXPECT_TRUE(ignore_glob("*a*a*a*a*a*a*a*a*a*a*", name.c_str()));
}

TEST(IgnoreRules, CommentsBlanksAndEscapes) {
    EXPECT_EQ(verdict("# comment\n\n", "comment"), -1);
    EXPECT_EQ(verdict("\\#name\n", "#name"), 1);
    EXPECT_EQ(verdict("\\!name\n", "!name"), 1);
    EXPECT_EQ(verdict("trailing   \n", "trailing"), 1);
    EXPECT_EQ(verdict("crlf\r\n", "crlf"), 1);
}

TEST(IgnoreRules, UnanchoredNamesMatchAtAnyDepth) {
    EXPECT_EQ(verdict("*.log\n", "a/b/x.log"), 1);
    EXPECT_EQ(verdict("build\n", "src/build", true), 1);
    EXPECT_EQ(verdict("build\n", "src/build"), 1);
}

TEST(IgnoreRules, SlashesAnchor) {
    EXPECT_EQ(verdict("/build\n", "build", true), 1);
    EXPECT_EQ(verdict("/build\n", "src/build", true), -1);
    EXPECT_EQ(verdict("doc/*.txt\n", "doc/a.txt"), 1);
    EXPECT_EQ(verdict("doc/*.txt\n", "x/doc/a.txt"), -1);
}

TEST(IgnoreRules, TrailingSlashMeansDirectoriesOnly) {
    EXPECT_EQ(verdict("out/\n", "out", true), 1);
    EXPECT_EQ(verdict("out/\n", "out", false), -1);
    EXPECT_EQ(verdict("out/\n", "a/out", true), 1);
}

TEST(IgnoreRules, LastMatchingRuleWinsAndNegationReincludes) {
    EXPECT_EQ(verdict("*.log\n!keep.log\n", "keep.log"), 0);
    EXPECT_EQ(verdict("*.log\n!keep.log\n", "other.log"), 1);
    EXPECT_EQ(verdict("!keep.log\n*.log\n", "keep.log"), 1);
}

// What pattern_to_ere makes of a pattern ("!" + the message when it refuses).
std::string ere(const char* pattern, int* icase = nullptr) {
    int ignore_case = 0;
    const char* error = nullptr;
    char* out = pattern_to_ere(pattern, &ignore_case, &error);
    if (icase) *icase = ignore_case;
    if (!out) return std::string("!") + error;
    std::string result(out);
    std::free(out);
    return result;
}

bool matches(const char* pattern, const char* text) {
    int icase = 0;
    const char* error = nullptr;
    char* out = pattern_to_ere(pattern, &icase, &error);
    EXPECT_NE(out, nullptr) << pattern;
    regex_t re;
    int rc = regcomp(&re, out, REG_EXTENDED | REG_NEWLINE | (icase ? REG_ICASE : 0));
    std::free(out);
    EXPECT_EQ(rc, 0) << pattern;
    bool found = regexec(&re, text, 0, nullptr, 0) == 0;
    regfree(&re);
    return found;
}

TEST(SearchPattern, PerlEscapesBecomePosix) {
    EXPECT_EQ(ere("\\d+"), "[0-9]+");
    EXPECT_EQ(ere("\\D"), "[^0-9]");
    EXPECT_EQ(ere("[\\d_]"), "[0-9_]");
    EXPECT_EQ(ere("[\\w.]"), "[[:alnum:]_.]");
    EXPECT_EQ(ere("a\\tb"), "a\tb");
    EXPECT_EQ(ere("\\x41"), "A");
    EXPECT_EQ(ere("\\x2e"), "\\.");
    EXPECT_EQ(ere("\\/path\\-x"), "/path-x");
    EXPECT_EQ(ere("\\bfoo\\b"), "\\bfoo\\b");
    EXPECT_EQ(ere("(?:ab)+"), "(ab)+");
    EXPECT_EQ(ere("a.*?b"), "a.*b");
    EXPECT_EQ(ere("a{2,3}"), "a{2,3}");
    EXPECT_EQ(ere("fn {"), "fn \\{");
    int icase = 0;
    EXPECT_EQ(ere("(?i)foo", &icase), "foo");
    EXPECT_EQ(icase, 1);
}

TEST(SearchPattern, BracketsWithPerlEscapes) {
    EXPECT_EQ(ere("[\\]a]"), "[]a]");
    EXPECT_EQ(ere("[a\\-z]"), "[az-]");
    EXPECT_EQ(ere("[\\^a]"), "[a^]");
    EXPECT_EQ(ere("[\\^]"), "\\^");
    EXPECT_EQ(ere("[^\\]]"), "[^]]");
    EXPECT_TRUE(matches("[\\[\\]]", "x]"));
    EXPECT_TRUE(matches("[\\\\]", "a\\b"));
    EXPECT_FALSE(matches("[\\\\]", "ab"));
    // a range that ends in ']' keeps it inside: "[:-]" would close early and
    // leave what follows to regcomp as stacked quantifiers (2.3 GB in the fuzzer)
    EXPECT_EQ(ere("[:-\\]+++]"), "[]:-\\+++]");
    EXPECT_TRUE(matches("^[:-\\]]$", "]"));
    EXPECT_TRUE(matches("^[:-\\]]$", "\\"));
    EXPECT_FALSE(matches("^[:-\\]]$", "^"));
    // a range from '^' is no negation, one to '-' no dangling range
    EXPECT_TRUE(matches("^[\\^-a]$", "_"));
    EXPECT_FALSE(matches("^[\\^-a]$", "b"));
    EXPECT_TRUE(matches("^[!-\\-]$", "-"));
    EXPECT_EQ(ere("[\\[:]"), "[:[]");
    EXPECT_EQ(ere("[z-a]"), "!a range in [...] runs backwards (such as z-a)");
}

TEST(SearchPattern, TranslatedPatternsMatch) {
    EXPECT_TRUE(matches("\\d{3}-\\d{4}", "call 555-1234 now"));
    EXPECT_FALSE(matches("\\d{3}-\\d{4}", "call 55-1234 now"));
    EXPECT_TRUE(matches("\\bint\\s+main\\(", "int  main(void)"));
    EXPECT_TRUE(matches("\\w+\\.c$", "file.c"));
    EXPECT_TRUE(matches("(?i)HELLO", "hello"));
    EXPECT_TRUE(matches("foo{", "foo{"));
}

TEST(SearchPattern, DotMatchesAWholeUtf8Character) {
    EXPECT_TRUE(matches("^h.llo$", "h\xC3\xA9llo"));      // é
    EXPECT_TRUE(matches("^h.llo$", "h\xE2\x82\xAC" "llo"));  // €
    EXPECT_TRUE(matches("^h.llo$", "h\xE9llo"));           // Latin-1 é: one byte
    EXPECT_TRUE(matches("^h.llo$", "hello"));
    EXPECT_FALSE(matches("^h.llo$", "hllo"));
    EXPECT_EQ(ere("a.*b"), "a.*b");
    EXPECT_EQ(ere("(x)\\1."), "(x)\\1.");  // back-references keep their groups
}

TEST(SearchPattern, RefusalsNameTheProblem) {
    EXPECT_EQ(ere("(?=x)").substr(0, 9), "!(?...) g");
    EXPECT_EQ(ere("\\p{L}"), "!\\p is not supported in search patterns");
    EXPECT_EQ(ere("a\\nb").substr(0, 28), "!a match never spans lines, ");
    EXPECT_EQ(ere("[\\D]").substr(0, 3), "!\\D");
    EXPECT_EQ(ere("[abc").substr(0, 6), "!a [ i");
    EXPECT_EQ(ere("r+++p").substr(0, 24), "!a quantifier follows an");
    EXPECT_EQ(ere("(a{100}){100}(b{100})").substr(0, 24), "!the pattern's {n,m} rep");
    // regcomp's memory grows with the square of an atom's copies: 2.5 GB for this one
    EXPECT_EQ(ere("x{2,17778}?").substr(0, 24), "!the pattern's {n,m} rep");
    EXPECT_EQ(ere("a{2,1999}"), "a{2,1999}");   // 33 MB
    EXPECT_EQ(ere("a{1000}b{1000}").substr(0, 24), "!the pattern's {n,m} rep");   // neighbours add up
    // copies of what can match empty chain regcomp's closures: 316 MB for (a?){1999}
    EXPECT_EQ(ere("(a?){1999}").substr(0, 24), "!the pattern's {n,m} rep");
    EXPECT_EQ(ere("(a*b*){999}").substr(0, 24), "!the pattern's {n,m} rep");
    EXPECT_EQ(ere("(a|){999}").substr(0, 24), "!the pattern's {n,m} rep");
    EXPECT_EQ(ere("(^){999}").substr(0, 24), "!the pattern's {n,m} rep");
    EXPECT_EQ(ere("(a?){249}"), "(a?){249}");   // 7 MB
    EXPECT_EQ(ere("(ab?){600}"), "(ab?){600}");   // each copy needs an a
    // a group and a '|' are nodes of their own: this took 1.9 GB when they counted nothing
    EXPECT_EQ(ere("((){1999}){1999}").substr(0, 24), "!the pattern's {n,m} rep");
    EXPECT_EQ(ere("(|){1999}").substr(0, 24), "!the pattern's {n,m} rep");
    EXPECT_EQ(ere("x{0,1999}"), "x{0,1999}");   // one atom made optional costs as a{2,1999}
    EXPECT_EQ(ere("\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}").substr(0, 6), "[0-9]{");
    EXPECT_EQ(ere(std::string(64, '(').c_str()).substr(0, 21), "!groups are nested to");
}

std::string literal(const char* ere_text) {
    std::string out(std::string(ere_text).size() + 1, '\0');
    out.resize(pattern_required_literal(ere_text, out.data()));
    return out;
}

TEST(SearchPattern, RequiredLiteral) {
    EXPECT_EQ(literal("parse_header"), "parse_header");
    EXPECT_EQ(literal("foo\\(bar"), "foo(bar");
    EXPECT_EQ(literal("\\bconfig_[a-z]+"), "config_");
    EXPECT_EQ(literal("abcd?e"), "abc");
    EXPECT_EQ(literal("ab+cdef"), "cdef");
    EXPECT_EQ(literal("x(yy)*zz"), "zz");
    EXPECT_EQ(literal("a{2}bcd"), "bcd");
    EXPECT_EQ(literal("foo|bar"), "");
    EXPECT_EQ(literal("[|]xy"), "xy");
    EXPECT_EQ(literal("^$"), "");
    EXPECT_EQ(literal("\\w+"), "");
    EXPECT_EQ(literal("ab+?cd"), "cd");  // "b+?" may match nothing in ERE
    EXPECT_EQ(literal("xy|z"), "");
}

} // namespace
