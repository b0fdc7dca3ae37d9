#include "engine/grammar/gbnf_text.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace ferry::grammar {
namespace {

using CodePoints = std::vector<uint32_t>;

CodePoints Decode(const std::string& s) {
  // The test's markers and alphabets are valid UTF-8 written in the source.
  CodePoints out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string Utf8(uint32_t cp) {
  std::string out;
  AppendUtf8(cp, &out);
  return out;
}

// The reference, straight from the definitions: where the first occurrence of `m` in `s` ends
// (a code point index), or -1.
long FirstEnd(const CodePoints& s, const CodePoints& m) {
  for (size_t at = 0; at + m.size() <= s.size(); ++at) {
    if (std::equal(m.begin(), m.end(), s.begin() + at)) return static_cast<long>(at + m.size());
  }
  return -1;
}

// Until: `s` is in the language when its first occurrence of the marker ends it; a prefix can
// still be completed when it has no occurrence yet, or is itself in the language.
bool UntilAccepts(const CodePoints& s, const CodePoints& m) {
  return FirstEnd(s, m) == static_cast<long>(s.size());
}
bool UntilViable(const CodePoints& s, const CodePoints& m) {
  const long end = FirstEnd(s, m);
  return end < 0 || end == static_cast<long>(s.size());
}
// Without: no occurrence (every prefix of such a text has none either).
bool WithoutAccepts(const CodePoints& s, const CodePoints& m) { return FirstEnd(s, m) < 0; }

struct MarkerCase {
  bool until;
  CodePoints marker;
  std::unique_ptr<GrammarMatcher> matcher;
  size_t checked = 0;
};

std::unique_ptr<GrammarMatcher> MatcherFor(const std::string& gbnf) {
  absl::StatusOr<Grammar> g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << gbnf;
  if (!g.ok()) return nullptr;
  absl::StatusOr<GrammarMatcher> m =
      GrammarMatcher::Create(std::make_shared<const Grammar>(*std::move(g)));
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  return std::make_unique<GrammarMatcher>(*std::move(m));
}

MarkerCase Build(const std::string& marker, bool until) {
  MarkerCase c;
  c.until = until;
  c.marker = Decode(marker);
  const std::string rules =
      until ? GbnfTextUntilRules("text", marker) : GbnfTextWithoutRules("text", marker);
  c.matcher = MatcherFor("root ::= text\n" + rules);
  return c;
}

bool Accepts(const MarkerCase& c, const CodePoints& s) {
  return c.until ? UntilAccepts(s, c.marker) : WithoutAccepts(s, c.marker);
}
bool Viable(const MarkerCase& c, const CodePoints& s) {
  return c.until ? UntilViable(s, c.marker) : WithoutAccepts(s, c.marker);
}

// Every string over `alphabet` up to `max_len` code points, depth first: the matcher takes the
// next character exactly when the reference says the text can still end in the language, and
// accepts exactly the texts in it.
void Enumerate(MarkerCase* c, const CodePoints& alphabet, size_t max_len, CodePoints* s) {
  for (uint32_t cp : alphabet) {
    s->push_back(cp);
    const size_t checkpoint = c->matcher->Checkpoint();
    const bool took = c->matcher->AdvanceBytes(Utf8(cp)) == GrammarMatcher::Step::kOk;
    ++c->checked;
    ASSERT_EQ(took, Viable(*c, *s)) << "after " << s->size() << " characters";
    if (took) {
      ASSERT_EQ(c->matcher->Accepting(), Accepts(*c, *s)) << "after " << s->size();
      if (s->size() < max_len) Enumerate(c, alphabet, max_len, s);
      c->matcher->Rollback(checkpoint);
    }
    s->pop_back();
  }
}

// One text, character by character, against the reference.
void CheckText(MarkerCase* c, const CodePoints& text) {
  c->matcher->Rollback(0);
  CodePoints s;
  for (uint32_t cp : text) {
    s.push_back(cp);
    const bool took = c->matcher->AdvanceBytes(Utf8(cp)) == GrammarMatcher::Step::kOk;
    ASSERT_EQ(took, Viable(*c, s));
    if (!took) return;
    ASSERT_EQ(c->matcher->Accepting(), Accepts(*c, s));
  }
}

// The marker's characters and one other; strings up to a length that keeps the count near
// 200,000 (at most 9), then random texts made of the marker's prefixes (which reach lengths the
// enumeration cannot for long markers).
void CheckMarker(const std::string& marker) {
  for (bool until : {true, false}) {
    SCOPED_TRACE(absl::StrCat(until ? "until " : "without ", marker));
    MarkerCase c = Build(marker, until);
    ASSERT_NE(c.matcher, nullptr);
    EXPECT_EQ(c.matcher->Accepting(), !until);  // the empty text
    CodePoints alphabet = c.marker;
    std::sort(alphabet.begin(), alphabet.end());
    alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
    uint32_t other = 'x';
    while (std::binary_search(alphabet.begin(), alphabet.end(), other)) ++other;
    alphabet.push_back(other);
    size_t max_len = 1;
    for (size_t n = alphabet.size(); max_len < 9 && n * alphabet.size() < 200000;) {
      n *= alphabet.size();
      ++max_len;
    }
    CodePoints s;
    Enumerate(&c, alphabet, max_len, &s);
    EXPECT_GT(c.checked, 500u);

    std::mt19937 rng(49);
    for (int round = 0; round < 2000; ++round) {
      CodePoints text;
      const int pieces = 1 + static_cast<int>(rng() % 6);
      for (int p = 0; p < pieces; ++p) {
        const size_t len = rng() % (c.marker.size() + 1);
        text.insert(text.end(), c.marker.begin(), c.marker.begin() + len);
        text.push_back(alphabet[rng() % alphabet.size()]);
      }
      if (round % 3 == 0) text.insert(text.end(), c.marker.begin(), c.marker.end());
      CheckText(&c, text);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(GbnfMarkerRulesTest, ShapeOfTheRules) {
  EXPECT_EQ(GbnfTextUntilRules("u", "ab"),
            "u ::= [^a] u | \"a\" u-1\n"
            "u-1 ::= [^ab] u | \"a\" u-1 | \"b\"\n");
  EXPECT_EQ(GbnfTextWithoutRules("w", "ab"),
            "w ::= [^a] w | \"a\" w-1 | \"\"\n"
            "w-1 ::= [^ab] w | \"a\" w-1 | \"\"\n");
}

TEST(GbnfMarkerRulesTest, ThinkEndMarker) { CheckMarker("</think>"); }
TEST(GbnfMarkerRulesTest, SelfOverlappingMarkers) {
  CheckMarker("aab");
  CheckMarker("abab");
  CheckMarker("aaa");
}
TEST(GbnfMarkerRulesTest, ToolCallMarker) { CheckMarker("<tool_call>"); }
TEST(GbnfMarkerRulesTest, NonAsciiMarkers) {
  CheckMarker("日本日");
  CheckMarker("<｜tool▁sep｜>");
  CheckMarker("é\"]\\^-[");  // the class specials, escaped in the rules
}

TEST(RenameGbnfRuleTest, NamesOnlyNotLiteralsClassesCountsOrComments) {
  const std::string gbnf =
      "root ::= a \"a\" [a] a-1 ab # a here\n"
      "a ::= \"\\\"a\" [\\]a] a{2} (a | \"x\")\n"
      "a-1 ::= \"b\"\n"
      "ab ::= \"c\"\n";
  const std::string renamed = RenameGbnfRule(gbnf, "a", "t-a");
  EXPECT_EQ(renamed,
            "root ::= t-a \"a\" [a] a-1 ab # a here\n"
            "t-a ::= \"\\\"a\" [\\]a] t-a{2} (t-a | \"x\")\n"
            "a-1 ::= \"b\"\n"
            "ab ::= \"c\"\n");
  EXPECT_TRUE(ParseGbnf(renamed).ok());

  const std::string prefixed = PrefixGbnfRules(gbnf, "p-");
  EXPECT_EQ(prefixed,
            "p-root ::= p-a \"a\" [a] p-a-1 p-ab # a here\n"
            "p-a ::= \"\\\"a\" [\\]a] p-a{2} (p-a | \"x\")\n"
            "p-a-1 ::= \"b\"\n"
            "p-ab ::= \"c\"\n");
  EXPECT_TRUE(ParseGbnf("root ::= p-root\n" + prefixed).ok());
}

}  // namespace
}  // namespace ferry::grammar
