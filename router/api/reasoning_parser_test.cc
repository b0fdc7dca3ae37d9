#include "router/api/reasoning_parser.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

struct Split {
  std::string reasoning, content;
  bool whole_utf8 = true;
};

bool WholeUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    i += n;
  }
  return true;
}

Split Parse(const std::vector<std::string>& pieces, bool started) {
  ReasoningParser parser(started);
  Split s;
  for (const std::string& piece : pieces) {
    std::string r, c;
    parser.Feed(piece, &r, &c);
    s.whole_utf8 = s.whole_utf8 && WholeUtf8(r) && WholeUtf8(c);
    s.reasoning += r;
    s.content += c;
  }
  std::string r, c;
  parser.Finish(&r, &c);
  s.reasoning += r;
  s.content += c;
  return s;
}

Split ExpectSplitInvariant(const std::string& text, bool started = false) {
  const Split whole = Parse({text}, started);
  auto same = [&](const Split& s, const std::string& where) {
    EXPECT_EQ(s.reasoning, whole.reasoning) << where;
    EXPECT_EQ(s.content, whole.content) << where;
    EXPECT_TRUE(s.whole_utf8) << where;
  };
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    same(Parse({text.substr(0, cut), text.substr(cut)}, started), "cut " + std::to_string(cut));
  }
  std::mt19937 rng(3);
  for (int round = 0; round < 30; ++round) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min<size_t>(text.size() - at, 1 + rng() % 5);
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    same(Parse(pieces, started), "random " + std::to_string(round));
  }
  return whole;
}

TEST(ReasoningParserTest, ThinkingThenAnswer) {
  const Split s = ExpectSplitInvariant("<think>\nLet me think: 2+2 é.\n</think>\n\nIt is 4.");
  EXPECT_EQ(s.reasoning, "\nLet me think: 2+2 é.\n");
  EXPECT_EQ(s.content, "It is 4.");
}

TEST(ReasoningParserTest, StartedByThePromptAndCutInside) {
  const Split started = ExpectSplitInvariant("hmm 😀</think>answer", /*started=*/true);
  EXPECT_EQ(started.reasoning, "hmm 😀");
  EXPECT_EQ(started.content, "answer");
  const Split cut = ExpectSplitInvariant("<think>never ends </thi");
  EXPECT_EQ(cut.reasoning, "never ends </thi");
  EXPECT_EQ(cut.content, "");
}

TEST(ReasoningParserTest, NoBlockIsAllContent) {
  for (const std::string& text :
       {std::string("plain answer <think>x</think>"), std::string("<thin"), std::string("  "),
        std::string("<thinking>no</thinking>")}) {
    const Split s = ExpectSplitInvariant(text);
    EXPECT_EQ(s.reasoning, "") << text;
    EXPECT_EQ(s.content, text) << text;
  }
}

TEST(ReasoningParserTest, PromptOpensBlock) {
  EXPECT_TRUE(ReasoningParser::PromptOpensBlock("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(ReasoningParser::PromptOpensBlock("<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningParser::PromptOpensBlock("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace ferry
