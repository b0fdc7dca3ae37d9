#include "engine/grammar/gbnf_parser.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::grammar {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::string& text, const GbnfLimits& limits = {}) {
  absl::StatusOr<Grammar> g = ParseGbnf(text, limits);
  if (g.ok()) return "OK";
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  return std::string(g.status().message());
}

TEST(GbnfParserTest, ParsesTheDialect) {
  const char* kText = R"g(# a comment
root ::= object | array   # trailing comment
object ::= "{" ws ( pair ( "," ws pair )* )? "}"
pair ::= string ":" ws value
array ::= "[" ws (
    value ("," ws value)*
  )? "]"
value ::= object | array | string | [0-9]+ | "true" | "\u00e9\x41\U0001F600"
string ::= "\"" ( [^"\\] | "\\" [nrt"\\] )* "\""
ws ::= [ \t\n]{0,2} .?
rep ::= "a"{3} "b"{2,} "c"{1,4}
)g";
  absl::StatusOr<Grammar> g = ParseGbnf(kText);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->rules[g->root].name, "root");
  EXPECT_THAT(g->DebugString(), HasSubstr("root ::= object | array"));
}

TEST(GbnfParserTest, UnicodeClassLowersToUtf8Sequences) {
  absl::StatusOr<Grammar> g = ParseGbnf("root ::= [a-zé-ü\\u4e00-\\u9fff]");
  ASSERT_TRUE(g.ok()) << g.status();
  std::string dump = g->DebugString();
  EXPECT_THAT(dump, HasSubstr("[a-z]"));
  EXPECT_THAT(dump, HasSubstr("[\\xC3] [\\xA9-\\xBC]"));  // é..ü
  // U+4E00-U+9FFF: E4 B8-BF 80-BF, then E5-E9 80-BF 80-BF.
  EXPECT_THAT(dump, HasSubstr("[\\xE4] [\\xB8-\\xBF] [\\x80-\\xBF]"));
  EXPECT_THAT(dump, HasSubstr("[\\xE5-\\xE9] [\\x80-\\xBF] [\\x80-\\xBF]"));
}

TEST(GbnfParserTest, ErrorsSayWhereAndWhat) {
  EXPECT_EQ(ErrorOf("root ::= foo\n"), "line 1, column 10: undefined rule 'foo'");
  EXPECT_EQ(ErrorOf("a ::= \"x\"\n"), "the grammar has no 'root' rule (the start rule)");
  EXPECT_EQ(ErrorOf("root ::= \"a\\q\"\n"),
            "line 1, column 12: unknown escape '\\q' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\x "
            "\\u \\U)");
  EXPECT_EQ(ErrorOf("root ::= (\"a\" | \"b\"\n"), "line 1, column 10: unbalanced '(': missing ')'");
  EXPECT_EQ(ErrorOf("root ::= \"a\" )\n"),
            "line 1, column 14: unexpected ')' (expected an element, '|', or the end of the rule)");
  EXPECT_EQ(ErrorOf("root ::= \"abc\n"), "line 1, column 10: unterminated literal (missing '\"')");
  EXPECT_EQ(ErrorOf("root ::= [a-z\n"),
            "line 1, column 10: unterminated character class (missing ']')");
  EXPECT_EQ(ErrorOf("root ::= [z-a]\n"),
            "line 1, column 12: character range is reversed (end < start)");
  EXPECT_EQ(ErrorOf("root \"a\"\n"), "line 1, column 6: expected '::=' after the rule name");
  EXPECT_EQ(ErrorOf("root ::= * \"a\"\n"),
            "line 1, column 10: '*' has no item before it to repeat");
  EXPECT_EQ(ErrorOf("root ::= \"a\"{3,2}\n"), "line 1, column 13: repetition {m,n} with n < m");
  EXPECT_EQ(ErrorOf("root ::= \"a\"{x}\n"), "line 1, column 13: expected a number after '{'");
  EXPECT_EQ(ErrorOf("root ::= \"a\"\nroot ::= \"b\"\n"),
            "line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(ErrorOf("root ::= \"\\uD800\"\n"),
            "line 1, column 11: escape is not a Unicode scalar value (surrogate or above "
            "U+10FFFF)");
  EXPECT_EQ(ErrorOf("root ::= \"\\x4\"\n"), "line 1, column 11: escape needs 2 hex digits");
  EXPECT_EQ(ErrorOf("root ::= <[1000]>\n"),
            "line 1, column 10: token references (<...>) are not supported");
  EXPECT_EQ(ErrorOf("root ::= \"\xff\"\n"), "line 1, column 11: invalid UTF-8 in the grammar");
  EXPECT_EQ(ErrorOf("root ::= [^\\x00-\\U0010FFFF]\n"),
            "line 1, column 10: the character class matches no character");
}

TEST(GbnfParserTest, RefusesLeftRecursion) {
  EXPECT_THAT(ErrorOf("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n"),
              HasSubstr("left recursion (a rule reaches itself before matching any character; "
                        "the matcher cannot expand it): expr -> expr"));
  // Through a rule that can be empty.
  EXPECT_THAT(ErrorOf("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= \"z\"?\n"), HasSubstr("a -> a"));
  // A repetition of something that can be empty is left recursion too.
  EXPECT_THAT(ErrorOf("root ::= (\"a\"?)*\n"), HasSubstr("left recursion"));
  // Right recursion is fine.
  EXPECT_EQ(ErrorOf("root ::= \"a\" root | \"\"\n"), "OK");
}

TEST(GbnfParserTest, Limits) {
  GbnfLimits limits;
  limits.max_text_bytes = 10;
  EXPECT_EQ(ErrorOf("root ::= \"abcdef\"\n", limits),
            "grammar text is 18 bytes, more than the limit of 10");
  limits = {};
  limits.max_repetition = 100;
  EXPECT_EQ(ErrorOf("root ::= \"a\"{101}\n", limits),
            "line 1, column 13: repetition bound above the limit of 100");
  limits = {};
  limits.max_nesting_depth = 3;
  EXPECT_EQ(ErrorOf("root ::= ((((\"a\"))))\n", limits),
            "line 1, column 13: groups nested deeper than 3");
  limits = {};
  limits.max_elements = 1000;
  EXPECT_THAT(ErrorOf("root ::= (\"ab\"{500}){10}\n", limits),
              HasSubstr("the grammar needs more than 1000 elements"));
  limits = {};
  limits.max_rules = 5;
  EXPECT_THAT(ErrorOf("root ::= \"a\"{0,10}\n", limits), HasSubstr("more than 5 rules"));
}

}  // namespace
}  // namespace ferry::grammar
