#include "engine/grammar/grammar_matcher.h"

#include <memory>
#include <string>

#include "engine/grammar/gbnf_parser.h"
#include "gtest/gtest.h"

namespace ferry::grammar {
namespace {

using Step = GrammarMatcher::Step;

std::shared_ptr<const Grammar> Compile(const std::string& text) {
  absl::StatusOr<Grammar> g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const Grammar>(*std::move(g));
}

// "accept": a whole sentence; "prefix": a proper prefix only; "reject": not even a prefix.
std::string Classify(const std::shared_ptr<const Grammar>& g, const std::string& input) {
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g);
  EXPECT_TRUE(m.ok()) << m.status();
  Step step = m->AdvanceBytes(input);
  if (step == Step::kLimit) return "limit";
  if (step == Step::kRejected) return "reject";
  return m->Accepting() ? "accept" : "prefix";
}

TEST(GrammarMatcherTest, NestedArraysByRecursion) {
  auto g = Compile(R"g(root ::= arr
arr ::= "[" ( elem ( "," elem )* )? "]"
elem ::= arr | [0-9]+
)g");
  EXPECT_EQ(Classify(g, "[]"), "accept");
  EXPECT_EQ(Classify(g, "[1,[2,[]],[[[[[[[[[[3]]]]]]]]]]]"), "accept");
  EXPECT_EQ(Classify(g, "[1,[2,"), "prefix");
  EXPECT_EQ(Classify(g, ""), "prefix");
  EXPECT_EQ(Classify(g, "[1,]"), "reject");
  EXPECT_EQ(Classify(g, "[]]"), "reject");
  std::string deep(2000, '[');
  EXPECT_EQ(Classify(g, deep + std::string(2000, ']')), "accept");
}

TEST(GrammarMatcherTest, Repetitions) {
  auto g = Compile("root ::= \"a\"{2,4} \"b\"{3} \"c\"{1,} \"d\"?\n");
  EXPECT_EQ(Classify(g, "aabbbc"), "accept");
  EXPECT_EQ(Classify(g, "aaaabbbccccd"), "accept");
  EXPECT_EQ(Classify(g, "abbbc"), "reject");
  EXPECT_EQ(Classify(g, "aaaaa"), "reject");
  EXPECT_EQ(Classify(g, "aabb"), "prefix");
  EXPECT_EQ(Classify(g, "aabbbcdd"), "reject");
}

TEST(GrammarMatcherTest, UnicodeByteByByte) {
  auto g = Compile("root ::= \"é\" [^a-z] [\\u4e00-\\u9fff]+ .\n");
  EXPECT_EQ(Classify(g, "éA中文😀"), "accept");
  EXPECT_EQ(Classify(g, "é\xc3"), "prefix");  // half of a two-byte character
  EXPECT_EQ(Classify(g, "éa"), "reject");
  EXPECT_EQ(Classify(g, "éA中\xe6"), "prefix");
  EXPECT_EQ(Classify(g, "éA\xed\xa0\x80"), "reject");  // a surrogate's encoding is not UTF-8
  EXPECT_EQ(Classify(g, "éA中\xff"), "reject");
}

TEST(GrammarMatcherTest, Arithmetic) {
  auto g = Compile(R"g(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
)g");
  EXPECT_EQ(Classify(g, "1+2*(3-4)/-5"), "accept");
  EXPECT_EQ(Classify(g, "((1+2)"), "prefix");
  EXPECT_EQ(Classify(g, "1+*2"), "reject");
}

TEST(GrammarMatcherTest, RollbackRestoresState) {
  auto g = Compile("root ::= \"[\" root \"]\" | \"x\"\n");
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->AdvanceBytes("[["), Step::kOk);
  size_t cp = m->Checkpoint();
  size_t nodes = m->node_count();
  ASSERT_EQ(m->AdvanceBytes("[[[x]]"), Step::kOk);
  EXPECT_FALSE(m->Accepting());
  m->Rollback(cp);
  EXPECT_EQ(m->node_count(), nodes);
  EXPECT_EQ(m->Checkpoint(), 2u);
  EXPECT_EQ(m->AdvanceBytes("x]]"), Step::kOk);
  EXPECT_TRUE(m->Accepting());
  EXPECT_EQ(m->Advance(']'), Step::kRejected);
  EXPECT_TRUE(m->Accepting());  // a refused byte changes nothing
  m->Rollback(0);
  EXPECT_EQ(m->AdvanceBytes("x"), Step::kOk);
  EXPECT_TRUE(m->Accepting());
}

TEST(GrammarMatcherTest, AmbiguityIsBounded) {
  // Every split of the a's is a different parse: stacks grow each byte.
  auto g = Compile("root ::= x*\nx ::= \"a\" | \"a\" \"a\" | y\ny ::= \"a\" y | \"a\"\n");
  MatcherLimits limits;
  limits.max_stacks = 64;
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g, limits);
  ASSERT_TRUE(m.ok());
  Step step = Step::kOk;
  int n = 0;
  while (step == Step::kOk && n < 10000) {
    step = m->Advance('a');
    ++n;
  }
  // Stack hash-consing keeps this from growing forever, or the limit stops it: never a hang.
  EXPECT_TRUE(step == Step::kOk || step == Step::kLimit);
  EXPECT_LE(m->stack_count(), 64u);
}

TEST(GrammarMatcherTest, NestedRepetitionIsBoundedNotSlow) {
  // Exponentially many parses of a run of a's, but 400 distinct stacks: each (position, stack)
  // item is expanded once per byte, so this stays below the limits.
  auto g = Compile("root ::= (\"a\"{0,20}){0,20} \"b\"\n");
  absl::StatusOr<GrammarMatcher> m = GrammarMatcher::Create(g);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->AdvanceBytes(std::string(50, 'a') + "b"), Step::kOk);
  EXPECT_TRUE(m->Accepting());
  EXPECT_EQ(m->limit_hits(), 0u);
  // One level more has 20^3 distinct stacks (which level each a belongs to): over max_stacks,
  // so the byte is refused with kLimit and the state rolled back, quickly.
  g = Compile("root ::= ((\"a\"{0,20}){0,20}){0,20} \"b\"\n");
  m = GrammarMatcher::Create(g);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->AdvanceBytes(std::string(50, 'a') + "b"), Step::kLimit);
  EXPECT_EQ(m->Checkpoint(), 0u);
  EXPECT_EQ(m->limit_hits(), 1u);
}

TEST(GrammarMatcherTest, ExpansionLimit) {
  auto g = Compile("root ::= a\na ::= b | c\nb ::= \"x\"\nc ::= \"y\"\n");
  MatcherLimits limits;
  limits.max_expansions = 2;
  EXPECT_EQ(GrammarMatcher::Create(g, limits).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ferry::grammar
