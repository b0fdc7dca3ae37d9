#include "engine/grammar/gbnf_rewrite.h"

#include <memory>
#include <string>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "gtest/gtest.h"

namespace ferry::grammar {
namespace {

bool Accepts(const std::string& gbnf, const std::string& text) {
  absl::StatusOr<Grammar> g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << gbnf;
  if (!g.ok()) return false;
  auto m = GrammarMatcher::Create(std::make_shared<Grammar>(*std::move(g)));
  return m.ok() && m->AdvanceBytes(text) == GrammarMatcher::Step::kOk && m->Accepting();
}

TEST(GbnfRewriteTest, PrefixesRuleNamesOnlyOutsideLiteralsClassesBoundsAndComments) {
  const std::string gbnf =
      "root ::= item (\",\" item){0,2} # item root\n"
      "item ::= \"root \\\" item\" | [a-z_-]+ | x_2\n"
      "x_2 ::= [\\]root]\n";
  EXPECT_EQ(PrefixGbnfRules(gbnf, "p-"),
            "p-root ::= p-item (\",\" p-item){0,2} # item root\n"
            "p-item ::= \"root \\\" item\" | [a-z_-]+ | p-x_2\n"
            "p-x_2 ::= [\\]root]\n");
}

TEST(GbnfRewriteTest, APrefixedGrammarUnderANewRootAcceptsTheSameStrings) {
  const std::string gbnf =
      "root ::= item (\",\" item){0,2}\n"
      "item ::= \"root \\\" item\" | [a-c]+ | x\n"
      "x ::= [\\]]\n";
  const std::string wrapped = "root ::= \"<\" p-root \">\"\n" + PrefixGbnfRules(gbnf, "p-");
  for (const std::string text : {"abc", "root \" item,]", "a,b,c", "]"}) {
    EXPECT_TRUE(Accepts(gbnf, text)) << text;
    EXPECT_TRUE(Accepts(wrapped, "<" + text + ">")) << text;
  }
  for (const std::string text : {"a,b,c,a", "root", "d", ""}) {
    EXPECT_FALSE(Accepts(gbnf, text)) << text;
    EXPECT_FALSE(Accepts(wrapped, "<" + text + ">")) << text;
  }
}

}  // namespace
}  // namespace ferry::grammar
