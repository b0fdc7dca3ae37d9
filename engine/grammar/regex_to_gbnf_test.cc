#include "engine/grammar/regex_to_gbnf.h"

#include <gtest/gtest.h>

namespace ferry::grammar {
namespace {

std::string Raw(const std::string& p) {
  auto g = RegexToGbnfExpression(p, RegexTarget::kRawText);
  return g.ok() ? *g : "ERROR: " + std::string(g.status().message());
}
std::string Json(const std::string& p) {
  auto g = RegexToGbnfExpression(p, RegexTarget::kJsonStringContent);
  return g.ok() ? *g : "ERROR: " + std::string(g.status().message());
}

TEST(RegexToGbnfTest, Basics) {
  EXPECT_EQ(Raw("ab"), "\"a\" \"b\"");
  EXPECT_EQ(Raw("a|b"), "(\"a\" | \"b\")");
  EXPECT_EQ(Raw("^a+$"), "(\"a\")+");
  EXPECT_EQ(Raw("[a-c]{2,3}"), "([a-c]){2,3}");
  EXPECT_EQ(Raw("\\d*?"), "([0-9])*");
  EXPECT_EQ(Raw("(?:x)?"), "((\"x\"))?");
  EXPECT_EQ(Raw("a{,2}"), "(\"a\"){0,2}");
  EXPECT_EQ(Raw("a{"), "\"a\" \"{\"");
  EXPECT_EQ(
      Raw("[^\\s\\S]"),
      "ERROR: regex \"[^\\s\\S]\" has a character class that matches nothing (at character 7)");
}

TEST(RegexToGbnfTest, JsonEscaping) {
  EXPECT_EQ(Json("\""), "\"\\\\\\\"\"");
  EXPECT_EQ(Json("\\\\"), "\"\\\\\\\\\"");
  EXPECT_EQ(Json("\\n"), "\"\\\\n\"");
  EXPECT_EQ(Json("[\"a]"), "([a] | \"\\\\\\\"\")");
}

TEST(RegexToGbnfTest, Refusals) {
  for (const char* p :
       {"(a)\\1", "(?=a)", "(?!a)", "(?<=a)b", "(?<!a)b", "\\bword", "a^b", "a$b", "(^a)", "(?i)a",
        "a*+", "\\p{L}", "(a", "a)", "*a", "a**", "(a{1000}){1000}", "a{2000}"}) {
    EXPECT_FALSE(RegexToGbnfExpression(p, RegexTarget::kRawText).ok()) << p;
  }
  auto s = RegexToGbnfExpression("(a)\\1", RegexTarget::kRawText).status();
  EXPECT_NE(s.message().find("backreference"), std::string::npos) << s;
  s = RegexToGbnfExpression("(?=a)", RegexTarget::kRawText).status();
  EXPECT_NE(s.message().find("lookaround"), std::string::npos) << s;
}

TEST(RegexToGbnfTest, PatternSearch) {
  auto g = PatternToGbnfJsonContent("^a|b$", "c");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g, "(\"a\" (c)* | (c)* \"b\")");
}

}  // namespace
}  // namespace ferry::grammar
